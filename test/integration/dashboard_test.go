package integration

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	. "github.com/onsi/gomega"
	dto "github.com/prometheus/client_model/go"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/metrics"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
)

// The metric names a query can use, and what selects or groups by a label.
var (
	metricName  = regexp.MustCompile(`\b(zaya_[a-z_]+|controller_runtime_[a-z_]+|workqueue_[a-z_]+|rest_client_[a-z_]+|leader_election_[a-z_]+)\b`)
	selector    = regexp.MustCompile(`\b([a-z_:][a-z0-9_:]*)\{([^}]*)\}`)
	matcherName = regexp.MustCompile(`([a-zA-Z_][a-zA-Z0-9_]*)\s*(=~|!~|!=|=)`)
	grouping    = regexp.MustCompile(`\b(?:by|without)\s*\(([^)]*)\)`)
)

// dashboardQueries is every query of the chart's dashboard and alert rules.
func dashboardQueries(t *testing.T) []string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(repoRoot, "charts", "zaya-operator", "files", "dashboards", "zaya-operator.json"))
	if err != nil {
		t.Fatal(err)
	}
	var d struct {
		Panels []struct {
			Title   string `json:"title"`
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
		Templating struct {
			List []struct {
				Query any `json:"query"`
			} `json:"list"`
		} `json:"templating"`
	}
	if err := json.Unmarshal(b, &d); err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, p := range d.Panels {
		for _, q := range p.Targets {
			out = append(out, q.Expr)
		}
	}
	for _, v := range d.Templating.List {
		if s, ok := v.Query.(string); ok && strings.Contains(s, "(") {
			out = append(out, s)
		}
	}
	// And the chart's alert rules: every expr line of the template.
	rules, err := os.ReadFile(filepath.Join(repoRoot, "charts", "zaya-operator", "templates", "prometheusrule.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(rules), "\n") {
		if expr, ok := strings.CutPrefix(strings.TrimSpace(line), "expr: "); ok {
			out = append(out, expr)
		}
	}
	return out
}

// family is the scraped family a name in a query reads: a histogram's _bucket, _sum and
// _count are its own.
func family(scraped map[string]*dto.MetricFamily, name string) (*dto.MetricFamily, bool) {
	if f, ok := scraped[name]; ok {
		return f, true
	}
	for _, suffix := range []string{"_bucket", "_sum", "_count"} {
		if f, ok := scraped[strings.TrimSuffix(name, suffix)]; ok && strings.HasSuffix(name, suffix) && f.GetType() == dto.MetricType_HISTOGRAM {
			return f, true
		}
	}
	return nil, false
}

// hasLabel reports whether the family's series carry label (a histogram's buckets carry le).
func hasLabel(f *dto.MetricFamily, label string) bool {
	if label == "le" && f.GetType() == dto.MetricType_HISTOGRAM {
		return true
	}
	for _, m := range f.GetMetric() {
		if slices.ContainsFunc(m.GetLabel(), func(l *dto.LabelPair) bool { return l.GetName() == label }) {
			return true
		}
	}
	return false
}

// Every metric and label the chart's dashboard and alerts name is one a running operator exports: the
// operator here runs a job through a restart, and a second manager holds a leader lease, as
// the chart's replicas do; then its registry (what /metrics serves) is read.
func TestTheDashboardNamesOnlyExportedMetrics(t *testing.T) {
	g := NewWithT(t)
	ns := newNamespace(t)
	startManager(t)
	recreatedOnce(g, ns)

	leader, err := ctrl.NewManager(cfg, ctrl.Options{Scheme: scheme, Metrics: metricsserver.Options{BindAddress: "0"}, HealthProbeBindAddress: "0",
		LeaderElection: true, LeaderElectionID: "zaya-dashboard-check", LeaderElectionNamespace: ns})
	g.Expect(err).NotTo(HaveOccurred())
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() { _ = leader.Start(ctx) }()
	g.Eventually(leader.Elected(), timeout).Should(BeClosed())

	gathered, err := metrics.Registry.Gather()
	g.Expect(err).NotTo(HaveOccurred())
	scraped := map[string]*dto.MetricFamily{}
	for _, f := range gathered {
		scraped[f.GetName()] = f
	}
	queries := dashboardQueries(t)
	g.Expect(len(queries)).To(BeNumerically(">", 20), "the dashboard's queries")
	for _, q := range queries {
		names := metricName.FindAllString(q, -1)
		g.Expect(names).NotTo(BeEmpty(), "query %q reads no metric of the operator", q)
		var read []*dto.MetricFamily
		for _, name := range names {
			f, ok := family(scraped, name)
			g.Expect(ok).To(BeTrue(), "query %q reads %s, which the operator does not export", q, name)
			read = append(read, f)
		}
		for _, s := range selector.FindAllStringSubmatch(q, -1) {
			f, ok := family(scraped, s[1])
			if !ok {
				continue // a function's braces, not a metric's
			}
			for _, m := range matcherName.FindAllStringSubmatch(s[2], -1) {
				g.Expect(hasLabel(f, m[1])).To(BeTrue(), "query %q selects %s by %s, a label it does not carry", q, s[1], m[1])
			}
		}
		for _, by := range grouping.FindAllStringSubmatch(q, -1) {
			for _, label := range strings.Split(by[1], ",") {
				label = strings.TrimSpace(label)
				g.Expect(slices.ContainsFunc(read, func(f *dto.MetricFamily) bool { return hasLabel(f, label) })).To(BeTrue(),
					"query %q groups by %s, which none of its metrics carries", q, label)
			}
		}
	}
}
