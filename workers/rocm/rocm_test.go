//go:build rocm && cgo

package rocm_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/zaya-operator/zaya-operator/internal/testnet"
	"github.com/zaya-operator/zaya-operator/workers/attention"
	"github.com/zaya-operator/zaya-operator/workers/hip"
	"github.com/zaya-operator/zaya-operator/workers/model"
	"github.com/zaya-operator/zaya-operator/workers/rocm"
	"github.com/zaya-operator/zaya-operator/workers/train"
	"github.com/zaya-operator/zaya-operator/workers/transport"
)

// The libraries are loaded once per process, so the tests of loading failures run in a child.
func TestMain(m *testing.M) {
	if lib := os.Getenv("ZAYA_ROCM_CHILD_HIP"); lib != "" {
		_, err := rocm.OpenBackend(rocm.Libraries{HIP: lib}, os.Getenv("ZAYA_ROCM_CHILD_DIR"), 0)
		fmt.Println(err)
		os.Exit(0)
	}
	os.Exit(m.Run())
}

var fake struct {
	once       sync.Once
	lib, kdir  string
	err        error
	skipReason string
}

// setup builds the fake ROCm library (testdata/fakerocm.c) and the real gfx942 code objects.
func setup(t *testing.T) (rocm.Libraries, string) {
	t.Helper()
	fake.once.Do(func() {
		dir, err := os.MkdirTemp("", "zaya-rocm-test")
		if err != nil {
			fake.err = err
			return
		}
		fake.lib = filepath.Join(dir, "libfakerocm.so")
		cc := os.Getenv("CC")
		if cc == "" {
			cc = "cc"
		}
		if b, err := exec.Command(cc, "-shared", "-fPIC", "-O2", "-Wall", "-Werror", "-pthread", "-I../hip",
			"testdata/fakerocm.c", "-o", fake.lib, "-lm").CombinedOutput(); err != nil {
			fake.err = fmt.Errorf("building the fake ROCm library: %w\n%s", err, b)
			return
		}
		clang := os.Getenv("ZAYA_HIP_CLANG")
		if clang == "" {
			clang = "clang++-19"
		}
		if _, err := exec.LookPath(clang); err != nil {
			fake.skipReason = clang + " not found: it builds the kernels' code objects"
			return
		}
		fake.kdir = filepath.Join(dir, "kernels")
		if err := os.Mkdir(fake.kdir, 0o755); err != nil {
			fake.err = err
			return
		}
		fake.err = hip.BuildCodeObjects(clang, "../hip", fake.kdir)
	})
	if fake.err != nil {
		t.Fatal(fake.err)
	}
	if fake.skipReason != "" {
		if os.Getenv("CI") != "" {
			t.Fatal(fake.skipReason)
		}
		t.Skip(fake.skipReason)
	}
	return rocm.Libraries{HIP: fake.lib, RCCL: fake.lib}, fake.kdir
}

func random(r *rand.Rand, rows, cols int) attention.Matrix {
	m := attention.NewMatrix(rows, cols)
	for i := range m.Data {
		m.Data[i] = r.Float32()*2 - 1
	}
	return m
}

func near(a, b, tol float64) bool {
	if math.IsInf(a, -1) || math.IsInf(b, -1) {
		return a == b
	}
	return math.Abs(a-b) <= tol*(1+math.Abs(b))
}

