// Package train is the reference training job of the worker: a small attention model on
// seeded synthetic data, trained data parallel × context parallel (ring attention) over the
// ranks of the worker contract, with distributed checkpoints and resume. Every rank sees the
// same all-reduced gradients bit for bit, and data depends only on (seed, step, data-parallel
// index), so a run resumed from a checkpoint ends with exactly the parameters of a run that
// never stopped.
package train

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"net"
	"os"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/zaya-operator/zaya-operator/api/contract"
	"github.com/zaya-operator/zaya-operator/workers/attention"
	"github.com/zaya-operator/zaya-operator/workers/checkpoint"
	"github.com/zaya-operator/zaya-operator/workers/ring"
	"github.com/zaya-operator/zaya-operator/workers/rocm"
	"github.com/zaya-operator/zaya-operator/workers/transport"
)

// ExitConfig is the worker contract's exit code for a configuration error: fatal, no restart.
const ExitConfig = contract.ExitConfig

// ConfigError is a configuration problem; the worker exits with ExitConfig.
type ConfigError struct{ Msg string }

func (e *ConfigError) Error() string { return e.Msg }

// Config is one worker process: its node's ranks and the job's shape.
type Config struct {
	NodeRank, Nodes, GPUsPerNode, ContextParallel int
	Master                                        string // MASTER_ADDR:MASTER_PORT
	Listen                                        string // where ring neighbours connect (":0")
	RendezvousTimeout                             time.Duration
	CheckpointDir                                 string
	CheckpointEvery, Keep                         int           // steps between checkpoints (0: none)
	CheckpointPeriod                              time.Duration // time between checkpoints (0: none)
	HeartbeatFile, TerminationLog                 string
	Steps, Seq, Dim                               int
	LR                                            float64
	Seed                                          uint64
	ParamsOut                                     string        // rank 0 writes the final parameters here
	Pace                                          time.Duration // each step takes at least this long (demos, chaos tests)
	LogEvery                                      int           // progress line every N steps (default 10)
	Log                                           io.Writer
	Metrics                                       *Metrics // nil: none
	// Transport is "tcp" (default) or "rccl"; Backend is "cpu" (default) or "hip". RCCL and
	// HIP need a worker built with the rocm tag; each local rank drives device = local rank.
	Transport, Backend string
	KernelDir          string // the HIP backend's code objects
	Libraries          rocm.Libraries
}

// FromEnv reads the worker contract's variables (docs/worker-contract.md) into cfg.
func FromEnv(cfg Config, getenv func(string) string) (Config, error) {
	num := func(name string, into *int, minimum int) error {
		v := getenv(name)
		if v == "" {
			return &ConfigError{fmt.Sprintf("%s is not set (docs/worker-contract.md)", name)}
		}
		n, err := strconv.Atoi(v)
		if err != nil || n < minimum {
			return &ConfigError{fmt.Sprintf("%s=%q must be an integer >= %d", name, v, minimum)}
		}
		*into = n
		return nil
	}
	var world int
	for _, f := range []struct {
		name string
		into *int
		min  int
	}{
		{contract.EnvNodeRank, &cfg.NodeRank, 0}, {contract.EnvNNodes, &cfg.Nodes, 1}, {contract.EnvGPUsPerNode, &cfg.GPUsPerNode, 1},
		{contract.EnvWorldSize, &world, 1}, {contract.EnvContextParallel, &cfg.ContextParallel, 1},
	} {
		if err := num(f.name, f.into, f.min); err != nil {
			return cfg, err
		}
	}
	addr, port := getenv(contract.EnvMasterAddr), getenv(contract.EnvMasterPort)
	if addr == "" || port == "" {
		return cfg, &ConfigError{contract.EnvMasterAddr + " and " + contract.EnvMasterPort + " must be set (docs/worker-contract.md)"}
	}
	cfg.Master = net.JoinHostPort(addr, port)
	if world != cfg.Nodes*cfg.GPUsPerNode {
		return cfg, &ConfigError{fmt.Sprintf("%s=%d is not %s x %s = %d", contract.EnvWorldSize, world, contract.EnvNNodes, contract.EnvGPUsPerNode, cfg.Nodes*cfg.GPUsPerNode)}
	}
	cfg.CheckpointDir = getenv(contract.EnvCheckpointDir)
	if every := getenv(contract.EnvCheckpointEvery); every != "" {
		if n, err := strconv.Atoi(every); err == nil && n >= 1 {
			cfg.CheckpointEvery = n
		} else if d, err := time.ParseDuration(every); err == nil && d > 0 {
			cfg.CheckpointPeriod = d
		} else {
			return cfg, &ConfigError{fmt.Sprintf("%s=%q must be a positive number of steps (500) or a duration (30m0s)", contract.EnvCheckpointEvery, every)}
		}
	}
	cfg.Keep = 3
	if keep := getenv(contract.EnvCheckpointKeep); keep != "" {
		if err := num(contract.EnvCheckpointKeep, &cfg.Keep, 1); err != nil {
			return cfg, err
		}
	}
	cfg.HeartbeatFile = getenv(contract.EnvHeartbeatFile)
	return cfg, cfg.Validate()
}

