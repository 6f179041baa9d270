//go:build rocm && cgo

package rocm

import (
	"fmt"
	"math"
	"unsafe"

	"github.com/zaya-operator/zaya-operator/workers/model"
)

// Step is the decoder's training step resident on one GPU: the fp32 master weights, AdamW's
// moments, the gradients and every activation live in buffers allocated once; the products
// run on the MFMA GEMM, attention on the MFMA kernels, the rest on model_ops. With context
// parallelism (a StepRing) the rank holds its zigzag share of the sequence and attention's key
// and value blocks travel the ring as device buffers, their gradients with them on the way
// back. What crosses to the host each step is the tokens (in), the loss and, over TCP, the
// gradient and the ring's blocks; the weights and moments only for checkpoints (State, Load).
type Step struct {
	d       *Device
	s       model.Shape
	n, hd   int
	scale   float64
	np      int
	decay   *Buffer
	p, pb   *Buffer // weights fp32 and as bf16 GEMM operands
	m, v, g *Buffer
	tokens  *Buffer
	targets *Buffer
	start   *Buffer // the tokens' rows grouped by token (TokenRows), for the embedding's gradient
	order   *Buffer
	pos     *Buffer // this rank's positions (qpos)
	ring    StepRing
	allPos  *Buffer // every ring rank's positions, rank after rank
	ident   *Buffer // 0 .. n-1: the merge's rows
	blkA    *Buffer // a travelling block: K | V (bf16), then dK | dV (fp32) in the backward
	blkB    *Buffer
	tmpOut  *Buffer // one block's partial attention
	tmpLse  *Buffer
	blocks  []blockBufs
	xf      *Buffer // the residual stream after the last block
	hf      *Buffer // the final norm's output
	hfb     *Buffer
	invf    *Buffer
	logits  *Buffer
	dlogits *Buffer
	dlb     *Buffer
	loss    *Buffer
	// backward scratch
	dx, dxb, dh, dhb, dxmid, du, dub, dg, delta *Buffer
	douth, douthb, dqh, dkh, dvh, dqb, dkb, dvb *Buffer
	normA, normB                                *Buffer                  // the gradient norm's partial sums
	host                                        []float32                // the gradient's host copy over TCP
	reduce                                      func(*Buffer, int) error // RCCL's device all-reduce, or nil
	all                                         []*Buffer
}

// blockBufs are one block's activations, kept from the forward for the backward.
type blockBufs struct {
	xin, h1, h1b, inv1, xmid, h2, h2b, inv2, u, g, gb *Buffer
	qh, kh, vh, qb, kb, vb, out, outb, lse            []*Buffer // per head
}

// StepRing is this rank's place in a context-parallel ring: every rank's positions (in ring
// order, as ring.Layout gives them), its own index, and the exchange that passes bytes of a
// device buffer to the next rank while receiving the previous rank's into another.
type StepRing struct {
	Positions [][]int
	Rank      int
	Exchange  func(send, recv *Buffer, bytes int) error
}

// RingExchange is the device exchange over tr: device to device on RCCL, through the host on
// a byte transport (TCP).
func RingExchange(tr any) (func(send, recv *Buffer, bytes int) error, error) {
	if dx, ok := tr.(interface {
		ExchangeDevice(send, recv *Buffer, bytes int) error
	}); ok {
		return dx.ExchangeDevice, nil
	}
	bx, ok := tr.(interface{ Exchange([]byte) ([]byte, error) })
	if !ok {
		return nil, fmt.Errorf("rocm: %T exchanges no ring blocks", tr)
	}
	return func(send, recv *Buffer, bytes int) error {
		if err := holds("exchange", send, bytes, recv, bytes); err != nil {
			return err
		}
		out := make([]byte, bytes)
		if err := send.copyOut(unsafe.Pointer(&out[0]), bytes); err != nil {
			return err
		}
		in, err := bx.Exchange(out)
		if err != nil {
			return err
		}
		if len(in) != bytes {
			return fmt.Errorf("rocm: the previous rank sent a block of %d bytes, want %d", len(in), bytes)
		}
		return recv.copyIn(unsafe.Pointer(&in[0]), bytes)
	}, nil
}