// TestBackendMatchesCPU drives the HIP backend's whole path (code objects, argument
// marshalling, device buffers, fp32 conversions) against the fake runtime's host rendition of
// the kernels, and holds it to the CPU backend within fp32 tolerance: odd shapes, a head
// dimension wider than a wavefront, causal masks that leave rows with no key.
func TestBackendMatchesCPU(t *testing.T) {
	libs, kdir := setup(t)
	be, err := rocm.OpenBackend(libs, kdir, 1)
	if err != nil {
		t.Fatal(err)
	}
	r := rand.New(rand.NewPCG(1, 2))
	for _, c := range []struct {
		nq, nk, d int
		causal    bool
	}{{1, 1, 1, false}, {5, 7, 3, true}, {8, 8, 70, true}, {3, 9, 12, false}} { // none a multiple of 16: the fp32 kernels
		t.Run(fmt.Sprintf("%dx%dx%d causal=%v", c.nq, c.nk, c.d, c.causal), func(t *testing.T) {
			q, k, v := random(r, c.nq, c.d), random(r, c.nk, c.d), random(r, c.nk, c.d)
			qPos, kPos := make([]int, c.nq), make([]int, c.nk)
			for i := range qPos {
				qPos[i] = 2 * i // early queries see few keys; with causal, query 0 may see none
			}
			for j := range kPos {
				kPos[j] = j + 1
			}
			scale := 1 / math.Sqrt(float64(c.d))
			want, err := attention.CPU.Forward(q, k, v, qPos, kPos, c.causal, scale)
			if err != nil {
				t.Fatal(err)
			}
			got, err := be.Forward(q, k, v, qPos, kPos, c.causal, scale)
			if err != nil {
				t.Fatal(err)
			}
			for i := range want.LSE {
				if !near(got.LSE[i], want.LSE[i], 1e-5) {
					t.Errorf("lse[%d] = %v, want %v", i, got.LSE[i], want.LSE[i])
				}
			}
			for i := range want.Out.Data {
				if !near(float64(got.Out.Data[i]), float64(want.Out.Data[i]), 1e-5) {
					t.Fatalf("out[%d] = %v, want %v", i, got.Out.Data[i], want.Out.Data[i])
				}
			}

			// Merge the block into a partial over the same rows that saw other keys.
			other := random(r, c.nk, c.d)
			base, _ := attention.CPU.Forward(q, other, v, qPos, kPos, false, scale)
			rows := make([]int, c.nq)
			for i := range rows {
				rows[i] = i
			}
			a1, a2 := clonePartial(base), clonePartial(base)
			if err := attention.CPU.Merge(&a1, want, rows); err != nil {
				t.Fatal(err)
			}
			if err := be.Merge(&a2, want, rows); err != nil {
				t.Fatal(err)
			}
			for i := range a1.Out.Data {
				if !near(float64(a2.Out.Data[i]), float64(a1.Out.Data[i]), 1e-5) {
					t.Fatalf("merged out[%d] = %v, want %v", i, a2.Out.Data[i], a1.Out.Data[i])
				}
			}

			dout := random(r, c.nq, c.d)
			grads := func(b attention.Backend) []attention.Grad {
				dq, dk, dv := attention.NewGrad(c.nq, c.d), attention.NewGrad(c.nk, c.d), attention.NewGrad(c.nk, c.d)
				kRows := make([]int, c.nk)
				for j := range kRows {
					kRows[j] = j
				}
				if err := b.Backward(q, k, v, want.Out, dout, want.LSE, qPos, kPos, c.causal, scale, dq, rows, dk, dv, kRows); err != nil {
					t.Fatal(err)
				}
				return []attention.Grad{dq, dk, dv}
			}
			w, g := grads(attention.CPU), grads(be)
			for n, name := range []string{"dq", "dk", "dv"} {
				for i := range w[n].Data {
					if math.Abs(g[n].Data[i]-w[n].Data[i]) > 1e-4*(1+math.Abs(w[n].Data[i])) {
						t.Fatalf("%s[%d] = %v, want %v", name, i, g[n].Data[i], w[n].Data[i])
					}
				}
			}
		})
	}
	if _, err := be.Forward(attention.NewMatrix(1, 300), attention.NewMatrix(1, 300), attention.NewMatrix(1, 300), []int{0}, []int{0}, false, 1); err == nil ||
		!strings.Contains(err.Error(), "head dimension 300 exceeds") {
		t.Errorf("head dimension 300: %v", err)
	}
}

