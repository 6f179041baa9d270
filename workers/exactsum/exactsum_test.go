package exactsum_test

import (
	"context"
	"math"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/zaya-operator/zaya-operator/internal/testnet"
	"github.com/zaya-operator/zaya-operator/workers/exactsum"
	"github.com/zaya-operator/zaya-operator/workers/transport"
)

// terms are count random vectors whose elements span many magnitudes and both signs, as
// gradients do.
func terms(r *rand.Rand, count, n int) [][]float64 {
	out := make([][]float64, count)
	for k := range out {
		out[k] = make([]float64, n)
		for i := range out[k] {
			out[k][i] = (2*r.Float64() - 1) * math.Ldexp(1, -r.IntN(40))
		}
	}
	return out
}

// sumAtWidth sums ts as width ranks would: rank w adds terms k ≡ w (mod width) in the
// order order gives, then the ranks' sums are added in the order ranks gives.
func sumAtWidth(ts [][]float64, width int, e int, order func([]int), ranks []int) []float64 {
	n := len(ts[0])
	partial := make([][]float64, width)
	for w := range width {
		partial[w] = make([]float64, n)
		var mine []int
		for k := w; k < len(ts); k += width {
			mine = append(mine, k)
		}
		order(mine)
		for _, k := range mine {
			exactsum.Add(partial[w], ts[k], e)
		}
	}
	sum := make([]float64, n)
	for _, w := range ranks {
		for i := range sum {
			sum[i] += partial[w][i]
		}
	}
	exactsum.Unscale(sum, e)
	return sum
}

func TestTheSumIsTheSameAtEveryWidthAndInEveryOrder(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	const count, n = 24, 257
	ts := terms(r, count, n)
	largest := 0.0
	for _, v := range ts {
		largest = max(largest, exactsum.MaxAbs(v))
	}
	e, err := exactsum.Exponent(largest, count)
	if err != nil {
		t.Fatal(err)
	}
	want := sumAtWidth(ts, 1, e, func([]int) {}, []int{0})
	for _, width := range []int{2, 3, 4, 5, 8, 24} {
		for trial := range 3 {
			ranks := r.Perm(width)
			shuffle := func(k []int) { r.Shuffle(len(k), func(i, j int) { k[i], k[j] = k[j], k[i] }) }
			got := sumAtWidth(ts, width, e, shuffle, ranks)
			for i := range want {
				if math.Float64bits(got[i]) != math.Float64bits(want[i]) {
					t.Fatalf("width %d, trial %d: element %d is %x, want %x", width, trial, i, math.Float64bits(got[i]), math.Float64bits(want[i]))
				}
			}
		}
	}
	// Each term moved by at most half a step of the grid.
	for i := range want {
		exact := 0.0
		for _, v := range ts {
			exact += v[i]
		}
		if d := math.Abs(want[i] - exact); d > float64(count)*math.Ldexp(1, -e) {
			t.Fatalf("element %d: %g, the float sum %g: off by %g, more than %d grid steps", i, want[i], exact, d, count)
		}
	}
	// The test can fail: plain float sums of these terms do change with the grouping.
	plain := func(width int) []float64 {
		sum := make([]float64, n)
		for w := range width {
			part := make([]float64, n)
			for k := w; k < count; k += width {
				for i := range part {
					part[i] += ts[k][i]
				}
			}
			for i := range sum {
				sum[i] += part[i]
			}
		}
		return sum
	}
	if slices.Equal(plain(3), plain(4)) {
		t.Fatal("plain float sums at widths 3 and 4 agree: the terms do not exercise rounding")
	}
}

func TestExponentKeepsEverySumBelow2To53(t *testing.T) {
	for _, c := range []struct {
		maxAbs float64
		terms  int
	}{{1, 1}, {1, 3}, {0.75, 4}, {1e-300, 17}, {5e-324, 2}, {1e300, 1000}, {math.MaxFloat64, exactsum.MaxTerms}} {
		e, err := exactsum.Exponent(c.maxAbs, c.terms)
		if err != nil {
			t.Fatalf("%v: %v", c, err)
		}
		q := math.Round(math.Ldexp(c.maxAbs, e))
		if total := q * float64(c.terms); total > 1<<52 {
			t.Errorf("%v: e=%d, %d terms of %g sum to %g > 2^52", c, e, c.terms, q, total)
		}
		if q2 := math.Round(math.Ldexp(c.maxAbs, e+1)); q2*float64(c.terms) <= 1<<51 {
			t.Errorf("%v: e=%d is not the finest grid: e+1 still sums to %g", c, e, q2*float64(c.terms))
		}
	}
	if e, err := exactsum.Exponent(0, 5); err != nil || e != 0 {
		t.Errorf("all zero: e=%d, %v", e, err)
	}
	for _, bad := range []struct {
		maxAbs float64
		terms  int
	}{{math.NaN(), 1}, {math.Inf(1), 1}, {-1, 1}, {1, 0}, {1, exactsum.MaxTerms + 1}} {
		if _, err := exactsum.Exponent(bad.maxAbs, bad.terms); err == nil {
			t.Errorf("%v: want an error", bad)
		}
	}
}

func TestAllMaxOverTCP(t *testing.T) {
	const world = 3
	cfg := transport.Config{World: world, Master: testnet.FreeAddr(t), Listen: "127.0.0.1:0", Timeout: 20 * time.Second}
	got := make([][]float64, world)
	errs := make([]error, world)
	var wg sync.WaitGroup
	for rank := range world {
		wg.Go(func() {
			c := cfg
			c.Rank = rank
			tr, err := transport.Dial(context.Background(), c)
			if err != nil {
				errs[rank] = err
				return
			}
			defer func() { _ = tr.Close() }()
			// Rank 1 holds the largest first value, rank 2 the largest second, rank 0 a NaN third.
			local := []float64{float64(rank%2) + 0.5, float64(rank) * 1e-300, 1}
			if rank == 0 {
				local[2] = math.NaN()
			}
			errs[rank] = exactsum.AllMax(tr, local)
			got[rank] = local
		})
	}
	wg.Wait()
	for rank := range world {
		if errs[rank] != nil {
			t.Fatalf("rank %d: %v", rank, errs[rank])
		}
		if got[rank][0] != 1.5 || got[rank][1] != 2e-300 || !math.IsNaN(got[rank][2]) {
			t.Errorf("rank %d: %v, want [1.5 2e-300 NaN]", rank, got[rank])
		}
	}
}
