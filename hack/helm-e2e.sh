#!/usr/bin/env bash
# make test-helm: a fresh local cluster (4 fake MI300X nodes for the sample jobs), then
# test/chart with the e2e tag: helm lint/template checks and a real `helm install --wait` whose
# operator pod runs the real binary on a process-backed node (test/nodeagent). Extra
# arguments go to `go test`.
set -euo pipefail
source "$(dirname "$0")/lib.sh"
export ZAYA_CLUSTER=${ZAYA_CLUSTER:-zaya-helm}
"$root/hack/tools.sh" cluster helm
go build -o "$bin/zaya-operator" "$root"
trap '"$root/hack/cluster.sh" down' EXIT
KUBECONFIG=$("$root/hack/cluster.sh" up 4)
export KUBECONFIG ZAYA_E2E_OPERATOR="$bin/zaya-operator"
go test -tags e2e -count=1 "$@" ./test/chart/...