// OpenStep opens device dev (OpenDevice) and a Step on it for rank of a ring whose ranks hold
// positions (one rank: no context parallelism); tr passes the ring's blocks (RingExchange).
func OpenStep(l Libraries, dir string, dev int, s model.Shape, params []float32, positions [][]int, rank int, tr any) (TrainingStep, error) {
	if rank < 0 || rank >= len(positions) {
		return nil, fmt.Errorf("rocm: rank %d of a ring of %d", rank, len(positions))
	}
	ring := &StepRing{Positions: positions, Rank: rank}
	if len(positions) > 1 {
		x, err := RingExchange(tr)
		if err != nil {
			return nil, err
		}
		ring.Exchange = x
	}
	d, err := OpenDevice(l, dir, dev)
	if err != nil {
		return nil, err
	}
	st, err := NewStep(d, s, len(positions[rank]), params, ring)
	if err != nil {
		return nil, err
	}
	if red, ok := tr.(interface{ AllReduceDevice(*Buffer, int) error }); ok {
		st.reduce = red.AllReduceDevice
	}
	return st, nil
}

// NewStep allocates a step for shape s and rows tokens per step on d, starting from params; a
// ring places it in a context-parallel ring (nil: the rank holds positions 0..rows-1).
func NewStep(d *Device, s model.Shape, rows int, params []float32, ring *StepRing) (*Step, error) {
	if err := s.Validate(); err != nil {
		return nil, err
	}
	hd := s.HeadDim()
	if !MFMA(hd) {
		return nil, fmt.Errorf("rocm: the device step needs a head dimension the MFMA kernels take (a multiple of 16 up to 128), not %d", hd)
	}
	if rows < 1 || len(params) != s.NumParams() {
		return nil, fmt.Errorf("rocm: a step of %d rows with %d parameters for a model of %d", rows, len(params), s.NumParams())
	}
	if widest := max(s.Vocab, s.FFN, s.Dim); float64(rows)*float64(widest) > math.MaxInt32 {
		return nil, fmt.Errorf("rocm: %d rows of %d values: the kernels index with 32-bit ints", rows, widest)
	}
	st := &Step{d: d, s: s, n: rows, hd: hd, scale: 1 / math.Sqrt(float64(hd)), np: s.NumParams()}
	if ring == nil {
		own := make([]int, rows)
		for i := range own {
			own[i] = i
		}
		ring = &StepRing{Positions: [][]int{own}}
	}
	if ring.Rank < 0 || ring.Rank >= len(ring.Positions) || (len(ring.Positions) > 1 && ring.Exchange == nil) {
		return nil, fmt.Errorf("rocm: rank %d of a ring of %d", ring.Rank, len(ring.Positions))
	}
	for r, p := range ring.Positions {
		if len(p) != rows {
			return nil, fmt.Errorf("rocm: ring rank %d holds %d positions, the step %d rows", r, len(p), rows)
		}
	}
	st.ring = *ring
	st.host = make([]float32, st.np)
	var err error
	alloc := func(bytes int) *Buffer {
		if err != nil {
			return nil
		}
		var b *Buffer
		if b, err = d.Alloc(bytes); err == nil {
			st.all = append(st.all, b)
		}
		return b
	}
	n, dm, f, vocab, np := rows, s.Dim, s.FFN, s.Vocab, st.np
	st.decay, st.p, st.pb = alloc(np), alloc(4*np), alloc(2*np)
	st.m, st.v, st.g = alloc(4*np), alloc(4*np), alloc(4*np)
	st.tokens, st.targets, st.pos = alloc(4*n), alloc(4*n), alloc(4*n)
	st.start, st.order = alloc(4*(vocab+1)), alloc(4*n)
	for range s.Layers {
		b := blockBufs{xin: alloc(4 * n * dm), h1: alloc(4 * n * dm), h1b: alloc(2 * n * dm), inv1: alloc(4 * n),
			xmid: alloc(4 * n * dm), h2: alloc(4 * n * dm), h2b: alloc(2 * n * dm), inv2: alloc(4 * n),
			u: alloc(4 * n * f), g: alloc(4 * n * f), gb: alloc(2 * n * f)}
		for range s.Heads {
			b.qh, b.kh, b.vh = append(b.qh, alloc(4*n*hd)), append(b.kh, alloc(4*n*hd)), append(b.vh, alloc(4*n*hd))
			b.qb, b.kb, b.vb = append(b.qb, alloc(2*n*hd)), append(b.kb, alloc(2*n*hd)), append(b.vb, alloc(2*n*hd))
			b.out, b.outb, b.lse = append(b.out, alloc(4*n*hd)), append(b.outb, alloc(2*n*hd)), append(b.lse, alloc(4*n))
		}
		st.blocks = append(st.blocks, b)
	}
	st.xf, st.hf, st.hfb, st.invf = alloc(4*n*dm), alloc(4*n*dm), alloc(2*n*dm), alloc(4*n)
	st.logits, st.dlogits, st.dlb, st.loss = alloc(4*n*vocab), alloc(4*n*vocab), alloc(2*n*vocab), alloc(4*n)
	st.dx, st.dxb, st.dh, st.dhb, st.dxmid = alloc(4*n*dm), alloc(2*n*dm), alloc(4*n*dm), alloc(2*n*dm), alloc(4*n*dm)
	st.du, st.dub, st.dg, st.delta = alloc(4*n*f), alloc(2*n*f), alloc(4*n*f), alloc(4*n)
	st.douth, st.douthb = alloc(4*n*hd), alloc(2*n*hd)
	st.normA, st.normB = alloc(4*((np+63)/64)), alloc(4*((np+63)/64))
	st.allPos, st.ident = alloc(4*n*len(ring.Positions)), alloc(4*n)
	st.blkA, st.blkB = alloc(12*n*hd), alloc(12*n*hd)
	st.tmpOut, st.tmpLse = alloc(4*n*hd), alloc(4*n)
	st.dqh, st.dkh, st.dvh, st.dqb, st.dkb, st.dvb = alloc(4*n*hd), alloc(4*n*hd), alloc(4*n*hd), alloc(2*n*hd), alloc(2*n*hd), alloc(2*n*hd)
	if err != nil {
		_ = st.Close()
		return nil, err
	}
	decay := make([]byte, np)
	for i := range decay {
		if s.Decays(i) {
			decay[i] = 1
		}
	}
	var all []int32
	for _, p := range ring.Positions {
		for _, x := range p {
			all = append(all, int32(x))
		}
	}
	ident := make([]int32, n)
	for i := range ident {
		ident[i] = int32(i)
	}
	own := all[ring.Rank*n : (ring.Rank+1)*n]
	zeros := make([]float32, np)
	for _, e := range []error{st.decay.WriteBytes(decay), st.pos.WriteTokens(own, math.MaxInt32), st.allPos.WriteTokens(all, math.MaxInt32),
		st.ident.WriteTokens(ident, n), st.Load(params, zeros, zeros)} {
		if e != nil {
			_ = st.Close()
			return nil, e
		}
	}
	return st, nil
}

