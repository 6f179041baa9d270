package ring

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
)

// BenchmarkRingForward is causal ring attention over P in-process ranks for a 1024-token
// sequence, d=64. P=1 is one rank doing all the work; compare P ranks against it as a ratio
// (the machine's cores bound the speedup: 2 here).
func BenchmarkRingForward(b *testing.B) {
	r := rand.New(rand.NewPCG(1, 1))
	const seq, d = 1024, 64
	q, k, v := randomMatrix(r, seq, d), randomMatrix(r, seq, d), randomMatrix(r, seq, d)
	for _, ranks := range []int{1, 2, 4} {
		b.Run(fmt.Sprintf("P=%d", ranks), func(b *testing.B) {
			l := Layout{Seq: seq, Ranks: ranks}
			for b.Loop() {
				channelRing(b, l, q, k, v, true, 1/math.Sqrt(d))
			}
		})
	}
}
