// Package train is the reference training job of the worker: the decoder of workers/model on
// seeded synthetic text, trained data parallel × context parallel (ring attention) over the
// ranks of the worker contract with AdamW, with distributed checkpoints (weights and the
// optimizer's moments) and resume. Every rank sees the same all-reduced gradients bit for
// bit, and data depends only on (seed, step, micro-batch), so a run resumed from a checkpoint
// ends with exactly the parameters of a run that never stopped. The sum is exact (exactsum),
// so an elastic job (ZAYA_TARGET_NODES) that resumes on fewer or more nodes, each group
// training more or fewer of the step's micro-batches, ends with those parameters too.
package train

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/zaya-operator/zaya-operator/api/contract"
	"github.com/zaya-operator/zaya-operator/workers/attention"
	"github.com/zaya-operator/zaya-operator/workers/checkpoint"
	"github.com/zaya-operator/zaya-operator/workers/model"
	"github.com/zaya-operator/zaya-operator/workers/ring"
	"github.com/zaya-operator/zaya-operator/workers/rocm"
	"github.com/zaya-operator/zaya-operator/workers/transport"
)

// StoppedError is why a rank stopped before its last step through no fault of its own: it
// was signalled, or a peer was and the ranks saved and stopped together, or a peer failed
// (transport.PeerError: lost in a collective, or missing at the rendezvous). The run is not
// complete: ExitStopped.
type StoppedError struct {
	Step int64
	Why  string
	err  error // the rank's own cancellation, if it was signalled, or the peer's failure
}

func (e *StoppedError) Error() string { return e.Why }
func (e *StoppedError) Unwrap() error { return e.err }

// Result is what a process reports when it stops.
type Result struct {
	Step, CheckpointStep int64
	Loss                 float64
	StepSeconds          float64   // mean seconds per step trained in this run; 0 before one
	TrainingSince        time.Time // when this run began training, its resume done
	LastStepAt           time.Time // when it last finished a step
	before               string    // "joining", "resuming": the rank stopped before training, Step is not yet its own
}

// Run trains this node's ranks (one goroutine per local GPU) until Steps or until ctx ends;
// on cancellation the ranks agree on a step, save a final checkpoint and stop.
func Run(ctx context.Context, cfg Config) (Result, error) {
	if err := cfg.Validate(); err != nil {
		return Result{}, err
	}
	if cfg.CheckpointDir != "" {
		if err := checkpoint.Writable(cfg.CheckpointDir); errors.Is(err, checkpoint.ErrNotWritable) {
			return Result{}, &ConfigError{fmt.Sprintf("%s %s: %v: mount the checkpoint volume read-write, writable by the worker's user (uid %d)",
				contract.EnvCheckpointDir, cfg.CheckpointDir, err, os.Getuid())}
		} else if err != nil {
			return Result{}, err
		}
	}
	if cfg.Log == nil {
		cfg.Log = io.Discard
	}
	// The termination log is written only at exit: a process that crashes leaves it empty, so
	// with terminationMessagePolicy FallbackToLogsOnError the kubelet takes its log's tail
	// (the runtime's or RCCL's last words) as the evidence instead.
	cfg.report = &lineBuffer{}
	cfg.slow = &atomic.Bool{}
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
	err := outcome(errs, results)
	for _, line := range cfg.report.take() {
		appendLine(cfg.TerminationLog, line)
	}
	if cfg.TerminationLog != "" && res.CheckpointStep > 0 {
		appendLine(cfg.TerminationLog, contract.TerminationMessageCheckpointPrefix+strconv.FormatInt(res.CheckpointStep, 10))
	}
	if cfg.TerminationLog != "" && res.before == "" && res.StepSeconds > 0 {
		appendLine(cfg.TerminationLog, contract.TerminationMessageTrainingStepPrefix+strconv.FormatInt(res.Step, 10))
		appendLine(cfg.TerminationLog, contract.TerminationMessageStepSecondsPrefix+strconv.FormatFloat(res.StepSeconds, 'f', 4, 64))
		appendLine(cfg.TerminationLog, contract.TerminationMessageTrainingSincePrefix+res.TrainingSince.UTC().Format(time.RFC3339Nano))
		appendLine(cfg.TerminationLog, contract.TerminationMessageLastStepAtPrefix+res.LastStepAt.UTC().Format(time.RFC3339Nano))
	}
	if cfg.TerminationLog != "" {
		var stopped *StoppedError
		switch {
		case errors.As(err, &stopped):
			appendLine(cfg.TerminationLog, contract.TerminationMessageStoppedPrefix+" "+stopped.Why)
		case errors.Is(err, context.Canceled):
			appendLine(cfg.TerminationLog, fmt.Sprintf("%s signalled at step %d, before the ranks could agree to save", contract.TerminationMessageStoppedPrefix, res.Step))
		}
	}
	return res, err
}

