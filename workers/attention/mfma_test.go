package attention

import (
	"math"
	"math/rand/v2"
	"testing"
)

// The MFMA kernel's steps, run on the CPU, give attention within bfloat16's precision: the
// whole sequence against the float64 reference, several shapes (partial tiles, head
// dimensions 16 to 128), causal or not. The inputs are rounded to bfloat16 first, so what is
// left is the kernel's own error (fp32 sums, bf16 softmax weights).
func TestMFMAForwardMatchesTheFloat64Reference(t *testing.T) {
	r := rand.New(rand.NewPCG(7, 11))
	for _, c := range []struct{ n, d int }{{1, 16}, {16, 16}, {17, 32}, {53, 64}, {64, 128}, {100, 48}} {
		for _, causal := range []bool{false, true} {
			q, k, v := RoundBF16(randomMatrix(r, c.n, c.d, 2)), RoundBF16(randomMatrix(r, c.n, c.d, 2)), RoundBF16(randomMatrix(r, c.n, c.d, 1))
			scale := 1 / math.Sqrt(float64(c.d))
			got, err := ForwardMFMA(q, k, v, seq(c.n), seq(c.n), causal, scale)
			if err != nil {
				t.Fatal(err)
			}
			want, wantLSE := Reference(q, k, v, causal, scale)
			checkMFMA(t, c.n, c.d, causal, got, want, wantLSE)
		}
	}
}

// Zigzag ring blocks: each rank holds blocks r and 2P-1-r of the sequence; a query block
// against another rank's key block (some rows see none of it) and the merge of every rank's
// block give full causal attention.
func TestMFMAForwardRingBlocksMergeToFullAttention(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 5))
	const p, blk, d = 4, 12, 64 // 8 blocks of 12 tokens
	n := 2 * p * blk
	q, k, v := RoundBF16(randomMatrix(r, n, d, 2)), RoundBF16(randomMatrix(r, n, d, 2)), RoundBF16(randomMatrix(r, n, d, 1))
	scale := 1 / math.Sqrt(d)
	want, wantLSE := Reference(q, k, v, true, scale)
	rows := func(rank int) []int { return zigzagRows(p, blk, rank) }
	for qr := range p {
		qi := rows(qr)
		acc := EmptyPartial(len(qi), d)
		for kr := range p {
			ki := rows((qr + kr) % p) // the order a ring brings them in
			part, err := ForwardMFMA(q.SelectRows(qi), k.SelectRows(ki), v.SelectRows(ki), qi, ki, true, scale)
			if err != nil {
				t.Fatal(err)
			}
			Merge(&acc, part, seq(len(qi)))
		}
		w, wl := make([][]float64, len(qi)), make([]float64, len(qi))
		for i, row := range qi {
			w[i], wl[i] = want[row], wantLSE[row]
		}
		checkMFMA(t, len(qi), d, true, acc, w, wl)
	}
}

func TestMFMAForwardRefusesWhatTheKernelCannotHold(t *testing.T) {
	for _, d := range []int{0, 8, 24, MFMAMaxD + 16} {
		m := NewMatrix(4, d)
		if _, err := ForwardMFMA(m, m, m, seq(4), seq(4), false, 1); err == nil {
			t.Errorf("head dimension %d accepted", d)
		}
	}
}

// checkMFMA compares against float64: outputs within 1% of the values' range (softmax
// weights in bfloat16 carry 2^-8 relative error), LSE within 1e-4 (sums in float32).
func checkMFMA(t *testing.T, n, d int, causal bool, got Partial, want [][]float64, wantLSE []float64) {
	t.Helper()
	var worst float64
	for i := range n {
		if math.Abs(got.LSE[i]-wantLSE[i]) > 1e-4*(1+math.Abs(wantLSE[i])) {
			t.Fatalf("n=%d d=%d causal=%v: lse[%d] = %v, want %v", n, d, causal, i, got.LSE[i], wantLSE[i])
		}
		for j := range d {
			e := math.Abs(float64(got.Out.Row(i)[j]) - want[i][j])
			worst = math.Max(worst, e)
			if e > 1e-2 {
				t.Fatalf("n=%d d=%d causal=%v: out[%d][%d] = %v, want %v", n, d, causal, i, j, got.Out.Row(i)[j], want[i][j])
			}
		}
	}
	t.Logf("n=%d d=%d causal=%v: largest output error %.2g", n, d, causal, worst)
}

// zigzagRows are the sequence rows rank holds in a zigzag ring of p ranks with blocks of blk
// tokens: blocks rank and 2p-1-rank.
func zigzagRows(p, blk, rank int) []int {
	var idx []int
	for _, b := range []int{rank, 2*p - 1 - rank} {
		for i := range blk {
			idx = append(idx, b*blk+i)
		}
	}
	return idx
}