// Close frees every buffer of the step.
func (st *Step) Close() error {
	var first error
	for _, b := range st.all {
		if err := b.Free(); err != nil && first == nil {
			first = err
		}
	}
	st.all = nil
	return first
}

// Load puts the weights and AdamW's moments on the device (a start, or a resume).
func (st *Step) Load(params, m, v []float32) error {
	if len(params) != st.np || len(m) != st.np || len(v) != st.np {
		return fmt.Errorf("rocm: loading %d/%d/%d values into a model of %d", len(params), len(m), len(v), st.np)
	}
	for _, e := range []error{st.p.WriteF32(params), st.m.WriteF32(m), st.v.WriteF32(v)} {
		if e != nil {
			return e
		}
	}
	return st.d.CastBF16(st.p, st.pb, st.np)
}

// State copies the weights and AdamW's moments to the host (a checkpoint).
func (st *Step) State() (params, m, v []float32, err error) {
	params, m, v = make([]float32, st.np), make([]float32, st.np), make([]float32, st.np)
	for _, e := range []error{st.p.ReadF32(params), st.m.ReadF32(m), st.v.ReadF32(v)} {
		if e != nil {
			return nil, nil, nil, e
		}
	}
	return params, m, v, nil
}

// weight is parameter tensor pl of the bf16 operands, transposed when trans.
func (st *Step) weight(pl model.Place, trans bool) Matrix {
	return Matrix{Buf: st.pb, Off: pl.Off, Rows: pl.Rows, Cols: pl.Cols, LD: pl.Cols, Trans: trans}
}

