#!/usr/bin/env bash
# Launch benchmark: time from `create` to all ranks Running for jobs of 128 and 1024 nodes on
# the local cluster (real apiserver and scheduler, kwok nodes with no start delay), and the
# operator's share of it. Prints a markdown table for BENCHMARKS.md.
#   NODES_LIST="128 1024" RUNS=3 hack/bench-launch.sh
# With RECOVER=1 it measures a gang restart instead: one rank of a running job exits 1, and
# the clock runs until every rank of the new attempt runs (hack/bench-recovery.sh).
set -euo pipefail
source "$(dirname "$0")/lib.sh"
export ZAYA_CLUSTER=${ZAYA_CLUSTER:-zaya-bench}
nodes_list=${NODES_LIST:-"128 1024"}
runs=${RUNS:-3}

"$root/hack/tools.sh" cluster
go build -o "$bin/zaya-operator" "$root"
go build -o "$bin/bench-launch" "$root/hack/bench/launch"
trap 'stop_operator; "$root/hack/cluster.sh" down' EXIT

rows=()
for n in $nodes_list; do
	KUBECONFIG=$("$root/hack/cluster.sh" up "$n")
	export KUBECONFIG
	install_crd
	port=$((20000 + RANDOM % 20000))
	"$bin/zaya-operator" --kubeconfig "$KUBECONFIG" --metrics-bind-address="127.0.0.1:$port" --metrics-secure=false \
		--health-probe-bind-address=0 >"$bin/bench-operator.log" 2>&1 &
	operator_pid=$!
	sleep 2 # the metrics endpoint comes up with the manager; a scrape before it fails loudly
	rows+=("$("$bin/bench-launch" -nodes "$n" -runs "$runs" -metrics "http://127.0.0.1:$port/metrics" -operator-pid "$operator_pid" -recover="${RECOVER:-0}")")
	stop_operator
done

if [ "${RECOVER:-0}" = 1 ]; then
	echo "| nodes | runs | failure → restart decided | → old attempt gone | → new pods created | → new pods bound | → new pods Running | → job Running | operator share | operator CPU | operator API requests |"
	echo "|---|---|---|---|---|---|---|---|---|---|---|"
else
	echo "| nodes | runs | create → all pods created | pods created/s | create → all bound | create → all Running | create → job Running | operator share | operator CPU | operator API requests/job |"
	echo "|---|---|---|---|---|---|---|---|---|---|"
fi
printf '%s\n' "${rows[@]}"
