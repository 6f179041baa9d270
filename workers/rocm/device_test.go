//go:build rocm && cgo

package rocm_test

import (
	"math"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/zaya-operator/zaya-operator/workers/mfma"
	"github.com/zaya-operator/zaya-operator/workers/model"
	"github.com/zaya-operator/zaya-operator/workers/rocm"
)

func openDevice(t *testing.T) *rocm.Device {
	t.Helper()
	libs, kdir := setup(t)
	d, err := rocm.OpenDevice(libs, kdir, 0)
	if err != nil {
		t.Fatal(err)
	}
	return d
}

func alloc(t *testing.T, d *rocm.Device, bytes int) *rocm.Buffer {
	t.Helper()
	b, err := d.Alloc(bytes)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = b.Free() })
	return b
}

// The GEMM on device buffers (kept, not copied per call) against the kernel's lane-by-lane
// rendition: every transpose pair, partial tiles, padded leading dimensions, accumulation.
func TestDeviceGEMMMatchesTheKernelsRendition(t *testing.T) {
	d := openDevice(t)
	r := rand.New(rand.NewPCG(41, 43))
	const m, n, k = 65, 70, 33
	for _, ta := range []bool{false, true} {
		for _, tb := range []bool{false, true} {
			a := mfma.Operand{Rows: m, Cols: k, Trans: ta}
			if ta {
				a.Rows, a.Cols = k, m
			}
			a.LD = a.Cols + 2
			b := mfma.Operand{Rows: k, Cols: n, Trans: tb}
			if tb {
				b.Rows, b.Cols = n, k
			}
			b.LD = b.Cols
			for _, o := range []*mfma.Operand{&a, &b} {
				o.Data = make([]uint16, o.Rows*o.LD)
				for i := range o.Data {
					o.Data[i] = mfma.BF16(r.Float32()*2 - 1)
				}
			}
			ldc := n + 1
			c := make([]float32, m*ldc)
			for i := range c {
				c[i] = float32(i%5) - 2
			}
			want := append([]float32(nil), c...)
			if err := mfma.GEMM(a, b, want, ldc, true); err != nil {
				t.Fatal(err)
			}
			ab, bb, cb := alloc(t, d, 2*len(a.Data)), alloc(t, d, 2*len(b.Data)), alloc(t, d, 4*len(c))
			for _, err := range []error{ab.WriteU16(a.Data), bb.WriteU16(b.Data), cb.WriteF32(c)} {
				if err != nil {
					t.Fatal(err)
				}
			}
			err := d.GEMM(rocm.Matrix{Buf: ab, Rows: a.Rows, Cols: a.Cols, LD: a.LD, Trans: ta},
				rocm.Matrix{Buf: bb, Rows: b.Rows, Cols: b.Cols, LD: b.LD, Trans: tb},
				rocm.Matrix{Buf: cb, Rows: m, Cols: n, LD: ldc}, true)
			if err != nil {
				t.Fatal(err)
			}
			got := make([]float32, len(c))
			if err := cb.ReadF32(got); err != nil {
				t.Fatal(err)
			}
			for i := range got {
				if math.Abs(float64(got[i]-want[i])) > 1e-5*(1+math.Abs(float64(want[i]))) {
					t.Fatalf("ta=%v tb=%v: c[%d] = %v, the kernel's rendition %v", ta, tb, i, got[i], want[i])
				}
			}
		}
	}
}

