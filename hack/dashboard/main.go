// Command dashboard writes the operator's Grafana dashboard as JSON (make manifests): typed
// code with Grafana's Apache-licensed foundation SDK, not hand-edited JSON. Every query names
// only metrics the operator exports; test/integration's TestTheDashboardNamesOnlyExportedMetrics
// scrapes a running operator to keep it so.
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"os"

	"github.com/grafana/grafana-foundation-sdk/go/common"
	"github.com/grafana/grafana-foundation-sdk/go/dashboard"
	"github.com/grafana/grafana-foundation-sdk/go/prometheus"
	"github.com/grafana/grafana-foundation-sdk/go/stat"
	"github.com/grafana/grafana-foundation-sdk/go/timeseries"
	"k8s.io/utils/ptr"
)

func main() {
	out := flag.String("out", "charts/zaya-operator/files/dashboards/zaya-operator.json", "where to write the dashboard")
	flag.Parse()
	d, err := build().Build()
	if err != nil {
		fmt.Fprintln(os.Stderr, "dashboard:", err)
		os.Exit(1)
	}
	b, err := json.MarshalIndent(d, "", "  ")
	if err != nil {
		fmt.Fprintln(os.Stderr, "dashboard:", err)
		os.Exit(1)
	}
	if err := os.WriteFile(*out, append(b, '\n'), 0o644); err != nil {
		fmt.Fprintln(os.Stderr, "dashboard:", err)
		os.Exit(1)
	}
}

// ds is the dashboard's Prometheus, picked by its variable.
var ds = common.DataSourceRef{Type: ptr.To("prometheus"), Uid: ptr.To("${datasource}")}

// Selectors of the job panels (the namespace variable) and of the operator's own controller.
const (
	jobs = `namespace=~"$namespace"`
	ctrl = `controller="zayatrainingjob"`
)

func query(expr, legend string) *prometheus.DataqueryBuilder {
	return prometheus.NewDataqueryBuilder().Expr(expr).LegendFormat(legend).Datasource(ds)
}

func series(title, description, unit string, queries ...*prometheus.DataqueryBuilder) *timeseries.PanelBuilder {
	p := timeseries.NewPanelBuilder().Title(title).Description(description).Unit(unit).Datasource(ds).Height(8).Span(12).
		Legend(common.NewVizLegendOptionsBuilder().DisplayMode(common.LegendDisplayModeTable).Placement(common.LegendPlacementBottom).ShowLegend(true))
	for _, q := range queries {
		p.WithTarget(q)
	}
	return p
}

func single(title, description, unit string, q *prometheus.DataqueryBuilder) *stat.PanelBuilder {
	return stat.NewPanelBuilder().Title(title).Description(description).Unit(unit).Datasource(ds).Height(4).Span(6).WithTarget(q)
}

