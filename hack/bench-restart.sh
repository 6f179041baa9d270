#!/usr/bin/env bash
# Gang restart benchmark, in place against recreate (issue 19): for jobs of each size in
# NODES_LIST on the local kwok cluster (two nodes to spare), one rank is lost to a crash or to its
# node (InPlace/node+spare: with a warm spare held), and the clock runs from the fault to the
# job's Recovered with every rank running. The case Elastic/node (issue 38) is an elastic job's
# shrink and grow: a node lost with none free, then another made schedulable
# (hack/bench/restart/resize.go); with it the operator polls no progress (kwok's pods serve
# none), so a grow waits for no checkpoint.
# Prints markdown tables for BENCHMARKS.md.
#   NODES_LIST="128 512 2048" RUNS=3 CASES="InPlace/crash,InPlace/node,Recreate/crash,Recreate/node" hack/bench-restart.sh
#   NODES_LIST="128 2048" RUNS=1 CASES=Elastic/node hack/bench-restart.sh
set -euo pipefail
source "$(dirname "$0")/lib.sh"
export ZAYA_CLUSTER=${ZAYA_CLUSTER:-zaya-bench}
nodes_list=${NODES_LIST:-"128 512 2048"}
runs=${RUNS:-3}
cases=${CASES:-"InPlace/crash,InPlace/node,Recreate/crash,Recreate/node"}

"$root/hack/tools.sh" cluster
go build -o "$bin/zaya-operator" "$root"
go build -o "$bin/bench-restart" "$root/hack/bench/restart"
trap 'stop_operator; "$root/hack/cluster.sh" down' EXIT

# OPERATOR_FLAGS: more flags for the operator, e.g. --pprof-bind-address=127.0.0.1:6060.
read -r -a flags <<<"${OPERATOR_FLAGS:-}"
[[ $cases != *Elastic* ]] || flags+=(--progress-poll-interval=0)

rows=() resizes=()
for n in $nodes_list; do
	KUBECONFIG=$("$root/hack/cluster.sh" up $((n + 2)))
	export KUBECONFIG
	install_crd
	port=$((20000 + RANDOM % 20000))
	"$bin/zaya-operator" --kubeconfig "$KUBECONFIG" --metrics-bind-address="127.0.0.1:$port" --metrics-secure=false \
		--health-probe-bind-address=0 "${flags[@]}" >"$bin/bench-restart-operator-$n.log" 2>&1 &
	operator_pid=$!
	sleep 2 # the metrics endpoint comes up with the manager
	while read -r row; do
		case $row in
		restart\|*) rows+=("${row#restart|}") ;;
		resize\|*) resizes+=("${row#resize|}") ;;
		esac
	done < <("$bin/bench-restart" -nodes "$n" -runs "$runs" -cases "$cases" \
		-metrics "http://127.0.0.1:$port/metrics" -operator-pid "$operator_pid")
	stop_operator
done

if [ ${#rows[@]} -gt 0 ]; then
	echo "| nodes | mode | fault | runs | fault → restart decided | fault → recovered, every rank running | pods deleted | pods created | operator API writes | operator API requests | operator CPU | slowest recovery | in-place restarts escalated to a recreate |"
	echo "|---|---|---|---|---|---|---|---|---|---|---|---|---|"
	printf '%s\n' "${rows[@]}"
fi
if [ ${#resizes[@]} -gt 0 ]; then
	echo "| nodes | runs | node lost → shrink decided | shrink decided → smaller gang running | node back → grow decided | grow decided → whole gang running | pods deleted | pods created | operator API writes | operator API requests | operator CPU |"
	echo "|---|---|---|---|---|---|---|---|---|---|---|"
	printf '%s\n' "${resizes[@]}"
fi
