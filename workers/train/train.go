// Package train is the reference training job of the worker: the decoder of workers/model on
// seeded synthetic text, trained data parallel × context parallel (ring attention) over the
// ranks of the worker contract with AdamW, with distributed checkpoints (weights and the
// optimizer's moments) and resume. Every rank sees the same all-reduced gradients bit for
// bit, and data depends only on (seed, step, data-parallel index), so a run resumed from a
// checkpoint ends with exactly the parameters of a run that never stopped.
package train

import (
	"cmp"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"os"
	"path/filepath"
	"slices"
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

// ExitConfig is the worker contract's exit code for a configuration error: fatal, no restart.
const ExitConfig = contract.ExitConfig

// ConfigError is a configuration problem; the worker exits with ExitConfig.
type ConfigError struct{ Msg string }

func (e *ConfigError) Error() string { return e.Msg }

// Config is one worker process: its node's ranks and the job's shape.
type Config struct {
	NodeRank, Nodes, GPUsPerNode, ContextParallel int
	Master                                        string // MASTER_ADDR:MASTER_PORT
	MasterListen                                  string // where rank 0 listens ("": every interface)
	Listen                                        string // where ring neighbours connect (":0")
	RendezvousTimeout                             time.Duration
	PeerTimeout                                   time.Duration // a peer silent this long is lost (0: the transport's default; negative: no bound)
	CollectiveTimeout                             time.Duration // ZAYA_COLLECTIVE_TIMEOUT: a live peer's part waited for at most this long (0: no bound)
	CheckpointDir                                 string
	Attempt                                       int           // ZAYA_RESTART_ATTEMPT, the generation; after resume, the attempt number this start writes under
	JobUID                                        string        // ZAYA_JOB_UID: owns the checkpoint directory
	CheckpointEvery, Keep                         int           // steps between checkpoints (0: none)
	CheckpointPeriod                              time.Duration // time between checkpoints (0: none)
	HeartbeatFile, TerminationLog                 string
	// FaultFile, when set, is polled every step: a fault named in it ("gpu", "nic",
	// "usercode") is played as the real one would end the process (docs/worker-contract.md,
	// "Fault injection"). For chaos tests; never set on a real job.
	FaultFile  string
	slow       *atomic.Bool // a "slow" fault was played: every local rank drags its steps
	board      *board       // rank 0's live progress, served with the metrics (nil: none)
	restored   int64        // the step resume restored: retention keeps it until a newer one is kept
	report     *lineBuffer  // termination-log lines held until the process exits
	Steps, Seq int
	Model      model.Shape // Model.Dim is -dim; FFN 0 is 4 x Dim
	LR         float64     // AdamW's learning rate
	Seed       uint64
	ParamsOut  string        // rank 0 writes the final parameters here
	Pace       time.Duration // each step takes at least this long (demos, chaos tests)
	LogEvery   int           // progress line every N steps (default 10)
	Log        io.Writer
	Metrics    *Metrics // nil: none
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
		{contract.EnvRestartAttempt, &cfg.Attempt, 0},
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
	cfg.JobUID = getenv(contract.EnvJobUID)
	if len(cfg.JobUID) > 128 || strings.ContainsAny(cfg.JobUID, " \t\r\n") {
		return cfg, &ConfigError{fmt.Sprintf("%s=%q must be a job's UID", contract.EnvJobUID, cfg.JobUID)}
	}
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
	if v := getenv(contract.EnvCollectiveTimeout); v != "" {
		// Seconds, as the operator sets it (network.collectiveTimeout), or a Go duration.
		if n, err := strconv.Atoi(v); err == nil && n >= 1 {
			cfg.CollectiveTimeout = time.Duration(n) * time.Second
		} else if d, err := time.ParseDuration(v); err == nil && d > 0 {
			cfg.CollectiveTimeout = d
		} else {
			return cfg, &ConfigError{fmt.Sprintf("%s=%q must be a positive number of seconds or a duration", contract.EnvCollectiveTimeout, v)}
		}
	}
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
	case c.Steps < 0 || !(c.LR > 0 && c.LR < 1):
		return &ConfigError{fmt.Sprintf("steps %d, lr %v: want steps >= 0, 0 < lr < 1", c.Steps, c.LR)}
	case c.shape().Validate() != nil:
		return &ConfigError{fmt.Sprintf("model (-vocab, -dim, -layers, -heads, -ffn): %v", c.shape().Validate())}
	case c.Transport != "" && c.Transport != "tcp" && c.Transport != "rccl":
		return &ConfigError{fmt.Sprintf("-transport=%q must be tcp or rccl", c.Transport)}
	case c.Backend != "" && c.Backend != "cpu" && c.Backend != "hip":
		return &ConfigError{fmt.Sprintf("-backend=%q must be cpu or hip", c.Backend)}
	case (c.Transport == "rccl" || c.Backend == "hip") && !rocm.Built:
		return &ConfigError{fmt.Sprintf("-transport=%s -backend=%s: %v", c.Transport, c.Backend, rocm.ErrNotBuilt)}
	case (c.CheckpointEvery > 0 || c.CheckpointPeriod > 0) && c.CheckpointDir == "":
		return &ConfigError{contract.EnvCheckpointEvery + " is set without " + contract.EnvCheckpointDir}
	case c.PeerTimeout > 0 && c.PeerTimeout < minPeerTimeout:
		return &ConfigError{fmt.Sprintf("%s (-peer-timeout) %v is below %v: live peers would be lost", contract.EnvPeerTimeout, c.PeerTimeout, minPeerTimeout)}
	}
	return nil
}

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

