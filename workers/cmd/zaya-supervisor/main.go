// zaya-supervisor runs a worker's command under the job's restart rule, for clusters whose
// kubelet has no container restart rules (faultTolerance.inPlaceMechanism Supervisor), and
// stops it when another rank of the gang fails or is lost (the gang watch):
//
//	zaya-supervisor [--gang-listen=ADDR] [--gang-timeout=DURATION] [--no-gang] [--progress-listen=ADDR] [--answer-listen=ADDR] [--] command [args...]
//	zaya-supervisor install DIR
//
// It also reports the progress a trainer writes to ZAYA_PROGRESS_FILE, serving it at
// --progress-listen (default :9400; empty: nowhere) once the trainer wrote a report, and
// answers the operator at --answer-listen (default $ZAYA_POD_IP:29511; nowhere without it)
// while it runs, so that a rank its peers lost can be told from a lost node. It needs no API
// access. See docs/worker-contract.md, "Progress" and "The supervisor". `install`
// copies the binary into DIR, as the init container the operator adds does (faultTolerance.
// supervisor Inject).
package main

import (
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/zaya-operator/zaya-operator/api/contract"
	"github.com/zaya-operator/zaya-operator/workers/gangwatch"
	"github.com/zaya-operator/zaya-operator/workers/supervisor"
)

func main() {
	args := os.Args[1:]
	if len(args) > 0 && args[0] == "install" {
		if len(args) != 2 {
			fmt.Fprintln(os.Stderr, "zaya-supervisor: usage: zaya-supervisor install DIR")
			os.Exit(contract.ExitConfig)
		}
		if err := supervisor.Install(args[1]); err != nil {
			fmt.Fprintf(os.Stderr, "zaya-supervisor: %v\n", err)
			os.Exit(1)
		}
		return
	}
	// On the pod's own address where the operator says it (it injected the supervisor),
	// else on every address.
	ip := os.Getenv(contract.EnvPodIP)
	listen, timeout, watch := net.JoinHostPort(ip, strconv.Itoa(contract.GangWatchPort)), 5*time.Second, true
	progressListen := net.JoinHostPort(ip, strconv.Itoa(contract.ProgressPort))
	answerListen := ""
	if ip != "" {
		// Only where the operator injected it and said where: its pod declares the port.
		answerListen = net.JoinHostPort(ip, strconv.Itoa(contract.SupervisorPort))
	}
	if d, err := time.ParseDuration(os.Getenv(contract.EnvPeerTimeout)); err == nil && d > 0 {
		timeout = d
	}
	var bad error
	for len(args) > 0 && strings.HasPrefix(args[0], "--") {
		a := args[0]
		args = args[1:]
		switch {
		case a == "--":
		case a == "--no-gang":
			watch = false
			continue
		case strings.HasPrefix(a, "--gang-listen="):
			listen = strings.TrimPrefix(a, "--gang-listen=")
			continue
		case strings.HasPrefix(a, "--progress-listen="):
			progressListen = strings.TrimPrefix(a, "--progress-listen=")
			continue
		case strings.HasPrefix(a, "--answer-listen="):
			answerListen = strings.TrimPrefix(a, "--answer-listen=")
			continue
		case strings.HasPrefix(a, "--gang-timeout="):
			d, err := time.ParseDuration(strings.TrimPrefix(a, "--gang-timeout="))
			if err != nil || d < 100*time.Millisecond {
				bad = fmt.Errorf("%s: want a duration of at least 100ms", a)
			}
			timeout = d
			continue
		default:
			bad = fmt.Errorf("unknown flag %s", a)
		}
		break
	}
	cfg := supervisor.Config{Args: args, TerminationLog: os.Getenv(contract.EnvTerminationLog), Log: os.Stderr, JoinWait: 2 * time.Minute, OwnStop: 2 * time.Second, StopGrace: 5 * time.Second, CutGrace: time.Second,
		ProgressListen: progressListen, AnswerListen: answerListen}
	if cfg.TerminationLog == "" {
		cfg.TerminationLog = "/dev/termination-log"
	}
	if s := os.Getenv(contract.EnvNodeLostAt); s != "" {
		if at, err := time.Parse(time.RFC3339Nano, s); err == nil {
			cfg.NodeLostAt = at
		} else {
			fmt.Fprintf(os.Stderr, "zaya-supervisor: %s: %v: not waiting for the replaced rank\n", contract.EnvNodeLostAt, err)
		}
	}
	if s, ok := os.LookupEnv(contract.EnvRestartExitCodes); ok {
		rule, err := contract.ParseRestartRule(s)
		if err != nil {
			// A rule it cannot read is a configuration error, reported as the worker's fatal
			// exit: restarting would loop on it.
			bad = fmt.Errorf("%s: %w", contract.EnvRestartExitCodes, err)
			rule = contract.RestartRule{Codes: []int32{0, contract.ExitConfig}}
		}
		cfg.Rule = &rule
	}
	if bad != nil {
		fmt.Fprintf(os.Stderr, "zaya-supervisor: %v\n", bad)
		cfg.Args = nil
	}
	if watch {
		cfg.Gang = gangOf(listen, timeout)
	}
	os.Exit(supervisor.Run(cfg))
}

// gangOf is this rank's gang watch from the worker contract's environment: nil for a job of
// one node, or outside a job.
func gangOf(listen string, timeout time.Duration) *gangwatch.Config {
	nodes, err1 := strconv.Atoi(os.Getenv(contract.EnvNNodes))
	rank, err2 := strconv.Atoi(os.Getenv(contract.EnvNodeRank))
	gpus, _ := strconv.Atoi(os.Getenv(contract.EnvGPUsPerNode))
	addr := os.Getenv(contract.EnvMasterAddr)
	if err1 != nil || err2 != nil || nodes < 2 || rank < 0 || rank >= nodes || addr == "" {
		return nil
	}
	_, port, err := net.SplitHostPort(listen)
	if err != nil {
		port = strconv.Itoa(contract.GangWatchPort)
	}
	return &gangwatch.Config{
		Rank: rank, GPUsPerNode: max(gpus, 1), Hub: net.JoinHostPort(addr, port), Listen: listen,
		Token:   os.Getenv(contract.EnvJobUID) + "/" + os.Getenv(contract.EnvRestartAttempt),
		Timeout: timeout, Log: os.Stderr,
	}
}