// A matrix that overruns its buffer or shapes that do not chain are refused before any
// kernel runs: the kernels trust their arguments.
func TestDeviceGEMMRefusesWhatDoesNotFit(t *testing.T) {
	d := openDevice(t)
	small, big := alloc(t, d, 2*16*16), alloc(t, d, 4*64*64)
	for _, c := range []struct {
		name    string
		a, b, c rocm.Matrix
		wants   string
	}{
		{"a overruns", rocm.Matrix{Buf: small, Rows: 17, Cols: 16, LD: 16}, rocm.Matrix{Buf: small, Rows: 16, Cols: 16, LD: 16},
			rocm.Matrix{Buf: big, Rows: 17, Cols: 16, LD: 16}, "overruns its buffer"},
		{"K differs", rocm.Matrix{Buf: small, Rows: 8, Cols: 16, LD: 16}, rocm.Matrix{Buf: small, Rows: 8, Cols: 16, LD: 16},
			rocm.Matrix{Buf: big, Rows: 8, Cols: 16, LD: 16}, "GEMM of 8x16 by 8x16"},
		{"leading dimension short", rocm.Matrix{Buf: small, Rows: 4, Cols: 16, LD: 8}, rocm.Matrix{Buf: small, Rows: 16, Cols: 4, LD: 4},
			rocm.Matrix{Buf: big, Rows: 4, Cols: 4, LD: 4}, "leading dimension 8"},
	} {
		if err := d.GEMM(c.a, c.b, c.c, false); err == nil || !strings.Contains(err.Error(), c.wants) {
			t.Errorf("%s: %v, want %q", c.name, err, c.wants)
		}
	}
	if err := small.WriteF32(make([]float32, 129)); err == nil {
		t.Error("a write past the buffer's end was accepted")
	}
}

// AdamW with its state on the device follows the model's host AdamW (fp32 on the device,
// float64 on the host) over several steps, weight decay only where the model says, and the
// masters cast to bf16 round as the host rounds.
func TestDeviceAdamWFollowsTheModel(t *testing.T) {
	d := openDevice(t)
	s := model.Shape{Vocab: 8, Dim: 4, Layers: 1, Heads: 2, FFN: 8}
	n := s.NumParams()
	r := rand.New(rand.NewPCG(47, 53))
	hostP := s.Init(3)
	hostM, hostV := make([]float32, n), make([]float32, n)
	decay := make([]byte, n)
	for i := range decay {
		if s.Decays(i) {
			decay[i] = 1
		}
	}
	bufs := make([]*rocm.Buffer, 4)
	for i := range bufs {
		bufs[i] = alloc(t, d, 4*n)
	}
	p, m, v, g := bufs[0], bufs[1], bufs[2], bufs[3]
	db := alloc(t, d, n)
	for _, err := range []error{p.WriteF32(hostP), m.WriteF32(hostM), v.WriteF32(hostV), db.WriteBytes(decay)} {
		if err != nil {
			t.Fatal(err)
		}
	}
	opt := model.DefaultAdamW(0.01)
	for step := int64(1); step <= 5; step++ {
		grad := make([]float64, n)
		g32 := make([]float32, n)
		var ss float64
		for i := range grad {
			g32[i] = float32(r.NormFloat64() * 0.5)
			grad[i] = float64(g32[i])
			ss += grad[i] * grad[i]
		}
		if err := opt.Update(s, hostP, hostM, hostV, grad, step); err != nil {
			t.Fatal(err)
		}
		if err := g.WriteF32(g32); err != nil {
			t.Fatal(err)
		}
		if err := d.AdamW(opt, step, opt.ClipFactor(math.Sqrt(ss)), p, m, v, g, db, n); err != nil {
			t.Fatal(err)
		}
	}
	got := make([]float32, n)
	if err := p.ReadF32(got); err != nil {
		t.Fatal(err)
	}
	for i := range got {
		if math.Abs(float64(got[i]-hostP[i])) > 1e-5*(1+math.Abs(float64(hostP[i]))) {
			t.Fatalf("parameter %d = %v after 5 device steps, %v on the host", i, got[i], hostP[i])
		}
	}
	half := alloc(t, d, 2*n)
	if err := d.CastBF16(p, half, n); err != nil {
		t.Fatal(err)
	}
	h := make([]uint16, n)
	if err := half.ReadU16(h); err != nil {
		t.Fatal(err)
	}
	for i := range h {
		if h[i] != mfma.BF16(got[i]) {
			t.Fatalf("bf16 of %v = %04x on the device, %04x on the host", got[i], h[i], mfma.BF16(got[i]))
		}
	}
}

// upload puts x in a new device buffer.
func upload(t *testing.T, d *rocm.Device, x []float32) *rocm.Buffer {
	t.Helper()
	b := alloc(t, d, 4*len(x))
	if err := b.WriteF32(x); err != nil {
		t.Fatal(err)
	}
	return b
}