// shape is the model's size with the defaults filled in.
func (c Config) shape() model.Shape {
	s := c.Model
	if s.FFN == 0 {
		s.FFN = 4 * s.Dim
	}
	return s
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
	r.norm = float64(cfg.Seq * r.dpGroups) // the loss is the mean over every token of the step
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
	r.devReduce = r.dev != nil && r.dev.Reduces() // every rank decides alike: same flags
	return nil
}

// resume restores the newest step whose every part verifies, agreed by every rank: rank 0
// proposes the steps newest first, each rank opens the manifest and reads and verifies only
// its own slice of the parameters (so the step is read about once in total), and the ranks
// vote through an all-reduce. A committed step that fails is moved aside by rank 0, so the
// gang can save that step number again instead of being refused forever; a step without a
// manifest is an unfinished save and is skipped. The ranks then share their slices.
func (r *rankState) resume() error {
	dir := r.cfg.CheckpointDir
	if dir == "" {
		return nil
	}
	var steps []int64
	var fenced error
	if r.rank == 0 {
		// Before reading anything: from now on no writer of an older attempt can publish or
		// delete a step here, neither a stale pod of an older generation nor a process of
		// this generation's run before an in-place restart (each start numbers anew).
		attempt, err := checkpoint.FenceNext(dir, r.cfg.JobUID, r.cfg.Attempt)
		switch {
		case errors.Is(err, checkpoint.ErrFenced):
			fenced = err
		case err != nil:
			return err
		}
		if fenced == nil {
			if steps, err = checkpoint.Steps(dir); err != nil {
				return err
			}
			r.cfg.Attempt = attempt
		}
	}
	for i := 0; ; i++ {
		// Rank 0's proposal, as step+1 (0: no step left, a fresh start); whether a newer
		// attempt owns the directory; and the attempt number every rank writes under: the one
		// rank 0 fenced the directory with (this start's within its generation, offset past an
		// earlier job's when this job took the volume over; at most 2^53, exact in a float64).
		prop := []float64{0, 0, 0}
		if r.rank == 0 {
			prop[2] = float64(r.cfg.Attempt)
			if i < len(steps) {
				prop[0] = float64(steps[i] + 1)
			}
		}
		if fenced != nil {
			prop[1] = 1
		}
		if err := r.tr.AllReduce(prop); err != nil {
			return fmt.Errorf("rank %d resuming: %w", r.rank, err)
		}
		r.cfg.Attempt = int(prop[2])
		if prop[1] > 0 {
			// This pod is stale (a newer attempt of its job started): restarting cannot
			// help, so every rank says so.
			if fenced == nil {
				fenced = errors.New("rank 0 found it fenced by a newer attempt")
			}
			return &ConfigError{fmt.Sprintf("%s=%d: %v: a newer attempt of this job owns %s",
				contract.EnvRestartAttempt, r.cfg.Attempt, fenced, dir)}
		}
		step := int64(prop[0]) - 1
		if step < 0 {
			r.restored(0)
			return nil
		}
		lo, parts, outcome, err := r.verifyPart(step)
		vote := make([]float64, partOK) // ranks that found it corrupt, not committed, not fitting, unreadable
		if outcome != partOK {
			vote[outcome] = 1
		}
		if err := r.tr.AllReduce(vote); err != nil {
			return fmt.Errorf("rank %d resuming: %w", r.rank, err)
		}
		switch {
		case vote[partMisfit] > 0:
			if err == nil {
				err = fmt.Errorf("another rank found it does not fit")
			}
			return &ConfigError{fmt.Sprintf("checkpoint at step %d does not fit this model: %v", step, err)}
		case vote[partCorrupt] > 0:
			if err := r.dropCorrupt(step, err); err != nil {
				return err
			}
			continue
		case vote[partUnreadable] > 0:
			// Storage that cannot be read now is no reason to give up a step: fail, and
			// let the restarted gang try again.
			return fmt.Errorf("rank %d: checkpoint step %d could not be read by %.0f rank(s) (this one: %w)", r.rank, step, vote[partUnreadable], err)
		case vote[partUncommitted] > 0:
			if r.rank == 0 {
				_, _ = fmt.Fprintf(r.cfg.Log, "skipping checkpoint step %d: not committed\n", step)
			}
			continue
		}
		for i, t := range r.state() {
			whole, err := r.gather(lo, parts[i])
			if err != nil {
				return err
			}
			copy(t.data, whole)
		}
		if r.dev != nil {
			if err := r.dev.Load(r.params, r.adamM, r.adamV); err != nil {
				return rocmError(err)
			}
		}
		r.res.Step, r.res.CheckpointStep, r.cfg.restored = step, step, step
		if r.rank == 0 {
			_, _ = fmt.Fprintf(r.cfg.Log, "resumed from step %d\n", step)
		}
		r.restored(step)
		return nil
	}
}

