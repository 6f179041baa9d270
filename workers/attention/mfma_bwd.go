package attention

import (
	"fmt"
	"math"

	"github.com/zaya-operator/zaya-operator/workers/mfma"
)

// BackwardMFMA is Backward as the MFMA backward kernels (workers/hip/attention_bwd_mfma.hip)
// compute it, lane by lane: q, k, v and dout rounded to bfloat16, out and lse as float32,
// products on the emulated matrix instruction, P and dS rounded to bfloat16 before they
// multiply. dK and dV come from one pass per key tile over every query tile, dQ from one pass
// per query tile over every key tile: each gradient element is one lane's fixed-order sum,
// added once into dq (rows qRows), dk and dv (rows kRows). d must be a multiple of 16 of at
// most MFMAMaxD.
func BackwardMFMA(q, k, v, out, dout Matrix, lse []float64, qPos, kPos []int, causal bool, scale float64,
	dq Grad, qRows []int, dk, dv Grad, kRows []int) error {
	d, nq, nk := q.Cols, q.Rows, k.Rows
	if q.Cols != k.Cols || k.Cols != v.Cols || k.Rows != v.Rows || out.Rows != nq || dout.Rows != nq || out.Cols != d || dout.Cols != d ||
		len(lse) != nq || len(qPos) != nq || len(kPos) != nk || len(qRows) != nq || len(kRows) != nk {
		return fmt.Errorf("attention: MFMA backward shapes do not fit (q %dx%d, k %dx%d, v %dx%d)", q.Rows, q.Cols, k.Rows, k.Cols, v.Rows, v.Cols)
	}
	if d%mfmaK != 0 || d == 0 || d > MFMAMaxD {
		return fmt.Errorf("attention: the MFMA kernel needs a head dimension that is a multiple of 16 up to %d, not %d", MFMAMaxD, d)
	}
	b := bwdInputs{d: d, nq: nq, nk: nk, causal: causal, scale: float32(scale), qPos: qPos, kPos: kPos,
		q: mfma.BF16s(q.Data), k: mfma.BF16s(k.Data), v: mfma.BF16s(v.Data), do: mfma.BF16s(dout.Data), lse: make([]float32, nq), delta: make([]float32, nq)}
	for r := range nq {
		b.lse[r] = float32(lse[r])
		var s float32 // zaya_attn_bwd_mfma_prep
		for c := range d {
			s += mfma.FromBF16(b.do[r*d+c]) * out.Data[r*d+c]
		}
		b.delta[r] = s
	}
	for key0 := 0; key0 < nk; key0 += mfmaN {
		b.dkdv(key0, dk, dv, kRows)
	}
	for q0 := 0; q0 < nq; q0 += mfmaM {
		b.dq(q0, dq, qRows)
	}
	return nil
}

type bwdInputs struct {
	d, nq, nk   int
	causal      bool
	scale       float32
	qPos, kPos  []int
	q, k, v, do []uint16
	lse, delta  []float32
}

// operandA is the kernel's load_a: lane holds X[row0 + l%16][kk + 4(l/16) + j], zero past n.
func operandA(x []uint16, row0, n, d, kk int) (a [wave]bf16x4) {
	for l := range wave {
		if r := row0 + l%16; r < n {
			copy(a[l][:], x[r*d+kk+4*(l/16):])
		}
	}
	return a
}

// stage is the kernel's LDS copy of rows row0 .. row0+15, zero past n.
func stage(x []uint16, row0, n, d int) []uint16 {
	out := make([]uint16, mfmaM*d)
	for r := range mfmaM {
		if row0+r < n {
			copy(out[r*d:(r+1)*d], x[(row0+r)*d:])
		}
	}
	return out
}

// rowsB is the B operand X[n = l%16][k = kk + 4(l/16) + j] of a staged tile (S = Q K^T's K).
func rowsB(x []uint16, d, kk int) (b [wave]bf16x4) {
	for l := range wave {
		copy(b[l][:], x[(l%16)*d+kk+4*(l/16):])
	}
	return b
}

// colsB is the B operand X[k = 4(l/16) + j][n = 16t + l%16] of a staged tile (dQ = dS K's K).
func colsB(x []uint16, d, t int) (b [wave]bf16x4) {
	for l := range wave {
		for j := range 4 {
			b[l][j] = x[(4*(l/16)+j)*d+16*t+l%16]
		}
	}
	return b
}

// transposeA reads a 16x16 tile the lanes wrote in the C layout (row 4(l/16)+i, column l%16)
// back as an A operand: lane holds T[l%16][4(l/16) + j].
func transposeA(tile *[mfmaM * mfmaN]uint16) (a [wave]bf16x4) {
	for l := range wave {
		copy(a[l][:], tile[(l%16)*mfmaN+4*(l/16):])
	}
	return a
}

