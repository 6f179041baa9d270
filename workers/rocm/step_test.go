//go:build rocm && cgo

package rocm_test

import (
	"context"
	"encoding/binary"
	"io"
	"math"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/zaya-operator/zaya-operator/internal/testnet"
	"github.com/zaya-operator/zaya-operator/workers/train"

	"github.com/zaya-operator/zaya-operator/workers/model"
	"github.com/zaya-operator/zaya-operator/workers/rocm"
)

// The device-resident step against the model on the CPU: the same loss and gradients within
// bf16's precision (the device also rounds attention's inputs to bf16), then AdamW steps on
// the device following the host's, for a model whose heads the MFMA kernels take, with a
// row count that leaves partial tiles.
func TestDeviceStepMatchesTheModel(t *testing.T) {
	d := openDevice(t)
	s := model.Shape{Vocab: 24, Dim: 32, Layers: 2, Heads: 2, FFN: 48}
	const rows = 20
	params := s.Init(9)
	st, err := rocm.NewStep(d, s, rows, params, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = st.Close() }()
	pos := make(model.Local, rows)
	for i := range pos {
		pos[i] = i
	}
	host := append([]float32(nil), params...)
	m, v := make([]float32, len(host)), make([]float32, len(host))
	opt := model.DefaultAdamW(0.01)
	for step := int64(0); step < 3; step++ {
		toks := model.Tokens(9, step, 0, rows, s.Vocab)
		b := model.Batch{Inputs: toks[:rows], Targets: toks[1:], Norm: rows}
		want := make([]float64, s.NumParams())
		wantLoss, err := s.Grad(host, b, pos, model.BF16, want)
		if err != nil {
			t.Fatal(err)
		}
		got := make([]float64, s.NumParams())
		gotLoss, err := st.Grad(b, got)
		if err != nil {
			t.Fatal(err)
		}
		if math.Abs(gotLoss-wantLoss) > 1e-3*wantLoss {
			t.Fatalf("step %d: loss %v on the device, %v on the CPU", step, gotLoss, wantLoss)
		}
		var worst, top float64
		for i := range want {
			top = math.Max(top, math.Abs(want[i]))
			worst = math.Max(worst, math.Abs(got[i]-want[i]))
		}
		if worst > 2e-2*top {
			t.Fatalf("step %d: gradients differ by up to %.3g (largest %.3g)", step, worst, top)
		}
		t.Logf("step %d: loss %.5f vs %.5f, largest gradient difference %.2g of %.3g", step, gotLoss, wantLoss, worst, top)
		if err := opt.Update(s, host, m, v, want, step+1); err != nil {
			t.Fatal(err)
		}
		if err := st.Update(opt, step+1, want); err != nil { // the same gradient: the update alone is compared
			t.Fatal(err)
		}
	}
	gotP, gotM, _, err := st.State()
	if err != nil {
		t.Fatal(err)
	}
	for i := range host {
		if math.Abs(float64(gotP[i]-host[i])) > 1e-5*(1+math.Abs(float64(host[i]))) || math.Abs(float64(gotM[i]-m[i])) > 1e-5*(1+math.Abs(float64(m[i]))) {
			t.Fatalf("parameter %d after 3 steps: %v (moment %v) on the device, %v (%v) on the host", i, gotP[i], gotM[i], host[i], m[i])
		}
	}
	if _, err := rocm.NewStep(d, model.Shape{Vocab: 8, Dim: 8, Layers: 1, Heads: 2, FFN: 8}, rows, make([]float32, 0), nil); err == nil {
		t.Error("a head dimension of 4 accepted by the device step")
	}
}