// outcome is the process's error from its local ranks' errors (results: where each stood).
// The operator takes the earliest exit that is not ExitStopped for the root failure, so a
// process stops (a StoppedError, or its own cancellation) only when every failed rank
// stopped through no fault of its own; if any rank failed by itself, only those faults are
// returned (what the other local ranks saw next is their consequence).
func outcome(errs []error, results []Result) error {
	var own []error
	var stopped, lostPeer *StoppedError
	var cancelled error
	for i, err := range errs {
		var se *StoppedError
		var pe *transport.PeerError
		var ce *ConfigError
		switch {
		case err == nil:
		case errors.As(err, &se):
			stopped = cmp.Or(stopped, se)
		case errors.As(err, &ce):
			own = append(own, err)
		case errors.Is(err, context.Canceled): // signalled before the ranks could agree
			cancelled = cmp.Or(cancelled, err)
		case errors.As(err, &pe):
			if lostPeer == nil {
				lostPeer = &StoppedError{Step: results[i].Step, Why: peerWhy(pe, results[i]), err: err}
			}
		default:
			own = append(own, err)
		}
	}
	switch {
	case len(own) > 0:
		return errors.Join(own...)
	case stopped != nil:
		return stopped
	case cancelled != nil:
		return cancelled
	case lostPeer != nil:
		return lostPeer
	}
	return nil
}

// peerWhy is the stopped line's reason for a rank that a peer's failure stopped where res says.
func peerWhy(pe *transport.PeerError, res Result) string {
	if pe.Op == transport.OpRendezvous {
		return strings.TrimPrefix(pe.Error(), "transport: ")
	}
	who, when := "a peer failed", fmt.Sprintf("at step %d", res.Step)
	if pe.Rank >= 0 {
		who = fmt.Sprintf("lost rank %d", pe.Rank)
	}
	if res.before != "" {
		when = "while " + res.before
	}
	return fmt.Sprintf("%s during the %s %s: %v", who, pe.Op, when, pe.Err)
}

// rocmError makes a missing or broken ROCm library a configuration error (the image is wrong:
// a restart cannot help); a missing device stays a failure the operator may retry elsewhere.
func rocmError(err error) error {
	if errors.Is(err, rocm.ErrLibrary) {
		return &ConfigError{err.Error()}
	}
	return err
}

// lineBuffer holds termination-log lines until the process exits.
type lineBuffer struct {
	mu    sync.Mutex
	lines []string
}

