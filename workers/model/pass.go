package model

import (
	"math"

	"github.com/zaya-operator/zaya-operator/workers/attention"
)

// NormEps is RMSNorm's epsilon, added to the mean square.
const NormEps = 1e-6

// forward holds one step's activations, kept for the backward pass.
type forward struct {
	s      Shape
	params []float32
	att    Attention
	mm     mul

	layers  []acts
	xf      attention.Matrix // the residual stream after the last block
	final   norm
	dlogits attention.Matrix
}

// acts are one block's activations.
type acts struct {
	xin, xmid attention.Matrix
	n1, n2    norm
	q, k, v   attention.Matrix
	heads     []attention.Partial
	a         attention.Matrix // the heads' outputs side by side
	u, g      attention.Matrix // the MLP's pre-activation and its GELU
}

// norm is an RMSNorm's output and each row's 1/rms.
type norm struct {
	out attention.Matrix
	inv []float64
}

func (f *forward) run(b Batch) (float64, error) {
	s, n := f.s, len(b.Inputs)
	emb := s.embedding().of(f.params)
	x := attention.NewMatrix(n, s.Dim)
	for i, t := range b.Inputs {
		copy(x.Row(i), emb.Row(int(t)))
	}
	scale := 1 / math.Sqrt(float64(s.HeadDim()))
	f.layers = make([]acts, s.Layers)
	for l := range s.Layers {
		ly, a := s.layer(l), &f.layers[l]
		a.xin = x
		a.n1 = rmsNorm(x, ly.norm1.of(f.params))
		a.q, a.k, a.v = f.mm.prod(a.n1.out, ly.wq.of(f.params)), f.mm.prod(a.n1.out, ly.wk.of(f.params)), f.mm.prod(a.n1.out, ly.wv.of(f.params))
		a.a = attention.NewMatrix(n, s.Dim)
		a.heads = make([]attention.Partial, s.Heads)
		for h := range s.Heads {
			lo, hi := h*s.HeadDim(), (h+1)*s.HeadDim()
			p, err := f.att.Forward(cols(a.q, lo, hi), cols(a.k, lo, hi), cols(a.v, lo, hi), scale)
			if err != nil {
				return 0, err
			}
			a.heads[h] = p
			setCols(a.a, lo, p.Out)
		}
		a.xmid = add(x, f.mm.prod(a.a, ly.wo.of(f.params)))
		a.n2 = rmsNorm(a.xmid, ly.norm2.of(f.params))
		a.u = f.mm.prod(a.n2.out, ly.w1.of(f.params))
		a.g = attention.NewMatrix(n, s.FFN)
		for i, u := range a.u.Data {
			a.g.Data[i] = float32(gelu(float64(u)))
		}
		x = add(a.xmid, f.mm.prod(a.g, ly.w2.of(f.params)))
	}
	f.xf = x
	f.final = rmsNorm(x, s.finalNorm().of(f.params))
	logits := f.mm.prodT(f.final.out, emb)
	// Cross-entropy, and its gradient while the softmax is at hand.
	var loss float64
	f.dlogits = attention.NewMatrix(n, s.Vocab)
	for i := range n {
		row := logits.Row(i)
		top := math.Inf(-1)
		for _, z := range row {
			top = math.Max(top, float64(z))
		}
		var sum float64
		for _, z := range row {
			sum += math.Exp(float64(z) - top)
		}
		lse := top + math.Log(sum)
		t := int(b.Targets[i])
		loss += lse - float64(row[t])
		d := f.dlogits.Row(i)
		for j, z := range row {
			p := math.Exp(float64(z) - lse)
			if j == t {
				p--
			}
			d[j] = float32(p / b.Norm)
		}
	}
	return loss, nil
}

