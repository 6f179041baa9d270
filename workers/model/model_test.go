package model

import (
	"fmt"
	"math"
	"slices"
	"sync"
	"testing"

	"github.com/zaya-operator/zaya-operator/workers/attention"
	"github.com/zaya-operator/zaya-operator/workers/ring"
)

var small = Shape{Vocab: 7, Dim: 4, Layers: 2, Heads: 2, FFN: 6}

// batchOf is the whole sequence of Tokens on one rank.
func batchOf(s Shape, seed uint64, step int64, seq int) (Batch, Local) {
	toks := Tokens(seed, step, 0, seq, s.Vocab)
	pos := make(Local, seq)
	for i := range pos {
		pos[i] = i
	}
	return Batch{Inputs: toks[:seq], Targets: toks[1:], Norm: float64(seq)}, pos
}

func lossAt(t *testing.T, s Shape, p []float32, b Batch, att Attention) float64 {
	t.Helper()
	loss, err := s.Grad(p, b, att, FP32, make([]float64, s.NumParams()))
	if err != nil {
		t.Fatal(err)
	}
	return loss / b.Norm
}

// Every parameter's gradient against central finite differences of the loss, in fp32.
func TestGradientsMatchFiniteDifferences(t *testing.T) {
	s := small
	p := s.Init(3)
	b, pos := batchOf(s, 3, 0, 6)
	grad := make([]float64, s.NumParams())
	if _, err := s.Grad(p, b, pos, FP32, grad); err != nil {
		t.Fatal(err)
	}
	const h = 1e-2
	var worst float64
	for i := range p {
		orig := p[i]
		p[i] = orig + h
		up := lossAt(t, s, p, b, pos)
		p[i] = orig - h
		down := lossAt(t, s, p, b, pos)
		p[i] = orig
		want := (up - down) / (2 * h)
		err := math.Abs(grad[i]-want) / math.Max(1e-2, math.Abs(want))
		worst = math.Max(worst, err)
		if err > 2e-2 {
			t.Errorf("parameter %d: gradient %.6g, finite difference %.6g", i, grad[i], want)
		}
	}
	t.Logf("%d parameters, worst relative error %.2g", len(p), worst)
}

// Context parallelism changes where attention is computed, not the gradients: P ranks on a
// channel ring, each with its zigzag positions, sum to the one-rank gradients.
func TestRingRanksSumToTheWholeSequence(t *testing.T) {
	s := Shape{Vocab: 11, Dim: 8, Layers: 2, Heads: 2, FFN: 12}
	p := s.Init(5)
	const seq = 16
	whole, pos := batchOf(s, 5, 2, seq)
	want := make([]float64, s.NumParams())
	wantLoss, err := s.Grad(p, whole, pos, BF16, want)
	if err != nil {
		t.Fatal(err)
	}
	for _, ranks := range []int{2, 4} {
		l := ring.Layout{Seq: seq, Ranks: ranks}
		kv := make([]chan [2]attention.Matrix, ranks)
		blocks := make([]chan ring.Block, ranks)
		for i := range kv {
			kv[i], blocks[i] = make(chan [2]attention.Matrix, 1), make(chan ring.Block, 1)
		}
		grads := make([][]float64, ranks)
		losses, errs := make([]float64, ranks), make([]error, ranks)
		var wg sync.WaitGroup
		for r := range ranks {
			wg.Go(func() {
				next := (r + 1) % ranks
				att := Ring{Backend: attention.CPU, Layout: l, Rank: r,
					KV: func(k, v attention.Matrix) (attention.Matrix, attention.Matrix, error) {
						kv[next] <- [2]attention.Matrix{k, v}
						got := <-kv[r]
						return got[0], got[1], nil
					},
					Blocks: func(b ring.Block) (ring.Block, error) {
						blocks[next] <- b
						return <-blocks[r], nil
					}}
				var b Batch
				for _, at := range l.Positions(r) {
					b.Inputs, b.Targets = append(b.Inputs, whole.Inputs[at]), append(b.Targets, whole.Targets[at])
				}
				b.Norm = whole.Norm
				grads[r] = make([]float64, s.NumParams())
				losses[r], errs[r] = s.Grad(p, b, att, BF16, grads[r])
			})
		}
		wg.Wait()
		var loss float64
		got := make([]float64, s.NumParams())
		for r := range ranks {
			if errs[r] != nil {
				t.Fatalf("ranks %d, rank %d: %v", ranks, r, errs[r])
			}
			loss += losses[r]
			for i, g := range grads[r] {
				got[i] += g
			}
		}
		if math.Abs(loss-wantLoss) > 1e-4*wantLoss {
			t.Errorf("ranks %d: loss %v, one rank %v", ranks, loss, wantLoss)
		}
		var worst, scale float64
		for i := range got {
			worst = math.Max(worst, math.Abs(got[i]-want[i]))
			scale = math.Max(scale, math.Abs(want[i]))
		}
		// bf16 rounds the attention outputs' gradients differently once the ring merges
		// partial results in another order: a few bf16 ulps of the largest gradient.
		if worst > 2e-2*scale {
			t.Errorf("ranks %d: gradients differ by up to %.3g (largest gradient %.3g)", ranks, worst, scale)
		}
	}
}