// The worker on the HIP backend with no context parallelism trains on the device-resident
// step: close to the CPU run of the same job (attention's inputs in bf16 on the device), and a
// run stopped at a checkpoint and resumed ends with the bits of the run that never stopped
// (the weights and AdamW's moments go to the checkpoint and back to the device). Over RCCL
// the gradients are summed on the device: no all-reduce through the host is larger than the
// step's few control values. The same with context parallelism.
func TestWorkerTrainsOnTheDeviceStep(t *testing.T) {
	libs, kdir := setup(t)
	transportName, cp := "tcp", 1
	run := func(backend string, steps int, dir string) []float32 {
		t.Helper()
		out := filepath.Join(t.TempDir(), "params")
		cfg := train.Config{NodeRank: 0, Nodes: 1, GPUsPerNode: 2, ContextParallel: cp, Master: "127.0.0.1:" + testnet.FreePort(t),
			Listen: "127.0.0.1:0", RendezvousTimeout: 10 * time.Second, Steps: steps, Seq: 24,
			Model: model.Shape{Vocab: 16, Dim: 32, Layers: 1, Heads: 2, FFN: 32}, LR: 0.01, Seed: 5,
			ParamsOut: out, Backend: backend, Transport: transportName, KernelDir: kdir, Libraries: libs,
			CheckpointDir: dir, CheckpointEvery: 5, Keep: 2, JobUID: "job", Log: io.Discard}
		if dir == "" {
			cfg.CheckpointEvery = 0
		}
		if _, err := train.Run(context.Background(), cfg); err != nil {
			t.Fatalf("%s, %d steps: %v", backend, steps, err)
		}
		b, err := os.ReadFile(out)
		if err != nil {
			t.Fatal(err)
		}
		p := make([]float32, len(b)/4)
		for i := range p {
			p[i] = math.Float32frombits(binary.LittleEndian.Uint32(b[4*i:]))
		}
		return p
	}
	cpu, gpu := run("cpu", 20, ""), run("hip", 20, "")
	var worst float64
	for i := range cpu {
		worst = math.Max(worst, math.Abs(float64(gpu[i]-cpu[i])))
	}
	if worst > 0.05 {
		t.Errorf("after 20 steps the device's weights are up to %.3g from the CPU's", worst)
	}
	t.Logf("after 20 steps: device vs CPU weights within %.2g", worst)
	resumeIsExact := func() {
		t.Helper()
		dir := t.TempDir()
		run("hip", 10, dir)
		resumed, whole := run("hip", 20, dir), run("hip", 20, t.TempDir())
		for i := range whole {
			if math.Float32bits(resumed[i]) != math.Float32bits(whole[i]) {
				t.Fatalf("%s: parameter %d: resumed %v, uninterrupted %v", transportName, i, resumed[i], whole[i])
			}
		}
	}
	resumeIsExact()

	transportName = "rccl"
	t.Setenv("FAKE_RCCL_MAX_FLOAT64", "64") // the step's vector: loss, votes, each node's time
	onDevice := run("hip", 20, "")
	worst = 0
	for i := range cpu {
		worst = math.Max(worst, math.Abs(float64(onDevice[i]-cpu[i])))
	}
	if worst > 0.05 {
		t.Errorf("over RCCL, after 20 steps the device's weights are up to %.3g from the CPU's", worst)
	}
	t.Setenv("FAKE_RCCL_MAX_FLOAT64", "") // a resume shares the weights through a host all-reduce
	resumeIsExact()

	// Context parallel 2: each rank holds half the sequence and the ring's key/value blocks
	// (and their gradients) travel as device buffers: through the host over TCP, device to
	// device over RCCL, where still no host all-reduce is gradient-sized.
	cp = 2
	transportName = "tcp"
	ringCPU := run("cpu", 20, "")
	for _, tn := range []string{"tcp", "rccl"} {
		transportName = tn
		if tn == "rccl" {
			t.Setenv("FAKE_RCCL_MAX_FLOAT64", "64")
		}
		ringHIP := run("hip", 20, "")
		worst = 0
		for i := range ringCPU {
			worst = math.Max(worst, math.Abs(float64(ringHIP[i]-ringCPU[i])))
		}
		if worst > 0.05 {
			t.Errorf("context parallel over %s: after 20 steps the device's weights are up to %.3g from the CPU's", tn, worst)
		}
		t.Logf("context parallel over %s: device vs CPU weights within %.2g", tn, worst)
		t.Setenv("FAKE_RCCL_MAX_FLOAT64", "")
		resumeIsExact()
	}
}