// build is the dashboard in Grafana's classic JSON model, which the SDK marks deprecated for
// its v2 schema: the classic one is what file provisioning and kube-prometheus-stack's
// sidecar load in every Grafana a platform team runs; v2 needs Grafana 12's v2 dashboards.
func build() *dashboard.DashboardBuilder { //nolint:staticcheck // the classic JSON model, above
	namespaces := dashboard.StringOrMap{String: ptr.To("label_values(zaya_job_effective_training_ratio, namespace)")}
	return dashboard.NewDashboardBuilder("ZayaTrainingJobs"). //nolint:staticcheck // the classic JSON model (build)
									Uid("zaya-operator").
									Description("Training jobs run by zaya-operator: their state, goodput, failures by root cause, recovery times, quarantined nodes and the operator's health.").
									Tags([]string{"zaya-operator", "training", "amd"}).
									Refresh("30s").
									Time("now-6h", "now").
									Timezone(common.TimeZoneBrowser).
									WithVariable(dashboard.NewDatasourceVariableBuilder("datasource").Label("Prometheus").Type("prometheus")).
									WithVariable(dashboard.NewQueryVariableBuilder("namespace").Label("Namespace").Query(namespaces).Datasource(ds).
										Multi(true).IncludeAll(true).AllValue(".*").Refresh(dashboard.VariableRefreshOnTimeRangeChanged)).
									WithRow(dashboard.NewRowBuilder("Jobs")).
									WithPanel(single("Running", "Jobs whose Running condition is True.", "none", query(`sum(zaya_jobs{condition="Running"})`, "running"))).
									WithPanel(single("Restarting", "Jobs restarting their gang now.", "none", query(`sum(zaya_jobs{condition="Restarting"})`, "restarting"))).
									WithPanel(single("Waiting for capacity", "Jobs whose ranks the scheduler cannot place.", "none", query(`sum(zaya_jobs{condition="WaitingForCapacity"})`, "waiting"))).
									WithPanel(single("Effective training time", "The mean of the jobs' training time over their started time (status.goodput).", "percentunit",
			query(`avg(zaya_job_effective_training_ratio{`+jobs+`})`, "mean"))).
		WithPanel(series("Jobs by state", "Jobs whose condition is True, by condition.", "none", query(`sum by (condition) (zaya_jobs)`, "{{condition}}"))).
		WithPanel(series("Effective training time per job", "Each job's training time over its started time (status.goodput).", "percentunit",
			query(`zaya_job_effective_training_ratio{`+jobs+`}`, "{{namespace}}/{{name}}"))).
		WithPanel(series("Time since each job trained", "Seconds since a started job stopped training (a start or a failure not yet over); 0 while it trains.", "s",
			query(`zaya_job_not_training_seconds{`+jobs+`}`, "{{namespace}}/{{name}}"))).
		WithPanel(series("Restart budget left", "Counted restarts each job has left within its restart window.", "none",
			query(`zaya_job_restarts_left{`+jobs+`}`, "{{namespace}}/{{name}}"))).
		WithRow(dashboard.NewRowBuilder("Failures and recovery")).
		WithPanel(series("Root failures by category", "Rank failures that restarted or failed a job, by their root cause's category.", "none",
			query(`sum by (category) (increase(zaya_failures_total{role="root"}[$__rate_interval]))`, "{{category}}"))).
		WithPanel(series("Time lost by category", "Seconds of jobs' time that went to no training, by category: down (until training again) and recompute (steps trained again).", "s",
			query(`sum by (category, kind) (increase(zaya_lost_seconds_total[$__rate_interval]))`, "{{category}} {{kind}}"))).
		WithPanel(series("Gang restarts", "Whole-gang restarts by failure reason and mode (InPlace, Recreate), and elastic gangs' resizes.", "none",
			query(`sum by (reason, mode) (increase(zaya_gang_restarts_total[$__rate_interval]))`, "{{reason}} {{mode}}"),
			query(`sum by (reason) (increase(zaya_gang_restart_escalations_total[$__rate_interval]))`, "escalated: {{reason}}"),
			query(`sum by (reason) (increase(zaya_gang_pods_replaced_total[$__rate_interval]))`, "pods replaced: {{reason}}"),
			query(`sum by (direction) (increase(zaya_gang_resizes_total[$__rate_interval]))`, "elastic: {{direction}}"))).
		WithPanel(series("Fault to running and training again", "From a failure to every rank running again (p50, p95 by mode), and the mean time down per root failure (to training again).", "s",
			query(`histogram_quantile(0.5, sum by (le, mode) (rate(zaya_gang_recovery_seconds_bucket[$__rate_interval])))`, "running again p50 {{mode}}"),
			query(`histogram_quantile(0.95, sum by (le, mode) (rate(zaya_gang_recovery_seconds_bucket[$__rate_interval])))`, "running again p95 {{mode}}"),
			query(`sum(rate(zaya_lost_seconds_total{kind="down",category!="Startup"}[$__rate_interval])) / sum(rate(zaya_failures_total{role="root"}[$__rate_interval]))`, "training again, mean"))).
		WithRow(dashboard.NewRowBuilder("Nodes")).
		WithPanel(series("Quarantined and suspect nodes", "Nodes the jobs keep off, and nodes the operator tainted: a job's quarantine, or hardware failures rooted there in several namespaces' jobs.", "none",
			query(`sum(zaya_job_quarantined_nodes{`+jobs+`})`, "quarantined by jobs"),
			query(`zaya_nodes_tainted`, "tainted {{taint}}"))).
		WithPanel(series("Stragglers", "Jobs with a straggling rank now, and stragglers replaced.", "none",
			query(`sum(zaya_jobs{condition="Straggling"})`, "jobs straggling"),
			query(`sum(increase(zaya_failures_total{category="Straggler",role="root"}[$__rate_interval]))`, "stragglers replaced"))).
		WithRow(dashboard.NewRowBuilder("Operator")).
		WithPanel(series("Reconcile latency", "How long a pass over one job takes (controller-runtime).", "s",
			query(`histogram_quantile(0.5, sum by (le) (rate(controller_runtime_reconcile_time_seconds_bucket{`+ctrl+`}[$__rate_interval])))`, "p50"),
			query(`histogram_quantile(0.99, sum by (le) (rate(controller_runtime_reconcile_time_seconds_bucket{`+ctrl+`}[$__rate_interval])))`, "p99"))).
		WithPanel(series("Reconciles and errors", "Passes by result, and failed passes.", "ops",
			query(`sum by (result) (rate(controller_runtime_reconcile_total{`+ctrl+`}[$__rate_interval]))`, "{{result}}"),
			query(`sum(rate(controller_runtime_reconcile_errors_total{`+ctrl+`}[$__rate_interval]))`, "errors"))).
		WithPanel(series("Work queue depth", "Jobs waiting for a pass.", "none", query(`sum(workqueue_depth{name="zayatrainingjob"})`, "depth"))).
		WithPanel(series("API requests", "The operator's requests to the API server, by method and code.", "reqps",
			query(`sum by (method, code) (rate(rest_client_requests_total[$__rate_interval]))`, "{{method}} {{code}}"))).
		WithPanel(series("Leader", "1 on the replica that leads (leader election).", "none",
			query(`max by (name) (leader_election_master_status)`, "{{name}}"))).
		WithPanel(series("Pods created", "Worker pods the operator created.", "none",
			query(`sum(increase(zaya_worker_pods_created_total[$__rate_interval]))`, "pods")))
}