// Validate checks the job's shape.
func (c Config) Validate() error {
	world := c.Nodes * c.GPUsPerNode
	switch {
	case c.NodeRank < 0 || c.NodeRank >= c.Nodes:
		return &ConfigError{fmt.Sprintf("%s=%d is outside 0..%d", contract.EnvNodeRank, c.NodeRank, c.Nodes-1)}
	case c.ContextParallel < 1 || world%c.ContextParallel != 0:
		return &ConfigError{fmt.Sprintf("%s=%d must divide the world size %d", contract.EnvContextParallel, c.ContextParallel, world)}
	case c.Seq < 2*c.ContextParallel || c.Seq%(2*c.ContextParallel) != 0:
		return &ConfigError{fmt.Sprintf("sequence length %d must be a multiple of 2 x context parallel %d", c.Seq, c.ContextParallel)}
	case c.Dim < 1 || c.Steps < 0 || c.LR <= 0:
		return &ConfigError{fmt.Sprintf("dim %d, steps %d, lr %v: want dim >= 1, steps >= 0, lr > 0", c.Dim, c.Steps, c.LR)}
	case c.Transport != "" && c.Transport != "tcp" && c.Transport != "rccl":
		return &ConfigError{fmt.Sprintf("-transport=%q must be tcp or rccl", c.Transport)}
	case c.Backend != "" && c.Backend != "cpu" && c.Backend != "hip":
		return &ConfigError{fmt.Sprintf("-backend=%q must be cpu or hip", c.Backend)}
	case (c.Transport == "rccl" || c.Backend == "hip") && !rocm.Built:
		return &ConfigError{fmt.Sprintf("-transport=%s -backend=%s: %v", c.Transport, c.Backend, rocm.ErrNotBuilt)}
	case (c.CheckpointEvery > 0 || c.CheckpointPeriod > 0) && c.CheckpointDir == "":
		return &ConfigError{contract.EnvCheckpointEvery + " is set without " + contract.EnvCheckpointDir}
	}
	return nil
}

// Result is what a process reports when it stops.
type Result struct {
	Step, CheckpointStep int64
	Loss                 float64
}

// Run trains this node's ranks (one goroutine per local GPU) until Steps or until ctx ends;
// on cancellation the ranks agree on a step, save a final checkpoint and stop.
func Run(ctx context.Context, cfg Config) (Result, error) {
	if err := cfg.Validate(); err != nil {
		return Result{}, err
	}
	if cfg.Log == nil {
		cfg.Log = io.Discard
	}
	results := make([]Result, cfg.GPUsPerNode)
	errs := make([]error, cfg.GPUsPerNode)
	var wg sync.WaitGroup
	for local := range cfg.GPUsPerNode {
		wg.Go(func() {
			results[local], errs[local] = runRank(ctx, cfg, cfg.NodeRank*cfg.GPUsPerNode+local)
		})
	}
	wg.Wait()
	res := results[0]
	if cfg.TerminationLog != "" && res.CheckpointStep > 0 {
		appendLine(cfg.TerminationLog, contract.TerminationMessageCheckpointPrefix+strconv.FormatInt(res.CheckpointStep, 10))
	}
	return res, errors.Join(errs...)
}

// rocmError makes a missing or broken ROCm library a configuration error (the image is wrong:
// a restart cannot help); a missing device stays a failure the operator may retry elsewhere.
func rocmError(err error) error {
	if errors.Is(err, rocm.ErrLibrary) {
		return &ConfigError{err.Error()}
	}
	return err
}

func appendLine(path, line string) {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return // best effort: the termination log is advisory
	}
	_, _ = fmt.Fprintln(f, line)
	_ = f.Close()
}

// model is the student: Wq, Wk, Wv, each dim×dim, flattened.
type model struct {
	dim    int
	params []float32
}

func (m model) w(i int) attention.Matrix {
	n := m.dim * m.dim
	return attention.Matrix{Rows: m.dim, Cols: m.dim, Data: m.params[i*n : (i+1)*n]}
}

