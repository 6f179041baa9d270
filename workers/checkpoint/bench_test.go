package checkpoint

import (
	"fmt"
	"path/filepath"
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
// ≥ 0.9.
func BenchmarkSaveVsRawDisk(b *testing.B) {
	state := benchState()
	buf := make([]byte, 4*benchElements/benchRanks)
	var raw, save time.Duration
	for i := 0; b.Loop(); i++ {
		dir := b.TempDir()
		start := time.Now()
		var wg sync.WaitGroup
		for r := range benchRanks {
			wg.Go(func() {
				if err := writeFileSync(filepath.Join(dir, fmt.Sprint("raw-", r)), buf); err != nil {
					b.Error(err)
				}
			})
		}
		wg.Wait()
		raw += time.Since(start)

		start = time.Now()
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
		save += time.Since(start)
	}
	b.ReportMetric(float64(raw)/float64(save), "save/raw")
	b.ReportMetric(4*benchElements*float64(b.N)/save.Seconds()/1e6, "save-MB/s")
	b.ReportMetric(4*benchElements*float64(b.N)/raw.Seconds()/1e6, "raw-MB/s")
}
