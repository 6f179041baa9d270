package chart

import (
	"os"
	"path/filepath"
	"testing"

	"sigs.k8s.io/yaml"
)

// The chart's alert rules, rendered with the default values, pass Prometheus' own rule tests
// (promtool test rules, alerts/alerts.test.yaml): each alert fires when it should and not
// before.
func TestTheChartsAlertsPassPromtool(t *testing.T) {
	var rule map[string]any
	for _, o := range mustRender(t, "--set", "prometheusRule.enabled=true") {
		if o.GetKind() == "PrometheusRule" {
			rule = o.Object
		}
	}
	if rule == nil {
		t.Fatal("no PrometheusRule rendered with prometheusRule.enabled")
	}
	rules, err := yaml.Marshal(rule["spec"])
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "rules.yaml"), rules, 0o644); err != nil {
		t.Fatal(err)
	}
	tests, err := os.ReadFile(filepath.Join("alerts", "alerts.test.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "alerts.test.yaml"), tests, 0o644); err != nil {
		t.Fatal(err)
	}
	promtool := tool(t, "promtool")
	if out, err := run(t, promtool, "check", "rules", filepath.Join(dir, "rules.yaml")); err != nil {
		t.Fatalf("promtool check rules: %v\n%s", err, out)
	}
	if out, err := run(t, promtool, "test", "rules", filepath.Join(dir, "alerts.test.yaml")); err != nil {
		t.Fatalf("promtool test rules: %v\n%s", err, out)
	}
}
