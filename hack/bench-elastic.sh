#!/usr/bin/env bash
# Goodput of one schedule with and without spec.elastic (issue 38): a 4-node reference-worker
# job on process-backed nodes of the local kwok cluster loses a node with no free node; DOWN
# later (default 60s) another node becomes schedulable. Prints each job's wall time and goodput,
# as the e2e test logs them.
#   DOWN=120s hack/bench-elastic.sh
set -euo pipefail
source "$(dirname "$0")/lib.sh"
export ZAYA_CLUSTER=${ZAYA_CLUSTER:-zaya-bench-elastic}
out=$(mktemp)
ZAYA_E2E_ELASTIC_BENCH=1 ZAYA_E2E_ELASTIC_DOWN=${DOWN:-60s} "$root/hack/e2e.sh" -run 'TestElasticGoodputBench' -timeout 60m -v >"$out" 2>&1 || {
	tail -n 80 "$out"
	exit 1
}
grep -E 'goodput|--- (PASS|FAIL)' "$out" | sed 's/^ *//'
rm -f "$out"