func randomParams(seed uint64, stream uint64, n int, scale float32) []float32 {
	r := rand.New(rand.NewPCG(seed, stream))
	p := make([]float32, n)
	for i := range p {
		p[i] = (r.Float32()*2 - 1) * scale
	}
	return p
}

// batch is the sequence data-parallel index dp trains on at step: it depends on nothing else,
// so a resumed run sees exactly the data the uninterrupted one did.
func batch(seed uint64, step int64, dp, seq, dim int) attention.Matrix {
	return attention.Matrix{Rows: seq, Cols: dim, Data: randomParams(seed^0x5eed, uint64(step)<<20|uint64(dp), seq*dim, 1)}
}

func matmul(a, b attention.Matrix) attention.Matrix {
	out := attention.NewMatrix(a.Rows, b.Cols)
	for i := range a.Rows {
		for k := range a.Cols {
			x := float64(a.Data[i*a.Cols+k])
			for j := range b.Cols {
				out.Data[i*b.Cols+j] += float32(x * float64(b.Data[k*b.Cols+j]))
			}
		}
	}
	return out
}

// runRank is one rank's training loop.
func runRank(ctx context.Context, cfg Config, rank int) (Result, error) {
	world := cfg.Nodes * cfg.GPUsPerNode
	cp := cfg.ContextParallel
	cpRank, dp, dpGroups := rank%cp, rank/cp, world/cp
	listen := cfg.Listen
	if listen == "" {
		listen = ":0"
	}
	local := rank % cfg.GPUsPerNode
	be := attention.CPU
	if cfg.Backend == "hip" {
		var err error
		if be, err = rocm.OpenBackend(cfg.Libraries, cfg.KernelDir, local); err != nil {
			return Result{}, rocmError(err)
		}
	}
	tcfg := transport.Config{Rank: rank, World: world, Master: cfg.Master, Listen: listen, RingSize: cp, Timeout: cfg.RendezvousTimeout}
	var tr transport.Transport
	var err error
	if cfg.Transport == "rccl" {
		tr, err = rocm.DialRCCL(ctx, tcfg, local, cfg.Libraries)
	} else {
		tr, err = transport.Dial(ctx, tcfg)
	}
	if err != nil {
		return Result{}, rocmError(err)
	}
	defer func() { _ = tr.Close() }()

	n := 3 * cfg.Dim * cfg.Dim
	m := model{dim: cfg.Dim, params: randomParams(cfg.Seed, 1, n, 0.5)}
	teacher := model{dim: cfg.Dim, params: randomParams(cfg.Seed, 2, n, 1)}
	var res Result
	if cfg.CheckpointDir != "" {
		ck, skipped, err := checkpoint.Latest(cfg.CheckpointDir)
		if err != nil {
			return res, err
		}
		for _, s := range skipped {
			if rank == 0 {
				_, _ = fmt.Fprintf(cfg.Log, "skipping checkpoint %v\n", s)
			}
		}
		if ck != nil {
			p, err := ck.Read("params", 0, int64(n))
			if err != nil {
				return res, &ConfigError{fmt.Sprintf("checkpoint at step %d does not fit this model: %v", ck.Manifest.Step, err)}
			}
			m.params = p
			res.Step, res.CheckpointStep = ck.Manifest.Step, ck.Manifest.Step
			if rank == 0 {
				_, _ = fmt.Fprintf(cfg.Log, "resumed from step %d\n", ck.Manifest.Step)
			}
		}
	}

	l := ring.Layout{Seq: cfg.Seq, Ranks: cp}
	pos := l.Positions(cpRank)
	scale := 1 / math.Sqrt(float64(cfg.Dim))
	norm := float64(cfg.Seq * cfg.Dim * dpGroups)
	start, resumed := time.Now(), res.Step
	local0 := local == 0 // reports this process's metrics
	lastSave := time.Now()
	var pending *inflight
	if cfg.LogEvery == 0 {
		cfg.LogEvery = 10
	}
	for res.Step < int64(cfg.Steps) {
		if cfg.Pace > 0 {
			time.Sleep(cfg.Pace) // before the step's all-reduce, so every rank keeps the pace
		}
		x := batch(cfg.Seed, res.Step, dp, cfg.Seq, cfg.Dim)
		xl := x.SelectRows(pos)
		want, _ := attention.Reference(matmul(x, teacher.w(0)), matmul(x, teacher.w(1)), matmul(x, teacher.w(2)), true, scale)

		q, k, v := matmul(xl, m.w(0)), matmul(xl, m.w(1)), matmul(xl, m.w(2))
		fwd, err := ring.Forward(be, l, cpRank, q, k, v, true, scale, ring.Over(tr))
		if err != nil {
			return res, err
		}
		var loss float64
		dout := attention.NewMatrix(fwd.Out.Rows, cfg.Dim)
		for i, p := range pos {
			for c := range cfg.Dim {
				diff := float64(fwd.Out.Row(i)[c]) - want[p][c]
				loss += diff * diff
				dout.Row(i)[c] = float32(2 * diff / norm)
			}
		}
		dq, dk, dv, err := ring.Backward(be, l, cpRank, q, k, v, fwd.Out, dout, fwd.LSE, true, scale, ring.OverBlocks(tr))
		if err != nil {
			return res, err
		}
		// One all-reduce carries the loss, the three weight gradients, the stop vote, whether
		// this rank's background save is written, the last step rank 0 committed, and rank 0's
		// call (by its clock) that a time-based checkpoint is due after this step.
		vec := make([]float64, 5+n)
		vec[0] = loss / norm
		for wi, g := range []attention.Grad{dq, dk, dv} {
			for i := range xl.Rows {
				for a := range cfg.Dim {
					xa := float64(xl.Row(i)[a])
					for b := range cfg.Dim {
						vec[1+wi*cfg.Dim*cfg.Dim+a*cfg.Dim+b] += xa * g.Row(i)[b]
					}
				}
			}
		}
		if ctx.Err() != nil {
			vec[1+n] = 1
		}
		if pending != nil {
			if written, err := pending.written(); err != nil {
				return res, err
			} else if written {
				vec[2+n] = 1
			}
		}
		if rank == 0 {
			vec[3+n] = float64(res.CheckpointStep)
			if cfg.CheckpointPeriod > 0 && time.Since(lastSave) >= cfg.CheckpointPeriod {
				vec[4+n] = 1
			}
		}
		if err := tr.AllReduce(vec); err != nil {
			return res, fmt.Errorf("rank %d step %d: all-reduce: %w", rank, res.Step, err)
		}
		res.CheckpointStep = max(res.CheckpointStep, int64(vec[3+n]))
		if pending != nil && int(vec[2+n]) == world {
			// Every rank's shard is on disk: rank 0 commits, the others hear of it next step.
			if rank == 0 {
				if err := commit(cfg, world, pending.step); err != nil {
					return res, err
				}
				res.CheckpointStep = pending.step
			}
			pending = nil
		}
		for i := range m.params {
			m.params[i] = float32(float64(m.params[i]) - cfg.LR*vec[1+i])
		}
		res.Step++
		res.Loss = vec[0]
		if cfg.HeartbeatFile != "" {
			touch(cfg.HeartbeatFile)
		}
		if local0 && cfg.Metrics != nil {
			cfg.Metrics.Step.Set(float64(res.Step))
			cfg.Metrics.Loss.Set(res.Loss)
			cfg.Metrics.TokensPerSec.Set(float64(int64(cfg.Seq*dpGroups)*(res.Step-resumed)) / time.Since(start).Seconds())
		}
		if rank == 0 && (res.Step%int64(max(cfg.LogEvery, 1)) == 0 || res.Step == int64(cfg.Steps)) {
			tokens := float64(int64(cfg.Seq*dpGroups)*(res.Step-resumed)) / time.Since(start).Seconds()
			_, _ = fmt.Fprintf(cfg.Log, "step %d loss %.6g tokens/s %.0f\n", res.Step, res.Loss, tokens)
		}
		if local0 && cfg.Metrics != nil {
			cfg.Metrics.CheckpointStep.Set(float64(res.CheckpointStep))
		}
		stop := vec[1+n] > 0
		if stop {
			// The ranks agreed to stop after this step: save it while the collectives work.
			if err := finishSave(cfg, tr, rank, world, &pending, &res); err != nil {
				return res, err
			}
			if cfg.CheckpointDir != "" {
				if err := save(cfg, tr, rank, world, res.Step, m.params); err != nil {
					return res, err
				}
				res.CheckpointStep = res.Step
			}
			return res, ctx.Err()
		}
		due := (cfg.CheckpointEvery > 0 && res.Step%int64(cfg.CheckpointEvery) == 0) || vec[4+n] > 0
		if cfg.CheckpointDir != "" && due {
			lastSave = time.Now()
			// A save still in flight is finished first: storage slower than the interval then
			// holds training rather than let a fault lose more than one interval.
			began := time.Now()
			if err := finishSave(cfg, tr, rank, world, &pending, &res); err != nil {
				return res, err
			}
			pending = startSave(cfg, rank, world, res.Step, m.params)
			if local0 && cfg.Metrics != nil {
				cfg.Metrics.SaveSeconds.Observe(time.Since(began).Seconds())
			}
		}
	}
	if err := finishSave(cfg, tr, rank, world, &pending, &res); err != nil {
		return res, err
	}
	if cfg.CheckpointDir != "" && res.CheckpointStep < res.Step && res.Step > resumed {
		// The job is done: its final state is worth a checkpoint too.
		if err := save(cfg, tr, rank, world, res.Step, m.params); err != nil {
			return res, err
		}
		res.CheckpointStep = res.Step
	}
	if local0 && cfg.Metrics != nil {
		cfg.Metrics.CheckpointStep.Set(float64(res.CheckpointStep))
	}
	if rank == 0 && cfg.ParamsOut != "" {
		if err := os.WriteFile(cfg.ParamsOut, paramBytes(m.params), 0o644); err != nil {
			return res, err
		}
	}
	return res, nil
}

