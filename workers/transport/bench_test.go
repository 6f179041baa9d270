package transport

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/zaya-operator/zaya-operator/internal/testnet"
)

// BenchmarkAllReduceVsRawTCP measures, in one run on one set of connections, an all-reduce of
// a 16 MiB vector over P ranks (the ring, and the star through rank 0) against raw TCP: every
// rank streaming 16 MiB to its ring neighbour at once. Bus bandwidth is NCCL's: the vector's
// bytes × 2(P-1)/P over the time, what each rank's link carries. Reported per iteration:
// raw-MB/s, ring-busMB/s, star-busMB/s and their ratios to raw.
//
//	go test ./workers/transport -run '^$' -bench AllReduceVsRawTCP -benchtime 5x
func BenchmarkAllReduceVsRawTCP(b *testing.B) {
	const bytes = 16 << 20
	for _, world := range []int{2, 4, 8} {
		b.Run(fmt.Sprintf("ranks=%d", world), func(b *testing.B) {
			trs := dialWorld(b, world)
			var raw, ring, star time.Duration
			for range b.N {
				raw += timeRanks(b, trs, func(tr *TCP) error { _, err := tr.Exchange(make([]byte, bytes)); return err })
				ring += timeRanks(b, trs, func(tr *TCP) error { return tr.ringAllReduce(make([]float64, bytes/8)) })
				star += timeRanks(b, trs, func(tr *TCP) error { return tr.allReduce("bench", make([]float64, bytes/8)) })
			}
			mbps := func(d time.Duration, factor float64) float64 {
				return factor * float64(b.N) * bytes / d.Seconds() / 1e6
			}
			bus := 2 * float64(world-1) / float64(world)
			b.ReportMetric(mbps(raw, 1), "raw-MB/s")
			b.ReportMetric(mbps(ring, bus), "ring-busMB/s")
			b.ReportMetric(mbps(star, bus), "star-busMB/s")
			b.ReportMetric(mbps(ring, bus)/mbps(raw, 1), "ring/raw")
			b.ReportMetric(mbps(star, bus)/mbps(raw, 1), "star/raw")
		})
	}
}

// dialWorld connects world ranks on loopback as one ring, for the length of the benchmark.
func dialWorld(b *testing.B, world int) []*TCP {
	b.Helper()
	cfg := Config{World: world, Master: testnet.FreeAddr(b), Listen: "127.0.0.1:0", Timeout: 20 * time.Second}
	trs := make([]*TCP, world)
	errs := make([]error, world)
	var wg sync.WaitGroup
	for r := range world {
		wg.Go(func() {
			c := cfg
			c.Rank = r
			trs[r], errs[r] = Dial(context.Background(), c)
		})
	}
	wg.Wait()
	for r, err := range errs {
		if err != nil {
			b.Fatalf("rank %d: %v", r, err)
		}
	}
	b.Cleanup(func() {
		for _, tr := range trs {
			_ = tr.Close()
		}
	})
	return trs
}

// timeRanks runs f on every rank at once and returns how long the slowest took.
func timeRanks(b *testing.B, trs []*TCP, f func(*TCP) error) time.Duration {
	b.Helper()
	errs := make([]error, len(trs))
	began := time.Now()
	var wg sync.WaitGroup
	for r, tr := range trs {
		wg.Go(func() { errs[r] = f(tr) })
	}
	wg.Wait()
	took := time.Since(began)
	for r, err := range errs {
		if err != nil {
			b.Fatalf("rank %d: %v", r, err)
		}
	}
	return took
}
