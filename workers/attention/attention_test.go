package attention

import (
	"math"
	"math/rand/v2"
	"testing"
)

// tolerance for fp32 outputs against the float64 reference (worker-math: fp32 tight).
const tol = 1e-5

func randomMatrix(r *rand.Rand, rows, cols int, scale float32) Matrix {
	m := NewMatrix(rows, cols)
	for i := range m.Data {
		m.Data[i] = (r.Float32()*2 - 1) * scale
	}
	return m
}

func close64(a, b float64) bool {
	return math.Abs(a-b) <= tol*(1+math.Abs(b))
}

func TestForwardMatchesReference(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for _, c := range []struct{ n, d int }{{1, 1}, {5, 3}, {17, 8}, {33, 64}} {
		for _, causal := range []bool{false, true} {
			q, k, v := randomMatrix(r, c.n, c.d, 1), randomMatrix(r, c.n, c.d, 1), randomMatrix(r, c.n, c.d, 1)
			scale := 1 / math.Sqrt(float64(c.d))
			got, err := Forward(q, k, v, seq(c.n), seq(c.n), causal, scale)
			if err != nil {
				t.Fatal(err)
			}
			want, wantLSE := Reference(q, k, v, causal, scale)
			for i := range c.n {
				if !close64(got.LSE[i], wantLSE[i]) {
					t.Fatalf("n=%d d=%d causal=%v: lse[%d] = %v, want %v", c.n, c.d, causal, i, got.LSE[i], wantLSE[i])
				}
				for j := range c.d {
					if g := float64(got.Out.Row(i)[j]); !close64(g, want[i][j]) {
						t.Fatalf("n=%d d=%d causal=%v: out[%d][%d] = %v, want %v", c.n, c.d, causal, i, j, g, want[i][j])
					}
				}
			}
		}
	}
}

// Splitting the keys into blocks and merging the partial results gives full attention, in
// any order: the property ring attention rests on.
func TestBlocksMergeToFullAttention(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	const n, d = 24, 16
	q, k, v := randomMatrix(r, n, d, 2), randomMatrix(r, n, d, 2), randomMatrix(r, n, d, 2)
	scale := 1 / math.Sqrt(d)
	want, wantLSE := Reference(q, k, v, true, scale)
	for _, order := range [][]int{{0, 1, 2}, {2, 0, 1}, {1, 2, 0}} {
		acc := EmptyPartial(n, d)
		for _, b := range order {
			rows := seq(8)
			for i := range rows {
				rows[i] += 8 * b
			}
			part, err := Forward(q, k.SelectRows(rows), v.SelectRows(rows), seq(n), rows, true, scale)
			if err != nil {
				t.Fatal(err)
			}
			Merge(&acc, part, seq(n))
		}
		for i := range n {
			if !close64(acc.LSE[i], wantLSE[i]) {
				t.Fatalf("order %v: lse[%d] = %v, want %v", order, i, acc.LSE[i], wantLSE[i])
			}
			for j := range d {
				if g := float64(acc.Out.Row(i)[j]); !close64(g, want[i][j]) {
					t.Fatalf("order %v: out[%d][%d] = %v, want %v", order, i, j, g, want[i][j])
				}
			}
		}
	}
}

func TestMergeRowEdges(t *testing.T) {
	inf := math.Inf(1)
	cases := []struct {
		name       string
		a          []float32
		lseA       float64
		b          []float32
		lseB       float64
		want       []float32
		wantLSE    float64
		wantLSENaN bool
	}{
		{"both saw nothing", []float32{0, 0}, -inf, []float32{0, 0}, -inf, []float32{0, 0}, -inf, false},
		{"only b saw keys", []float32{0, 0}, -inf, []float32{1, 2}, 3, []float32{1, 2}, 3, false},
		{"only a saw keys", []float32{1, 2}, 3, []float32{9, 9}, -inf, []float32{1, 2}, 3, false},
		{"equal weights average", []float32{0, 4}, 0, []float32{2, 0}, 0, []float32{1, 2}, math.Log(2), false},
		{"huge scores do not overflow", []float32{1, 0}, 1e30, []float32{0, 1}, 1e30, []float32{0.5, 0.5}, 1e30 + math.Log(2), false},
		{"a dominant side wins outright", []float32{1, 0}, 1e6, []float32{0, 1}, -1e6, []float32{1, 0}, 1e6, false},
		{"tiny against huge", []float32{1, 0}, -800, []float32{0, 1}, 800, []float32{0, 1}, 800, false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			o := append([]float32(nil), c.a...)
			lse := MergeRow(o, c.lseA, c.b, c.lseB)
			if math.IsNaN(lse) || (lse != c.wantLSE && !close64(lse, c.wantLSE)) {
				t.Errorf("lse = %v, want %v", lse, c.wantLSE)
			}
			for i := range o {
				if math.IsNaN(float64(o[i])) || !close64(float64(o[i]), float64(c.want[i])) {
					t.Errorf("out = %v, want %v", o, c.want)
					break
				}
			}
		})
	}
}

func TestFullyMaskedRowsContributeNothing(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 6))
	q, k, v := randomMatrix(r, 2, 4, 1), randomMatrix(r, 3, 4, 1), randomMatrix(r, 3, 4, 1)
	// Query at position 0 against keys at 5..7: masked out entirely.
	p, err := Forward(q, k, v, []int{0, 9}, []int{5, 6, 7}, true, 0.5)
	if err != nil {
		t.Fatal(err)
	}
	if !math.IsInf(p.LSE[0], -1) || p.Out.Row(0)[0] != 0 {
		t.Errorf("fully masked row: lse %v out %v, want -Inf and zeros", p.LSE[0], p.Out.Row(0))
	}
	if math.IsInf(p.LSE[1], 0) || math.IsNaN(p.LSE[1]) {
		t.Errorf("visible row: lse %v", p.LSE[1])
	}
}

func TestForwardRefusesMismatchedShapes(t *testing.T) {
	if _, err := Forward(NewMatrix(2, 4), NewMatrix(3, 5), NewMatrix(3, 4), seq(2), seq(3), false, 1); err == nil {
		t.Error("q and k of different widths were accepted")
	}
}