// headCols is columns [h hd, (h+1) hd) of a dim-wide weight (a head's slice of Wq, Wk, Wv).
func (st *Step) headCols(pl model.Place, h int, trans bool) Matrix {
	return Matrix{Buf: st.pb, Off: pl.Off + h*st.hd, Rows: pl.Rows, Cols: st.hd, LD: pl.Cols, Trans: trans}
}

// headRows is rows [h hd, (h+1) hd) of Wo.
func (st *Step) headRows(pl model.Place, h int, trans bool) Matrix {
	return Matrix{Buf: st.pb, Off: pl.Off + h*st.hd*pl.Cols, Rows: st.hd, Cols: pl.Cols, LD: pl.Cols, Trans: trans}
}

func act(b *Buffer, rows, cols int, trans bool) Matrix {
	return Matrix{Buf: b, Rows: rows, Cols: cols, LD: cols, Trans: trans}
}

// gradAt is parameter tensor pl's gradient, or a column or row block of it.
func (st *Step) gradAt(off, rows, cols, ld int) Matrix {
	return Matrix{Buf: st.g, Off: off, Rows: rows, Cols: cols, LD: ld}
}

// run stops at the first error of a sequence of device calls.
type run struct{ err error }

func (r *run) do(err error) {
	if r.err == nil {
		r.err = err
	}
}

// Grad runs the step's forward and backward for b (len(b.Inputs) must be the step's rows) and
// adds the gradient of the loss, summed over the rows and divided by b.Norm, into grad; it
// returns the summed loss.
func (st *Step) Grad(b model.Batch, grad []float64) (float64, error) {
	if len(grad) != st.np {
		return 0, fmt.Errorf("rocm: %d gradients for a model of %d", len(grad), st.np)
	}
	loss, err := st.pass(b)
	if err != nil {
		return 0, err
	}
	if err := st.g.ReadF32(st.host); err != nil {
		return 0, err
	}
	for i, x := range st.host {
		grad[i] += float64(x)
	}
	return loss, nil
}

// Reduces says whether the step's transport (OpenStep's tr) sums device memory (RCCL):
// GradReduced and UpdateReduced then keep the gradient on the device.
func (st *Step) Reduces() bool { return st.reduce != nil }

// GradReduced runs the step's forward and backward and sums the gradient over the ranks on
// the device; it returns this rank's summed loss.
func (st *Step) GradReduced(b model.Batch) (float64, error) {
	if st.reduce == nil {
		return 0, fmt.Errorf("rocm: the step's transport cannot all-reduce device memory")
	}
	loss, err := st.pass(b)
	if err != nil {
		return 0, err
	}
	return loss, st.reduce(st.g, st.np)
}

// UpdateReduced takes AdamW's step t with the gradient GradReduced left on the device, its
// global norm for the clip reduced there too.
func (st *Step) UpdateReduced(o model.AdamW, t int64) error {
	ss, err := st.d.SumSquares(st.g, st.normA, st.normB, st.np)
	if err != nil {
		return err
	}
	return st.adamW(o, t, ss)
}

// adamW applies the gradient in st.g whose squared norm is ss and refreshes the bf16 operands.
func (st *Step) adamW(o model.AdamW, t int64, ss float64) error {
	if err := st.d.AdamW(o, t, o.ClipFactor(math.Sqrt(ss)), st.p, st.m, st.v, st.g, st.decay, st.np); err != nil {
		return err
	}
	return st.d.CastBF16(st.p, st.pb, st.np)
}

