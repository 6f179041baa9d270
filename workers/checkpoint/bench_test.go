package checkpoint

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"testing"
	"time"
)

// The save benchmarks write the same 64 MiB of state (16 Mi float32) from 8 ranks, each
// holding 1/8, three ways; compare them as ratios within one run (`-bench Save`).
const (
	benchRanks    = 8
	benchElements = 16 << 20
)

func benchState() []float32 {
	s := make([]float32, benchElements)
	for i := range s {
		s[i] = float32(i)
	}
	return s
}

// BenchmarkSaveRawDisk is the disk's own bandwidth for the same bytes: 8 files written in
// parallel and fsynced, no checksums, no manifest.
func BenchmarkSaveRawDisk(b *testing.B) {
	buf := make([]byte, 4*benchElements/benchRanks)
	b.SetBytes(4 * benchElements)
	for i := 0; b.Loop(); i++ {
		dir := b.TempDir()
		var wg sync.WaitGroup
		for r := range benchRanks {
			wg.Go(func() {
				if err := writeFileSync(filepath.Join(dir, fmt.Sprint(r)), buf); err != nil {
					b.Error(err)
				}
			})
		}
		wg.Wait()
	}
}

// BenchmarkSaveParallelShards is this package's protocol: every rank writes its shard at once,
// then the coordinator commits the manifest.
func BenchmarkSaveParallelShards(b *testing.B) {
	state := benchState()
	b.SetBytes(4 * benchElements)
	for i := 0; b.Loop(); i++ {
		dir := b.TempDir()
		var wg sync.WaitGroup
		for r := range benchRanks {
			wg.Go(func() {
				n := int64(benchElements / benchRanks)
				t := Tensor{Name: "params", Shape: []int64{benchElements}, Start: int64(r) * n, Data: state[int64(r)*n : int64(r+1)*n]}
				if err := WriteShard(dir, 0, int64(i), r, []Tensor{t}); err != nil {
					b.Error(err)
				}
			})
		}
		wg.Wait()
		if _, err := Commit(dir, 0, int64(i), benchRanks, nil, Retention{Keep: 1}); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkSaveFunnelledThroughRank0 is what frameworks without distributed checkpoints do:
// every rank's state goes to rank 0, which writes it all.
func BenchmarkSaveFunnelledThroughRank0(b *testing.B) {
	state := benchState()
	b.SetBytes(4 * benchElements)
	for i := 0; b.Loop(); i++ {
		dir := b.TempDir()
		gathered := make([]float32, 0, benchElements)
		for r := range benchRanks { // the gather: rank 0 copies every rank's slice in turn
			n := benchElements / benchRanks
			gathered = append(gathered, state[r*n:(r+1)*n]...)
		}
		t := Tensor{Name: "params", Shape: []int64{benchElements}, Data: gathered}
		if err := WriteShard(dir, 0, int64(i), 0, []Tensor{t}); err != nil {
			b.Fatal(err)
		}
		if _, err := Commit(dir, 0, int64(i), 1, nil, Retention{Keep: 1}); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkSaveVsRawDisk pairs the two: each iteration writes the raw files and then saves
// through the protocol, in turn, so both meet the same disk and page-cache state; it reports
// the protocol's throughput as a share of the raw write's (save/raw), the figure to hold at
// ≥ 0.9. ZAYA_BENCH_SAVE_MIB sets the state size (default 64 MiB).
func BenchmarkSaveVsRawDisk(b *testing.B) {
	elements := benchElements
	if mib, err := strconv.Atoi(os.Getenv("ZAYA_BENCH_SAVE_MIB")); err == nil && mib > 0 {
		elements = mib << 18 // float32s
	}
	state := make([]float32, elements)
	for i := range state {
		state[i] = float32(i)
	}
	n := elements / benchRanks
	var raw, save time.Duration
	writeRaw := func(dir string) {
		// The same bytes the shards hold: a disk that writes zeros faster must not flatter it.
		var wg sync.WaitGroup
		for r := range benchRanks {
			wg.Go(func() {
				if err := writeFileSync(filepath.Join(dir, fmt.Sprint("raw-", r)), littleEndianBytes(state[r*n:(r+1)*n])); err != nil {
					b.Error(err)
				}
			})
		}
		wg.Wait()
	}
	writeSave := func(dir string, step int64) {
		var wg sync.WaitGroup
		for r := range benchRanks {
			wg.Go(func() {
				t := Tensor{Name: "params", Shape: []int64{int64(elements)}, Start: int64(r * n), Data: state[r*n : (r+1)*n]}
				if err := WriteShard(dir, 0, step, r, []Tensor{t}); err != nil {
					b.Error(err)
				}
			})
		}
		wg.Wait()
		if _, err := Commit(dir, 0, step, benchRanks, nil, Retention{Keep: 1}); err != nil {
			b.Fatal(err)
		}
	}
	for i := 0; b.Loop(); i++ {
		dir := b.TempDir()
		// Each goes first in every other iteration: the second write meets the first's dirty pages.
		for k := range 2 {
			start := time.Now()
			if (i+k)%2 == 0 {
				writeRaw(dir)
				raw += time.Since(start)
			} else {
				writeSave(dir, int64(i))
				save += time.Since(start)
			}
		}
	}
	b.ReportMetric(float64(raw)/float64(save), "save/raw")
	b.ReportMetric(4*float64(elements)*float64(b.N)/save.Seconds()/1e6, "save-MB/s")
	b.ReportMetric(4*float64(elements)*float64(b.N)/raw.Seconds()/1e6, "raw-MB/s")
}
