package controllers

import (
	"math"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	trainingv1alpha1 "github.com/zaya-operator/zaya-operator/api/v1alpha1"
	"github.com/zaya-operator/zaya-operator/internal/testjob"
)

// TestAHandWrittenStatusNeverBecomesAnInvalidPod: a stored status the schema refuses today (a
// negative restart count, a quarantined node no node can be called) still gives valid pods.
func TestAHandWrittenStatusNeverBecomesAnInvalidPod(t *testing.T) {
	job := testjob.MakeZayaTrainingJob("llm", "ns").Nodes(2).Generation(1).Defaulted().Obj()
	job.Status.Restarts = -3
	job.Status.QuarantinedNodes = []trainingv1alpha1.QuarantinedNode{
		{Name: "Not A Node!", Reason: "NodeLost", Since: metav1.Time{Time: now}},
		{Name: "n1", Reason: "NodeLost", Since: metav1.Time{Time: now}},
	}
	h := newHarness(t, interceptor.Funcs{}, job)
	h.mustReconcile(t, job)
	pods := h.pods(t)
	if len(pods) != 2 {
		t.Fatalf("pods = %v, want ranks 0 and 1 of attempt 0", podNames(pods))
	}
	for name, p := range pods {
		if got := p.Labels[trainingv1alpha1.AttemptLabel]; got != "0" {
			t.Errorf("%s: attempt label %q, want 0", name, got)
		}
		for k, v := range p.Labels {
			if errs := validation.IsValidLabelValue(v); len(errs) > 0 {
				t.Errorf("%s: label %s=%q: %v", name, k, v, errs)
			}
		}
		terms := p.Spec.Affinity.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution.NodeSelectorTerms
		if len(terms) != 1 || len(terms[0].MatchFields) != 1 || terms[0].MatchFields[0].Values[0] != "n1" {
			t.Errorf("%s: node affinity %+v, want only NotIn n1", name, terms)
		}
	}
	if got := h.get(t, job).Status.Restarts; got != 0 {
		t.Errorf("status.restarts = %d after the pass, want 0", got)
	}
}

// TestARestartCounterAtItsMaximumFailsTheJob: there is no attempt after MaxInt32; the job
// fails instead of wrapping to a negative attempt.
func TestARestartCounterAtItsMaximumFailsTheJob(t *testing.T) {
	job := testjob.MakeZayaTrainingJob("llm", "ns").Nodes(1).Generation(1).Defaulted().Obj()
	job.Status.Restarts = math.MaxInt32
	h := newHarness(t, interceptor.Funcs{}, job)
	h.mustReconcile(t, job)
	h.runAll(t)
	h.mustReconcile(t, job)
	h.setPod(t, "llm-2147483647-0", exited("n0", 1, now))
	h.mustReconcile(t, job)
	got := h.get(t, job)
	if got.Status.Restarts != math.MaxInt32 {
		t.Errorf("status.restarts = %d, want it left at MaxInt32", got.Status.Restarts)
	}
	if c := condition(got, trainingv1alpha1.ConditionFailed); c == nil || c.Reason != trainingv1alpha1.ReasonRestartBudgetExceeded {
		t.Errorf("Failed = %+v, want RestartBudgetExceeded", c)
	}
}

// TestADeadlineBeyondADurationMeansNever: a stored activeDeadlineSeconds too big for
// time.Duration (the CRD allows ten years now) neither fails the job at once nor requeues.
