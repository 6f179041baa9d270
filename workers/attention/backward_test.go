package attention

import (
	"math"
	"math/rand/v2"
	"testing"
)

// loss is Σ dout ⊙ out for the reference forward: its gradient is what Backward computes.
func loss(q, k, v, dout Matrix, causal bool, scale float64) float64 {
	out, _ := Reference(q, k, v, causal, scale)
	var l float64
	for i := range out {
		for c := range out[i] {
			l += out[i][c] * float64(dout.Row(i)[c])
		}
	}
	return l
}

// TestBackwardMatchesFiniteDifferences checks the gradient formula itself, independently of
// how ring attention splits it.
func TestBackwardMatchesFiniteDifferences(t *testing.T) {
	r := rand.New(rand.NewPCG(11, 12))
	for _, causal := range []bool{false, true} {
		const n, d = 5, 3
		q, k, v, dout := randomMatrix(r, n, d, 1), randomMatrix(r, n, d, 1), randomMatrix(r, n, d, 1), randomMatrix(r, n, d, 1)
		scale := 1 / math.Sqrt(d)
		dq, dk, dv := FullBackward(q, k, v, dout, causal, scale)
		const h = 1e-2
		for _, c := range []struct {
			name string
			m    Matrix
			g    Grad
		}{{"dq", q, dq}, {"dk", k, dk}, {"dv", v, dv}} {
			for idx := range c.m.Data {
				orig := c.m.Data[idx]
				c.m.Data[idx] = orig + h
				up := loss(q, k, v, dout, causal, scale)
				c.m.Data[idx] = orig - h
				down := loss(q, k, v, dout, causal, scale)
				c.m.Data[idx] = orig
				numeric := (up - down) / (2 * h)
				if math.Abs(numeric-c.g.Data[idx]) > 1e-4*(1+math.Abs(numeric)) {
					t.Errorf("causal=%v %s[%d] = %v, finite difference %v", causal, c.name, idx, c.g.Data[idx], numeric)
				}
			}
		}
	}
}

func TestBackwardSkipsQueriesThatSawNothing(t *testing.T) {
	q, k, v := NewMatrix(1, 2), NewMatrix(1, 2), NewMatrix(1, 2)
	out, dout := NewMatrix(1, 2), Matrix{Rows: 1, Cols: 2, Data: []float32{1, 1}}
	dq, dk, dv := NewGrad(1, 2), NewGrad(1, 2), NewGrad(1, 2)
	err := Backward(q, k, v, out, dout, []float64{math.Inf(-1)}, []int{0}, []int{5}, true, 1, dq, []int{0}, dk, dv, []int{0})
	if err != nil {
		t.Fatal(err)
	}
	for _, g := range [][]float64{dq.Data, dk.Data, dv.Data} {
		for _, x := range g {
			if x != 0 || math.IsNaN(x) {
				t.Fatalf("gradient %v for a fully masked query", g)
			}
		}
	}
}
