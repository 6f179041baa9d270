package model

import (
	"github.com/zaya-operator/zaya-operator/workers/attention"
	"github.com/zaya-operator/zaya-operator/workers/mfma"
)

// mul does the model's matrix products at its precision: inputs rounded as the matrix cores
// take them, sums in fp32 in a fixed order.
type mul struct{ prec Precision }

func (m mul) in(x attention.Matrix) []float32 {
	if m.prec == FP32 {
		return x.Data
	}
	out := make([]float32, len(x.Data))
	for i, v := range x.Data {
		out[i] = mfma.FromBF16(mfma.BF16(v)) // as the kernels round
	}
	return out
}

// prod is a·w (a n×k, w k×m).
func (m mul) prod(a, w attention.Matrix) attention.Matrix {
	ad, wd := m.in(a), m.in(w)
	out := attention.NewMatrix(a.Rows, w.Cols)
	for i := range a.Rows {
		o := out.Row(i)
		for k, x := range ad[i*a.Cols : (i+1)*a.Cols] {
			for j, y := range wd[k*w.Cols : (k+1)*w.Cols] {
				o[j] += x * y
			}
		}
	}
	return out
}

// prodT is a·wᵀ (a n×k, w m×k).
func (m mul) prodT(a, w attention.Matrix) attention.Matrix {
	ad, wd := m.in(a), m.in(w)
	out := attention.NewMatrix(a.Rows, w.Rows)
	for i := range a.Rows {
		ar := ad[i*a.Cols : (i+1)*a.Cols]
		o := out.Row(i)
		for j := range w.Rows {
			var sum float32
			for k, y := range wd[j*w.Cols : (j+1)*w.Cols] {
				sum += ar[k] * y
			}
			o[j] = sum
		}
	}
	return out
}

// gradW adds aᵀ·dy (a n×k, dy n×m) into g (k×m): a weight's gradient from its input and
// its output's gradient, summed over this rank's rows in fp32 before joining the float64
// gradient vector.
func (m mul) gradW(a, dy attention.Matrix, g []float64) {
	ad, dd := m.in(a), m.in(dy)
	acc := make([]float32, a.Cols*dy.Cols)
	for i := range a.Rows {
		dr := dd[i*dy.Cols : (i+1)*dy.Cols]
		for k, x := range ad[i*a.Cols : (i+1)*a.Cols] {
			row := acc[k*dy.Cols : (k+1)*dy.Cols]
			for j, y := range dr {
				row[j] += x * y
			}
		}
	}
	for i, v := range acc {
		g[i] += float64(v)
	}
}
