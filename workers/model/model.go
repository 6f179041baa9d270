// Package model is the reference worker's language model: a decoder of token embedding,
// Layers pre-norm blocks (RMSNorm, multi-head causal attention, RMSNorm, GELU MLP), a final
// RMSNorm and an output head tied to the embedding, trained on next-token cross-entropy.
// Matrix products take bf16 inputs and accumulate in fp32, as the matrix cores do; the
// parameters (fp32 master weights), norms, softmax and the optimizer stay fp32 or wider.
//
// Everything but attention is position-wise, so a rank computes only its own positions of
// the sequence; attention goes through an Attention, which a ring implements for context
// parallelism. The arithmetic order is fixed: the same inputs give the same bits.
package model

import (
	"fmt"
	"math"

	"github.com/zaya-operator/zaya-operator/workers/attention"
)

// Shape is the model's size.
type Shape struct {
	Vocab, Dim, Layers, Heads, FFN int
}

// Validate names the first size that cannot make a model.
func (s Shape) Validate() error {
	switch {
	case s.Vocab < 2:
		return fmt.Errorf("vocabulary %d: want at least 2 tokens", s.Vocab)
	case s.Dim < 1 || s.Layers < 1 || s.Heads < 1 || s.FFN < 1:
		return fmt.Errorf("dim %d, layers %d, heads %d, ffn %d: want each at least 1", s.Dim, s.Layers, s.Heads, s.FFN)
	case s.Dim%s.Heads != 0:
		return fmt.Errorf("dim %d is not a multiple of heads %d", s.Dim, s.Heads)
	}
	// In float64 first: sizes from flags can be large enough that the int product wraps.
	v, d, l, f := float64(s.Vocab), float64(s.Dim), float64(s.Layers), float64(s.FFN)
	// The worker all-reduces a float64 per parameter: 2^27 keeps that vector at 1 GiB.
	if n := v*d + l*(2*d+4*d*d+2*d*f) + d; n > 1<<27 {
		return fmt.Errorf("%.3g parameters: this reference model keeps at most 2^27", n)
	}
	return nil
}

// HeadDim is the width of one attention head.
func (s Shape) HeadDim() int { return s.Dim / s.Heads }

// The parameters lie in one flat vector: the embedding, then each layer's, then the final norm.
func (s Shape) layerSize() int       { return 2*s.Dim + 4*s.Dim*s.Dim + 2*s.Dim*s.FFN }
func (s Shape) layerStart(l int) int { return s.Vocab*s.Dim + l*s.layerSize() }

// NumParams is the length of the parameter vector.
func (s Shape) NumParams() int { return s.Vocab*s.Dim + s.Layers*s.layerSize() + s.Dim }

// span is one tensor's place in the parameter vector.
type span struct{ off, rows, cols int }

func (p span) of(params []float32) attention.Matrix {
	return attention.Matrix{Rows: p.rows, Cols: p.cols, Data: params[p.off : p.off+p.rows*p.cols]}
}

// layer is where one block's tensors lie.
type layer struct {
	norm1, wq, wk, wv, wo, norm2, w1, w2 span
}

func (s Shape) layer(l int) layer {
	d, f := s.Dim, s.FFN
	off := s.layerStart(l)
	next := func(rows, cols int) span {
		sp := span{off, rows, cols}
		off += rows * cols
		return sp
	}
	return layer{norm1: next(1, d), wq: next(d, d), wk: next(d, d), wv: next(d, d), wo: next(d, d),
		norm2: next(1, d), w1: next(d, f), w2: next(f, d)}
}

func (s Shape) embedding() span { return span{0, s.Vocab, s.Dim} }
func (s Shape) finalNorm() span { return span{s.NumParams() - s.Dim, 1, s.Dim} }

// Decays says which parameters weight decay applies to: the matrices, not the norms' gains
// nor the embedding (which is also the output head).
func (s Shape) Decays(i int) bool {
	if i < s.Vocab*s.Dim || i >= s.NumParams()-s.Dim {
		return false
	}
	j := (i - s.Vocab*s.Dim) % s.layerSize()
	d := s.Dim
	norm1, norm2 := j < d, j >= d+4*d*d && j < 2*d+4*d*d
	return !norm1 && !norm2
}

// Init is the parameters for seed: gains 1, the embedding small enough that the first
// logits are near zero (loss ≈ ln vocab), every matrix uniform with variance 1/fan-in, the
// ones that write into the residual stream scaled down by the depth.
func (s Shape) Init(seed uint64) []float32 {
	p := make([]float32, s.NumParams())
	r := newRand(seed, 1)
	fill := func(sp span, bound float64) {
		for i := range sp.rows * sp.cols {
			p[sp.off+i] = float32((2*r.Float64() - 1) * bound)
		}
	}
	ones := func(sp span) {
		for i := range sp.cols {
			p[sp.off+i] = 1
		}
	}
	fill(s.embedding(), 0.2*math.Sqrt(3/float64(s.Dim)))
	residual := 1 / math.Sqrt(2*float64(s.Layers))
	for l := range s.Layers {
		ly := s.layer(l)
		ones(ly.norm1)
		ones(ly.norm2)
		in := math.Sqrt(3 / float64(s.Dim))
		fill(ly.wq, in)
		fill(ly.wk, in)
		fill(ly.wv, in)
		fill(ly.wo, in*residual)
		fill(ly.w1, in)
		fill(ly.w2, math.Sqrt(3/float64(s.FFN))*residual)
	}
	ones(s.finalNorm())
	return p
}