// inflight is a checkpoint being written in the background from a snapshot of the parameters.
type inflight struct {
	step int64
	done chan error
	ok   bool
}

// written reports, without blocking, whether this rank's shard is on disk.
func (f *inflight) written() (bool, error) {
	if f.ok {
		return true, nil
	}
	select {
	case err := <-f.done:
		if err != nil {
			return false, err
		}
		f.ok = true
	default:
	}
	return f.ok, nil
}

// startSave snapshots this rank's slice of the parameters and writes it in the background,
// so training does not wait on storage; the commit follows once every rank reports its shard.
func startSave(cfg Config, rank, world int, step int64, params []float32) *inflight {
	n := int64(len(params))
	lo, hi := n*int64(rank)/int64(world), n*int64(rank+1)/int64(world)
	snapshot := slices.Clone(params[lo:hi])
	f := &inflight{step: step, done: make(chan error, 1)}
	go func() {
		t := checkpoint.Tensor{Name: "params", Shape: []int64{n}, Start: lo, Data: snapshot}
		f.done <- checkpoint.WriteShard(cfg.CheckpointDir, step, rank, []checkpoint.Tensor{t})
	}()
	return f
}

// finishSave completes a background save in step with the other ranks (every rank has the
// same pending save: the all-reduce decided it), committing it before the ranks stop.
func finishSave(cfg Config, tr transport.Transport, rank, world int, pending **inflight, res *Result) error {
	f := *pending
	if f == nil {
		return nil
	}
	*pending = nil
	if !f.ok { // written() has not seen the write finish: wait for it
		if err := <-f.done; err != nil {
			return err
		}
	}
	if err := tr.Barrier(); err != nil {
		return err
	}
	if rank == 0 {
		if err := commit(cfg, world, f.step); err != nil {
			return err
		}
	}
	if err := tr.Barrier(); err != nil {
		return err
	}
	res.CheckpointStep = f.step
	return nil
}