func (b *lineBuffer) add(line string) {
	if b == nil {
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	b.lines = append(b.lines, line)
}

func (b *lineBuffer) take() []string {
	if b == nil {
		return nil
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	out := b.lines
	b.lines = nil
	return out
}

func appendLine(path, line string) {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return // best effort: the termination log is advisory
	}
	_, _ = fmt.Fprintln(f, line)
	_ = f.Close()
}

// tensor is one named vector of the training state that checkpoints hold.
type tensor struct {
	name string
	data []float32
}

// runRank is one rank's training loop.
func runRank(ctx context.Context, cfg Config, rank int) (Result, error) {
	r, err := setupRank(cfg, rank)
	if err != nil {
		return Result{}, err
	}
	r.res.before = "joining"
	err = r.connect(ctx)
	if r.dev != nil {
		defer func() { _ = r.dev.Close() }()
	}
	if err != nil {
		return r.res, err
	}
	defer func() { _ = r.tr.Close() }()
	r.met = time.Now()
	r.res.before = "resuming"
	if err := r.resume(); err != nil {
		return r.res, err
	}
	r.res.before = ""
	r.startTraining()
	for r.res.Step < int64(r.cfg.Steps) {
		stop, periodDue, err := r.step(ctx)
		if err != nil {
			return r.res, err
		}
		if n := r.res.Step - r.resumed; n > 0 {
			r.res.StepSeconds = time.Since(r.start).Seconds() / float64(n)
		}
		if r.cfg.FaultFile != "" && r.local == 0 && injectFault(r.cfg.FaultFile, r.cfg.Log, r.cfg.NodeRank, r.res.Step) {
			r.cfg.slow.Store(true)
		}
		if stop.count > 0 && r.res.Step < int64(r.cfg.Steps) {
			err = r.saveAndStop(ctx, stop) // not in the return: r.res must be read after it
			return r.res, err
		}
		if err := r.checkpointIfDue(periodDue); err != nil {
			return r.res, err
		}
	}
	err = r.finish() // before reading r.res, which it updates
	return r.res, err
}

// rankState is one rank's place in the job, its model and its progress.
type rankState struct {
	cfg                  Config
	rank, world, local   int
	cpRank, dp, dpGroups int
	micro                int    // sequences a step trains, at every width (Config.microBatches)
	scales               [2]int // this step's exact-sum exponents: the loss's, the gradients'
	be                   attention.Backend
	tr                   transport.Transport
	n                    int // parameters
	shape                model.Shape
	opt                  model.AdamW
	params, adamM, adamV []float32         // fp32 master weights and AdamW's moments (the device's, copied for checkpoints)
	dev                  rocm.TrainingStep // the step resident on the GPU, or nil
	devReduce            bool              // dev's gradients are summed on the device (RCCL), not in the step's vector
	layout               ring.Layout
	pos                  []int // sequence positions of this rank's context-parallel slice
	norm                 float64
	res                  Result
	resumed              int64 // the step training (re)started from
	start, lastSave      time.Time
	met                  time.Time // when the transport had met every rank
	nodeBusy             []float64 // rank 0: each node's moving mean of busy seconds per step
	pending              *inflight
}

// setupRank places the rank in the job, opens its attention backend and seeds the models.
func setupRank(cfg Config, rank int) (*rankState, error) {
	world := cfg.Nodes * cfg.GPUsPerNode
	cp := cfg.ContextParallel
	r := &rankState{cfg: cfg, rank: rank, world: world, local: rank % cfg.GPUsPerNode,
		cpRank: rank % cp, dp: rank / cp, dpGroups: world / cp, be: attention.CPU}
	if r.cfg.Listen == "" {
		r.cfg.Listen = ":0"
	}
	if r.cfg.LogEvery == 0 {
		r.cfg.LogEvery = 10
	}
	if cfg.Backend == "hip" {
		be, err := rocm.OpenBackend(cfg.Libraries, cfg.KernelDir, r.local)
		if err != nil {
			return nil, rocmError(err)
		}
		r.be = be
	}
	r.shape, r.opt = cfg.shape(), model.DefaultAdamW(cfg.LR)
	r.n = r.shape.NumParams()
	r.params = r.shape.Init(cfg.Seed)
	r.adamM, r.adamV = make([]float32, r.n), make([]float32, r.n)
	r.layout = ring.Layout{Seq: cfg.Seq, Ranks: cp}
	r.pos = r.layout.Positions(r.cpRank)
	r.micro = cfg.microBatches()
	r.norm = float64(cfg.Seq * r.micro) // the loss is the mean over every token of the step
	return r, nil
}

// connect joins the job's collectives: TCP, or RCCL on this rank's device.
func (r *rankState) connect(ctx context.Context) error {
	cfg := r.cfg
	// The gang's own ranks know the job's UID and the attempt; a stray connection, another
	// job's rank or an older attempt's does not, and is dropped.
	token := cfg.JobUID + "/" + strconv.Itoa(cfg.Attempt)
	tcfg := transport.Config{Rank: r.rank, World: r.world, Master: cfg.Master, MasterListen: cfg.MasterListen, Listen: cfg.Listen, RingSize: cfg.ContextParallel,
		Timeout: cfg.RendezvousTimeout, Token: token, PeerTimeout: cfg.PeerTimeout, CollectiveTimeout: cfg.CollectiveTimeout}
	var err error
	if cfg.Transport == "rccl" {
		r.tr, err = rocm.DialRCCL(ctx, tcfg, r.local, cfg.Libraries)
	} else {
		r.tr, err = transport.Dial(ctx, tcfg)
	}
	if err != nil {
		return rocmError(err)
	}
	if cfg.Backend == "hip" && rocm.MFMA(r.shape.HeadDim()) {
		// The whole step on the GPU, the ring's blocks passed over r.tr; with heads the
		// matrix cores do not take, the model runs here and attention's blocks go to the GPU.
		positions := make([][]int, cfg.ContextParallel)
		for i := range positions {
			positions[i] = r.layout.Positions(i)
		}
		if r.dev, err = rocm.OpenStep(cfg.Libraries, cfg.KernelDir, r.local, r.shape, r.params, positions, r.cpRank, r.tr); err != nil {
			return rocmError(err)
		}
	}
	// Every rank decides alike (same flags). An elastic job sums on the host: the device's
	// float32 sum depends on the width.
	r.devReduce = r.dev != nil && r.dev.Reduces() && cfg.TargetNodes == 0
	return nil
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "..."
}

// finish completes the last save, checkpoints the final step and writes rank 0's parameters.
func (r *rankState) finish() error {
	cfg := r.cfg
	if err := finishSave(cfg, r.tr, r.rank, r.world, &r.pending, &r.res); err != nil {
		return err
	}
	if err := r.pull(); err != nil {
		return err
	}
	if cfg.CheckpointDir != "" && r.res.CheckpointStep < r.res.Step && r.res.Step > r.resumed {
		// The job is done: its final state is worth a checkpoint too.
		if err := save(cfg, r.tr, r.rank, r.world, r.res.Step, r.state()); err != nil {
			return err
		}
		r.res.CheckpointStep = r.res.Step
	}
	if r.local == 0 && cfg.Metrics != nil {
		cfg.Metrics.CheckpointStep.Set(float64(r.res.CheckpointStep))
	}
	if r.rank == 0 && cfg.ParamsOut != "" {
		if err := os.WriteFile(cfg.ParamsOut, paramBytes(r.params), 0o644); err != nil {
			return err
		}
	}
	return nil
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
