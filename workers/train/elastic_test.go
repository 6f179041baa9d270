package train

import (
	"bytes"
	"context"
	"crypto/sha256"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/zaya-operator/zaya-operator/api/contract"
	"github.com/zaya-operator/zaya-operator/internal/testnet"
	"github.com/zaya-operator/zaya-operator/workers/exactsum"
	"github.com/zaya-operator/zaya-operator/workers/model"
)

// finalParams runs j to the end of its args' steps and returns rank 0's parameters.
func finalParams(t *testing.T, j job) []byte {
	t.Helper()
	if j.port == "" {
		j.port = testnet.FreePort(t)
	}
	out := filepath.Join(j.dir, "params")
	logs := j.logs()
	waitAll(t, j.start(t, out, logs), logs)
	b, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestEveryWidthTrainsTheSameBits: a job whose target is 8 data-parallel ranks trains, on 2,
// 3, 4 or 8 of them, the same parameters bit for bit; so does a job of context-parallel rings
// (2 GPUs a node, one ring each) on 1, 2 or 3 of its 3 nodes. The same steps without a
// target (each width its own global batch) do differ: the test can tell. The float32
// parameters hide the float64 gradient's last bits; TestAStepsGradientIsTheSameAtEveryWidth
// compares those.
func TestEveryWidthTrainsTheSameBits(t *testing.T) {
	const args = "-steps=6 -seq=16 -dim=6"
	for _, c := range []struct {
		gpus, cp, target int
		widths           []int
	}{{1, 1, 8, []int{8, 2, 3, 4}}, {2, 2, 3, []int{3, 1, 2}}} {
		var want []byte
		for _, nodes := range c.widths {
			got := finalParams(t, job{nodes: nodes, gpus: c.gpus, cp: c.cp, target: c.target, args: args, dir: t.TempDir()})
			if want == nil {
				want = got
				continue
			}
			if !bytes.Equal(got, want) {
				t.Errorf("target %d nodes of %d GPUs (context parallel %d): %d nodes end with parameters %x, %d nodes with %x",
					c.target, c.gpus, c.cp, nodes, sha256.Sum256(got), c.widths[0], sha256.Sum256(want))
			}
		}
	}
	a := finalParams(t, job{nodes: 2, gpus: 1, cp: 1, args: args, dir: t.TempDir()})
	b := finalParams(t, job{nodes: 4, gpus: 1, cp: 1, args: args, dir: t.TempDir()})
	if bytes.Equal(a, b) {
		t.Error("2 and 4 nodes without a target (global batches of 2 and 4) end alike: the comparison above proves nothing")
	}
}

// TestAResizedRunEndsBitIdentical: a job of target 4 nodes (2 GPUs each, rings of 2) trains
// to step 8 on 4 nodes, resumes on 3 (a node lost) to step 16, then on 4 again to step 24,
// each width reading the checkpoint the other wrote; it ends with the parameters of the run
// that never resized.
func TestAResizedRunEndsBitIdentical(t *testing.T) {
	const args = "-seq=16 -dim=6"
	want := finalParams(t, job{nodes: 4, gpus: 2, cp: 2, target: 4, args: args + " -steps=24", dir: t.TempDir()})

	dir := t.TempDir()
	for i, leg := range []struct{ nodes, steps int }{{4, 8}, {3, 16}, {4, 24}} {
		j := job{nodes: leg.nodes, gpus: 2, cp: 2, target: 4, attempt: i, args: args + " -steps=" + strconv.Itoa(leg.steps), dir: dir, port: testnet.FreePort(t)}
		logs := j.logs()
		out := filepath.Join(dir, "params")
		waitAll(t, j.start(t, out, logs), logs)
		if i > 0 && !strings.Contains(logs[0].String(), "resumed from step "+strconv.Itoa((i)*8)) {
			t.Fatalf("leg %d on %d nodes did not resume from step %d:\n%s", i, leg.nodes, i*8, logs[0])
		}
	}
	got, err := os.ReadFile(filepath.Join(dir, "params"))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("4 → 3 → 4 nodes ends with parameters %x, the run that stayed on 4 with %x", sha256.Sum256(got), sha256.Sum256(want))
	}
}

