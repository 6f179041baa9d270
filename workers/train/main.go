package train

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strconv"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/zaya-operator/zaya-operator/api/contract"
	"github.com/zaya-operator/zaya-operator/workers/transport"
)

// minPeerTimeout keeps heartbeats (4 per timeout) coarser than a busy scheduler's delays.
const minPeerTimeout = 100 * time.Millisecond

// Main is the zaya-worker command: flags for the model, the worker contract's environment for
// everything else. It returns the process exit code: 0 done, 78 bad configuration, 75
// stopped before the last step through no fault of its own (signalled, a peer was and the
// ranks saved together, or a peer failed: lost in a collective, missing at the rendezvous),
// 1 failed by itself (the root failure the operator looks for).
func Main(args []string, getenv func(string) string, stderr io.Writer) int {
	fs := flag.NewFlagSet("zaya-worker", flag.ContinueOnError)
	fs.SetOutput(stderr)
	cfg := Config{Log: stderr, TerminationLog: "/dev/termination-log"}
	if p := getenv(contract.EnvTerminationLog); p != "" {
		cfg.TerminationLog = p
	}
	peerTimeout := transport.DefaultPeerTimeout
	if v := getenv(contract.EnvPeerTimeout); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil {
			_, _ = fmt.Fprintf(stderr, "zaya-worker: configuration: %s=%q must be a duration (5s; 0 turns the bound off)\n", contract.EnvPeerTimeout, v)
			return ExitConfig
		}
		peerTimeout = d
	}
	fs.IntVar(&cfg.Steps, "steps", 100, "training steps")
	fs.IntVar(&cfg.Seq, "seq", 32, "sequence length (a multiple of 2 x "+contract.EnvContextParallel+")")
	fs.IntVar(&cfg.Model.Vocab, "vocab", 32, "vocabulary size")
	fs.IntVar(&cfg.Model.Dim, "dim", 16, "model width (a multiple of -heads)")
	fs.IntVar(&cfg.Model.Layers, "layers", 2, "decoder blocks")
	fs.IntVar(&cfg.Model.Heads, "heads", 2, "attention heads")
	fs.IntVar(&cfg.Model.FFN, "ffn", 0, "MLP width (default 4 x -dim)")
	fs.Float64Var(&cfg.LR, "lr", 0.01, "AdamW's learning rate")
	fs.Uint64Var(&cfg.Seed, "seed", 1, "seed of the model and the data")
	fs.StringVar(&cfg.Listen, "listen", ":0", "address ring neighbours connect to")
	fs.StringVar(&cfg.MasterListen, "master-listen", "", "where rank 0 listens for the rendezvous (default: every interface at MASTER_PORT; hosts shared by several pods, such as process-backed test nodes, give the pod's own address)")
	fs.StringVar(&cfg.ParamsOut, "params-out", "", "write the final parameters here (rank 0)")
	fs.DurationVar(&cfg.RendezvousTimeout, "rendezvous-timeout", 5*time.Minute, "how long to wait for every rank to join")
	fs.DurationVar(&peerTimeout, "peer-timeout", peerTimeout, "a peer silent this long (frozen, its host gone) is lost: exit 75; 0 turns the bound off; "+contract.EnvPeerTimeout+" sets its default")
	fs.StringVar(&cfg.TerminationLog, "termination-log", cfg.TerminationLog, "where the last committed checkpoint step is appended on exit")
	fs.StringVar(&cfg.FaultFile, "fault-file", "", "chaos tests only: a file polled every step; a fault named in it (gpu, nic, usercode) ends the process as the real one would; slow makes this node a straggler")
	fs.DurationVar(&cfg.Pace, "pace", 0, "make every step take at least this long (demos and chaos tests)")
	fs.IntVar(&cfg.LogEvery, "log-every", 10, "print progress every N steps")
	fs.StringVar(&cfg.Transport, "transport", "tcp", "collectives: tcp, or rccl (a worker built with -tags rocm)")
	fs.StringVar(&cfg.Backend, "backend", "cpu", "attention math: cpu, or hip (the gfx942 kernels; -tags rocm)")
	fs.StringVar(&cfg.KernelDir, "kernel-dir", "/opt/zaya/kernels", "where the hip backend finds its code objects")
	fs.StringVar(&cfg.Libraries.HIP, "hip-library", "", "the HIP runtime to load (default libamdhip64.so, .so.6, .so.5)")
	fs.StringVar(&cfg.Libraries.RCCL, "rccl-library", "", "RCCL to load (default librccl.so, .so.1)")
	fixedWidth := fs.Bool("fixed-width", false, "refuse to train below ZAYA_TARGET_NODES: exit "+strconv.Itoa(contract.ExitNoResize)+", as a trainer that cannot resize does")
	metricsAddr := fs.String("metrics-addr", ":9400", "address of the Prometheus /metrics endpoint; empty disables it")
	if err := fs.Parse(args); err != nil {
		return ExitConfig
	}
	cfg.PeerTimeout = peerTimeout
	if peerTimeout <= 0 {
		cfg.PeerTimeout = -1 // the transport's "no bound"; its 0 is the default
	}
	cfg, err := FromEnv(cfg, getenv)
	if err != nil {
		_, _ = fmt.Fprintln(stderr, "zaya-worker: configuration:", err)
		return ExitConfig
	}
	if *fixedWidth && cfg.TargetNodes > cfg.Nodes {
		// A trainer that cannot resize says so at start (docs/worker-contract.md).
		_, _ = fmt.Fprintf(stderr, "zaya-worker: -fixed-width: %s=%d, %s=%d: this run trains only at its target width\n",
			contract.EnvNNodes, cfg.Nodes, contract.EnvTargetNodes, cfg.TargetNodes)
		return contract.ExitNoResize
	}
	if *metricsAddr != "" {
		reg := prometheus.NewRegistry()
		cfg.Metrics = NewMetrics(reg)
		cfg.board = &board{}
		addr, err := serveMetrics(*metricsAddr, reg, cfg.board)
		if err != nil {
			_, _ = fmt.Fprintln(stderr, "zaya-worker: metrics:", err)
			return 1
		}
		_, _ = fmt.Fprintf(stderr, "zaya-worker: metrics on http://%s/metrics\n", addr)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	res, err := Run(ctx, cfg)
	code := exitCode(err)
	switch code {
	case ExitConfig:
		_, _ = fmt.Fprintln(stderr, "zaya-worker: configuration:", err)
	case contract.ExitStopped:
		_, _ = fmt.Fprintf(stderr, "zaya-worker: stopped at step %d, checkpoint %d: %v\n", res.Step, res.CheckpointStep, err)
	case 0:
		_, _ = fmt.Fprintf(stderr, "zaya-worker: done at step %d, loss %.6g\n", res.Step, res.Loss)
	default:
		_, _ = fmt.Fprintln(stderr, "zaya-worker:", err)
	}
	return code
}

// exitCode is the worker contract's exit code for Run's error.
func exitCode(err error) int {
	var cerr *ConfigError
	var stopped *StoppedError
	switch {
	case err == nil:
		return 0
	case errors.As(err, &cerr):
		return ExitConfig
	case errors.As(err, &stopped), errors.Is(err, context.Canceled):
		// Not done, and not this rank's fault: exit 0 would tell the operator the run is
		// complete, exit 1 that this rank is the root failure.
		return contract.ExitStopped
	}
	return 1
}
