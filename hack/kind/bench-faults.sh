#!/usr/bin/env bash
# The kind node-fault matrix, run after run, for a spread rather than an anecdote: each run is
# `hack/kind/e2e.sh` on the faults' subtests (the cluster kept between runs; each test puts
# its faulted node back), each fault's recovery timeline (seconds from the gang's last step,
# docs/recovery.md "A recovery's timeline") and the test's own clock appended to RESULTS.
# Runs already in RESULTS (by number and workers) are not run again, so the runs may be spread
# over days, on new machines (RESULTS is kept in the repository); ratios only
# between rows of one cluster. Prints the median and worst of every stage per fault.
#   hack/kind/bench-faults.sh [RUNS] [RESULTS]      (default 5, docs/bench/kind-faults.tsv)
# KIND_BENCH_FAULTS is the -run pattern (default: the injected supervisor's node faults),
# KIND_WORKERS the kind workers (default 5: the kind suite trains on workers − 2 nodes, so a
# job of 3 nodes with a free node for the replacement; make test-kind uses 4, a job of 2).
set -euo pipefail
source "$(dirname "$0")/../lib.sh"
runs=${1:-5}
results=${2:-$root/docs/bench/kind-faults.tsv}
pattern=${KIND_BENCH_FAULTS:-'TestRecoveryOnRealKubelets/^(node-frozen|network-cut)$/'}
export KIND_WORKERS=${KIND_WORKERS:-5}
mkdir -p "$(dirname "$results")"
[ -s "$results" ] || printf 'run\twhen\tcommit\tworkers\tfault\tdetected\tdecided\trunning\tworker\trendezvous\ttraining\ttest_clock\tplayed\n' >"$results"
commit=$(git -C "$root" rev-parse --short HEAD)
kept=${KIND_KEEP:-}
trap '[ "$kept" = 1 ] || "$root/hack/kind/cluster.sh" down' EXIT
for run in $(seq "$runs"); do
	if awk -F'\t' -v r="$run" -v w="$KIND_WORKERS" '$1 == r && $4 == w { found = 1 } END { exit !found }' "$results"; then
		continue
	fi
	log=$(mktemp)
	echo "bench-faults: run $run of $runs ($(date +%T)), log $log" >&2
	if ! KIND_KEEP=1 "$root/hack/kind/e2e.sh" -run "$pattern" -v >"$log" 2>&1; then
		echo "bench-faults: run $run failed (not recorded); its log: $log" >&2
		exit 1
	fi
	# realnodes_test.go's line: "<fault>: running again after …, training again after 9.95s, …;
	# timeline from the last step: detected +6.28s decided +7.07s …"
	python3 - "$log" "$run" "$commit" "$KIND_WORKERS" >>"$results" <<'EOF'
import re, sys, datetime
log, run, commit, workers = sys.argv[1:]
when = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M")
stages = ["detected", "decided", "running", "worker", "rendezvous", "training"]
played = {}  # Docker's time to play each fault: the test's clock starts before it
for line in open(log):
    p = re.search(r"realnodes_test\.go:\d+: (\S+): the fault took ([0-9.]+)(ms|s) to play", line)
    if p:
        played[p.group(1)] = float(p.group(2)) / (1000 if p.group(3) == "ms" else 1)
    m = re.search(r"realnodes_test\.go:\d+: (\S+): running again after \S+, training again after ([0-9.]+)(ms|s|m\S*s)", line)
    t = re.search(r"timeline from the last step: (.*)$", line)
    if not m or not t:
        continue
    clock = float(m.group(2)) / (1000 if m.group(3) == "ms" else 1)
    got = dict(re.findall(r"(\w+) \+(-?[0-9.]+)s", t.group(1)))
    took = played.get(m.group(1))
    print("\t".join([run, when, commit, workers, m.group(1)] + [got.get(s, "") for s in stages] +
                    [f"{clock:.2f}", "" if took is None else f"{took:.2f}"]))
EOF
	echo "bench-faults: run $run recorded" >&2
done
python3 - "$results" <<'EOF'
import csv, statistics, sys
rows = list(csv.DictReader(open(sys.argv[1]), delimiter="\t"))
cols = ["detected", "decided", "running", "worker", "rendezvous", "training", "test_clock", "played"]
print("| fault (workers) | runs | " + " | ".join(f"{c} median / worst" for c in cols) + " |")
print("|---|---|" + "---|" * len(cols))
for key in sorted({(r["fault"], r["workers"]) for r in rows}):
    mine = [r for r in rows if (r["fault"], r["workers"]) == key]
    cells = []
    for c in cols:
        v = sorted(float(r[c]) for r in mine if r[c])
        cells.append(f"{statistics.median(v):.2f} / {v[-1]:.2f}" if v else "–")
    print(f"| {key[0]} ({key[1]}) | {len(mine)} | " + " | ".join(cells) + " |")
EOF
