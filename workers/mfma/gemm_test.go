package mfma

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
)

func randomBF16(r *rand.Rand, n int) []uint16 {
	out := make([]uint16, n)
	for i := range out {
		out[i] = BF16(r.Float32()*2 - 1)
	}
	return out
}

// The GEMM kernel's steps, run on the CPU, against float64 products of the same bf16 inputs:
// every transpose combination, shapes with partial tiles and K not a multiple of 32, padded
// leading dimensions, and accumulation into C. What is left is fp32 summation error.
func TestGEMMMatchesFloat64(t *testing.T) {
	r := rand.New(rand.NewPCG(31, 37))
	for _, s := range []struct{ m, n, k int }{{1, 1, 1}, {16, 16, 16}, {64, 64, 32}, {65, 70, 33}, {100, 37, 130}, {8, 200, 64}} {
		for _, ta := range []bool{false, true} {
			for _, tb := range []bool{false, true} {
				t.Run(fmt.Sprintf("%dx%dx%d ta=%v tb=%v", s.m, s.n, s.k, ta, tb), func(t *testing.T) {
					a := Operand{Rows: s.m, Cols: s.k, Trans: ta}
					if ta {
						a.Rows, a.Cols = s.k, s.m
					}
					a.LD = a.Cols + 3
					a.Data = randomBF16(r, a.Rows*a.LD)
					b := Operand{Rows: s.k, Cols: s.n, Trans: tb}
					if tb {
						b.Rows, b.Cols = s.n, s.k
					}
					b.LD = b.Cols
					b.Data = randomBF16(r, b.Rows*b.LD)
					ldc := s.n + 5
					c := make([]float32, s.m*ldc)
					for i := range c {
						c[i] = float32(i % 7)
					}
					if err := GEMM(a, b, c, ldc, true); err != nil {
						t.Fatal(err)
					}
					var worst float64
					for i := range s.m {
						for j := range s.n {
							want := float64(((i*ldc + j) % 7))
							for x := range s.k {
								want += float64(FromBF16(a.at(i, x))) * float64(FromBF16(b.at(x, j)))
							}
							e := math.Abs(float64(c[i*ldc+j]) - want)
							worst = math.Max(worst, e)
							if e > 1e-5*float64(s.k+8) {
								t.Fatalf("c[%d][%d] = %v, want %v", i, j, c[i*ldc+j], want)
							}
						}
						for j := s.n; j < ldc && i < s.m-1; j++ {
							if c[i*ldc+j] != float32((i*ldc+j)%7) {
								t.Fatalf("c[%d][%d] past n was written", i, j)
							}
						}
					}
					t.Logf("largest error %.2g", worst)
				})
			}
		}
	}
}

func TestGEMMRefusesMisfits(t *testing.T) {
	a := Operand{Data: make([]uint16, 12), Rows: 3, Cols: 4, LD: 4}
	b := Operand{Data: make([]uint16, 10), Rows: 5, Cols: 2, LD: 2}
	if err := GEMM(a, b, make([]float32, 6), 2, false); err == nil {
		t.Error("K of 4 against 5 accepted")
	}
	b = Operand{Data: make([]uint16, 8), Rows: 4, Cols: 2, LD: 2}
	if err := GEMM(a, b, make([]float32, 5), 2, false); err == nil {
		t.Error("a C of 5 values for 3x2 accepted")
	}
	short := Operand{Data: make([]uint16, 7), Rows: 4, Cols: 2, LD: 2}
	if err := GEMM(a, short, make([]float32, 6), 2, false); err == nil {
		t.Error("a B of 7 values for 4x2 accepted")
	}
}

// Without accumulate, C is overwritten, whatever it held (NaN included), and nothing past n.
func TestGEMMOverwrites(t *testing.T) {
	r := rand.New(rand.NewPCG(73, 79))
	a := Operand{Data: randomBF16(r, 17*20), Rows: 17, Cols: 20, LD: 20}
	b := Operand{Data: randomBF16(r, 20*9), Rows: 20, Cols: 9, LD: 9}
	const ldc = 10
	c := make([]float32, 17*ldc)
	for i := range c {
		c[i] = float32(math.NaN())
	}
	if err := GEMM(a, b, c, ldc, false); err != nil {
		t.Fatal(err)
	}
	for i := range 17 {
		for j := range ldc {
			x := c[i*ldc+j]
			if j < 9 && math.IsNaN(float64(x)) {
				t.Fatalf("c[%d][%d] kept its old value", i, j)
			}
			if j == 9 && !math.IsNaN(float64(x)) {
				t.Fatalf("c[%d][%d] past n was written", i, j)
			}
		}
	}
}
