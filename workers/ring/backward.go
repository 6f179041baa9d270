package ring

import (
	"fmt"

	"github.com/zaya-operator/zaya-operator/workers/attention"
)

// Block is what travels around the ring in the backward pass: a rank's keys and values with
// the key/value gradients gathered so far.
type Block struct {
	K, V   attention.Matrix
	DK, DV attention.Grad
}

// BlockExchange sends this rank's block to the next rank and returns the previous rank's.
type BlockExchange func(Block) (Block, error)

// Backward is ring attention's backward pass for one rank, its blocks computed by be: q, k, v, out (the forward's output),
// lse and dout are its tokens in Layout order. dq stays home; each key/value block travels
// with its gradients and, after Ranks exchanges, is back with its owner carrying every rank's
// contribution. The schedule is the forward's, so the causal work stays balanced.
func Backward(be attention.Backend, l Layout, rank int, q, k, v, out, dout attention.Matrix, lse []float64, causal bool, scale float64,
	exchange BlockExchange) (dq, dk, dv attention.Grad, err error) {
	if err := l.Validate(); err != nil {
		return dq, dk, dv, err
	}
	if q.Rows != 2*l.Chunk() || k.Rows != q.Rows || v.Rows != q.Rows || out.Rows != q.Rows || dout.Rows != q.Rows || len(lse) != q.Rows {
		return dq, dk, dv, fmt.Errorf("ring: rank %d backward inputs hold the wrong number of tokens", rank)
	}
	qPos := l.Positions(rank)
	dq = attention.NewGrad(q.Rows, q.Cols)
	blk := Block{K: k, V: v, DK: attention.NewGrad(k.Rows, k.Cols), DV: attention.NewGrad(v.Rows, v.Cols)}
	for step := range l.Ranks {
		w := l.Step(rank, step, causal)
		kPos := l.Positions(l.Source(rank, step))
		err := be.Backward(q.SelectRows(w.QRows), blk.K.SelectRows(w.KRows), blk.V.SelectRows(w.KRows),
			out.SelectRows(w.QRows), dout.SelectRows(w.QRows), pickF(lse, w.QRows), pick(qPos, w.QRows), pick(kPos, w.KRows),
			w.Causal, scale, dq, w.QRows, blk.DK, blk.DV, w.KRows)
		if err != nil {
			return dq, dk, dv, err
		}
		// Every step passes the block on, the last one too: that brings it home.
		if blk, err = exchange(blk); err != nil {
			return dq, dk, dv, fmt.Errorf("ring: rank %d backward step %d: %w", rank, step, err)
		}
	}
	return dq, blk.DK, blk.DV, nil
}

func pickF(xs []float64, idx []int) []float64 {
	out := make([]float64, len(idx))
	for i, j := range idx {
		out[i] = xs[j]
	}
	return out
}
