#!/usr/bin/env bash
# Many-jobs benchmark: N jobs of 8 ranks created at once on the local cluster, every one
# followed to Running, then a quiet steady state. Reports the operator's CPU time, peak memory,
# reconcile latency, API requests per job and its writes in steady state, as a markdown table
# for BENCHMARKS.md. A fresh operator process runs each row, so its peak memory is that row's.
#   JOBS_LIST="1 10 100 1000" hack/bench-jobs.sh
#   JOBS_LIST=200 FLAGS_LIST="--concurrency=1|--concurrency=8|--concurrency=32" hack/bench-jobs.sh
#   OPERATORS="bin/old-operator bin/zaya-operator" JOBS_LIST=1000 hack/bench-jobs.sh   # compare builds
# Ranks take 1 GPU each and share nodes, so the cluster has one fake MI300X node per job
# (8 GPUs): 1000 jobs are 8000 pods on 1000 nodes.
set -euo pipefail
source "$(dirname "$0")/lib.sh"
export ZAYA_CLUSTER=${ZAYA_CLUSTER:-zaya-bench-jobs}
jobs_list=${JOBS_LIST:-"1 10 100"}
flags_list=${FLAGS_LIST:-""}
steady=${STEADY:-60s}
settle=${SETTLE:-40s}
foreign=${FOREIGN_PODS:-0}

"$root/hack/tools.sh" cluster
go build -o "$bin/zaya-operator" "$root"
operators=${OPERATORS:-$bin/zaya-operator}
go build -o "$bin/bench-jobs" "$root/hack/bench/jobs"
trap 'stop_operator; "$root/hack/cluster.sh" down' EXIT

max=1
for n in $jobs_list; do [ "$n" -gt "$max" ] && max=$n; done
KUBECONFIG=$("$root/hack/cluster.sh" up "$max")
export KUBECONFIG
install_crd

rows=()
IFS='|' read -r -a flag_sets <<<"$flags_list"
[ ${#flag_sets[@]} -gt 0 ] || flag_sets=("")
for operator in $operators; do
	for flags in "${flag_sets[@]}"; do
		for n in $jobs_list; do
			port=$((20000 + RANDOM % 20000))
			# shellcheck disable=SC2086 # flags are words
			"$operator" --kubeconfig "$KUBECONFIG" --metrics-bind-address="127.0.0.1:$port" --metrics-secure=false \
				--health-probe-bind-address=0 $flags >"$bin/bench-jobs-operator.log" 2>&1 &
			operator_pid=$!
			for _ in $(seq 1 100); do curl -fs "http://127.0.0.1:$port/metrics" >/dev/null 2>&1 && break; sleep 0.1; done
			label=$n
			[ -z "$flags" ] || label="$label, \`$flags\`"
			[ -z "${OPERATORS:-}" ] || label="$label, $(basename "$operator")"
			rows+=("$("$bin/bench-jobs" -jobs "$n" -metrics "http://127.0.0.1:$port/metrics" -operator-pid "$operator_pid" \
				-steady "$steady" -settle "$settle" -foreign-pods "$foreign" -label "$label")")
			echo "${rows[-1]}" >&2 # a later row's failure keeps this one
			stop_operator
		done
	done
done

foreign_col=""
[ "$foreign" = 0 ] || foreign_col=" heap with foreign pods |"
echo "| jobs | pods | create → all jobs Running | job create → Running p50 / p90 / p99 | reconciles/job | reconcile time p50 / p99 | API requests/job | writes/job | operator CPU | CPU/job | steady-state writes | steady-state reconciles | steady-state CPU | peak RSS | Go heap in use |$foreign_col"
echo "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|$([ "$foreign" = 0 ] || echo '---|')"
printf '%s\n' "${rows[@]}"