// What a rank found when it verified its part of a step.
const (
	partCorrupt = iota
	partUncommitted
	partMisfit
	partUnreadable
	partOK
)

// verifyPart opens step's manifest and reads and verifies this rank's slice of every tensor
// of the state (parts in state() order).
func (r *rankState) verifyPart(step int64) (lo int64, parts [][]float32, outcome int, err error) {
	n := int64(r.n)
	lo, hi := n*int64(r.rank)/int64(r.world), n*int64(r.rank+1)/int64(r.world)
	ck, err := checkpoint.Open(r.cfg.CheckpointDir, step)
	switch {
	case errors.Is(err, checkpoint.ErrNotCommitted):
		return lo, nil, partUncommitted, err
	case errors.Is(err, checkpoint.ErrCorrupt):
		return lo, nil, partCorrupt, err
	case err != nil:
		return lo, nil, partUnreadable, err
	}
	// The shape first: sizes can trade off (vocabulary against MLP width) and the heads do
	// not change the count at all.
	if saved, ok := ck.Manifest.State[modelStateKey]; ok && saved != describe(r.shape) {
		return lo, nil, partMisfit, fmt.Errorf("it was saved by a model of %s, this one has %s", saved, describe(r.shape))
	}
	for _, t := range r.state() {
		switch got := ck.Elements(t.name); {
		case got < 0:
			return lo, nil, partMisfit, fmt.Errorf("it has no %q tensor (a checkpoint of another model: this one (%s) keeps params, adam.m and adam.v)", t.name, describe(r.shape))
		case got != n:
			return lo, nil, partMisfit, fmt.Errorf("its %q holds %d values, this model (%s) has %d parameters", t.name, got, describe(r.shape), n)
		}
	}
	for _, t := range r.state() {
		part, err := ck.Read(t.name, lo, hi-lo)
		if errors.Is(err, checkpoint.ErrCorrupt) {
			return lo, nil, partCorrupt, err
		}
		if err != nil {
			return lo, nil, partUnreadable, err
		}
		parts = append(parts, part)
	}
	return lo, parts, partOK, nil
}