func (f *forward) backward(b Batch, grad []float64) error {
	s := f.s
	at := func(sp span) []float64 { return grad[sp.off : sp.off+sp.rows*sp.cols] }
	emb := s.embedding().of(f.params)
	// logits = hf · embᵀ
	f.mm.gradW(f.dlogits, f.final.out, at(s.embedding()))
	dx := rmsNormBack(f.xf, s.finalNorm().of(f.params), f.final, f.mm.prod(f.dlogits, emb), at(s.finalNorm()))
	scale := 1 / math.Sqrt(float64(s.HeadDim()))
	for l := s.Layers - 1; l >= 0; l-- {
		ly, a := s.layer(l), &f.layers[l]
		// x = xmid + gelu(n2·W1)·W2
		f.mm.gradW(a.g, dx, at(ly.w2))
		du := f.mm.prodT(dx, ly.w2.of(f.params))
		for i, u := range a.u.Data {
			du.Data[i] = float32(float64(du.Data[i]) * geluGrad(float64(u)))
		}
		f.mm.gradW(a.n2.out, du, at(ly.w1))
		dxmid := add(dx, rmsNormBack(a.xmid, ly.norm2.of(f.params), a.n2, f.mm.prodT(du, ly.w1.of(f.params)), at(ly.norm2)))
		// xmid = xin + attention(n1·Wq, n1·Wk, n1·Wv)·Wo
		f.mm.gradW(a.a, dxmid, at(ly.wo))
		da := f.mm.prodT(dxmid, ly.wo.of(f.params))
		n := dx.Rows
		dq, dk, dv := attention.NewMatrix(n, s.Dim), attention.NewMatrix(n, s.Dim), attention.NewMatrix(n, s.Dim)
		for h := range s.Heads {
			lo, hi := h*s.HeadDim(), (h+1)*s.HeadDim()
			p := a.heads[h]
			gq, gk, gv, err := f.att.Backward(cols(a.q, lo, hi), cols(a.k, lo, hi), cols(a.v, lo, hi), p.Out, cols(da, lo, hi), p.LSE, scale)
			if err != nil {
				return err
			}
			setGradCols(dq, lo, gq)
			setGradCols(dk, lo, gk)
			setGradCols(dv, lo, gv)
		}
		f.mm.gradW(a.n1.out, dq, at(ly.wq))
		f.mm.gradW(a.n1.out, dk, at(ly.wk))
		f.mm.gradW(a.n1.out, dv, at(ly.wv))
		dn1 := add(add(f.mm.prodT(dq, ly.wq.of(f.params)), f.mm.prodT(dk, ly.wk.of(f.params))), f.mm.prodT(dv, ly.wv.of(f.params)))
		dx = add(dxmid, rmsNormBack(a.xin, ly.norm1.of(f.params), a.n1, dn1, at(ly.norm1)))
	}
	demb := at(s.embedding())
	for i, t := range b.Inputs {
		row := demb[int(t)*s.Dim : (int(t)+1)*s.Dim]
		for c, v := range dx.Row(i) {
			row[c] += float64(v)
		}
	}
	return nil
}

// rmsNorm is x / rms(x) · gain, row by row.
func rmsNorm(x, gain attention.Matrix) norm {
	out := norm{out: attention.NewMatrix(x.Rows, x.Cols), inv: make([]float64, x.Rows)}
	for i := range x.Rows {
		row := x.Row(i)
		var ss float64
		for _, v := range row {
			ss += float64(v) * float64(v)
		}
		inv := 1 / math.Sqrt(ss/float64(len(row))+NormEps)
		out.inv[i] = inv
		o := out.out.Row(i)
		for c, v := range row {
			o[c] = float32(float64(v) * inv * float64(gain.Data[c]))
		}
	}
	return out
}

// rmsNormBack is the gradient of x given the output's dy; it adds the gain's into dgain.
func rmsNormBack(x, gain attention.Matrix, nm norm, dy attention.Matrix, dgain []float64) attention.Matrix {
	dx := attention.NewMatrix(x.Rows, x.Cols)
	d := float64(x.Cols)
	for i := range x.Rows {
		row, dyr, inv := x.Row(i), dy.Row(i), nm.inv[i]
		var dot float64 // Σ dxhat·xhat
		for c, v := range row {
			xhat := float64(v) * inv
			dgain[c] += float64(dyr[c]) * xhat
			dot += float64(dyr[c]) * float64(gain.Data[c]) * xhat
		}
		o := dx.Row(i)
		for c, v := range row {
			xhat := float64(v) * inv
			o[c] = float32(inv * (float64(dyr[c])*float64(gain.Data[c]) - xhat*dot/d))
		}
	}
	return dx
}

const geluC = 0.7978845608028654 // √(2/π)

// gelu is the tanh approximation.
func gelu(u float64) float64 {
	return 0.5 * u * (1 + math.Tanh(geluC*(u+0.044715*u*u*u)))
}

func geluGrad(u float64) float64 {
	t := math.Tanh(geluC * (u + 0.044715*u*u*u))
	return 0.5*(1+t) + 0.5*u*(1-t*t)*geluC*(1+3*0.044715*u*u)
}

func add(a, b attention.Matrix) attention.Matrix {
	out := attention.NewMatrix(a.Rows, a.Cols)
	for i := range out.Data {
		out.Data[i] = a.Data[i] + b.Data[i]
	}
	return out
}

// cols is columns [lo, hi) of m, copied.
func cols(m attention.Matrix, lo, hi int) attention.Matrix {
	out := attention.NewMatrix(m.Rows, hi-lo)
	for i := range m.Rows {
		copy(out.Row(i), m.Row(i)[lo:hi])
	}
	return out
}

func setCols(m attention.Matrix, lo int, part attention.Matrix) {
	for i := range m.Rows {
		copy(m.Row(i)[lo:lo+part.Cols], part.Row(i))
	}
}

func setGradCols(m attention.Matrix, lo int, g attention.Grad) {
	for i := range m.Rows {
		dst := m.Row(i)[lo : lo+g.Cols]
		for c, v := range g.Row(i) {
			dst[c] = float32(v)
		}
	}
}