// pass is the forward and backward: the gradient is left in st.g, the summed loss returned.
func (st *Step) pass(b model.Batch) (float64, error) {
	s, d, n := st.s, st.d, st.n
	dm, f, vocab := s.Dim, s.FFN, s.Vocab
	if len(b.Inputs) != n || len(b.Targets) != n {
		return 0, fmt.Errorf("rocm: a step of %d rows given %d inputs and %d targets", n, len(b.Inputs), len(b.Targets))
	}
	r := &run{}
	r.do(st.tokens.WriteTokens(b.Inputs, vocab))
	r.do(st.targets.WriteTokens(b.Targets, vocab))
	if r.err == nil { // the inputs are in the vocabulary: TokenRows may index with them
		start, order := TokenRows(b.Inputs, vocab)
		r.do(st.start.WriteTokens(start, n+1))
		r.do(st.order.WriteTokens(order, n))
	}
	r.do(d.Zero(st.g, 4*st.np))
	emb := s.EmbeddingPlace()
	// Forward.
	x := st.xf
	if s.Layers > 0 {
		x = st.blocks[0].xin
	}
	r.do(d.Embed(st.tokens, st.p, x, n, vocab, dm)) // the embedding is the parameters' first tensor
	for l := range s.Layers {
		bl, pl := &st.blocks[l], s.Block(l)
		next := st.xf
		if l+1 < s.Layers {
			next = st.blocks[l+1].xin
		}
		r.do(st.norm(bl.xin, pl.Norm1, bl.h1, bl.inv1))
		r.do(d.CastBF16(bl.h1, bl.h1b, n*dm))
		r.do(d.Copy(bl.xmid, bl.xin, 4*n*dm))
		for h := range s.Heads {
			for _, p := range []struct {
				w     model.Place
				f32   *Buffer
				bf16s *Buffer
			}{{pl.Wq, bl.qh[h], bl.qb[h]}, {pl.Wk, bl.kh[h], bl.kb[h]}, {pl.Wv, bl.vh[h], bl.vb[h]}} {
				r.do(d.GEMM(act(bl.h1b, n, dm, false), st.headCols(p.w, h, false), act(p.f32, n, st.hd, false), false))
				r.do(d.CastBF16(p.f32, p.bf16s, n*st.hd))
			}
			r.do(st.attention(bl, h))
			r.do(d.CastBF16(bl.out[h], bl.outb[h], n*st.hd))
			r.do(d.GEMM(act(bl.outb[h], n, st.hd, false), st.headRows(pl.Wo, h, false), act(bl.xmid, n, dm, false), true))
		}
		r.do(st.norm(bl.xmid, pl.Norm2, bl.h2, bl.inv2))
		r.do(d.CastBF16(bl.h2, bl.h2b, n*dm))
		r.do(d.GEMM(act(bl.h2b, n, dm, false), st.weight(pl.W1, false), act(bl.u, n, f, false), false))
		r.do(d.GELU(bl.u, bl.g, n*f))
		r.do(d.CastBF16(bl.g, bl.gb, n*f))
		r.do(d.Copy(next, bl.xmid, 4*n*dm))
		r.do(d.GEMM(act(bl.gb, n, f, false), st.weight(pl.W2, false), act(next, n, dm, false), true))
	}
	r.do(st.norm(st.xf, s.FinalNormPlace(), st.hf, st.invf))
	r.do(d.CastBF16(st.hf, st.hfb, n*dm))
	r.do(d.GEMM(act(st.hfb, n, dm, false), st.weight(emb, true), act(st.logits, n, vocab, false), false))
	r.do(d.CrossEntropy(st.logits, st.targets, st.dlogits, st.loss, n, vocab, b.Norm))
	// Backward.
	r.do(d.CastBF16(st.dlogits, st.dlb, n*vocab))
	r.do(d.GEMM(act(st.dlb, n, vocab, true), act(st.hfb, n, dm, false), st.gradAt(emb.Off, vocab, dm, dm), true))
	r.do(d.GEMM(act(st.dlb, n, vocab, false), st.weight(emb, false), act(st.dh, n, dm, false), false))
	r.do(st.normBack(st.xf, s.FinalNormPlace(), st.invf, st.dh, st.dx, false))
	for l := s.Layers - 1; l >= 0; l-- {
		bl, pl := &st.blocks[l], s.Block(l)
		// x = xmid + gelu(n2 W1) W2
		r.do(d.CastBF16(st.dx, st.dxb, n*dm))
		r.do(d.GEMM(act(bl.gb, n, f, true), act(st.dxb, n, dm, false), st.gradAt(pl.W2.Off, f, dm, dm), true))
		r.do(d.GEMM(act(st.dxb, n, dm, false), st.weight(pl.W2, true), act(st.dg, n, f, false), false))
		r.do(d.GELUBackward(bl.u, st.dg, st.du, n*f))
		r.do(d.CastBF16(st.du, st.dub, n*f))
		r.do(d.GEMM(act(bl.h2b, n, dm, true), act(st.dub, n, f, false), st.gradAt(pl.W1.Off, dm, f, f), true))
		r.do(d.GEMM(act(st.dub, n, f, false), st.weight(pl.W1, true), act(st.dh, n, dm, false), false))
		r.do(d.Copy(st.dxmid, st.dx, 4*n*dm))
		r.do(st.normBack(bl.xmid, pl.Norm2, bl.inv2, st.dh, st.dxmid, true))
		// xmid = xin + sum over heads of attention(n1 Wq_h, n1 Wk_h, n1 Wv_h) Wo_h
		r.do(d.CastBF16(st.dxmid, st.dxb, n*dm))
		for h := range s.Heads {
			r.do(d.GEMM(act(bl.outb[h], n, st.hd, true), act(st.dxb, n, dm, false), st.gradAt(pl.Wo.Off+h*st.hd*dm, st.hd, dm, dm), true))
			r.do(d.GEMM(act(st.dxb, n, dm, false), st.headRows(pl.Wo, h, true), act(st.douth, n, st.hd, false), false))
			r.do(d.CastBF16(st.douth, st.douthb, n*st.hd))
			r.do(st.attentionBackward(bl, h))
			for i, p := range []struct {
				w      model.Place
				g, gbf *Buffer
			}{{pl.Wq, st.dqh, st.dqb}, {pl.Wk, st.dkh, st.dkb}, {pl.Wv, st.dvh, st.dvb}} {
				r.do(d.CastBF16(p.g, p.gbf, n*st.hd))
				r.do(d.GEMM(act(bl.h1b, n, dm, true), act(p.gbf, n, st.hd, false), st.gradAt(p.w.Off+h*st.hd, dm, st.hd, dm), true))
				r.do(d.GEMM(act(p.gbf, n, st.hd, false), st.headCols(p.w, h, true), act(st.dh, n, dm, false), h > 0 || i > 0))
			}
		}
		r.do(d.Copy(st.dx, st.dxmid, 4*n*dm))
		r.do(st.normBack(bl.xin, pl.Norm1, bl.inv1, st.dh, st.dx, true))
	}
	r.do(d.EmbedBackward(st.start, st.order, st.dx, st.g, n, vocab, dm)) // the embedding's gradient is the first tensor's
	losses := make([]float32, n)
	r.do(st.loss.ReadF32(losses))
	if r.err != nil {
		return 0, r.err
	}
	var loss float64
	for _, x := range losses {
		loss += float64(x)
	}
	return loss, nil
}