// AdamW on the Markov chain: the loss falls from about ln(vocab) towards the chain's
// entropy, and two runs agree bit for bit.
func TestTrainingLearnsTheChainDeterministically(t *testing.T) {
	s := Shape{Vocab: 16, Dim: 16, Layers: 2, Heads: 2, FFN: 32}
	train := func() (first, last float64, params []float32) {
		p := s.Init(1)
		m, v := make([]float32, len(p)), make([]float32, len(p))
		opt := DefaultAdamW(1e-2)
		for step := range int64(150) {
			b, pos := batchOf(s, 1, step, 32)
			g := make([]float64, len(p))
			loss, err := s.Grad(p, b, pos, BF16, g)
			if err != nil {
				t.Fatal(err)
			}
			if step == 0 {
				first = loss / b.Norm
			}
			last = loss / b.Norm
			if err := opt.Update(s, p, m, v, g, step+1); err != nil {
				t.Fatal(err)
			}
		}
		return first, last, p
	}
	first, last, a := train()
	t.Logf("loss %.3f -> %.3f (ln %d = %.3f, floor %.3f)", first, last, s.Vocab, math.Log(float64(s.Vocab)), Floor)
	if math.Abs(first-math.Log(float64(s.Vocab))) > 0.5 {
		t.Errorf("first loss %.3f, want about ln %d = %.3f", first, s.Vocab, math.Log(float64(s.Vocab)))
	}
	if last > Floor+0.5 {
		t.Errorf("loss after 150 steps %.3f, want within 0.5 of the chain's entropy %.3f", last, Floor)
	}
	if _, _, b := train(); !slices.Equal(a, b) {
		t.Error("two runs from the same seed ended with different parameters")
	}
}