// stepGradient is the loss and gradients of a job's first step, all-reduced, as rank 0 of
// nodes × gpus in-process ranks (a real TCP transport) sees them.
func stepGradient(t *testing.T, target, nodes, gpus, cp int) []float64 {
	t.Helper()
	cfg := Config{Nodes: nodes, GPUsPerNode: gpus, ContextParallel: cp, TargetNodes: target, Steps: 1, Seq: 16, LR: 0.01, Seed: 3,
		Model: model.Shape{Vocab: 32, Dim: 8, Layers: 1, Heads: 2}, Master: testnet.FreeAddr(t), Listen: "127.0.0.1:0", RendezvousTimeout: 20 * time.Second}
	world := nodes * gpus
	out := make([][]float64, world)
	errs := make([]error, world)
	var wg sync.WaitGroup
	for rank := range world {
		wg.Go(func() {
			c := cfg
			c.NodeRank = rank / gpus
			r, err := setupRank(c, rank)
			if err == nil {
				err = r.connect(context.Background())
			}
			if err != nil {
				errs[rank] = err
				return
			}
			defer func() { _ = r.tr.Close() }()
			vec, err := r.gradients()
			if err == nil {
				err = r.tr.AllReduce(vec)
			}
			r.unscale(vec)
			out[rank], errs[rank] = vec[:1+r.n], err
		})
	}
	wg.Wait()
	for rank, err := range errs {
		if err != nil {
			t.Fatalf("%d nodes, rank %d: %v", nodes, rank, err)
		}
	}
	return out[0]
}

// TestAStepsGradientIsTheSameAtEveryWidth compares the step's float64 gradient itself, which
// the float32 parameters would hide a last bit of: a target of 8 data-parallel ranks gives
// the same bits on 2, 3, 4 and 8, and rings of 2 (target 3 nodes of 2 GPUs) on 1, 2 and 3.
func TestAStepsGradientIsTheSameAtEveryWidth(t *testing.T) {
	for _, c := range []struct {
		gpus, cp, target int
		widths           []int
	}{{1, 1, 8, []int{8, 2, 3, 4}}, {2, 2, 3, []int{3, 1, 2}}} {
		want := stepGradient(t, c.target, c.widths[0], c.gpus, c.cp)
		if exactsum.MaxAbs(want[1:]) == 0 {
			t.Fatal("the gradient is zero: nothing is compared")
		}
		for _, nodes := range c.widths[1:] {
			got := stepGradient(t, c.target, nodes, c.gpus, c.cp)
			for i := range want {
				if math.Float64bits(got[i]) != math.Float64bits(want[i]) {
					t.Fatalf("target %d nodes of %d GPUs: on %d nodes element %d is %v, on %d %v", c.target, c.gpus, nodes, i, got[i], c.widths[0], want[i])
				}
			}
		}
	}
}

// A worker told -fixed-width refuses a width below its target with ExitNoResize, and trains
// at its target.
func TestAFixedWidthWorkerRefusesToShrink(t *testing.T) {
	env := map[string]string{
		"NODE_RANK": "0", "NNODES": "1", "GPUS_PER_NODE": "1", "WORLD_SIZE": "1", "ZAYA_CONTEXT_PARALLEL": "1", "ZAYA_RESTART_ATTEMPT": "0",
		"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": testnet.FreePort(t), "ZAYA_TARGET_NODES": "2",
	}
	var stderr bytes.Buffer
	if code := Main([]string{"-fixed-width", "-steps=2", "-seq=16", "-dim=6", "-metrics-addr="}, func(k string) string { return env[k] }, &stderr); code != contract.ExitNoResize {
		t.Fatalf("exit %d, want %d; stderr: %s", code, contract.ExitNoResize, &stderr)
	}
	env["ZAYA_TARGET_NODES"] = "1"
	stderr.Reset()
	if code := Main([]string{"-fixed-width", "-steps=2", "-seq=16", "-dim=6", "-metrics-addr=", "-listen=127.0.0.1:0"}, func(k string) string { return env[k] }, &stderr); code != 0 {
		t.Fatalf("at its target: exit %d; stderr: %s", code, &stderr)
	}
}
