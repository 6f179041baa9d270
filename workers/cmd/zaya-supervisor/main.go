// zaya-supervisor runs a worker's command under the job's restart rule, for clusters whose
// kubelet has no container restart rules (faultTolerance.inPlaceMechanism Supervisor):
//
//	zaya-supervisor [--] command [args...]
//
// It needs no API access. See docs/worker-contract.md, "Supervisor".
package main

import (
	"fmt"
	"os"

	"github.com/zaya-operator/zaya-operator/api/contract"
	"github.com/zaya-operator/zaya-operator/workers/supervisor"
)

func main() {
	args := os.Args[1:]
	if len(args) > 0 && args[0] == "--" {
		args = args[1:]
	}
	cfg := supervisor.Config{Args: args, TerminationLog: os.Getenv(contract.EnvTerminationLog), Log: os.Stderr}
	if cfg.TerminationLog == "" {
		cfg.TerminationLog = "/dev/termination-log"
	}
	if s, ok := os.LookupEnv(contract.EnvRestartExitCodes); ok {
		rule, err := contract.ParseRestartRule(s)
		if err != nil {
			// A rule it cannot read is a configuration error, reported as the worker's fatal
			// exit: restarting would loop on it.
			fmt.Fprintf(os.Stderr, "zaya-supervisor: %s: %v\n", contract.EnvRestartExitCodes, err)
			cfg.Args = nil
			rule = contract.RestartRule{Codes: []int32{0, contract.ExitConfig}}
		}
		cfg.Rule = &rule
	}
	os.Exit(supervisor.Run(cfg))
}