func TestShape(t *testing.T) {
	s := Shape{Vocab: 10, Dim: 6, Layers: 3, Heads: 3, FFN: 8}
	decayed := 0
	for i := range s.NumParams() {
		if s.Decays(i) {
			decayed++
		}
	}
	if want := s.Layers * (4*s.Dim*s.Dim + 2*s.Dim*s.FFN); decayed != want {
		t.Errorf("%d parameters decay, want the %d of the matrices", decayed, want)
	}
	// Tensor by tensor: the matrices decay, the embedding and the norms' gains do not.
	check := func(name string, sp span, decays bool) {
		for i := sp.off; i < sp.off+sp.rows*sp.cols; i++ {
			if s.Decays(i) != decays {
				t.Fatalf("%s: parameter %d decays %v, want %v", name, i, s.Decays(i), decays)
			}
		}
	}
	check("embedding", s.embedding(), false)
	check("final norm", s.finalNorm(), false)
	for l := range s.Layers {
		ly := s.layer(l)
		for _, c := range []struct {
			name   string
			sp     span
			decays bool
		}{{"norm1", ly.norm1, false}, {"wq", ly.wq, true}, {"wk", ly.wk, true}, {"wv", ly.wv, true}, {"wo", ly.wo, true},
			{"norm2", ly.norm2, false}, {"w1", ly.w1, true}, {"w2", ly.w2, true}} {
			check(fmt.Sprintf("layer %d %s", l, c.name), c.sp, c.decays)
		}
	}
	if s.finalNorm().off != s.layer(s.Layers-1).w2.off+s.FFN*s.Dim {
		t.Error("the final norm does not follow the last layer")
	}
	for _, bad := range []Shape{{Vocab: 1, Dim: 4, Layers: 1, Heads: 1, FFN: 1}, {Vocab: 4, Dim: 6, Layers: 1, Heads: 4, FFN: 1}, {Vocab: 4, Dim: 4, Layers: 0, Heads: 1, FFN: 1},
		{Vocab: 1 << 40, Dim: 1 << 40, Layers: 1, Heads: 1, FFN: 1}, // the int product wraps negative
		{Vocab: 2, Dim: 1 << 14, Layers: 1, Heads: 1, FFN: 1}} {     // 2^30 parameters
		if bad.Validate() == nil {
			t.Errorf("%+v validated", bad)
		}
	}
}

// One AdamW step by hand in float64: bias correction at t = 1 and t = 2, decoupled weight
// decay only where Decays says, and the global clip when the gradient's norm is over it.
func TestAdamWStepsByHand(t *testing.T) {
	s := Shape{Vocab: 2, Dim: 2, Layers: 1, Heads: 1, FFN: 1}
	n := s.NumParams()
	decayed, plain := -1, -1
	for i := range n {
		if s.Decays(i) && decayed < 0 {
			decayed = i
		}
		if !s.Decays(i) && plain < 0 {
			plain = i
		}
	}
	o := AdamW{LR: 0.1, Beta1: 0.9, Beta2: 0.95, Eps: 1e-8, WeightDecay: 0.5, Clip: 1}
	for _, c := range []struct {
		name string
		g    float64 // every gradient element; the norm is |g| sqrt(n)
	}{{"unclipped", 0.01}, {"clipped", 3}} {
		p := make([]float32, n)
		for i := range p {
			p[i] = 0.5
		}
		m, v := make([]float32, n), make([]float32, n)
		grad := make([]float64, n)
		for i := range grad {
			grad[i] = c.g
		}
		clip := 1.0
		if norm := math.Abs(c.g) * math.Sqrt(float64(n)); norm > o.Clip {
			clip = o.Clip / norm
		}
		wantP := map[int]float64{decayed: 0.5, plain: 0.5}
		var wm, wv float64
		for step := int64(1); step <= 2; step++ {
			if err := o.Update(s, p, m, v, grad, step); err != nil {
				t.Fatal(err)
			}
			g := c.g * clip
			wm = 0.9*wm + 0.1*g
			wv = 0.95*wv + 0.05*g*g
			mhat, vhat := wm/(1-math.Pow(0.9, float64(step))), wv/(1-math.Pow(0.95, float64(step)))
			for i := range wantP {
				x := wantP[i]
				if i == decayed {
					x -= 0.1 * 0.5 * x
				}
				wantP[i] = x - 0.1*mhat/(math.Sqrt(vhat)+1e-8)
			}
			for i, w := range wantP {
				if math.Abs(float64(p[i])-w) > 1e-6 {
					t.Errorf("%s step %d: parameter %d (decays %v) = %v, by hand %v", c.name, step, i, s.Decays(i), p[i], w)
				}
			}
		}
	}
}
