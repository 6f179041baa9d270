package model

import (
	"fmt"
	"testing"
)

// BenchmarkStep is one training step of one rank holding the whole sequence (forward,
// backward, AdamW) on the CPU: the reference worker's step time at a few sizes, with the
// tokens per second and the model's FLOP rate (6 x parameters x tokens for the matrices plus
// the causal attention's 3 x layers x seq^2 x dim: half of the scores are masked).
func BenchmarkStep(b *testing.B) {
	for _, c := range []struct {
		s   Shape
		seq int
	}{
		{Shape{Vocab: 32, Dim: 16, Layers: 2, Heads: 2, FFN: 64}, 16},     // the worker's default
		{Shape{Vocab: 256, Dim: 128, Layers: 4, Heads: 4, FFN: 512}, 256}, // 0.8 M parameters
	} {
		b.Run(fmt.Sprintf("params=%d/seq=%d", c.s.NumParams(), c.seq), func(b *testing.B) {
			s := c.s
			p := s.Init(1)
			m, v := make([]float32, len(p)), make([]float32, len(p))
			opt := DefaultAdamW(1e-3)
			g := make([]float64, len(p))
			step := int64(0)
			for b.Loop() {
				bt, pos := batchOf(s, 1, step, c.seq)
				clear(g)
				if _, err := s.Grad(p, bt, pos, BF16, g); err != nil {
					b.Fatal(err)
				}
				step++
				if err := opt.Update(s, p, m, v, g, step); err != nil {
					b.Fatal(err)
				}
			}
			sec := b.Elapsed().Seconds() / float64(b.N)
			flop := 6*float64(s.NumParams()-s.Dim)*float64(c.seq) + 6*float64(s.Layers*c.seq*c.seq*s.Dim)/2
			b.ReportMetric(float64(c.seq)/sec, "tokens/s")
			b.ReportMetric(flop/sec/1e9, "GFLOP/s")
		})
	}
}
