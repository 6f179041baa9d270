package ring

import (
	"fmt"
	"math"
	"math/rand/v2"
	"sync"
	"testing"

	"github.com/zaya-operator/zaya-operator/workers/attention"
)

func TestRingBackwardMatchesFullBackward(t *testing.T) {
	r := rand.New(rand.NewPCG(13, 14))
	for _, ranks := range []int{1, 2, 3, 4} {
		for _, causal := range []bool{false, true} {
			t.Run(fmt.Sprintf("P=%d/causal=%v", ranks, causal), func(t *testing.T) {
				const d = 5
				l := Layout{Seq: 6 * ranks, Ranks: ranks}
				q, k, v, dout := randomMatrix(r, l.Seq, d), randomMatrix(r, l.Seq, d), randomMatrix(r, l.Seq, d), randomMatrix(r, l.Seq, d)
				scale := 1 / math.Sqrt(d)
				wantDQ, wantDK, wantDV := attention.FullBackward(q, k, v, dout, causal, scale)

				// The forward pass, then the backward pass, each over a channel ring.
				fwd := channelRing(t, l, q, k, v, causal, scale)
				inbox := make([]chan Block, ranks)
				for i := range inbox {
					inbox[i] = make(chan Block, 1)
				}
				type grads struct{ dq, dk, dv attention.Grad }
				got := make([]grads, ranks)
				errs := make([]error, ranks)
				var wg sync.WaitGroup
				for rank := range ranks {
					wg.Go(func() {
						pos := l.Positions(rank)
						exchange := func(b Block) (Block, error) {
							inbox[(rank+1)%ranks] <- b
							return <-inbox[rank], nil
						}
						dq, dk, dv, err := Backward(attention.CPU, l, rank, q.SelectRows(pos), k.SelectRows(pos), v.SelectRows(pos),
							fwd[rank].Out, dout.SelectRows(pos), fwd[rank].LSE, causal, scale, exchange)
						got[rank], errs[rank] = grads{dq, dk, dv}, err
					})
				}
				wg.Wait()
				for rank := range ranks {
					if errs[rank] != nil {
						t.Fatalf("rank %d: %v", rank, errs[rank])
					}
					for i, p := range l.Positions(rank) {
						for c := range d {
							for _, g := range []struct {
								name      string
								got, want attention.Grad
							}{{"dq", got[rank].dq, wantDQ}, {"dk", got[rank].dk, wantDK}, {"dv", got[rank].dv, wantDV}} {
								a, b := g.got.Row(i)[c], g.want.Row(p)[c]
								if math.Abs(a-b) > tol*(1+math.Abs(b)) {
									t.Fatalf("rank %d token %d: %s[%d] = %v, want %v", rank, p, g.name, c, a, b)
								}
							}
						}
					}
				}
			})
		}
	}
}