// TestBackendRunsTheMFMAKernelsForTheirHeadDims: for head dimensions that are multiples of 16
// up to 128 the backend runs the MFMA kernels (forward, and the three backward kernels): it
// hands them bf16 inputs (the fake's fp32 rendition then matches the CPU backend on rounded
// inputs to fp32 precision and misses it on the unrounded ones) and gets every gradient back,
// partial tiles and rows with no visible key included.
func TestBackendRunsTheMFMAKernelsForTheirHeadDims(t *testing.T) {
	libs, kdir := setup(t)
	be, err := rocm.OpenBackend(libs, kdir, 0)
	if err != nil {
		t.Fatal(err)
	}
	r := rand.New(rand.NewPCG(3, 4))
	for _, c := range []struct {
		nq, nk, d int
		causal    bool
	}{{3, 9, 16, false}, {17, 33, 32, true}, {40, 24, 64, true}, {5, 7, 128, false}} {
		t.Run(fmt.Sprintf("%dx%dx%d causal=%v", c.nq, c.nk, c.d, c.causal), func(t *testing.T) {
			if !rocm.MFMA(c.d) {
				t.Fatalf("head dimension %d does not take the MFMA kernels", c.d)
			}
			q, k, v, dout := random(r, c.nq, c.d), random(r, c.nk, c.d), random(r, c.nk, c.d), random(r, c.nq, c.d)
			qr, kr, vr, dor := attention.RoundBF16(q), attention.RoundBF16(k), attention.RoundBF16(v), attention.RoundBF16(dout)
			qPos, kPos := make([]int, c.nq), make([]int, c.nk)
			for i := range qPos {
				qPos[i] = i
			}
			for j := range kPos {
				kPos[j] = j + 2 // with causal, queries 0 and 1 see no key
			}
			scale := 1 / math.Sqrt(float64(c.d))
			got, err := be.Forward(q, k, v, qPos, kPos, c.causal, scale)
			if err != nil {
				t.Fatal(err)
			}
			want, _ := attention.CPU.Forward(qr, kr, vr, qPos, kPos, c.causal, scale)
			unrounded, _ := attention.CPU.Forward(q, k, v, qPos, kPos, c.causal, scale)
			var off float64
			for i := range want.Out.Data {
				if !near(float64(got.Out.Data[i]), float64(want.Out.Data[i]), 1e-4) {
					t.Fatalf("out[%d] = %v, want %v (CPU on bf16 inputs)", i, got.Out.Data[i], want.Out.Data[i])
				}
				off = math.Max(off, math.Abs(float64(got.Out.Data[i]-unrounded.Out.Data[i])))
			}
			if off < 1e-4 {
				t.Errorf("outputs within %.2g of fp32 attention on unrounded inputs: the inputs did not reach the kernel as bf16", off)
			}
			for i := range want.LSE {
				if !near(got.LSE[i], want.LSE[i], 1e-4) {
					t.Errorf("lse[%d] = %v, want %v", i, got.LSE[i], want.LSE[i])
				}
			}
			rows, kRows := make([]int, c.nq), make([]int, c.nk)
			for i := range rows {
				rows[i] = i
			}
			for j := range kRows {
				kRows[j] = j
			}
			grads := func(b attention.Backend, q, k, v, dout attention.Matrix) []attention.Grad {
				dq, dk, dv := attention.NewGrad(c.nq, c.d), attention.NewGrad(c.nk, c.d), attention.NewGrad(c.nk, c.d)
				if err := b.Backward(q, k, v, want.Out, dout, want.LSE, qPos, kPos, c.causal, scale, dq, rows, dk, dv, kRows); err != nil {
					t.Fatal(err)
				}
				return []attention.Grad{dq, dk, dv}
			}
			w, g := grads(attention.CPU, qr, kr, vr, dor), grads(be, q, k, v, dout)
			for n, name := range []string{"dq", "dk", "dv"} {
				for i := range w[n].Data {
					if math.Abs(g[n].Data[i]-w[n].Data[i]) > 1e-4*(1+math.Abs(w[n].Data[i])) {
						t.Fatalf("%s[%d] = %v, want %v", name, i, g[n].Data[i], w[n].Data[i])
					}
				}
			}
		})
	}
}

