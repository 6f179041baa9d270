//go:build rocm && cgo

package rocm

/*
#include <stdlib.h>
#include "zr.h"
*/
import "C"

import (
	"fmt"
	"math"
	"unsafe"

	"github.com/zaya-operator/zaya-operator/workers/model"
)

// Device is one GPU's memory and the kernels of the training step that work on it in place:
// buffers stay allocated across steps and cross to the host only when the host needs them
// (a checkpoint, a collective over TCP), the first pieces of the device-resident step.
type Device struct {
	dev                                   int
	gemm, adamw, cast, sumsq              unsafe.Pointer
	embed, embedBwd, rms, rmsBwd, rmsGain unsafe.Pointer
	gelu, geluBwd, xent                   unsafe.Pointer
	attnFwd, attnPrep, attnKV, attnQ      unsafe.Pointer
	merge                                 unsafe.Pointer
}

// OpenDevice loads the HIP runtime and the step's kernels (gemm_mfma.hsaco, adamw.hsaco,
// model_ops.hsaco and the MFMA attention kernels) from dir for device dev.
func OpenDevice(l Libraries, dir string, dev int) (*Device, error) {
	d := &Device{dev: dev}
	err := openKernels(l, dir, dev, []kernel{{"gemm_mfma.hip", "zaya_gemm_mfma", &d.gemm}, {"adamw.hip", "zaya_adamw", &d.adamw},
		{"adamw.hip", "zaya_cast_bf16", &d.cast}, {"adamw.hip", "zaya_sumsq", &d.sumsq},
		{"model_ops.hip", "zaya_embed_fwd", &d.embed}, {"model_ops.hip", "zaya_embed_bwd", &d.embedBwd},
		{"model_ops.hip", "zaya_rmsnorm_fwd", &d.rms}, {"model_ops.hip", "zaya_rmsnorm_bwd", &d.rmsBwd},
		{"model_ops.hip", "zaya_rmsnorm_dgain", &d.rmsGain}, {"model_ops.hip", "zaya_gelu_fwd", &d.gelu},
		{"model_ops.hip", "zaya_gelu_bwd", &d.geluBwd}, {"model_ops.hip", "zaya_xent", &d.xent},
		{"attention_fwd_mfma.hip", "zaya_attn_fwd_mfma", &d.attnFwd}, {"attention_bwd_mfma.hip", "zaya_attn_bwd_mfma_prep", &d.attnPrep},
		{"attention_bwd_mfma.hip", "zaya_attn_bwd_mfma_dkdv", &d.attnKV}, {"attention_bwd_mfma.hip", "zaya_attn_bwd_mfma_dq", &d.attnQ},
		{"attention_fwd.hip", "zaya_attn_merge", &d.merge}})
	if err != nil {
		return nil, err
	}
	return d, nil
}

// Buffer is device memory of a fixed size, allocated once, or a slice of such memory.
type Buffer struct {
	d     *Device
	p     unsafe.Pointer
	bytes int
	part  bool // part of another buffer: Free leaves it to that one
}

// slice is bytes of b from byte off (the caller checks they lie inside b).
func (b *Buffer) slice(off, bytes int) *Buffer {
	return &Buffer{d: b.d, p: unsafe.Add(b.p, off), bytes: bytes, part: true}
}

// Alloc allocates bytes of device memory.
func (d *Device) Alloc(bytes int) (*Buffer, error) {
	if bytes < 0 {
		return nil, fmt.Errorf("rocm: allocating %d bytes", bytes)
	}
	var p unsafe.Pointer
	into := &p // cgo's pointer check on &p reads as a duplicated expression to gocritic
	rc := C.zr_alloc(C.int(d.dev), C.size_t(bytes), into)
	if err := hipErr("hipMalloc", rc); err != nil {
		return nil, err
	}
	return &Buffer{d: d, p: p, bytes: bytes}, nil
}

// Free releases the buffer; it must not be used again.
func (b *Buffer) Free() error {
	if b.p == nil || b.part {
		return nil
	}
	err := hipErr("hipFree", C.zr_release(C.int(b.d.dev), b.p))
	b.p = nil
	return err
}

// Bytes is the buffer's size.
func (b *Buffer) Bytes() int { return b.bytes }

func (b *Buffer) copyIn(src unsafe.Pointer, n int) error {
	if n > b.bytes {
		return fmt.Errorf("rocm: writing %d bytes into a buffer of %d", n, b.bytes)
	}
	return hipErr("hipMemcpy to the device", C.zr_copy_in(C.int(b.d.dev), b.p, src, C.size_t(n)))
}

