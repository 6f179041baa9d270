#!/usr/bin/env bash
# hack/panels.sh [OUT]: draws the Grafana dashboard's panels from a real chaos run
# (docs/observability.md): a Prometheus built from the module proxy scrapes the e2e suite's
# operator every second while TestTrainingJobSurvivesChaos runs, then hack/panels evaluates
# each panel's queries over the run and writes an SVG per panel into OUT
# (docs/images/panels). ZAYA_CHAOS_* choose the run as for make chaos.
set -euo pipefail
source "$(dirname "$0")/lib.sh"
out=${1:-$root/docs/images/panels}
"$root/hack/tools.sh" prometheus
work=$(mktemp -d)
port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
metrics=127.0.0.1:$(port)
web=127.0.0.1:$(port)
cat >"$work/prometheus.yml" <<YAML
global: {scrape_interval: 1s, evaluation_interval: 1s}
scrape_configs:
- job_name: zaya-operator
  static_configs: [{targets: ["$metrics"]}]
YAML
"$bin/prometheus" --config.file="$work/prometheus.yml" --storage.tsdb.path="$work/data" \
	--web.listen-address="$web" >"$work/prometheus.log" 2>&1 &
prom=$!
trap 'kill $prom 2>/dev/null; wait $prom 2>/dev/null; rm -rf "$work"' EXIT
from=$(date -u +%Y-%m-%dT%H:%M:%SZ)
ZAYA_E2E_METRICS_ADDR=$metrics ZAYA_CHAOS_FAULTS=${ZAYA_CHAOS_FAULTS:-8} ZAYA_CHAOS_VARIANT=${ZAYA_CHAOS_VARIANT:-InPlace} \
	"$root/hack/e2e.sh" -run TestTrainingJobSurvivesChaos -v >"$work/chaos.log" 2>&1 || { tail -60 "$work/chaos.log"; exit 1; }
grep -E '^(=== RUN|--- |chaos)|seed' "$work/chaos.log" | head -20
to=$(date -u +%Y-%m-%dT%H:%M:%SZ)
go run "$root/hack/panels" -prometheus "http://$web" -from "$from" -to "$to" -out "$out"