func clonePartial(p attention.Partial) attention.Partial {
	out := attention.EmptyPartial(p.Out.Rows, p.Out.Cols)
	copy(out.Out.Data, p.Out.Data)
	copy(out.LSE, p.LSE)
	return out
}

// TestRCCLTransportRingsAndAllReduce: 4 ranks in rings of 2 exchange messages of different
// sizes (including empty) with their ring neighbours and all-reduce over the world.
func TestRCCLTransportRingsAndAllReduce(t *testing.T) {
	libs, _ := setup(t)
	const world, ring = 4, 2
	master := "127.0.0.1:" + testnet.FreePort(t)
	var wg sync.WaitGroup
	errs := make([]error, world)
	for rank := range world {
		wg.Go(func() {
			errs[rank] = func() error {
				tr, err := rocm.DialRCCL(context.Background(), transport.Config{Rank: rank, World: world, Master: master,
					Listen: "127.0.0.1:0", RingSize: ring, Timeout: 10 * time.Second}, rank, libs)
				if err != nil {
					return err
				}
				defer func() { _ = tr.Close() }()
				for round := range 3 {
					msg := bytes.Repeat([]byte{byte(rank)}, rank*round)
					got, err := tr.Exchange(msg)
					if err != nil {
						return err
					}
					prev := rank - rank%ring + (rank%ring+ring-1)%ring
					if want := bytes.Repeat([]byte{byte(prev)}, prev*round); !bytes.Equal(got, want) {
						return fmt.Errorf("rank %d round %d got %v, want %v", rank, round, got, want)
					}
				}
				v := []float64{float64(rank), 1, 0.1}
				if err := tr.AllReduce(v); err != nil {
					return err
				}
				if want := []float64{6, 4, 0.1 + 0.1 + 0.1 + 0.1}; fmt.Sprint(v) != fmt.Sprint(want) {
					return fmt.Errorf("rank %d all-reduce %v, want %v", rank, v, want)
				}
				return tr.Barrier()
			}()
		})
	}
	wg.Wait()
	for rank, err := range errs {
		if err != nil {
			t.Errorf("rank %d: %v", rank, err)
		}
	}
}

// TestRCCLRemoteErrorIsAPeerError: RCCL's remote error (a peer exited, the network failed)
// is the peers' failure, which the worker reports as stopped (exit 75), not its own.
func TestRCCLRemoteErrorIsAPeerError(t *testing.T) {
	libs, _ := setup(t)
	t.Setenv("FAKE_RCCL_REMOTE_ERROR", "1")
	const world = 2
	master := "127.0.0.1:" + testnet.FreePort(t)
	var wg sync.WaitGroup
	errs := make([]error, world)
	for rank := range world {
		wg.Go(func() {
			tr, err := rocm.DialRCCL(context.Background(), transport.Config{Rank: rank, World: world, Master: master,
				Listen: "127.0.0.1:0", Timeout: 10 * time.Second}, rank, libs)
			if err != nil {
				errs[rank] = err
				return
			}
			defer func() { _ = tr.Close() }()
			err = tr.AllReduce([]float64{1})
			var pe *transport.PeerError
			if !errors.As(err, &pe) || pe.Op != "all-reduce" || pe.Rank != -1 {
				errs[rank] = fmt.Errorf("all-reduce on a remote error: %w, want a PeerError", err)
			}
		})
	}
	wg.Wait()
	for rank, err := range errs {
		if err != nil {
			t.Errorf("rank %d: %v", rank, err)
		}
	}
}

func trainOnce(t *testing.T, transportName, backend string, libs rocm.Libraries, kdir string) ([]byte, train.Result) {
	t.Helper()
	out := filepath.Join(t.TempDir(), "params")
	cfg := train.Config{NodeRank: 0, Nodes: 1, GPUsPerNode: 4, ContextParallel: 2, Master: "127.0.0.1:" + testnet.FreePort(t),
		Listen: "127.0.0.1:0", RendezvousTimeout: 10 * time.Second, Steps: 30, Seq: 8, Model: model.Shape{Vocab: 16, Dim: 4, Layers: 1, Heads: 2, FFN: 8}, LR: 0.01, Seed: 7,
		ParamsOut: out, Transport: transportName, Backend: backend, KernelDir: kdir, Libraries: libs}
	res, err := train.Run(context.Background(), cfg)
	if err != nil {
		t.Fatalf("%s/%s: %v", transportName, backend, err)
	}
	b, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	return b, res
}