func (b *Buffer) copyOut(dst unsafe.Pointer, n int) error {
	if n > b.bytes {
		return fmt.Errorf("rocm: reading %d bytes from a buffer of %d", n, b.bytes)
	}
	return hipErr("hipMemcpy to the host", C.zr_copy_out(C.int(b.d.dev), dst, b.p, C.size_t(n)))
}

// write copies x to the front of b, read the front of b to x.
func write[T float32 | uint16 | byte | int32](b *Buffer, x []T) error {
	if len(x) == 0 {
		return nil
	}
	return b.copyIn(unsafe.Pointer(&x[0]), int(unsafe.Sizeof(x[0]))*len(x))
}

func read[T float32 | uint16](b *Buffer, x []T) error {
	if len(x) == 0 {
		return nil
	}
	return b.copyOut(unsafe.Pointer(&x[0]), int(unsafe.Sizeof(x[0]))*len(x))
}

// WriteF32 copies x to the front of the buffer.
func (b *Buffer) WriteF32(x []float32) error { return write(b, x) }

// ReadF32 copies the buffer's first len(x) float32 to x.
func (b *Buffer) ReadF32(x []float32) error { return read(b, x) }

// WriteU16 copies x (bf16 bit patterns) to the front of the buffer.
func (b *Buffer) WriteU16(x []uint16) error { return write(b, x) }

// ReadU16 copies the buffer's first len(x) uint16 to x.
func (b *Buffer) ReadU16(x []uint16) error { return read(b, x) }

// WriteBytes copies x to the front of the buffer.
func (b *Buffer) WriteBytes(x []byte) error { return write(b, x) }

// Matrix is a row-major view of a buffer from element Off: Rows x Cols elements with leading
// dimension LD, transposed when Trans (it then stands for its Cols x Rows transpose). Views
// with an offset and a wider LD are column blocks: one head's slice of a projection.
type Matrix struct {
	Buf                 *Buffer
	Off, Rows, Cols, LD int
	Trans               bool
}

func (m Matrix) at(elem int) unsafe.Pointer { return unsafe.Add(m.Buf.p, m.Off*elem) }

func (m Matrix) fits(elem int) error {
	switch {
	case m.Buf == nil || m.Buf.p == nil:
		return fmt.Errorf("rocm: a matrix without a buffer")
	case m.Rows < 0 || m.Cols < 0 || m.LD < m.Cols || m.Off < 0:
		return fmt.Errorf("rocm: a %dx%d matrix with leading dimension %d at %d", m.Rows, m.Cols, m.LD, m.Off)
	case m.Rows > 0 && float64(elem)*(float64(m.Off)+float64(m.Rows-1)*float64(m.LD)+float64(m.Cols)) > float64(m.Buf.bytes):
		return fmt.Errorf("rocm: a %dx%d matrix (leading dimension %d) overruns its buffer of %d bytes", m.Rows, m.Cols, m.LD, m.Buf.bytes)
	case m.Rows > math.MaxInt32 || m.LD > math.MaxInt32:
		return fmt.Errorf("rocm: a %dx%d matrix is too large for the kernels' int indices", m.Rows, m.Cols)
	}
	return nil
}

func (m Matrix) shape() (int, int) {
	if m.Trans {
		return m.Cols, m.Rows
	}
	return m.Rows, m.Cols
}

// GEMM is c (+)= a b on the matrix cores (gemm_mfma.hip): a and b bf16 as used (m x k and
// k x n), c fp32 m x n, never transposed. Shapes and buffer sizes are checked here: the kernel
// trusts them.
func (d *Device) GEMM(a, b, c Matrix, accumulate bool) error {
	m, k := a.shape()
	kb, n := b.shape()
	for _, e := range []error{a.fits(2), b.fits(2), c.fits(4)} {
		if e != nil {
			return e
		}
	}
	if k != kb || c.Trans || c.Rows != m || c.Cols != n {
		return fmt.Errorf("rocm: GEMM of %dx%d by %dx%d into %dx%d", m, k, kb, n, c.Rows, c.Cols)
	}
	rc := C.zr_gemm(d.gemm, C.int(d.dev), a.at(2), b.at(2), (*C.float)(c.at(4)), C.int(m), C.int(n), C.int(k),
		C.int(a.LD), C.int(b.LD), C.int(c.LD), b2i(a.Trans), b2i(b.Trans), b2i(accumulate))
	return hipErr("zaya_gemm_mfma", rc)
}