// vecGrads is how many gradients the step's all-reduce vector carries: none when the device
// sums them itself.
func (r *rankState) vecGrads() int {
	if r.devReduce {
		return 0
	}
	return r.n
}

// pull copies the device's weights and moments to the host before they are saved.
func (r *rankState) pull() error {
	if r.dev == nil {
		return nil
	}
	p, m, v, err := r.dev.State()
	if err != nil {
		return fmt.Errorf("rank %d: copying the state from the device: %w", r.rank, err)
	}
	copy(r.params, p)
	copy(r.adamM, m)
	copy(r.adamV, v)
	return nil
}

// state is what a checkpoint holds besides the step: the master weights and AdamW's moments
// (the step count is the checkpoint's step), so a resumed run goes on bit for bit.
func (r *rankState) state() []tensor {
	return []tensor{{"params", r.params}, {"adam.m", r.adamM}, {"adam.v", r.adamV}}
}

// modelStateKey names the model's shape in a checkpoint's manifest state.
const modelStateKey = "model"

func describe(s model.Shape) string {
	return fmt.Sprintf("vocab %d, dim %d, layers %d, heads %d, ffn %d", s.Vocab, s.Dim, s.Layers, s.Heads, s.FFN)
}

// dropCorrupt is the ranks' common decision on a step some rank found corrupt: rank 0
// verifies the whole step to learn why and moves it aside; if it finds nothing wrong, or
// only storage it cannot read, the step is kept and the gang fails (a node that cannot read
// good data must not destroy it).
func (r *rankState) dropCorrupt(step int64, own error) error {
	decision := []float64{0} // 1: moved aside, 2: rank 0 found it good
	if r.rank == 0 {
		reason := own
		if !errors.Is(reason, checkpoint.ErrCorrupt) {
			ck, err := checkpoint.Open(r.cfg.CheckpointDir, step)
			if err == nil {
				err = ck.Verify()
			}
			reason = err
		}
		decision[0] = 2
		if errors.Is(reason, checkpoint.ErrCorrupt) {
			to, err := checkpoint.MoveAside(r.cfg.CheckpointDir, step, reason.Error())
			if err != nil {
				return fmt.Errorf("moving corrupt step %d aside: %w", step, err)
			}
			decision[0] = 1
			_, _ = fmt.Fprintf(r.cfg.Log, "checkpoint step %d is corrupt, moved to %s: %v\n", step, to, reason)
			if r.cfg.TerminationLog != "" {
				r.cfg.report.add(fmt.Sprintf("%s step=%d moved to %s: %s", contract.TerminationMessageCorruptPrefix, step, filepath.Base(to), truncate(reason.Error(), 300)))
			}
		}
	}
	if err := r.tr.AllReduce(decision); err != nil {
		return fmt.Errorf("rank %d resuming: %w", r.rank, err)
	}
	if decision[0] != 1 {
		return fmt.Errorf("rank %d: checkpoint step %d failed verification on some rank but rank 0 found no corruption: %w", r.rank, step, own)
	}
	// Every pod says so: the operator may see only the pod that fails next, not rank 0's.
	if r.rank != 0 && r.local == 0 && r.cfg.TerminationLog != "" {
		r.cfg.report.add(fmt.Sprintf("%s step=%d moved aside by rank 0", contract.TerminationMessageCorruptPrefix, step))
	}
	return nil
}

