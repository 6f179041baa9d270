// Package ring is ring attention across a context-parallel group: the zigzag layout (which
// tokens each rank holds), the per-step schedule (which of its queries attend to which of the
// keys it has just received) and the forward pass that passes key/value blocks around the
// ring while it computes. The transport is a function, so the same code runs over channels in
// tests, TCP between processes and RCCL on GPUs.
package ring

import (
	"fmt"

	"github.com/zaya-operator/zaya-operator/workers/attention"
)

// Layout splits a sequence of Seq tokens over Ranks ranks, zigzag: the sequence is cut into
// 2·Ranks chunks and rank r holds chunks r and 2·Ranks-1-r, so that under a causal mask
// every rank does the same work at every step.
type Layout struct {
	Seq, Ranks int
}

// Validate checks that the sequence splits into 2·Ranks equal chunks.
func (l Layout) Validate() error {
	if l.Ranks < 1 || l.Seq < 2*l.Ranks || l.Seq%(2*l.Ranks) != 0 {
		return fmt.Errorf("ring: sequence length %d must be a positive multiple of 2 x %d ranks (zigzag chunks)", l.Seq, l.Ranks)
	}
	return nil
}

// Chunk is the tokens per chunk.
func (l Layout) Chunk() int { return l.Seq / (2 * l.Ranks) }

// Positions are the global positions of rank's tokens, in its local order.
func (l Layout) Positions(rank int) []int {
	c := l.Chunk()
	pos := make([]int, 0, 2*c)
	for _, chunk := range []int{rank, 2*l.Ranks - 1 - rank} {
		for i := range c {
			pos = append(pos, chunk*c+i)
		}
	}
	return pos
}

// Source is the rank whose keys and values rank holds at step (blocks travel to the next rank).
func (l Layout) Source(rank, step int) int {
	return ((rank-step)%l.Ranks + l.Ranks) % l.Ranks
}

// Work is one step of one rank: its query rows QRows attend to rows KRows of the key/value
// block it holds, with the causal mask still to apply only when Causal.
type Work struct {
	QRows, KRows []int
	Causal       bool
}

func span(from, to int) []int {
	out := make([]int, 0, to-from)
	for i := from; i < to; i++ {
		out = append(out, i)
	}
	return out
}

// Step is the work of rank at step. Without a causal mask every query sees every key. With
// one, step 0 is the rank's own block under the mask; a block from an earlier rank is seen by
// all queries but only in its first chunk (its second chunk lies after both of ours); a block
// from a later rank is seen whole, but only by our second chunk. Either way half the
// pairs, unmasked: the balance zigzag exists for.
func (l Layout) Step(rank, step int, causal bool) Work {
	c := l.Chunk()
	all := span(0, 2*c)
	src := l.Source(rank, step)
	switch {
	case !causal:
		return Work{QRows: all, KRows: all}
	case step == 0:
		return Work{QRows: all, KRows: all, Causal: true}
	case src < rank:
		return Work{QRows: all, KRows: span(0, c)}
	default:
		return Work{QRows: span(c, 2*c), KRows: all}
	}
}

// Exchange sends this rank's current key/value block to the next rank and returns the block
// of the previous one.
type Exchange func(k, v attention.Matrix) (attention.Matrix, attention.Matrix, error)

// Forward is ring attention for one rank, its blocks computed by be: q, k and v are its tokens in Layout order. Each step
// starts passing the block it holds before computing on it, so communication overlaps compute.
func Forward(be attention.Backend, l Layout, rank int, q, k, v attention.Matrix, causal bool, scale float64, exchange Exchange) (attention.Partial, error) {
	if err := l.Validate(); err != nil {
		return attention.Partial{}, err
	}
	if q.Rows != 2*l.Chunk() || k.Rows != q.Rows || v.Rows != q.Rows {
		return attention.Partial{}, fmt.Errorf("ring: rank %d holds %d/%d/%d tokens, want %d", rank, q.Rows, k.Rows, v.Rows, 2*l.Chunk())
	}
	type block struct {
		k, v attention.Matrix
		err  error
	}
	qPos := l.Positions(rank)
	acc := attention.EmptyPartial(q.Rows, v.Cols)
	curK, curV := k, v
	for step := range l.Ranks {
		var next chan block
		if step < l.Ranks-1 {
			next = make(chan block, 1)
			go func(k, v attention.Matrix) {
				nk, nv, err := exchange(k, v)
				next <- block{nk, nv, err}
			}(curK, curV)
		}
		w := l.Step(rank, step, causal)
		kPos := l.Positions(l.Source(rank, step))
		part, err := be.Forward(q.SelectRows(w.QRows), curK.SelectRows(w.KRows), curV.SelectRows(w.KRows),
			pick(qPos, w.QRows), pick(kPos, w.KRows), w.Causal, scale)
		if err != nil {
			return attention.Partial{}, err
		}
		if err := be.Merge(&acc, part, w.QRows); err != nil {
			return attention.Partial{}, err
		}
		if next != nil {
			b := <-next
			if b.err != nil {
				return attention.Partial{}, fmt.Errorf("ring: rank %d step %d: %w", rank, step, b.err)
			}
			curK, curV = b.k, b.v
		}
	}
	return acc, nil
}

func pick(xs, idx []int) []int {
	out := make([]int, len(idx))
	for i, j := range idx {
		out[i] = xs[j]
	}
	return out
}
