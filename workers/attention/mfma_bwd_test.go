package attention

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
)

// refOut is the float64 reference's output as float32 and its LSE: what the forward hands the
// backward.
func refOut(q, k, v Matrix, causal bool, scale float64) (Matrix, []float64) {
	out, lse := Reference(q, k, v, causal, scale)
	o := NewMatrix(q.Rows, v.Cols)
	for i := range out {
		for c := range out[i] {
			o.Row(i)[c] = float32(out[i][c])
		}
	}
	return o, lse
}

// checkGrads compares gradients with the float64 reference's: within 2% of the largest
// reference value (P and dS enter their products as bfloat16: 2^-8 relative each).
func checkGrads(t *testing.T, what string, got, want []Grad) {
	t.Helper()
	for g, name := range []string{"dq", "dk", "dv"} {
		var worst, top float64
		for i := range want[g].Data {
			top = math.Max(top, math.Abs(want[g].Data[i]))
			worst = math.Max(worst, math.Abs(got[g].Data[i]-want[g].Data[i]))
		}
		if worst > 2e-2*top || math.IsNaN(worst) {
			t.Errorf("%s: %s off by up to %.3g (largest value %.3g)", what, name, worst, top)
		} else {
			t.Logf("%s: %s largest error %.2g of %.3g", what, name, worst, top)
		}
	}
}

// The MFMA backward kernels' steps, run on the CPU, give attention's gradients within
// bfloat16's precision: several shapes (partial tiles, head dimensions 16 to 128), causal or
// not, against the float64 reference.
func TestMFMABackwardMatchesTheFloat64Reference(t *testing.T) {
	r := rand.New(rand.NewPCG(17, 19))
	for _, c := range []struct{ n, d int }{{1, 16}, {16, 16}, {17, 32}, {53, 64}, {64, 128}, {100, 48}} {
		for _, causal := range []bool{false, true} {
			q, k, v := RoundBF16(randomMatrix(r, c.n, c.d, 2)), RoundBF16(randomMatrix(r, c.n, c.d, 2)), RoundBF16(randomMatrix(r, c.n, c.d, 1))
			dout := RoundBF16(randomMatrix(r, c.n, c.d, 1))
			scale := 1 / math.Sqrt(float64(c.d))
			out, lse := refOut(q, k, v, causal, scale)
			dq, dk, dv := NewGrad(c.n, c.d), NewGrad(c.n, c.d), NewGrad(c.n, c.d)
			if err := BackwardMFMA(q, k, v, out, dout, lse, seq(c.n), seq(c.n), causal, scale, dq, seq(c.n), dk, dv, seq(c.n)); err != nil {
				t.Fatal(err)
			}
			wq, wk, wv := FullBackward(q, k, v, dout, causal, scale)
			checkGrads(t, fmt.Sprintf("n=%d d=%d causal=%v", c.n, c.d, causal),
				[]Grad{dq, dk, dv}, []Grad{wq, wk, wv})
		}
	}
}

// Zigzag ring blocks: every rank's query block against every rank's key block, each with the
// global output and LSE, summed into the blocks' rows, give the full causal gradients; rows
// of a block that see none of the other block's keys get nothing from it.
func TestMFMABackwardRingBlocksSumToTheFullGradients(t *testing.T) {
	r := rand.New(rand.NewPCG(23, 29))
	const p, blk, d = 4, 12, 32 // 8 blocks of 12 tokens
	n := 2 * p * blk
	q, k, v := RoundBF16(randomMatrix(r, n, d, 2)), RoundBF16(randomMatrix(r, n, d, 2)), RoundBF16(randomMatrix(r, n, d, 1))
	dout := RoundBF16(randomMatrix(r, n, d, 1))
	scale := 1 / math.Sqrt(d)
	out, lse := refOut(q, k, v, true, scale)
	rows := func(rank int) []int { return zigzagRows(p, blk, rank) }
	dq, dk, dv := NewGrad(n, d), NewGrad(n, d), NewGrad(n, d)
	for qr := range p {
		qi := rows(qr)
		ql := make([]float64, len(qi))
		for i, row := range qi {
			ql[i] = lse[row]
		}
		for kr := range p {
			ki := rows((qr + kr) % p)
			err := BackwardMFMA(q.SelectRows(qi), k.SelectRows(ki), v.SelectRows(ki), out.SelectRows(qi), dout.SelectRows(qi), ql,
				qi, ki, true, scale, dq, qi, dk, dv, ki)
			if err != nil {
				t.Fatal(err)
			}
		}
	}
	wq, wk, wv := FullBackward(q, k, v, dout, true, scale)
	checkGrads(t, "ring of 4", []Grad{dq, dk, dv}, []Grad{wq, wk, wv})
}

func TestMFMABackwardRefusesWhatTheKernelCannotHold(t *testing.T) {
	for _, d := range []int{0, 8, 24, MFMAMaxD + 16} {
		m, g := NewMatrix(4, d), NewGrad(4, d)
		if err := BackwardMFMA(m, m, m, m, m, make([]float64, 4), seq(4), seq(4), false, 1, g, seq(4), g, g, seq(4)); err == nil {
			t.Errorf("head dimension %d accepted", d)
		}
	}
}

// Queries that see no key (a ring block of later keys under the causal mask) have LSE -Inf:
// they get no gradient and give none, in the kernels' rendition as in the reference.
func TestMFMABackwardRowsThatSeeNoKey(t *testing.T) {
	r := rand.New(rand.NewPCG(67, 71))
	const nq, nk, d = 20, 18, 32
	q, k, v := RoundBF16(randomMatrix(r, nq, d, 2)), RoundBF16(randomMatrix(r, nk, d, 2)), RoundBF16(randomMatrix(r, nk, d, 1))
	dout := RoundBF16(randomMatrix(r, nq, d, 1))
	qPos, kPos := seq(nq), make([]int, nk)
	for j := range kPos {
		kPos[j] = j + 5 // queries 0-4 see none of these keys
	}
	scale := 1 / math.Sqrt(d)
	fwd, err := Forward(q, k, v, qPos, kPos, true, scale)
	if err != nil {
		t.Fatal(err)
	}
	if !math.IsInf(fwd.LSE[0], -1) || !math.IsInf(fwd.LSE[4], -1) || math.IsInf(fwd.LSE[5], -1) {
		t.Fatalf("LSE %v: the mask does not hide the keys from queries 0-4 only", fwd.LSE[:6])
	}
	want := []Grad{NewGrad(nq, d), NewGrad(nk, d), NewGrad(nk, d)}
	if err := Backward(q, k, v, fwd.Out, dout, fwd.LSE, qPos, kPos, true, scale, want[0], seq(nq), want[1], want[2], seq(nk)); err != nil {
		t.Fatal(err)
	}
	got := []Grad{NewGrad(nq, d), NewGrad(nk, d), NewGrad(nk, d)}
	if err := BackwardMFMA(q, k, v, fwd.Out, dout, fwd.LSE, qPos, kPos, true, scale, got[0], seq(nq), got[1], got[2], seq(nk)); err != nil {
		t.Fatal(err)
	}
	for i := range 5 {
		for _, x := range got[0].Row(i) {
			if x != 0 {
				t.Fatalf("query %d sees no key but has a gradient", i)
			}
		}
	}
	checkGrads(t, "rows without keys", got, want)
}
