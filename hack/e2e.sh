#!/usr/bin/env bash
# make test-e2e: runs test/e2e against a fresh local cluster of fake MI300X nodes, then removes
# it: 18 fake MI300X nodes (16 for the gang tests, 2 spare), process-backed nodes started by the
# tests that run the worker, and the operator binary as a process. Extra arguments go to `go
# test`. The same suite runs on kind with real kubelets (hack/kind/e2e.sh, make test-kind).
set -euo pipefail
source "$(dirname "$0")/lib.sh"
export ZAYA_CLUSTER=${ZAYA_CLUSTER:-zaya-e2e}
"$root/hack/tools.sh" cluster
go build -o "$bin/zaya-operator" "$root"
go build -o "$bin/zaya-worker" "$root/workers/cmd/zaya-worker"
go build -o "$bin/zaya-supervisor" "$root/workers/cmd/zaya-supervisor"
trap '"$root/hack/cluster.sh" down' EXIT
KUBECONFIG=$("$root/hack/cluster.sh" up 18)
export KUBECONFIG ZAYA_E2E_KUBECTL="$bin/kubectl" ZAYA_E2E_OPERATOR="$bin/zaya-operator" ZAYA_E2E_WORKER="$bin/zaya-worker" ZAYA_E2E_SUPERVISOR="$bin/zaya-supervisor"
# The suite runs about 10 minutes on 2 cores: more than go test's default timeout allows.
ZAYA_E2E_WORLD=kwok go test -tags e2e -count=1 -timeout 25m "$@" ./test/e2e/...
