package train

import (
	"cmp"
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/zaya-operator/zaya-operator/api/contract"
	"github.com/zaya-operator/zaya-operator/workers/exactsum"
	"github.com/zaya-operator/zaya-operator/workers/model"
	"github.com/zaya-operator/zaya-operator/workers/rocm"
)

// ExitConfig is the worker contract's exit code for a configuration error: fatal, no restart.
const ExitConfig = contract.ExitConfig

// ConfigError is a configuration problem; the worker exits with ExitConfig.
type ConfigError struct{ Msg string }

func (e *ConfigError) Error() string { return e.Msg }

// Config is one worker process: its node's ranks and the job's shape.
type Config struct {
	NodeRank, Nodes, GPUsPerNode, ContextParallel int
	// TargetNodes is ZAYA_TARGET_NODES, the width whose global batch every step trains
	// (elastic jobs; 0: Nodes). Above Nodes, each data-parallel group trains more
	// micro-batches.
	TargetNodes                   int
	Master                        string // MASTER_ADDR:MASTER_PORT
	MasterListen                  string // where rank 0 listens ("": every interface)
	Listen                        string // where ring neighbours connect (":0")
	RendezvousTimeout             time.Duration
	PeerTimeout                   time.Duration // a peer silent this long is lost (0: the transport's default; negative: no bound)
	CollectiveTimeout             time.Duration // ZAYA_COLLECTIVE_TIMEOUT: a live peer's part waited for at most this long (0: no bound)
	CheckpointDir                 string
	Attempt                       int           // ZAYA_RESTART_ATTEMPT, the generation; after resume, the attempt number this start writes under
	JobUID                        string        // ZAYA_JOB_UID: owns the checkpoint directory
	CheckpointEvery, Keep         int           // steps between checkpoints (0: none)
	CheckpointPeriod              time.Duration // time between checkpoints (0: none)
	HeartbeatFile, TerminationLog string
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
	if getenv(contract.EnvTargetNodes) != "" {
		if err := num(contract.EnvTargetNodes, &cfg.TargetNodes, 1); err != nil {
			return cfg, err
		}
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
	case max(c.Nodes, c.TargetNodes, c.GPUsPerNode) > exactsum.MaxTerms:
		// Bounded before any product of them: a huge value must not wrap into a small one.
		return &ConfigError{fmt.Sprintf("%s=%d, %s=%d, %s=%d: this worker sums at most %d ranks' gradients exactly",
			contract.EnvNNodes, c.Nodes, contract.EnvTargetNodes, c.TargetNodes, contract.EnvGPUsPerNode, c.GPUsPerNode, exactsum.MaxTerms)}
	case c.NodeRank < 0 || c.NodeRank >= c.Nodes:
		return &ConfigError{fmt.Sprintf("%s=%d is outside 0..%d", contract.EnvNodeRank, c.NodeRank, c.Nodes-1)}
	case c.ContextParallel < 1 || world%c.ContextParallel != 0:
		return &ConfigError{fmt.Sprintf("%s=%d must divide the world size %d", contract.EnvContextParallel, c.ContextParallel, world)}
	case c.TargetNodes != 0 && c.TargetNodes < c.Nodes:
		return &ConfigError{fmt.Sprintf("%s=%d is below %s=%d: a job grows back to its target, never past it", contract.EnvTargetNodes, c.TargetNodes, contract.EnvNNodes, c.Nodes)}
	case int64(cmp.Or(c.TargetNodes, c.Nodes))*int64(c.GPUsPerNode) > exactsum.MaxTerms:
		// A step's gradient is the exact sum of one term per micro-batch and context-parallel rank.
		return &ConfigError{fmt.Sprintf("%d nodes of %d GPUs: this worker sums at most %d ranks' gradients exactly", cmp.Or(c.TargetNodes, c.Nodes), c.GPUsPerNode, exactsum.MaxTerms)}
	case c.TargetNodes != 0 && c.TargetNodes*c.GPUsPerNode%c.ContextParallel != 0:
		return &ConfigError{fmt.Sprintf("%s=%d: %d GPUs are not whole rings of %s=%d", contract.EnvTargetNodes, c.TargetNodes, c.TargetNodes*c.GPUsPerNode, contract.EnvContextParallel, c.ContextParallel)}
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

// microBatches is how many sequences every step trains: one per data-parallel group of the
// target width, whatever this run's width.
func (c Config) microBatches() int {
	return cmp.Or(c.TargetNodes, c.Nodes) * c.GPUsPerNode / c.ContextParallel
}

// shape is the model's size with the defaults filled in.
func (c Config) shape() model.Shape {
	s := c.Model
	if s.FFN == 0 {
		s.FFN = 4 * s.Dim
	}
	return s
}