// gather gives every rank the whole parameters from each rank's verified slice, bit for bit:
// an all-gather of the bytes where the transport has one, else an all-reduce of the float32
// bits (as exact float64 integers, every other rank adding zero), so no bit changes, the
// sign of zero and NaN payloads included.
func (r *rankState) gather(lo int64, part []float32) ([]float32, error) {
	if r.world == 1 {
		return part, nil
	}
	if g, ok := r.tr.(transport.Gatherer); ok {
		b := make([]byte, 4*len(part))
		for i, x := range part {
			binary.LittleEndian.PutUint32(b[4*i:4*i+4], math.Float32bits(x))
		}
		parts, err := g.AllGather(b)
		if err != nil {
			return nil, fmt.Errorf("rank %d sharing restored parameters: %w", r.rank, err)
		}
		out := make([]float32, r.n)
		n := int64(r.n)
		for k, p := range parts {
			klo := n * int64(k) / int64(r.world)
			dst := out[klo : n*int64(k+1)/int64(r.world)]
			if len(p) != 4*len(dst) {
				return nil, fmt.Errorf("rank %d sharing restored parameters: rank %d sent %d bytes, want %d", r.rank, k, len(p), 4*len(dst))
			}
			for i := range dst {
				dst[i] = math.Float32frombits(binary.LittleEndian.Uint32(p[4*i : 4*i+4]))
			}
		}
		return out, nil
	}
	vec := make([]float64, r.n)
	for i, x := range part {
		vec[lo+int64(i)] = float64(math.Float32bits(x))
	}
	if err := r.tr.AllReduce(vec); err != nil {
		return nil, fmt.Errorf("rank %d sharing restored parameters: %w", r.rank, err)
	}
	out := make([]float32, r.n)
	for i, v := range vec {
		out[i] = math.Float32frombits(uint32(v))
	}
	return out, nil
}

// restored tells the operator, once per process, which step training goes on from (0: none).
func (r *rankState) restored(step int64) {
	if r.local == 0 && r.cfg.TerminationLog != "" {
		r.cfg.report.add(contract.TerminationMessageRestoredPrefix + strconv.FormatInt(step, 10))
	}
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "..."
}

// startTraining starts the clocks of throughput and time-based checkpoints.
func (r *rankState) startTraining() {
	r.start, r.resumed = time.Now(), r.res.Step
	r.res.TrainingSince = r.start
	r.lastSave = time.Now()
}

// stopVote is what the step's all-reduce said about stopping: how many ranks were signalled
// and the sum of their ranks (the rank itself when only one was).
type stopVote struct{ count, rankSum int }

// step trains one step in lockstep with every rank and returns the ranks' stop and save calls.
func (r *rankState) step(ctx context.Context) (stop stopVote, periodDue bool, err error) {
	began := time.Now()
	if r.cfg.Pace > 0 {
		time.Sleep(r.cfg.Pace) // before the step's all-reduce, so every rank keeps the pace
	}
	vec, err := r.gradients()
	if err != nil {
		return stop, false, err
	}
	if r.cfg.slow != nil && r.cfg.slow.Load() {
		time.Sleep(max(time.Since(began), 20*time.Millisecond))
	}
	// What kept this rank busy before it met the others: a straggler's is the largest.
	vec[6+r.vecGrads()+r.cfg.NodeRank] += time.Since(began).Seconds() / float64(r.cfg.GPUsPerNode)
	if err := r.vote(ctx, vec); err != nil {
		return stop, false, err
	}
	if err := r.tr.AllReduce(vec); err != nil {
		return stop, false, fmt.Errorf("rank %d step %d: all-reduce: %w", r.rank, r.res.Step, err)
	}
	if err := r.apply(vec); err != nil {
		return stop, false, err
	}
	if r.rank == 0 {
		r.nodeBusy = smoothNodes(r.nodeBusy, vec[6+r.vecGrads():])
	}
	r.report()
	n := r.vecGrads()
	return stopVote{int(vec[1+n]), int(vec[5+n])}, vec[4+n] > 0, nil
}

// gradients puts this rank's loss and weight gradients of the step into a new all-reduce vector.
func (r *rankState) gradients() ([]float64, error) {
	cfg, n := &r.cfg, r.vecGrads()
	tokens := model.Tokens(cfg.Seed, r.res.Step, r.dp, cfg.Seq, r.shape.Vocab)
	b := model.Batch{Norm: r.norm}
	for _, p := range r.pos {
		b.Inputs, b.Targets = append(b.Inputs, tokens[p]), append(b.Targets, tokens[p+1])
	}
	// One all-reduce carries the loss, the weight gradients, the stop vote, whether this
	// rank's background save is written, the last step rank 0 committed, and rank 0's call
	// (by its clock) that a time-based checkpoint is due after this step, and the sum of the
	// signalled ranks (see vote); then each node's busy seconds (see step).
	vec := make([]float64, 6+n+cfg.Nodes)
	var loss float64
	var err error
	switch {
	case r.devReduce:
		loss, err = r.dev.GradReduced(b)
	case r.dev != nil:
		loss, err = r.dev.Grad(b, vec[1:1+n])
	default:
		att := model.Ring{Backend: r.be, Layout: r.layout, Rank: r.cpRank, KV: ring.Over(r.tr), Blocks: ring.OverBlocks(r.tr)}
		loss, err = r.shape.Grad(r.params, b, att, model.BF16, vec[1:1+n])
	}
	if err != nil {
		return nil, fmt.Errorf("rank %d step %d: %w", r.rank, r.res.Step, err)
	}
	vec[0] = loss / r.norm
	return vec, nil
}

