// Command zaya-worker is the reference training worker of zaya-operator (docs/worker-contract.md):
// one process per pod driving its node's ranks, ring attention across context-parallel groups,
// distributed checkpoints and resume. This build uses the CPU backend and TCP.
package main

import (
	"os"

	"github.com/zaya-operator/zaya-operator/workers/train"
)

func main() {
	os.Exit(train.Main(os.Args[1:], os.Getenv, os.Stderr))
}