// norm is RMSNorm of x with the gain at pl into y, keeping inv.
func (st *Step) norm(x *Buffer, pl model.Place, y, inv *Buffer) error {
	gain, err := st.view(st.p, pl)
	if err != nil {
		return err
	}
	return st.d.RMSNorm(x, gain, y, inv, st.n, st.s.Dim, model.NormEps)
}

// normBack is RMSNorm's backward: x's gradient into dx (added with accumulate) and the
// gain's into its gradient.
func (st *Step) normBack(x *Buffer, pl model.Place, inv, dy, dx *Buffer, accumulate bool) error {
	gain, err := st.view(st.p, pl)
	if err != nil {
		return err
	}
	dgain, err := st.view(st.g, pl)
	if err != nil {
		return err
	}
	if err := st.d.RMSNormBackward(x, gain, inv, dy, dx, st.n, st.s.Dim, accumulate); err != nil {
		return err
	}
	return st.d.RMSNormGainGrad(x, inv, dy, dgain, st.n, st.s.Dim)
}

// view is the part of an fp32 parameter-sized buffer where tensor pl lies.
func (st *Step) view(b *Buffer, pl model.Place) (*Buffer, error) {
	if pl.Off < 0 || 4*(pl.Off+pl.Rows*pl.Cols) > b.bytes {
		return nil, fmt.Errorf("rocm: tensor at %d of %d values outside a buffer of %d bytes", pl.Off, pl.Rows*pl.Cols, b.bytes)
	}
	return b.slice(4*pl.Off, 4*pl.Rows*pl.Cols), nil
}