// vote adds the stop vote, the background save's state and rank 0's checkpoint calls to vec.
func (r *rankState) vote(ctx context.Context, vec []float64) error {
	n := r.vecGrads()
	if ctx.Err() != nil {
		vec[1+n], vec[5+n] = 1, float64(r.rank)
	}
	if r.pending != nil {
		if written, err := r.pending.written(); err != nil {
			return err
		} else if written {
			vec[2+n] = 1
		}
	}
	if r.rank == 0 {
		vec[3+n] = float64(r.res.CheckpointStep)
		if r.cfg.CheckpointPeriod > 0 && time.Since(r.lastSave) >= r.cfg.CheckpointPeriod {
			vec[4+n] = 1
		}
	}
	return nil
}

// apply commits a background save every rank has written and updates the parameters.
func (r *rankState) apply(vec []float64) error {
	n := r.vecGrads()
	r.res.CheckpointStep = max(r.res.CheckpointStep, int64(vec[3+n]))
	if r.pending != nil && int(vec[2+n]) == r.world {
		// Every rank's shard is on disk: rank 0 commits, the others hear of it next step.
		if r.rank == 0 {
			if err := commit(r.cfg, r.world, r.pending.step); err != nil {
				return err
			}
			r.res.CheckpointStep = r.pending.step
		}
		r.pending = nil
	}
	update := func() error { return r.opt.Update(r.shape, r.params, r.adamM, r.adamV, vec[1:1+n], r.res.Step+1) }
	switch {
	case r.devReduce:
		update = func() error { return r.dev.UpdateReduced(r.opt, r.res.Step+1) }
	case r.dev != nil:
		update = func() error { return r.dev.Update(r.opt, r.res.Step+1, vec[1:1+n]) }
	}
	if err := update(); err != nil {
		return fmt.Errorf("rank %d step %d: %w", r.rank, r.res.Step, err)
	}
	r.res.Step++
	r.res.Loss = vec[0]
	return nil
}

// report touches the heartbeat and publishes the step's progress in metrics and the log.
func (r *rankState) report() {
	cfg, res := &r.cfg, &r.res
	local0 := r.local == 0 // reports this process's metrics
	if cfg.HeartbeatFile != "" {
		touch(cfg.HeartbeatFile)
	}
	res.LastStepAt = time.Now()
	if r.local == 0 && cfg.board != nil { // every node answers; rank 0 also times the nodes
		cfg.board.set(contract.Progress{
			Step: res.Step, ResumedFrom: r.resumed, CheckpointStep: res.CheckpointStep,
			StepSeconds:   time.Since(r.start).Seconds() / float64(max(res.Step-r.resumed, 1)),
			TrainingSince: r.start, LastStepAt: res.LastStepAt, NodeStepSeconds: r.nodeBusy,
		})
	}
	if local0 && cfg.Metrics != nil {
		cfg.Metrics.Step.Set(float64(res.Step))
		cfg.Metrics.Loss.Set(res.Loss)
		cfg.Metrics.TokensPerSec.Set(float64(int64(cfg.Seq*r.dpGroups)*(res.Step-r.resumed)) / time.Since(r.start).Seconds())
	}
	if r.rank == 0 && (res.Step%int64(max(cfg.LogEvery, 1)) == 0 || res.Step == int64(cfg.Steps)) {
		tokens := float64(int64(cfg.Seq*r.dpGroups)*(res.Step-r.resumed)) / time.Since(r.start).Seconds()
		_, _ = fmt.Fprintf(cfg.Log, "step %d loss %.6g tokens/s %.0f at %s\n", res.Step, res.Loss, tokens, res.LastStepAt.UTC().Format(time.RFC3339Nano))
	}
	if local0 && cfg.Metrics != nil {
		cfg.Metrics.CheckpointStep.Set(float64(res.CheckpointStep))
	}
}

