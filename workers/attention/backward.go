package attention

import (
	"fmt"
	"math"
)

// Grad is a row-major rows×cols gradient, accumulated in float64: ring attention adds many
// partial gradients, and float32 sums would drift.
type Grad struct {
	Rows, Cols int
	Data       []float64
}

// NewGrad is a zeroed rows×cols gradient.
func NewGrad(rows, cols int) Grad {
	return Grad{Rows: rows, Cols: cols, Data: make([]float64, rows*cols)}
}

// Row is row i, sharing storage.
func (g Grad) Row(i int) []float64 { return g.Data[i*g.Cols : (i+1)*g.Cols] }

// Backward adds to dq (rows qRows), dk and dv (rows kRows) the gradients of one block: queries
// q against keys k and values v, given the *global* output out and LSE of those queries and
// the gradient dout of the output. With the global LSE, P_ij = exp(s_ij - lse_i) is the final
// attention weight, so blocks can be done in any order and simply summed:
//
//	dV_j += Σ_i P_ij dO_i          dS_ij = P_ij (dO_i·V_j − dO_i·O_i)
//	dQ_i += scale Σ_j dS_ij K_j    dK_j += scale Σ_i dS_ij Q_i
func Backward(q, k, v, out, dout Matrix, lse []float64, qPos, kPos []int, causal bool, scale float64,
	dq Grad, qRows []int, dk, dv Grad, kRows []int) error {
	if q.Cols != k.Cols || k.Rows != v.Rows || out.Rows != q.Rows || dout.Rows != q.Rows || len(lse) != q.Rows ||
		len(qPos) != q.Rows || len(kPos) != k.Rows || len(qRows) != q.Rows || len(kRows) != k.Rows {
		return fmt.Errorf("attention: backward shapes do not fit (q %dx%d, k %dx%d, v %dx%d)", q.Rows, q.Cols, k.Rows, k.Cols, v.Rows, v.Cols)
	}
	for i := range q.Rows {
		if math.IsInf(lse[i], -1) {
			continue // this query saw no key anywhere: no gradient
		}
		qi, oi, doi := q.Row(i), out.Row(i), dout.Row(i)
		var di float64 // dO_i · O_i
		for c := range doi {
			di += float64(doi[c]) * float64(oi[c])
		}
		dqi := dq.Row(qRows[i])
		for j := range k.Rows {
			if causal && kPos[j] > qPos[i] {
				continue
			}
			kj, vj := k.Row(j), v.Row(j)
			var s, dp float64
			for c := range qi {
				s += float64(qi[c]) * float64(kj[c])
			}
			for c := range doi {
				dp += float64(doi[c]) * float64(vj[c])
			}
			p := math.Exp(s*scale - lse[i])
			ds := p * (dp - di)
			dvj, dkj := dv.Row(kRows[j]), dk.Row(kRows[j])
			for c := range doi {
				dvj[c] += p * float64(doi[c])
			}
			for c := range qi {
				dqi[c] += scale * ds * float64(kj[c])
				dkj[c] += scale * ds * float64(qi[c])
			}
		}
	}
	return nil
}

// FullBackward is the gradient of attention over the whole sequence in one block: the
// baseline ring attention's backward must reproduce. (Backward's formula itself is checked
// against finite differences of Reference.)
func FullBackward(q, k, v, dout Matrix, causal bool, scale float64) (dq, dk, dv Grad) {
	out, lse := Reference(q, k, v, causal, scale)
	o := NewMatrix(q.Rows, v.Cols)
	for i := range out {
		for c := range out[i] {
			o.Row(i)[c] = float32(out[i][c])
		}
	}
	qr, kr := seq(q.Rows), seq(k.Rows)
	dq, dk, dv = NewGrad(q.Rows, q.Cols), NewGrad(k.Rows, k.Cols), NewGrad(v.Rows, v.Cols)
	if err := Backward(q, k, v, o, dout, lse, qr, kr, causal, scale, dq, qr, dk, dv, kr); err != nil {
		panic(err) // shapes come from the same matrices
	}
	return dq, dk, dv
}

func seq(n int) []int {
	s := make([]int, n)
	for i := range s {
		s[i] = i
	}
	return s
}
