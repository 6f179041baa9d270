package model

import (
	"fmt"
	"math"
)

// AdamW is Adam with decoupled weight decay (Loshchilov & Hutter) and the gradient's global
// norm clipped to Clip (0: not clipped).
type AdamW struct {
	LR, Beta1, Beta2, Eps, WeightDecay, Clip float64
}

// DefaultAdamW is the reference worker's optimizer at learning rate lr.
func DefaultAdamW(lr float64) AdamW {
	return AdamW{LR: lr, Beta1: 0.9, Beta2: 0.95, Eps: 1e-8, WeightDecay: 0.1, Clip: 1}
}

// ClipFactor is what the gradient is scaled by when its global norm is norm.
func (o AdamW) ClipFactor(norm float64) float64 {
	if o.Clip > 0 && norm > o.Clip {
		return o.Clip / norm
	}
	return 1
}

// Update takes step t (1 for the first) of the optimizer: params are the fp32 master
// weights, m and v its moments, grad the step's gradient (all ranks' summed).
func (o AdamW) Update(s Shape, params, m, v []float32, grad []float64, t int64) error {
	n := s.NumParams()
	if len(params) != n || len(m) != n || len(v) != n || len(grad) != n || t < 1 {
		return fmt.Errorf("adamw: %d parameters, %d/%d moments, %d gradients, step %d for a model of %d",
			len(params), len(m), len(v), len(grad), t, n)
	}
	var ss float64
	for _, g := range grad {
		ss += g * g
	}
	clip := o.ClipFactor(math.Sqrt(ss))
	c1, c2 := 1-math.Pow(o.Beta1, float64(t)), 1-math.Pow(o.Beta2, float64(t))
	for i, g := range grad {
		g *= clip
		mi := o.Beta1*float64(m[i]) + (1-o.Beta1)*g
		vi := o.Beta2*float64(v[i]) + (1-o.Beta2)*g*g
		m[i], v[i] = float32(mi), float32(vi)
		p := float64(params[i])
		if s.Decays(i) {
			p -= o.LR * o.WeightDecay * p
		}
		p -= o.LR * (mi / c1) / (math.Sqrt(vi/c2) + o.Eps)
		params[i] = float32(p)
	}
	return nil
}