// saveAndStop checkpoints the step the ranks agreed to stop after and returns why they stopped:
// always a StoppedError, also on a rank nobody signalled, so that no rank reports a run it
// did not finish as done.
func (r *rankState) saveAndStop(ctx context.Context, vote stopVote) error {
	if err := finishSave(r.cfg, r.tr, r.rank, r.world, &r.pending, &r.res); err != nil {
		return err
	}
	if r.cfg.CheckpointDir != "" {
		if err := r.pull(); err != nil {
			return err
		}
		if err := save(r.cfg, r.tr, r.rank, r.world, r.res.Step, r.state()); err != nil {
			return err
		}
		r.res.CheckpointStep = r.res.Step
	}
	why := fmt.Sprintf("%d ranks were stopped at step %d", vote.count, r.res.Step)
	switch {
	case ctx.Err() != nil:
		why = fmt.Sprintf("rank %d was signalled at step %d", r.rank, r.res.Step)
	case vote.count == 1:
		why = fmt.Sprintf("peer rank %d was stopped at step %d", vote.rankSum, r.res.Step)
	}
	return &StoppedError{Step: r.res.Step, Why: why, err: ctx.Err()}
}

// checkpointIfDue starts a background save when the step or time interval says so.
func (r *rankState) checkpointIfDue(periodDue bool) error {
	cfg := r.cfg
	due := (cfg.CheckpointEvery > 0 && r.res.Step%int64(cfg.CheckpointEvery) == 0) || periodDue
	if cfg.CheckpointDir == "" || !due {
		return nil
	}
	r.lastSave = time.Now()
	// A save still in flight is finished first: storage slower than the interval then
	// holds training rather than let a fault lose more than one interval.
	began := time.Now()
	if err := finishSave(cfg, r.tr, r.rank, r.world, &r.pending, &r.res); err != nil {
		return err
	}
	if err := r.pull(); err != nil {
		return err
	}
	r.pending = startSave(cfg, r.rank, r.world, r.res.Step, r.state())
	if r.local == 0 && cfg.Metrics != nil {
		cfg.Metrics.SaveSeconds.Observe(time.Since(began).Seconds())
	}
	return nil
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

// startSave snapshots this rank's slice of the state and writes it in the background, so
// training does not wait on storage; the commit follows once every rank reports its shard.
func startSave(cfg Config, rank, world int, step int64, state []tensor) *inflight {
	shard := shardOf(rank, world, state)
	for i := range shard {
		shard[i].Data = slices.Clone(shard[i].Data)
	}
	f := &inflight{step: step, done: make(chan error, 1)}
	go func() {
		f.done <- checkpoint.WriteShard(cfg.CheckpointDir, cfg.Attempt, step, rank, shard)
	}()
	return f
}

// shardOf is rank's slice of every tensor of the state, sharing its storage.
func shardOf(rank, world int, state []tensor) []checkpoint.Tensor {
	var out []checkpoint.Tensor
	for _, t := range state {
		n := int64(len(t.data))
		lo, hi := n*int64(rank)/int64(world), n*int64(rank+1)/int64(world)
		out = append(out, checkpoint.Tensor{Name: t.name, Shape: []int64{n}, Start: lo, Data: t.data[lo:hi]})
	}
	return out
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
	state := map[string]string{"step": strconv.FormatInt(step, 10), modelStateKey: describe(cfg.shape())}
	if _, err := checkpoint.Commit(cfg.CheckpointDir, cfg.Attempt, step, world, state,
		checkpoint.Retention{Keep: cfg.Keep, Protect: cfg.restored}); err != nil {
		return err
	}
	_, _ = fmt.Fprintf(cfg.Log, "checkpoint step %d committed\n", step)
	return nil
}

// save writes this rank's slice of the state; rank 0 commits once every rank has.
func save(cfg Config, tr transport.Transport, rank, world int, step int64, state []tensor) error {
	if err := checkpoint.WriteShard(cfg.CheckpointDir, cfg.Attempt, step, rank, shardOf(rank, world, state)); err != nil {
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