// Attention is causal attention over the whole sequence for this rank's rows: q, k and v are
// the rank's positions of one head. A ring of context-parallel ranks implements it by
// passing key/value blocks around; Local does it for a rank that holds the whole sequence.
type Attention interface {
	Forward(q, k, v attention.Matrix, scale float64) (attention.Partial, error)
	Backward(q, k, v, out, dout attention.Matrix, lse []float64, scale float64) (dq, dk, dv attention.Grad, err error)
}

// Local is causal attention among the given positions, all on this rank.
type Local []int

// Forward implements Attention.
func (pos Local) Forward(q, k, v attention.Matrix, scale float64) (attention.Partial, error) {
	return attention.Forward(q, k, v, pos, pos, true, scale)
}

// Backward implements Attention.
func (pos Local) Backward(q, k, v, out, dout attention.Matrix, lse []float64, scale float64) (dq, dk, dv attention.Grad, err error) {
	rows := make([]int, len(pos))
	for i := range rows {
		rows[i] = i
	}
	dq, dk, dv = attention.NewGrad(q.Rows, q.Cols), attention.NewGrad(k.Rows, k.Cols), attention.NewGrad(v.Rows, v.Cols)
	err = attention.Backward(q, k, v, out, dout, lse, pos, pos, true, scale, dq, rows, dk, dv, rows)
	return dq, dk, dv, err
}

// Precision is how matrix products round their inputs.
type Precision int

// The precisions: BF16 for training, FP32 to check gradients against finite differences.
const (
	BF16 Precision = iota // inputs rounded to bfloat16, fp32 accumulation (the default)
	FP32                  // inputs as they are (gradient checks)
)

// Batch is one rank's tokens of a step: Inputs at its positions, Targets the tokens that
// follow them. Norm is what the summed loss is divided by: every token of the step, all
// ranks together, so the all-reduced gradients are those of the mean loss.
type Batch struct {
	Inputs, Targets []int32
	Norm            float64
}

// Grad runs the model forward and backward on b and adds the gradients of the loss (summed
// over b's tokens, divided by b.Norm) into grad; it returns the summed loss, undivided.
func (s Shape) Grad(params []float32, b Batch, att Attention, prec Precision, grad []float64) (float64, error) {
	if len(params) != s.NumParams() || len(grad) != s.NumParams() {
		return 0, fmt.Errorf("model: %d parameters and %d gradients for a model of %d", len(params), len(grad), s.NumParams())
	}
	if len(b.Inputs) != len(b.Targets) || len(b.Inputs) == 0 {
		return 0, fmt.Errorf("model: %d inputs and %d targets", len(b.Inputs), len(b.Targets))
	}
	for i := range b.Inputs {
		if b.Inputs[i] < 0 || int(b.Inputs[i]) >= s.Vocab || b.Targets[i] < 0 || int(b.Targets[i]) >= s.Vocab {
			return 0, fmt.Errorf("model: token %d or %d outside the vocabulary of %d", b.Inputs[i], b.Targets[i], s.Vocab)
		}
	}
	f := forward{s: s, params: params, att: att, mm: mul{prec}}
	loss, err := f.run(b)
	if err != nil {
		return 0, err
	}
	return loss, f.backward(b, grad)
}

// Place is a tensor's place in the parameter vector: Rows x Cols values from Off, row-major.
type Place struct{ Off, Rows, Cols int }

// BlockPlaces are one block's tensors.
type BlockPlaces struct{ Norm1, Wq, Wk, Wv, Wo, Norm2, W1, W2 Place }

func (sp span) place() Place { return Place{sp.off, sp.rows, sp.cols} }

// EmbeddingPlace is the embedding (vocab x dim), also the output head.
func (s Shape) EmbeddingPlace() Place { return s.embedding().place() }

// FinalNormPlace is the final RMSNorm's gain.
func (s Shape) FinalNormPlace() Place { return s.finalNorm().place() }

// Block is block l's tensors, for backends that run the model elsewhere (the device step).
func (s Shape) Block(l int) BlockPlaces {
	ly := s.layer(l)
	return BlockPlaces{ly.norm1.place(), ly.wq.place(), ly.wk.place(), ly.wv.place(), ly.wo.place(),
		ly.norm2.place(), ly.w1.place(), ly.w2.place()}
}