// CastBF16 rounds the first n float32 of x to bfloat16 into y: the fp32 masters become the
// GEMMs' operands without leaving the device.
func (d *Device) CastBF16(x, y *Buffer, n int) error {
	if n < 0 || 4*n > x.bytes || 2*n > y.bytes {
		return fmt.Errorf("rocm: casting %d values from %d bytes into %d", n, x.bytes, y.bytes)
	}
	return hipErr("zaya_cast_bf16", C.zr_cast_bf16(d.cast, C.int(d.dev), (*C.float)(x.p), (*C.ushort)(y.p), C.int(n)))
}

// AdamW is o's step t on the device over n parameters: p, m, v and g hold n float32 (weights,
// moments, the all-reduced gradient), decay n bytes (1: decayed, model.Shape.Decays). clip is
// the factor the gradient's global norm asks for (1: none), computed where the norm is.
func (d *Device) AdamW(o model.AdamW, t int64, clip float64, p, m, v, g, decay *Buffer, n int) error {
	for _, b := range []*Buffer{p, m, v, g} {
		if 4*n > b.bytes {
			return fmt.Errorf("rocm: AdamW over %d parameters with a buffer of %d bytes", n, b.bytes)
		}
	}
	if n > decay.bytes || t < 1 || n > math.MaxInt32 {
		return fmt.Errorf("rocm: AdamW over %d parameters at step %d with %d decay flags", n, t, decay.bytes)
	}
	c1, c2 := 1-math.Pow(o.Beta1, float64(t)), 1-math.Pow(o.Beta2, float64(t))
	rc := C.zr_adamw(d.adamw, C.int(d.dev), (*C.float)(p.p), (*C.float)(m.p), (*C.float)(v.p), (*C.float)(g.p),
		(*C.uchar)(decay.p), C.int(n), C.float(o.LR), C.float(o.Beta1), C.float(o.Beta2), C.float(o.Eps),
		C.float(o.WeightDecay), C.float(c1), C.float(c2), C.float(clip))
	return hipErr("zaya_adamw", rc)
}

// WriteTokens copies tokens to the front of the buffer as int32 after checking each is a
// token of a vocabulary of vocab: the embedding kernels index with them unchecked.
func (b *Buffer) WriteTokens(tokens []int32, vocab int) error {
	for i, t := range tokens {
		if t < 0 || int(t) >= vocab {
			return fmt.Errorf("rocm: token %d at %d is outside the vocabulary of %d", t, i, vocab)
		}
	}
	return write(b, tokens)
}

// holds checks that every buffer holds at least the bytes given beside it, and that no count
// the kernels see (bytes / 2 at most) passes their 32-bit int indices.
func holds(op string, pairs ...any) error {
	for i := 0; i+1 < len(pairs); i += 2 {
		b, n := pairs[i].(*Buffer), pairs[i+1].(int)
		if n/2 > math.MaxInt32 {
			return fmt.Errorf("rocm: %s over %d bytes: the kernels index with 32-bit ints", op, n)
		}
		if b == nil || b.p == nil || n < 0 || n > b.bytes {
			have := 0
			if b != nil {
				have = b.bytes
			}
			return fmt.Errorf("rocm: %s needs %d bytes in a buffer of %d", op, n, have)
		}
	}
	return nil
}

func f(b *Buffer) *C.float  { return (*C.float)(b.p) }
func ints(b *Buffer) *C.int { return (*C.int)(b.p) }

// Embed is x = the embedding's rows for n tokens (tokens written with WriteTokens).
func (d *Device) Embed(tokens, emb, x *Buffer, n, vocab, dim int) error {
	if err := holds("embedding", tokens, 4*n, emb, 4*vocab*dim, x, 4*n*dim); err != nil {
		return err
	}
	return hipErr("zaya_embed_fwd", C.zr_embed_fwd(d.embed, C.int(d.dev), ints(tokens), f(emb), f(x), C.int(n), C.int(dim)))
}

// TokenRows groups the rows of tokens by token for EmbedBackward: the rows of token v are
// order[start[v]:start[v+1]], ascending.
func TokenRows(tokens []int32, vocab int) (start, order []int32) {
	start = make([]int32, vocab+1)
	for _, t := range tokens {
		start[t+1]++
	}
	for v := range vocab {
		start[v+1] += start[v]
	}
	order = make([]int32, len(tokens))
	next := append([]int32(nil), start[:vocab]...)
	for i, t := range tokens {
		order[next[t]] = int32(i)
		next[t]++
	}
	return start, order
}