// TestTrainingOnRCCLAndHIP runs the reference job (2 data × 2 context parallel ranks) on the
// RCCL transport, then also on the HIP backend: over RCCL the parameters are bit-identical to
// the TCP run (the fake, like TCP, sums in rank order), and with the kernels (fp32) they stay
// within fp32 tolerance of the CPU backend while the loss falls.
func TestTrainingOnRCCLAndHIP(t *testing.T) {
	libs, kdir := setup(t)
	tcp, tcpRes := trainOnce(t, "tcp", "cpu", libs, kdir)
	rccl, _ := trainOnce(t, "rccl", "cpu", libs, kdir)
	if !bytes.Equal(tcp, rccl) {
		t.Error("parameters trained over RCCL differ from those trained over TCP")
	}
	gpu, gpuRes := trainOnce(t, "rccl", "hip", libs, kdir)
	for i := 0; i < len(tcp); i += 4 {
		a := math.Float32frombits(uint32(tcp[i]) | uint32(tcp[i+1])<<8 | uint32(tcp[i+2])<<16 | uint32(tcp[i+3])<<24)
		b := math.Float32frombits(uint32(gpu[i]) | uint32(gpu[i+1])<<8 | uint32(gpu[i+2])<<16 | uint32(gpu[i+3])<<24)
		if math.Abs(float64(a-b)) > 1e-3*(1+math.Abs(float64(a))) {
			t.Fatalf("param %d: hip %v, cpu %v", i/4, b, a)
		}
	}
	if !(gpuRes.Loss < tcpRes.Loss*1.01 && gpuRes.Loss > tcpRes.Loss*0.99) {
		t.Errorf("final loss hip %v, cpu %v", gpuRes.Loss, tcpRes.Loss)
	}
}

// TestLoadingFailuresAreClear: a missing library, the real Debian HIP runtime on a machine
// with no GPU, a device beyond those visible, and a missing kernel directory each give an
// error that says what is wrong.
func TestLoadingFailuresAreClear(t *testing.T) {
	libs, kdir := setup(t)
	child := func(lib, dir string) string {
		cmd := exec.Command(os.Args[0], "-test.run=^$")
		cmd.Env = append(os.Environ(), "ZAYA_ROCM_CHILD_HIP="+lib, "ZAYA_ROCM_CHILD_DIR="+dir)
		b, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("%v\n%s", err, b)
		}
		return string(b)
	}
	if got := child("/nonexistent/libamdhip64.so", kdir); !strings.Contains(got, "rocm: library: loading the HIP runtime: /nonexistent/libamdhip64.so:") {
		t.Errorf("missing library: %s", got)
	}
	if _, err := os.Stat("/usr/lib/x86_64-linux-gnu/libamdhip64.so.5"); err == nil && os.Getenv("ZAYA_EXPECT_GPU") == "" {
		if got := child("libamdhip64.so.5", kdir); !strings.Contains(got, "no usable HIP device") {
			t.Errorf("real runtime without a GPU: %s", got)
		}
	}
	if _, err := rocm.OpenBackend(libs, kdir, 8); err == nil || !strings.Contains(err.Error(), "device 8 requested, 8 visible") {
		t.Errorf("device 8 of 8: %v", err)
	}
	if _, err := rocm.OpenBackend(libs, t.TempDir(), 0); err == nil || !strings.Contains(err.Error(), "hipErrorFileNotFound") ||
		!strings.Contains(err.Error(), "attention_fwd.hsaco") {
		t.Errorf("missing kernels: %v", err)
	}
}