func download(t *testing.T, b *rocm.Buffer, n int) []float32 {
	t.Helper()
	out := make([]float32, n)
	if err := b.ReadF32(out); err != nil {
		t.Fatal(err)
	}
	return out
}

func randoms(r *rand.Rand, n int) []float32 {
	out := make([]float32, n)
	for i := range out {
		out[i] = float32(r.NormFloat64())
	}
	return out
}

func closeTo(t *testing.T, what string, got []float32, want []float64, tol float64) {
	t.Helper()
	for i := range want {
		if math.Abs(float64(got[i])-want[i]) > tol*(1+math.Abs(want[i])) {
			t.Fatalf("%s[%d] = %v, want %v", what, i, got[i], want[i])
		}
	}
}

// The decoder's row and element steps on device buffers against float64 references: the
// embedding and its scatter back (repeated tokens), RMSNorm forward, backward (accumulating
// into a residual gradient) and its gain, GELU both ways, softmax cross-entropy.
func TestDeviceModelStepsMatchFloat64(t *testing.T) {
	d := openDevice(t)
	r := rand.New(rand.NewPCG(59, 61))
	const n, vocab, dim, ffn = 37, 11, 72, 150 // dim over a wavefront: lanes loop
	tokens := make([]int32, n)
	for i := range tokens {
		tokens[i] = int32(r.IntN(vocab))
	}
	tok := alloc(t, d, 4*n)
	if err := tok.WriteTokens(tokens, vocab); err != nil {
		t.Fatal(err)
	}
	if err := tok.WriteTokens([]int32{0, vocab}, vocab); err == nil {
		t.Error("a token outside the vocabulary was written")
	}

	emb := randoms(r, vocab*dim)
	embB, x := upload(t, d, emb), alloc(t, d, 4*n*dim)
	if err := d.Embed(tok, embB, x, n, vocab, dim); err != nil {
		t.Fatal(err)
	}
	xs := download(t, x, n*dim)
	want := make([]float64, n*dim)
	for i, tk := range tokens {
		for c := range dim {
			want[i*dim+c] = float64(emb[int(tk)*dim+c])
		}
	}
	closeTo(t, "embedding", xs, want, 0)

	dx := randoms(r, n*dim)
	demb := make([]float32, vocab*dim)
	dembB := upload(t, d, demb)
	start, order := rocm.TokenRows(tokens, vocab)
	startB, orderB := alloc(t, d, 4*(vocab+1)), alloc(t, d, 4*n)
	if err := startB.WriteTokens(start, n+1); err != nil {
		t.Fatal(err)
	}
	if err := orderB.WriteTokens(order, n); err != nil {
		t.Fatal(err)
	}
	if err := d.EmbedBackward(startB, orderB, upload(t, d, dx), dembB, n, vocab, dim); err != nil {
		t.Fatal(err)
	}
	wantE := make([]float64, vocab*dim)
	for i, tk := range tokens {
		for c := range dim {
			wantE[int(tk)*dim+c] += float64(dx[i*dim+c])
		}
	}
	closeTo(t, "embedding gradient", download(t, dembB, vocab*dim), wantE, 1e-5)

	gain := randoms(r, dim)
	gainB, y, inv := upload(t, d, gain), alloc(t, d, 4*n*dim), alloc(t, d, 4*n)
	if err := d.RMSNorm(x, gainB, y, inv, n, dim, model.NormEps); err != nil {
		t.Fatal(err)
	}
	invs := make([]float64, n)
	wantY := make([]float64, n*dim)
	for i := range n {
		var ss float64
		for c := range dim {
			ss += float64(xs[i*dim+c]) * float64(xs[i*dim+c])
		}
		invs[i] = 1 / math.Sqrt(ss/dim+model.NormEps)
		for c := range dim {
			wantY[i*dim+c] = float64(xs[i*dim+c]) * invs[i] * float64(gain[c])
		}
	}
	closeTo(t, "RMSNorm", download(t, y, n*dim), wantY, 1e-5)

	dy, resid := randoms(r, n*dim), randoms(r, n*dim)
	dyB, dxB := upload(t, d, dy), upload(t, d, resid)
	if err := d.RMSNormBackward(x, gainB, inv, dyB, dxB, n, dim, true); err != nil {
		t.Fatal(err)
	}
	wantDX, wantDG := make([]float64, n*dim), make([]float64, dim)
	for i := range n {
		var dot float64
		for c := range dim {
			xhat := float64(xs[i*dim+c]) * invs[i]
			dot += float64(dy[i*dim+c]) * float64(gain[c]) * xhat
			wantDG[c] += float64(dy[i*dim+c]) * xhat
		}
		for c := range dim {
			xhat := float64(xs[i*dim+c]) * invs[i]
			wantDX[i*dim+c] = float64(resid[i*dim+c]) + invs[i]*(float64(dy[i*dim+c])*float64(gain[c])-xhat*dot/dim)
		}
	}
	closeTo(t, "RMSNorm backward", download(t, dxB, n*dim), wantDX, 1e-4)
	dg := alloc(t, d, 4*dim)
	if err := dg.WriteF32(make([]float32, dim)); err != nil {
		t.Fatal(err)
	}
	if err := d.RMSNormGainGrad(x, inv, dyB, dg, n, dim); err != nil {
		t.Fatal(err)
	}
	closeTo(t, "RMSNorm gain gradient", download(t, dg, dim), wantDG, 1e-4)

	u := randoms(r, ffn)
	uB, g := upload(t, d, u), alloc(t, d, 4*ffn)
	dgl := randoms(r, ffn)
	du := alloc(t, d, 4*ffn)
	if err := d.GELU(uB, g, ffn); err != nil {
		t.Fatal(err)
	}
	if err := d.GELUBackward(uB, upload(t, d, dgl), du, ffn); err != nil {
		t.Fatal(err)
	}
	wantG, wantDU := make([]float64, ffn), make([]float64, ffn)
	const c = 0.7978845608028654
	for i, v := range u {
		x := float64(v)
		th := math.Tanh(c * (x + 0.044715*x*x*x))
		wantG[i] = 0.5 * x * (1 + th)
		wantDU[i] = float64(dgl[i]) * (0.5*(1+th) + 0.5*x*(1-th*th)*c*(1+3*0.044715*x*x))
	}
	closeTo(t, "GELU", download(t, g, ffn), wantG, 1e-5)
	closeTo(t, "GELU backward", download(t, du, ffn), wantDU, 1e-5)

	logits := randoms(r, n*vocab)
	targets := make([]int32, n)
	for i := range targets {
		targets[i] = int32(r.IntN(vocab))
	}
	tg := alloc(t, d, 4*n)
	if err := tg.WriteTokens(targets, vocab); err != nil {
		t.Fatal(err)
	}
	dl, loss := alloc(t, d, 4*n*vocab), alloc(t, d, 4*n)
	const norm = 100.0
	if err := d.CrossEntropy(upload(t, d, logits), tg, dl, loss, n, vocab, norm); err != nil {
		t.Fatal(err)
	}
	wantL, wantDL := make([]float64, n), make([]float64, n*vocab)
	for i := range n {
		row := logits[i*vocab : (i+1)*vocab]
		var sum float64
		for _, z := range row {
			sum += math.Exp(float64(z))
		}
		lse := math.Log(sum)
		wantL[i] = lse - float64(row[targets[i]])
		for j, z := range row {
			p := math.Exp(float64(z) - lse)
			if j == int(targets[i]) {
				p--
			}
			wantDL[i*vocab+j] = p / norm
		}
	}
	closeTo(t, "cross-entropy", download(t, loss, n), wantL, 1e-5)
	closeTo(t, "cross-entropy gradient", download(t, dl, n*vocab), wantDL, 1e-5)

	if err := d.RMSNorm(x, gainB, y, inv, n+1, dim, model.NormEps); err == nil || !strings.Contains(err.Error(), "RMSNorm needs") {
		t.Errorf("a row past the buffers: %v", err)
	}
}
