// Command kubectl-zaya is the kubectl plugin of ZayaTrainingJobs: `kubectl zaya status JOB`,
// `why`, `goodput`, `logs` and `preflight`. Install it with
// `go install github.com/zaya-operator/zaya-operator/cmd/kubectl-zaya@latest`.
package main

import (
	"context"
	"os"

	"github.com/zaya-operator/zaya-operator/internal/zayactl"
)

func main() {
	os.Exit(zayactl.Main(context.Background(), os.Args[1:], os.Stdout, os.Stderr))
}
