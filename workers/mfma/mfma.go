// Package mfma emulates, on the CPU, what the gfx942 kernels of workers/hip do on MI300X's
// matrix cores: bfloat16 rounding as the kernels round, and v_mfma_f32_16x16x16_bf16 over a
// wavefront with AMD's documented lane layout. The kernels' Go renditions (attention in
// workers/attention, the GEMM here) run their steps lane by lane through it, so CI checks the
// kernels' index arithmetic and numerics without an AMD GPU.
package mfma

import "math"

// Wave is a gfx942 wavefront's lane count.
const Wave = 64

// BF16x4 is one lane's A or B operand of the 16x16x16 instruction.
type BF16x4 [4]uint16

// F32x4 is one lane's accumulator (C, D) of the 16x16x16 instruction.
type F32x4 [4]float32

// BF16 rounds f to bfloat16 (nearest, ties to even), as the kernels' f32_to_bf16; Inf keeps
// its top half, a NaN stays a NaN (quiet) even when its payload is in the low half.
func BF16(f float32) uint16 {
	u := math.Float32bits(f)
	if u&0x7f800000 == 0x7f800000 {
		if u&0x007fffff != 0 {
			return uint16(u>>16) | 0x0040
		}
		return uint16(u >> 16)
	}
	u += 0x7fff + (u>>16)&1
	return uint16(u >> 16)
}

// BF16s is x rounded to bfloat16, as the kernels take their operands.
func BF16s(x []float32) []uint16 {
	out := make([]uint16, len(x))
	for i, v := range x {
		out[i] = BF16(v)
	}
	return out
}

// FromBF16 widens a bfloat16 to float32.
func FromBF16(h uint16) float32 { return math.Float32frombits(uint32(h) << 16) }

// Mul is v_mfma_f32_16x16x16_bf16 over a wavefront: lane l holds A[l%16][4(l/16)+j],
// B[4(l/16)+j][l%16] and C, D[4(l/16)+i][l%16]; D = C + A B, accumulated in float32.
func Mul(a, b *[Wave]BF16x4, c *[Wave]F32x4) [Wave]F32x4 {
	var am, bm [16][16]float32
	for l := range Wave {
		for j := range 4 {
			am[l%16][4*(l/16)+j] = FromBF16(a[l][j])
			bm[4*(l/16)+j][l%16] = FromBF16(b[l][j])
		}
	}
	var d [Wave]F32x4
	for l := range Wave {
		for i := range 4 {
			m, n := 4*(l/16)+i, l%16
			acc := c[l][i]
			for k := range 16 {
				acc += am[m][k] * bm[k][n]
			}
			d[l][i] = acc
		}
	}
	return d
}
