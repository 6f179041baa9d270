package model

import (
	"github.com/zaya-operator/zaya-operator/workers/attention"
	"github.com/zaya-operator/zaya-operator/workers/ring"
)

// Ring is causal attention over a context-parallel ring: this rank holds Layout's positions
// for Rank, Backend computes the blocks and the exchanges pass them to the ring's next rank.
type Ring struct {
	Backend attention.Backend
	Layout  ring.Layout
	Rank    int
	KV      ring.Exchange
	Blocks  ring.BlockExchange
}

// Forward implements Attention.
func (r Ring) Forward(q, k, v attention.Matrix, scale float64) (attention.Partial, error) {
	return ring.Forward(r.Backend, r.Layout, r.Rank, q, k, v, true, scale, r.KV)
}

// Backward implements Attention.
func (r Ring) Backward(q, k, v, out, dout attention.Matrix, lse []float64, scale float64) (dq, dk, dv attention.Grad, err error) {
	return ring.Backward(r.Backend, r.Layout, r.Rank, q, k, v, out, dout, lse, true, scale, r.Blocks)
}
