package ring

import (
	"fmt"
	"math"
	"math/rand/v2"
	"sync"
	"testing"

	"github.com/zaya-operator/zaya-operator/workers/attention"
)

const tol = 1e-5

func randomMatrix(r *rand.Rand, rows, cols int) attention.Matrix {
	m := attention.NewMatrix(rows, cols)
	for i := range m.Data {
		m.Data[i] = r.Float32()*2 - 1
	}
	return m
}

// channelRing runs Forward on every rank of a layout as goroutines, passing blocks over
// channels, and returns each rank's result.
func channelRing(t testing.TB, l Layout, q, k, v attention.Matrix, causal bool, scale float64) []attention.Partial {
	t.Helper()
	type kv struct{ k, v attention.Matrix }
	inbox := make([]chan kv, l.Ranks)
	for i := range inbox {
		inbox[i] = make(chan kv, 1)
	}
	out := make([]attention.Partial, l.Ranks)
	errs := make([]error, l.Ranks)
	var wg sync.WaitGroup
	for rank := range l.Ranks {
		wg.Go(func() {
			pos := l.Positions(rank)
			exchange := func(k, v attention.Matrix) (attention.Matrix, attention.Matrix, error) {
				inbox[(rank+1)%l.Ranks] <- kv{k, v}
				got := <-inbox[rank]
				return got.k, got.v, nil
			}
			out[rank], errs[rank] = Forward(attention.CPU, l, rank, q.SelectRows(pos), k.SelectRows(pos), v.SelectRows(pos), causal, scale, exchange)
		})
	}
	wg.Wait()
	for rank, err := range errs {
		if err != nil {
			t.Fatalf("rank %d: %v", rank, err)
		}
	}
	return out
}

func TestRingForwardMatchesFullAttention(t *testing.T) {
	r := rand.New(rand.NewPCG(7, 8))
	for _, ranks := range []int{1, 2, 3, 4} {
		for _, c := range []struct{ seq, d int }{{2 * ranks, 3}, {6 * ranks, 5}, {10 * ranks, 16}} {
			for _, causal := range []bool{false, true} {
				t.Run(fmt.Sprintf("P=%d/S=%d/d=%d/causal=%v", ranks, c.seq, c.d, causal), func(t *testing.T) {
					l := Layout{Seq: c.seq, Ranks: ranks}
					q, k, v := randomMatrix(r, c.seq, c.d), randomMatrix(r, c.seq, c.d), randomMatrix(r, c.seq, c.d)
					scale := 1 / math.Sqrt(float64(c.d))
					want, wantLSE := attention.Reference(q, k, v, causal, scale)
					for rank, got := range channelRing(t, l, q, k, v, causal, scale) {
						for i, p := range l.Positions(rank) {
							if d := math.Abs(got.LSE[i] - wantLSE[p]); d > tol*(1+math.Abs(wantLSE[p])) {
								t.Fatalf("rank %d token %d: lse %v, want %v", rank, p, got.LSE[i], wantLSE[p])
							}
							for j := range c.d {
								g := float64(got.Out.Row(i)[j])
								if d := math.Abs(g - want[p][j]); d > tol*(1+math.Abs(want[p][j])) {
									t.Fatalf("rank %d token %d dim %d: %v, want %v", rank, p, j, g, want[p][j])
								}
							}
						}
					}
				})
			}
		}
	}
}

// With a causal mask, zigzag gives every rank the same number of query-key pairs at every
// step after the first: the load balance it exists for.
func TestZigzagBalancesCausalWork(t *testing.T) {
	for _, ranks := range []int{2, 4, 8} {
		l := Layout{Seq: 16 * ranks, Ranks: ranks}
		for step := 1; step < ranks; step++ {
			want := -1
			for rank := range ranks {
				w := l.Step(rank, step, true)
				pairs := len(w.QRows) * len(w.KRows)
				if want == -1 {
					want = pairs
				}
				if pairs != want || w.Causal {
					t.Errorf("P=%d step %d rank %d: %d pairs (masked %v), rank 0 has %d", ranks, step, rank, pairs, w.Causal, want)
				}
			}
		}
	}
}

func TestLayout(t *testing.T) {
	l := Layout{Seq: 8, Ranks: 2}
	if got := fmt.Sprint(l.Positions(0), l.Positions(1)); got != "[0 1 6 7] [2 3 4 5]" {
		t.Errorf("positions = %s, want zigzag chunks 0+3 and 1+2", got)
	}
	if l.Source(0, 1) != 1 || l.Source(1, 1) != 0 {
		t.Errorf("sources at step 1: %d %d", l.Source(0, 1), l.Source(1, 1))
	}
	for _, bad := range []Layout{{Seq: 6, Ranks: 2}, {Seq: 2, Ranks: 2}, {Seq: 8, Ranks: 0}} {
		if bad.Validate() == nil {
			t.Errorf("%+v accepted", bad)
		}
	}
}