func (b *bwdInputs) visible(qp, kp int) bool { return !b.causal || kp <= qp }

func (b *bwdInputs) dkdv(key0 int, dk, dv Grad, kRows []int) {
	d := b.d
	var ka, va [MFMAMaxD / 16][wave]bf16x4
	var accK, accV [MFMAMaxD / 16][wave]f32x4
	for t := 0; 16*t < d; t++ {
		ka[t], va[t] = operandA(b.k, key0, b.nk, d, 16*t), operandA(b.v, key0, b.nk, d, 16*t)
	}
	for q0 := 0; q0 < b.nq; q0 += mfmaM {
		qs, dos := stage(b.q, q0, b.nq, d), stage(b.do, q0, b.nq, d)
		var st, dpt [wave]f32x4
		for t := 0; 16*t < d; t++ {
			qb, db := rowsB(qs, d, 16*t), rowsB(dos, d, 16*t)
			st = mfma16x16x16bf16(&ka[t], &qb, &st)
			dpt = mfma16x16x16bf16(&va[t], &db, &dpt)
		}
		var pts, dsts [mfmaM * mfmaN]uint16
		for l := range wave {
			col, grp := l%16, l/16
			qr := q0 + col
			for i := range 4 {
				kr := key0 + 4*grp + i
				var p float32
				if kr < b.nk && qr < b.nq && !math.IsInf(float64(b.lse[qr]), -1) && b.visible(b.qPos[qr], b.kPos[kr]) {
					p = float32(math.Exp(float64(st[l][i]*b.scale - b.lse[qr])))
				}
				var dl float32
				if qr < b.nq {
					dl = b.delta[qr]
				}
				pts[(4*grp+i)*mfmaN+col] = mfma.BF16(p)
				dsts[(4*grp+i)*mfmaN+col] = mfma.BF16(p * (dpt[l][i] - dl))
			}
		}
		pa, dsa := transposeA(&pts), transposeA(&dsts)
		for t := 0; 16*t < d; t++ {
			dob, qb := colsB(dos, d, t), colsB(qs, d, t)
			accV[t] = mfma16x16x16bf16(&pa, &dob, &accV[t])
			accK[t] = mfma16x16x16bf16(&dsa, &qb, &accK[t])
		}
	}
	for l := range wave {
		for i := range 4 {
			r := key0 + 4*(l/16) + i
			if r >= b.nk {
				continue
			}
			for t := 0; 16*t < d; t++ {
				c := 16*t + l%16
				dk.Row(kRows[r])[c] += float64(accK[t][l][i] * b.scale)
				dv.Row(kRows[r])[c] += float64(accV[t][l][i])
			}
		}
	}
}

func (b *bwdInputs) dq(q0 int, dq Grad, qRows []int) {
	d := b.d
	var qa, da [MFMAMaxD / 16][wave]bf16x4
	var acc [MFMAMaxD / 16][wave]f32x4
	for t := 0; 16*t < d; t++ {
		qa[t], da[t] = operandA(b.q, q0, b.nq, d, 16*t), operandA(b.do, q0, b.nq, d, 16*t)
	}
	for k0 := 0; k0 < b.nk; k0 += mfmaN {
		ks, vs := stage(b.k, k0, b.nk, d), stage(b.v, k0, b.nk, d)
		var s, dp [wave]f32x4
		for t := 0; 16*t < d; t++ {
			kb, vb := rowsB(ks, d, 16*t), rowsB(vs, d, 16*t)
			s = mfma16x16x16bf16(&qa[t], &kb, &s)
			dp = mfma16x16x16bf16(&da[t], &vb, &dp)
		}
		var dss [mfmaM * mfmaN]uint16
		for l := range wave {
			col, grp := l%16, l/16
			kr := k0 + col
			for i := range 4 {
				qr := q0 + 4*grp + i
				var p, dl float32
				if qr < b.nq {
					dl = b.delta[qr]
					if kr < b.nk && !math.IsInf(float64(b.lse[qr]), -1) && b.visible(b.qPos[qr], b.kPos[kr]) {
						p = float32(math.Exp(float64(s[l][i]*b.scale - b.lse[qr])))
					}
				}
				dss[(4*grp+i)*mfmaN+col] = mfma.BF16(p * (dp[l][i] - dl))
			}
		}
		dsa := transposeA(&dss)
		for t := 0; 16*t < d; t++ {
			kb := colsB(ks, d, t)
			acc[t] = mfma16x16x16bf16(&dsa, &kb, &acc[t])
		}
	}
	for l := range wave {
		for i := range 4 {
			r := q0 + 4*(l/16) + i
			if r >= b.nq {
				continue
			}
			for t := 0; 16*t < d; t++ {
				dq.Row(qRows[r])[16*t+l%16] += float64(acc[t][l][i] * b.scale)
			}
		}
	}
}