// EmbedBackward adds each row's gradient dx into its token's embedding row of demb, the rows
// of a token in order; start (vocab+1) and order (n) are TokenRows', written with WriteTokens.
func (d *Device) EmbedBackward(start, order, dx, demb *Buffer, n, vocab, dim int) error {
	if err := holds("embedding backward", start, 4*(vocab+1), order, 4*n, dx, 4*n*dim, demb, 4*vocab*dim); err != nil {
		return err
	}
	return hipErr("zaya_embed_bwd", C.zr_embed_bwd(d.embedBwd, C.int(d.dev), ints(start), ints(order), f(dx), f(demb), C.int(vocab), C.int(dim)))
}

// RMSNorm is y = x / rms(x) * gain row by row, keeping each row's 1/rms in inv.
func (d *Device) RMSNorm(x, gain, y, inv *Buffer, rows, dim int, eps float64) error {
	if err := holds("RMSNorm", x, 4*rows*dim, gain, 4*dim, y, 4*rows*dim, inv, 4*rows); err != nil {
		return err
	}
	return hipErr("zaya_rmsnorm_fwd", C.zr_rmsnorm_fwd(d.rms, C.int(d.dev), f(x), f(gain), f(y), f(inv), C.int(rows), C.int(dim), C.float(eps)))
}

// RMSNormBackward is x's gradient from the output's dy (added into dx with accumulate).
func (d *Device) RMSNormBackward(x, gain, inv, dy, dx *Buffer, rows, dim int, accumulate bool) error {
	if err := holds("RMSNorm backward", x, 4*rows*dim, gain, 4*dim, inv, 4*rows, dy, 4*rows*dim, dx, 4*rows*dim); err != nil {
		return err
	}
	return hipErr("zaya_rmsnorm_bwd", C.zr_rmsnorm_bwd(d.rmsBwd, C.int(d.dev), f(x), f(gain), f(inv), f(dy), f(dx), C.int(rows), C.int(dim), b2i(accumulate)))
}

// RMSNormGainGrad adds the gain's gradient, summed over the rows in order, into dgain.
func (d *Device) RMSNormGainGrad(x, inv, dy, dgain *Buffer, rows, dim int) error {
	if err := holds("RMSNorm gain gradient", x, 4*rows*dim, inv, 4*rows, dy, 4*rows*dim, dgain, 4*dim); err != nil {
		return err
	}
	return hipErr("zaya_rmsnorm_dgain", C.zr_rmsnorm_dgain(d.rmsGain, C.int(d.dev), f(x), f(inv), f(dy), f(dgain), C.int(rows), C.int(dim)))
}

// GELU is g = gelu(u) over n values (the tanh form).
func (d *Device) GELU(u, g *Buffer, n int) error {
	if err := holds("GELU", u, 4*n, g, 4*n); err != nil {
		return err
	}
	return hipErr("zaya_gelu_fwd", C.zr_gelu_fwd(d.gelu, C.int(d.dev), f(u), f(g), C.int(n)))
}

// GELUBackward is du = dg gelu'(u).
func (d *Device) GELUBackward(u, dg, du *Buffer, n int) error {
	if err := holds("GELU backward", u, 4*n, dg, 4*n, du, 4*n); err != nil {
		return err
	}
	return hipErr("zaya_gelu_bwd", C.zr_gelu_bwd(d.geluBwd, C.int(d.dev), f(u), f(dg), f(du), C.int(n)))
}

// CrossEntropy is each row's loss, logsumexp(logits) - logits[target], into loss, and the
// logits' gradient of the summed loss divided by norm into dlogits (targets written with
// WriteTokens).
func (d *Device) CrossEntropy(logits, targets, dlogits, loss *Buffer, rows, vocab int, norm float64) error {
	if err := holds("cross-entropy", logits, 4*rows*vocab, targets, 4*rows, dlogits, 4*rows*vocab, loss, 4*rows); err != nil {
		return err
	}
	return hipErr("zaya_xent", C.zr_xent(d.xent, C.int(d.dev), f(logits), ints(targets), f(dlogits), f(loss), C.int(rows), C.int(vocab), C.float(norm)))
}

// Copy copies bytes from the front of src to the front of dst, on the device.
func (d *Device) Copy(dst, src *Buffer, bytes int) error {
	if err := holds("copy", dst, bytes, src, bytes); err != nil {
		return err
	}
	return hipErr("hipMemcpy on the device", C.zr_copy_dev(C.int(d.dev), dst.p, src.p, C.size_t(bytes)))
}

