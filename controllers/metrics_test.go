package controllers

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	"github.com/zaya-operator/zaya-operator/internal/testjob"
)

func TestJobsCollectorCountsTrueConditions(t *testing.T) {
	running := testjob.MakeZayaTrainingJob("a", "ns").Defaulted().Obj()
	running.Status.Conditions = []metav1.Condition{{Type: "Running", Status: "True"}, {Type: "Created", Status: "True"}}
	failed := testjob.MakeZayaTrainingJob("b", "ns").Defaulted().Obj()
	failed.Status.Conditions = []metav1.Condition{{Type: "Failed", Status: "True"}, {Type: "Running", Status: "False"}, {Type: "Created", Status: "True"}}
	c := &jobsCollector{
		reader: fake.NewClientBuilder().WithScheme(testScheme()).WithObjects(running, failed).Build(),
	}
	want := jobsGauge(map[string]int{"Created": 2, "Failed": 1, "Running": 1})
	if err := testutil.CollectAndCompare(c, strings.NewReader(want)); err != nil {
		t.Error(err)
	}
}

func TestTheJobsGaugeReadsTheLatestManagersCache(t *testing.T) {
	reg := prometheus.NewRegistry()
	first := testjob.MakeZayaTrainingJob("a", "ns").Defaulted().Obj()
	first.Status.Conditions = []metav1.Condition{{Type: "Running", Status: "True"}}
	if err := registerJobsCollector(reg, fake.NewClientBuilder().WithScheme(testScheme()).WithObjects(first).Build()); err != nil {
		t.Fatal(err)
	}
	// A second manager in the same process (tests start many) reads its own cluster.
	if err := registerJobsCollector(reg, fake.NewClientBuilder().WithScheme(testScheme()).Build()); err != nil {
		t.Fatalf("registering again: %v", err)
	}
	if err := testutil.GatherAndCompare(reg, strings.NewReader(jobsGauge(nil)), "zaya_jobs"); err != nil {
		t.Errorf("the gauge still reads the first manager's client: %v", err)
	}
}

// jobsGauge is the exposition of the jobs gauge with the given counts (others 0).
func jobsGauge(counts map[string]int) string {
	var b strings.Builder
	b.WriteString("# HELP zaya_jobs ZayaTrainingJobs whose condition is True, by condition.\n# TYPE zaya_jobs gauge\n")
	types := slices.Clone(conditionTypes)
	slices.Sort(types)
	for _, c := range types {
		fmt.Fprintf(&b, "zaya_jobs{condition=%q} %d\n", c, counts[c])
	}
	return b.String()
}
