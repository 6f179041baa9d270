#!/usr/bin/env bash
# Recovery benchmark: a running job of N nodes loses one rank (its worker exits 1); the clock
# runs until every rank of the restarted gang runs again. Prints a markdown table.
#   NODES_LIST="128" RUNS=5 hack/bench-recovery.sh
RECOVER=1 NODES_LIST=${NODES_LIST:-128} exec "$(dirname "$0")/bench-launch.sh"