func commit(cfg Config, world int, step int64) error {
	if _, err := checkpoint.Commit(cfg.CheckpointDir, step, world, map[string]string{"step": strconv.FormatInt(step, 10)}, cfg.Keep); err != nil {
		return err
	}
	_, _ = fmt.Fprintf(cfg.Log, "checkpoint step %d committed\n", step)
	return nil
}

// save writes this rank's slice of the parameters; rank 0 commits once every rank has.
func save(cfg Config, tr transport.Transport, rank, world int, step int64, params []float32) error {
	n := int64(len(params))
	lo, hi := n*int64(rank)/int64(world), n*int64(rank+1)/int64(world)
	t := checkpoint.Tensor{Name: "params", Shape: []int64{n}, Start: lo, Data: params[lo:hi]}
	if err := checkpoint.WriteShard(cfg.CheckpointDir, step, rank, []checkpoint.Tensor{t}); err != nil {
		return fmt.Errorf("rank %d writing its shard of step %d: %w", rank, step, err)
	}
	if err := tr.Barrier(); err != nil {
		return err
	}
	if rank == 0 {
		if err := commit(cfg, world, step); err != nil {
			return err
		}
	}
	return tr.Barrier() // nobody reports a step as committed before it is
}

func touch(path string) {
	now := time.Now()
	if err := os.Chtimes(path, now, now); err != nil {
		appendLine(path, "")
	}
}

func paramBytes(p []float32) []byte {
	b := make([]byte, 0, 4*len(p))
	for _, x := range p {
		bits := math.Float32bits(x)
		b = append(b, byte(bits), byte(bits>>8), byte(bits>>16), byte(bits>>24))
	}
	return b
}
