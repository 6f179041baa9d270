package train

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/zaya-operator/zaya-operator/internal/testnet"
	"github.com/zaya-operator/zaya-operator/workers/checkpoint"
	"github.com/zaya-operator/zaya-operator/workers/model"
	"github.com/zaya-operator/zaya-operator/workers/transport"
)

// benchShape fixes the checkpoint size for every rank count: 1,049,344 parameters, with
// AdamW's two moments 3 x 4 bytes each = 12 MiB.
var benchShape = model.Shape{Vocab: 1024, Dim: 256, Layers: 1, Heads: 4, FFN: 1024}

// resumeGang is world ranks of one process, connected over loopback TCP, with a committed
// checkpoint of a model of shape written by world ranks.
func resumeGang(b testing.TB, world int, shape model.Shape) []*rankState {
	b.Helper()
	cfg := Config{Nodes: 1, GPUsPerNode: world, ContextParallel: 1, Seq: 2, Model: shape, LR: 0.01, Seed: 1,
		Master: "127.0.0.1:" + testnet.FreePort(b), Listen: "127.0.0.1:0", RendezvousTimeout: 30 * time.Second,
		CheckpointDir: b.TempDir(), Keep: 3, Log: io.Discard}
	ranks := make([]*rankState, world)
	errs := make([]error, world)
	var wg sync.WaitGroup
	for rank := range world {
		wg.Go(func() {
			r, err := setupRank(cfg, rank)
			if err == nil {
				err = r.connect(context.Background())
			}
			ranks[rank], errs[rank] = r, err
		})
	}
	wg.Wait()
	for rank, err := range errs {
		if err != nil {
			b.Fatalf("rank %d: %v", rank, err)
		}
	}
	b.Cleanup(func() {
		for _, r := range ranks {
			_ = r.tr.Close()
		}
	})
	writeBenchCheckpoint(b, ranks, 100)
	return ranks
}

// writeBenchCheckpoint saves every rank's slice of its parameters at step and commits it.
func writeBenchCheckpoint(b testing.TB, ranks []*rankState, step int64) {
	b.Helper()
	errs := make([]error, len(ranks))
	var wg sync.WaitGroup
	for i, r := range ranks {
		wg.Go(func() { errs[i] = save(r.cfg, r.tr, r.rank, r.world, step, r.state()) })
	}
	wg.Wait()
	for rank, err := range errs {
		if err != nil {
			b.Fatalf("rank %d saving: %v", rank, err)
		}
	}
}

// resumeAll runs resume on every rank at once, as a restarted gang does.
func resumeAll(b testing.TB, ranks []*rankState, resume func(*rankState) error) {
	errs := make([]error, len(ranks))
	var wg sync.WaitGroup
	for i, r := range ranks {
		wg.Go(func() { errs[i] = resume(r) })
	}
	wg.Wait()
	for rank, err := range errs {
		if err != nil {
			b.Fatalf("rank %d resuming: %v", rank, err)
		}
	}
	for _, r := range ranks {
		if r.res.Step != 100 {
			b.Fatalf("rank %d resumed at step %d, want 100", r.rank, r.res.Step)
		}
		// As the next start of the same generation: resume numbered this one's attempt
		// generation<<20 + k, which is not a generation to fence with again.
		r.res, r.cfg.Attempt = Result{}, 0
	}
}

// TestResumeReadsTheCheckpointOnce: a gang of 4 resumes reading each shard byte once in
// total, and every rank ends with the saved parameters and optimizer moments bit for bit
// (negative zero and a NaN payload included: the shared slices must not pass through float
// arithmetic).
func TestResumeReadsTheCheckpointOnce(t *testing.T) {
	t.Run("all-gather", func(t *testing.T) { testResumeReadsOnce(t, false) })
	t.Run("all-reduce of the bits (RCCL)", func(t *testing.T) { testResumeReadsOnce(t, true) })
}

func testResumeReadsOnce(t *testing.T, noGather bool) {
	ranks := resumeGang(t, 4, testShape(8))
	if noGather {
		for _, r := range ranks {
			r.tr = struct{ transport.Transport }{r.tr} // hides AllGather, as RCCL's transport has none
		}
	}
	n := ranks[0].n
	saved := slices.Concat(ranks[0].params, make([]float32, n), make([]float32, n))
	for i := n; i < 3*n; i++ {
		saved[i] = float32(i)
	}
	saved[3] = float32(math.Copysign(0, -1))
	saved[n+100] = math.Float32frombits(0x7fc0beef)
	for _, r := range ranks {
		copy(r.params, saved[:n])
		copy(r.adamM, saved[n:2*n])
		copy(r.adamV, saved[2*n:])
	}
	writeBenchCheckpoint(t, ranks, 200)
	for _, r := range ranks {
		for _, t := range r.state() {
			clear(t.data)
		}
	}
	before := checkpoint.ShardBytesRead()
	errs := make([]error, len(ranks))
	var wg sync.WaitGroup
	for i, r := range ranks {
		wg.Go(func() { errs[i] = r.resume() })
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	if read := checkpoint.ShardBytesRead() - before; read != 4*int64(len(saved)) {
		t.Errorf("the gang read %d bytes of shards, want the checkpoint's %d once", read, 4*len(saved))
	}
	for _, r := range ranks {
		if r.res.Step != 200 {
			t.Errorf("rank %d resumed step %d, want 200", r.rank, r.res.Step)
		}
		got := slices.Concat(r.params, r.adamM, r.adamV)
		for i := range saved {
			if math.Float32bits(got[i]) != math.Float32bits(saved[i]) {
				t.Fatalf("rank %d state value %d = %08x, saved %08x", r.rank, i, math.Float32bits(got[i]), math.Float32bits(saved[i]))
			}
		}
	}
}

// readEverythingTwice is the loader before shared verification: every rank verified every
// shard of the newest step (checkpoint.Latest), then read them all again for its state.
func readEverythingTwice(r *rankState) error {
	ck, _, err := checkpoint.Latest(r.cfg.CheckpointDir)
	if err != nil || ck == nil {
		return fmt.Errorf("latest: %v %w", ck, err)
	}
	for _, t := range r.state() {
		p, err := ck.Read(t.name, 0, int64(r.n))
		if err != nil {
			return err
		}
		copy(t.data, p)
	}
	r.res.Step, r.res.CheckpointStep = ck.Manifest.Step, ck.Manifest.Step
	return nil
}

// BenchmarkResume is one gang's resume of a 12 MiB checkpoint on 2, 4 and 8 local ranks: the
// old read-everything-twice path against the worker's resume (`-bench Resume`).
func BenchmarkResume(b *testing.B) {
	paths := []struct {
		name   string
		resume func(*rankState) error
	}{
		{"read-everything-twice", readEverythingTwice},
		{"worker", (*rankState).resume},
	}
	for _, world := range []int{2, 4, 8} {
		for _, p := range paths {
			b.Run(fmt.Sprintf("%s/ranks=%d", p.name, world), func(b *testing.B) {
				ranks := resumeGang(b, world, benchShape)
				b.SetBytes(3 * 4 * int64(ranks[0].n))
				read, iters := checkpoint.ShardBytesRead(), 0
				for b.Loop() {
					resumeAll(b, ranks, p.resume)
					iters++
				}
				// The checkpoint's bytes every resume reads from storage, all ranks together.
				b.ReportMetric(float64(checkpoint.ShardBytesRead()-read)/float64(iters)/(1<<20), "MiB-read/op")
			})
		}
	}
}