// Zero clears the first bytes of b.
func (d *Device) Zero(b *Buffer, bytes int) error {
	if err := holds("zero", b, bytes); err != nil {
		return err
	}
	return hipErr("hipMemset", C.zr_zero(C.int(d.dev), b.p, C.size_t(bytes)))
}

// Attention is causal attention of n query rows of one head against n key rows (q, k, v
// bf16 n x hd; qpos, kpos n int32 positions each, which the mask compares) on the MFMA
// kernel: out (fp32 n x hd) and lse (n).
func (d *Device) Attention(q, k, v, qpos, kpos, out, lse *Buffer, n, hd int, scale float64) error {
	if !MFMA(hd) {
		return fmt.Errorf("rocm: head dimension %d is not one the MFMA kernels take", hd)
	}
	if err := holds("attention", q, 2*n*hd, k, 2*n*hd, v, 2*n*hd, qpos, 4*n, kpos, 4*n, out, 4*n*hd, lse, 4*n); err != nil {
		return err
	}
	rc := C.zr_attn_fwd_mfma_dev(d.attnFwd, C.int(d.dev), q.p, k.p, v.p, ints(qpos), ints(kpos), C.int(n), C.int(n), C.int(hd), 1, C.float(scale), f(out), f(lse))
	return hipErr("zaya_attn_fwd_mfma", rc)
}

// AttentionBackward adds the gradients of Attention's q, k and v (fp32 n x hd) into dq, dk and
// dv given dout (bf16) and the *global* out and lse of the queries; delta is n floats of
// scratch.
func (d *Device) AttentionBackward(q, k, v, qpos, kpos, out, lse, dout, delta, dq, dk, dv *Buffer, n, hd int, scale float64) error {
	if !MFMA(hd) {
		return fmt.Errorf("rocm: head dimension %d is not one the MFMA kernels take", hd)
	}
	if err := holds("attention backward", q, 2*n*hd, k, 2*n*hd, v, 2*n*hd, qpos, 4*n, kpos, 4*n, out, 4*n*hd, lse, 4*n, dout, 2*n*hd,
		delta, 4*n, dq, 4*n*hd, dk, 4*n*hd, dv, 4*n*hd); err != nil {
		return err
	}
	rc := C.zr_attn_bwd_mfma_dev(d.attnPrep, d.attnKV, d.attnQ, C.int(d.dev), q.p, k.p, v.p, f(out), dout.p, f(lse), f(delta),
		ints(qpos), ints(kpos), C.int(n), C.int(n), C.int(hd), 1, C.float(scale), f(dq), f(dk), f(dv))
	return hipErr("zaya_attn_bwd_mfma", rc)
}

// Merge folds the partial (outB, lseB) of n rows into (outA, lseA) at rows (n int32): ring
// attention's log-sum-exp merge on the device.
func (d *Device) Merge(outA, lseA, outB, lseB, rows *Buffer, n, hd int) error {
	if err := holds("merge", outA, 4*n*hd, lseA, 4*n, outB, 4*n*hd, lseB, 4*n, rows, 4*n); err != nil {
		return err
	}
	return hipErr("zaya_attn_merge", C.zr_attn_merge_dev(d.merge, C.int(d.dev), f(outA), f(lseA), f(outB), f(lseB), ints(rows), C.int(n), C.int(hd)))
}

// SumSquares is the sum of the squares of x's first n float32, reduced on the device by a
// fixed tree (the same bits every run); a and b are scratch of at least ceil(n/64) floats.
func (d *Device) SumSquares(x, a, b *Buffer, n int) (float64, error) {
	parts := (n + 63) / 64
	if err := holds("sum of squares", x, 4*n, a, 4*parts, b, 4*parts); err != nil {
		return 0, err
	}
	if n == 0 {
		return 0, nil
	}
	src, dst, square := x, a, C.int(1)
	for {
		if err := hipErr("zaya_sumsq", C.zr_sumsq(d.sumsq, C.int(d.dev), f(src), C.int(n), square, f(dst))); err != nil {
			return 0, err
		}
		n, square = (n+63)/64, 0
		if n == 1 {
			var out [1]float32
			if err := dst.ReadF32(out[:]); err != nil {
				return 0, err
			}
			return float64(out[0]), nil
		}
		src = dst
		if dst == a {
			dst = b
		} else {
			dst = a
		}
	}
}
