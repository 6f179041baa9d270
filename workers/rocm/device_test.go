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