// Update takes AdamW's step t on the device with the all-reduced gradient and refreshes the
// bf16 operands.
func (st *Step) Update(o model.AdamW, t int64, grad []float64) error {
	if len(grad) != st.np {
		return fmt.Errorf("rocm: %d gradients for a model of %d", len(grad), st.np)
	}
	var ss float64
	for i, x := range grad {
		st.host[i] = float32(x)
		ss += x * x
	}
	if err := st.g.WriteF32(st.host); err != nil {
		return err
	}
	return st.adamW(o, t, ss)
}

// source is the ring rank whose block this rank holds at step, and its positions.
func (st *Step) source(step int) *Buffer {
	ranks := len(st.ring.Positions)
	src := ((st.ring.Rank-step)%ranks + ranks) % ranks
	return st.allPos.slice(4*src*st.n, 4*st.n)
}

// attention is head h's causal attention for this rank's rows against every block of the
// ring: its own first, then each block the previous rank passes on, merged by log-sum-exp.
func (st *Step) attention(bl *blockBufs, h int) error {
	d, n, hd := st.d, st.n, st.hd
	r := &run{}
	r.do(d.Attention(bl.qb[h], bl.kb[h], bl.vb[h], st.pos, st.source(0), bl.out[h], bl.lse[h], n, hd, st.scale))
	ranks := len(st.ring.Positions)
	if ranks == 1 {
		return r.err
	}
	kv := 2 * n * hd // bytes of K, and of V, in bf16
	cur, next := st.blkA, st.blkB
	r.do(d.Copy(cur, bl.kb[h], kv))
	r.do(d.Copy(cur.slice(kv, kv), bl.vb[h], kv))
	for step := 1; step < ranks; step++ {
		r.do(st.ring.Exchange(cur, next, 2*kv))
		cur, next = next, cur
		r.do(d.Attention(bl.qb[h], cur.slice(0, kv), cur.slice(kv, kv), st.pos, st.source(step), st.tmpOut, st.tmpLse, n, hd, st.scale))
		r.do(d.Merge(bl.out[h], bl.lse[h], st.tmpOut, st.tmpLse, st.ident, n, hd))
	}
	return r.err
}

// attentionBackward is attention's backward for head h: dq stays here, each key/value block
// travels the ring with its gradients and comes home after every rank has added to them.
// st.douthb holds dO (bf16); the gradients land in st.dqh, st.dkh and st.dvh.
func (st *Step) attentionBackward(bl *blockBufs, h int) error {
	d, n, hd := st.d, st.n, st.hd
	r := &run{}
	for _, z := range []*Buffer{st.dqh, st.dkh, st.dvh} {
		r.do(d.Zero(z, 4*n*hd))
	}
	ranks := len(st.ring.Positions)
	if ranks == 1 {
		r.do(d.AttentionBackward(bl.qb[h], bl.kb[h], bl.vb[h], st.pos, st.source(0), bl.out[h], bl.lse[h], st.douthb, st.delta,
			st.dqh, st.dkh, st.dvh, n, hd, st.scale))
		return r.err
	}
	kv, g := 2*n*hd, 4*n*hd // bytes of K (bf16) and of dK (fp32)
	cur, next := st.blkA, st.blkB
	r.do(d.Copy(cur, bl.kb[h], kv))
	r.do(d.Copy(cur.slice(kv, kv), bl.vb[h], kv))
	r.do(d.Zero(cur.slice(2*kv, 2*g), 2*g))
	for step := range ranks {
		r.do(d.AttentionBackward(bl.qb[h], cur.slice(0, kv), cur.slice(kv, kv), st.pos, st.source(step), bl.out[h], bl.lse[h],
			st.douthb, st.delta, st.dqh, cur.slice(2*kv, g), cur.slice(2*kv+g, g), n, hd, st.scale))
		// Every step passes the block on, the last one too: that brings it home.
		r.do(st.ring.Exchange(cur, next, 2*kv+2*g))
		cur, next = next, cur
	}
	r.do(d.Copy(st.dkh, cur.slice(2*kv, g), g))
	r.do(d.Copy(st.dvh, cur.slice(2*kv+g, g), g))
	return r.err
}
