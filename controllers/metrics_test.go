package controllers

import (
	"fmt"
	"math"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	trainingv1alpha1 "github.com/zaya-operator/zaya-operator/api/v1alpha1"
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
	if err := testutil.CollectAndCompare(c, strings.NewReader(want), "zaya_jobs"); err != nil {
		t.Error(err)
	}
}

// A job's time since it trained and its restart budget left are gauges, while it runs.
func TestAJobsIdleTimeAndBudgetLeftAreGauges(t *testing.T) {
	idle := testjob.MakeZayaTrainingJob("idle", "ns").Defaulted().Obj()
	idle.Spec.FaultTolerance.MaxRestarts = ptr.To[int32](5)
	idle.Status.RestartTimes = []metav1.Time{metav1.Now()}
	idle.Status.Goodput = &trainingv1alpha1.GoodputStatus{Open: &trainingv1alpha1.GoodputOpen{Category: "NodeLost", Since: metav1.NewMicroTime(time.Now().Add(-time.Hour))}}
	done := testjob.MakeZayaTrainingJob("done", "ns").Defaulted().Obj()
	done.Status.Conditions = []metav1.Condition{{Type: trainingv1alpha1.ConditionSucceeded, Status: metav1.ConditionTrue}}
	c := &jobsCollector{reader: fake.NewClientBuilder().WithScheme(testScheme()).WithObjects(idle, done).Build()}
	got := map[string]float64{}
	ch := make(chan prometheus.Metric, 64)
	c.Collect(ch)
	close(ch)
	for m := range ch {
		var d dto.Metric
		if err := m.Write(&d); err != nil {
			t.Fatal(err)
		}
		name := m.Desc().String()
		for _, l := range d.GetLabel() {
			if l.GetName() == "name" {
				name = strings.SplitN(strings.SplitN(name, "fqName: \"", 2)[1], "\"", 2)[0] + "/" + l.GetValue()
			}
		}
		got[name] = d.GetGauge().GetValue()
	}
	if v := got["zaya_job_not_training_seconds/idle"]; v < 3599 || v > 3700 {
		t.Errorf("idle for %v s: want an hour", v)
	}
	if got["zaya_job_restarts_left/idle"] != 4 {
		t.Errorf("restarts left %v: want 4", got["zaya_job_restarts_left/idle"])
	}
	if _, ok := got["zaya_job_restarts_left/done"]; ok {
		t.Error("a finished job's budget is reported")
	}
}

// Each job's quarantined nodes and the nodes carrying the operator's taints are gauges.
func TestQuarantinedAndTaintedNodesAreCounted(t *testing.T) {
	job := testjob.MakeZayaTrainingJob("a", "ns").Defaulted().Obj()
	job.Status.QuarantinedNodes = []trainingv1alpha1.QuarantinedNode{{Name: "n0"}, {Name: "n1"}}
	taint := func(name, key string) *corev1.Node {
		return &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: corev1.NodeSpec{Taints: []corev1.Taint{{Key: key, Effect: corev1.TaintEffectNoSchedule}}}}
	}
	c := &jobsCollector{reader: fake.NewClientBuilder().WithScheme(testScheme()).WithObjects(job,
		taint("n0", trainingv1alpha1.QuarantineTaintKey), taint("n2", trainingv1alpha1.HardwareSuspectTaintKey), taint("n3", "other")).Build()}
	want := `# HELP zaya_job_quarantined_nodes Nodes each job keeps its ranks off (status.quarantinedNodes).
# TYPE zaya_job_quarantined_nodes gauge
zaya_job_quarantined_nodes{name="a",namespace="ns"} 2
# HELP zaya_nodes_tainted Nodes tainted by the operator: quarantined (a job's quarantine, nodeTaint NoSchedule) or hardware-suspect (hardware failures rooted there in several namespaces' jobs).
# TYPE zaya_nodes_tainted gauge
zaya_nodes_tainted{taint="hardware-suspect"} 1
zaya_nodes_tainted{taint="quarantined"} 1
`
	if err := testutil.CollectAndCompare(c, strings.NewReader(want), "zaya_job_quarantined_nodes", "zaya_nodes_tainted"); err != nil {
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

// Status is partly others' word (a managedBy job's is its manager's): what the collector
// exports from it is bounded. A ratio stays within 0..1 whatever the counters and asOf, the
// time since a job trained is no longer than the job has existed, and a condition type the
// operator does not write is no label value (each would be a new series).
func TestMetricsFromStatusOthersWriteAreBounded(t *testing.T) {
	for _, tc := range []struct {
		wall, training int64
		asOf           string
	}{
		{math.MaxInt64 - 5, math.MaxInt64 - 5, "0001-01-01T00:00:00Z"},
		{1, math.MaxInt64 - 5, "0001-01-01T00:00:00Z"},
		{1, math.MaxInt64, now.Format(time.RFC3339)},
		{math.MaxInt64, 0, "9999-12-31T23:59:59Z"},
	} {
		obj := map[string]any{"status": map[string]any{"goodput": map[string]any{
			"asOf": tc.asOf, "wallMilliseconds": tc.wall, "trainingMilliseconds": tc.training}}}
		for _, running := range []bool{false, true} {
			if r, ok := goodputRatio(obj, running, now); ok && (r < 0 || r > 1 || math.IsNaN(r)) {
				t.Errorf("wall %d, training %d, asOf %s, running %v: ratio %v", tc.wall, tc.training, tc.asOf, running, r)
			}
		}
	}

	created := time.Now().Add(-time.Hour)
	job := testjob.MakeZayaTrainingJob("forged", "ns").Defaulted().Obj()
	job.CreationTimestamp = metav1.NewTime(created)
	job.Status.Goodput = &trainingv1alpha1.GoodputStatus{Open: &trainingv1alpha1.GoodputOpen{Category: "NodeLost", Since: metav1.NewMicroTime(time.Date(1, 1, 1, 0, 0, 0, 0, time.UTC))}}
	job.Status.Conditions = []metav1.Condition{{Type: "Running", Status: "True"}}
	for i := range 15 {
		job.Status.Conditions = append(job.Status.Conditions, metav1.Condition{Type: fmt.Sprintf("MadeUp%d", i), Status: "True"})
	}
	ch := make(chan prometheus.Metric, 64)
	jobGauges(ch, job, time.Now())
	close(ch)
	for m := range ch {
		var d dto.Metric
		if err := m.Write(&d); err != nil {
			t.Fatal(err)
		}
		if strings.Contains(m.Desc().String(), "zaya_job_not_training_seconds") && d.GetGauge().GetValue() > time.Since(created).Seconds()+1 {
			t.Errorf("not training for %v s, longer than the job's hour", d.GetGauge().GetValue())
		}
	}
	c := &jobsCollector{reader: fake.NewClientBuilder().WithScheme(testScheme()).WithObjects(job).Build()}
	if err := testutil.CollectAndCompare(c, strings.NewReader(jobsGauge(map[string]int{"Running": 1})), "zaya_jobs"); err != nil {
		t.Error(err)
	}
}
