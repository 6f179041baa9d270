package attention

import (
	"fmt"
	"math"

	"github.com/zaya-operator/zaya-operator/workers/mfma"
)

// The MFMA flash-attention forward (workers/hip/attention_fwd_mfma.hip) run on the CPU: the
// kernel's steps for each 16-row query tile, one wavefront of 64 lanes at a time, with an
// emulation of v_mfma_f32_16x16x16_bf16 that follows AMD's documented lane layout. It exists
// to test the kernel's logic (tiling, lane layout, online softmax, masking, bf16 rounding)
// without an AMD GPU; the variable names follow the kernel's.

// Tile sizes and limits of the MFMA kernel (ZAYA_MFMA_* in the .hip file).
const (
	mfmaM    = 16
	mfmaN    = 16
	mfmaK    = 16
	MFMAMaxD = 128
	wave     = mfma.Wave
)

// RoundBF16 is m with every element rounded to bfloat16 (the kernel's inputs).
func RoundBF16(m Matrix) Matrix {
	out := NewMatrix(m.Rows, m.Cols)
	for i, x := range m.Data {
		out.Data[i] = mfma.FromBF16(mfma.BF16(x))
	}
	return out
}

// The instruction and its operands, as package mfma emulates them.
type (
	bf16x4 = mfma.BF16x4
	f32x4  = mfma.F32x4
)

var mfma16x16x16bf16 = mfma.Mul

// groupReduce is the kernel's xor-shuffle reduction over the 16 lanes of each row group.
func groupReduce(x *[wave]float32, op func(a, b float32) float32) {
	for off := 8; off > 0; off >>= 1 {
		var next [wave]float32
		for l := range wave {
			next[l] = op(x[l], x[l^off])
		}
		*x = next
	}
}

// ForwardMFMA is Forward as the MFMA kernel computes it: q, k and v rounded to bfloat16, scores
// and sums in float32, softmax weights rounded to bfloat16 before P V. d must be a multiple of
// 16 of at most MFMAMaxD.
func ForwardMFMA(q, k, v Matrix, qPos, kPos []int, causal bool, scale float64) (Partial, error) {
	d := q.Cols
	if q.Cols != k.Cols || k.Cols != v.Cols || k.Rows != v.Rows || len(qPos) != q.Rows || len(kPos) != k.Rows {
		return Partial{}, fmt.Errorf("attention: shapes q %dx%d, k %dx%d, v %dx%d, positions %d/%d do not fit",
			q.Rows, q.Cols, k.Rows, k.Cols, v.Rows, v.Cols, len(qPos), len(kPos))
	}
	if d%mfmaK != 0 || d == 0 || d > MFMAMaxD {
		return Partial{}, fmt.Errorf("attention: the MFMA kernel needs a head dimension that is a multiple of 16 up to %d, not %d", MFMAMaxD, d)
	}
	nq, nk := q.Rows, k.Rows
	res := EmptyPartial(nq, d)
	sc := float32(scale)
	neg := float32(math.Inf(-1))
	for row0 := 0; row0 < nq; row0 += mfmaM { // one work-group per query tile
		qs := make([]uint16, mfmaM*d)
		for e := range mfmaM * d {
			r, c := e/d, e%d
			if row0+r < nq {
				qs[r*d+c] = mfma.BF16(q.Data[(row0+r)*d+c])
			}
		}
		var qp [wave][4]int
		var acc [wave][MFMAMaxD / 16]f32x4
		var runMax, runSum [wave][4]float32
		for l := range wave {
			for i := range 4 {
				r := row0 + 4*(l/16) + i
				qp[l][i] = -1
				if r < nq {
					qp[l][i] = qPos[r]
				}
				runMax[l][i] = neg
			}
		}
		ks, vs := make([]uint16, mfmaN*d), make([]uint16, mfmaN*d)
		ps := make([]uint16, mfmaM*mfmaN)
		var kp [mfmaN]int
		for base := 0; base < nk; base += mfmaN {
			for e := range mfmaN * d {
				r, c := e/d, e%d
				ks[r*d+c], vs[r*d+c] = 0, 0
				if base+r < nk {
					ks[r*d+c], vs[r*d+c] = mfma.BF16(k.Data[(base+r)*d+c]), mfma.BF16(v.Data[(base+r)*d+c])
				}
			}
			for j := range mfmaN {
				kp[j] = -1
				if base+j < nk {
					kp[j] = kPos[base+j]
				}
			}
			// S = Q K^T.
			var s [wave]f32x4
			for kk := 0; kk < d; kk += mfmaK {
				var a, b [wave]bf16x4
				for l := range wave {
					col, grp := l%16, l/16
					for j := range 4 {
						a[l][j] = qs[col*d+kk+4*grp+j]
						b[l][j] = ks[col*d+kk+4*grp+j]
					}
				}
				s = mfma16x16x16bf16(&a, &b, &s)
			}
			// Online softmax, row by row of each lane's group.
			var corr [wave][4]float32
			for i := range 4 {
				var x, p [wave]float32
				for l := range wave {
					col := l % 16
					x[l] = neg
					if kp[col] >= 0 && qp[l][i] >= 0 && (!causal || kp[col] <= qp[l][i]) {
						x[l] = s[l][i] * sc
					}
				}
				tileMax := x
				groupReduce(&tileMax, func(a, b float32) float32 { return float32(math.Max(float64(a), float64(b))) })
				var newMax [wave]float32
				for l := range wave {
					newMax[l] = float32(math.Max(float64(runMax[l][i]), float64(tileMax[l])))
					if x[l] != neg {
						p[l] = float32(math.Exp(float64(x[l] - newMax[l])))
					}
					switch {
					case newMax[l] == neg:
						corr[l][i] = 1
					case runMax[l][i] == neg:
						corr[l][i] = 0
					default:
						corr[l][i] = float32(math.Exp(float64(runMax[l][i] - newMax[l])))
					}
				}
				sum := p
				groupReduce(&sum, func(a, b float32) float32 { return a + b })
				for l := range wave {
					runSum[l][i] = runSum[l][i]*corr[l][i] + sum[l]
					runMax[l][i] = newMax[l]
					ps[(4*(l/16)+i)*mfmaN+l%16] = mfma.BF16(p[l])
				}
			}
			// O = O corr + P V.
			var pa [wave]bf16x4
			for l := range wave {
				for j := range 4 {
					pa[l][j] = ps[(l%16)*mfmaN+4*(l/16)+j]
				}
			}
			for t := 0; t*16 < d; t++ {
				var o [wave]f32x4
				var vb [wave]bf16x4
				for l := range wave {
					for i := range 4 {
						o[l][i] = acc[l][t][i] * corr[l][i]
					}
					for j := range 4 {
						vb[l][j] = vs[(4*(l/16)+j)*d+16*t+l%16]
					}
				}
				o = mfma16x16x16bf16(&pa, &vb, &o)
				for l := range wave {
					acc[l][t] = o[l]
				}
			}
		}
		for l := range wave {
			col, grp := l%16, l/16
			for i := range 4 {
				r := row0 + 4*grp + i
				if r >= nq {
					continue
				}
				var inv float32
				if runSum[l][i] > 0 {
					inv = 1 / runSum[l][i]
				}
				for t := 0; t*16 < d; t++ {
					res.Out.Data[r*d+16*t+col] = acc[l][t][i] * inv
				}
				if col == 0 && runSum[l][i] > 0 {
					res.LSE[r] = float64(runMax[l][i] + float32(math.Log(float64(runSum[l][i]))))
				}
			}
		}
	}
	return res, nil
}
