package mfma

import "fmt"

// The GEMM kernel's tiles (ZAYA_GEMM_* in workers/hip/gemm_mfma.hip).
const (
	gemmTile = 64 // C rows and columns per work-group
	gemmKT   = 32 // K per staged slice
)

// Operand is a row-major bf16 matrix as the GEMM kernel reads it: Rows x Cols stored with
// leading dimension LD (at least Cols); Trans makes it stand for its transpose.
type Operand struct {
	Data           []uint16
	Rows, Cols, LD int
	Trans          bool
}

// at is element (r, c) of the operand as used (transposed or not), zero outside it.
func (o Operand) at(r, c int) uint16 {
	rows, cols := o.Rows, o.Cols
	if o.Trans {
		rows, cols = cols, rows
	}
	if r >= rows || c >= cols {
		return 0
	}
	if o.Trans {
		return o.Data[c*o.LD+r]
	}
	return o.Data[r*o.LD+c]
}

// shape is the operand's shape as used.
func (o Operand) shape() (int, int) {
	if o.Trans {
		return o.Cols, o.Rows
	}
	return o.Rows, o.Cols
}

// GEMM is zaya_gemm_mfma on the CPU, lane by lane: c (m x n, leading dimension ldc) = a b,
// or += with accumulate, where a and b are the operands as used (m x k and k x n). Each
// element of c is one lane's fixed-order float32 sum over K in slices of 32, 16 at a time.
func GEMM(a, b Operand, c []float32, ldc int, accumulate bool) error {
	m, k := a.shape()
	kb, n := b.shape()
	if k != kb || ldc < n || len(c) < (m-1)*ldc+n || a.LD < a.Cols || b.LD < b.Cols ||
		len(a.Data) < (a.Rows-1)*a.LD+a.Cols || len(b.Data) < (b.Rows-1)*b.LD+b.Cols {
		return fmt.Errorf("mfma: GEMM of %dx%d by %dx%d into %d values (ldc %d) does not fit", m, k, kb, n, len(c), ldc)
	}
	var as, bs [gemmTile][gemmKT]uint16 // [m][k] and B^T [n][k]
	for m0 := 0; m0 < m; m0 += gemmTile {
		for n0 := 0; n0 < n; n0 += gemmTile {
			var acc [4][2][2][Wave]F32x4 // per wavefront
			for k0 := 0; k0 < k; k0 += gemmKT {
				for r := range gemmTile {
					for kk := range gemmKT {
						as[r][kk] = a.at(m0+r, k0+kk)
						bs[r][kk] = b.at(k0+kk, n0+r)
					}
				}
				for w := range 4 {
					wm, wn := 32*(w/2), 32*(w%2)
					for kk := 0; kk < gemmKT; kk += 16 {
						var fa, fb [2][Wave]BF16x4
						for i := range 2 {
							for l := range Wave {
								copy(fa[i][l][:], as[wm+16*i+l%16][kk+4*(l/16):])
								copy(fb[i][l][:], bs[wn+16*i+l%16][kk+4*(l/16):])
							}
						}
						for i := range 2 {
							for j := range 2 {
								acc[w][i][j] = Mul(&fa[i], &fb[j], &acc[w][i][j])
							}
						}
					}
				}
			}
			for w := range 4 {
				wm, wn := 32*(w/2), 32*(w%2)
				for i := range 2 {
					for j := range 2 {
						for l := range Wave {
							for v := range 4 {
								r, cc := m0+wm+16*i+4*(l/16)+v, n0+wn+16*j+l%16
								if r >= m || cc >= n {
									continue
								}
								if accumulate {
									c[r*ldc+cc] += acc[w][i][j][l][v]
								} else {
									c[r*ldc+cc] = acc[w][i][j][l][v]
								}
							}
						}
					}
				}
			}
		}
	}
	return nil
}
