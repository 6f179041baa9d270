package controllers

import (
	"slices"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	trainingv1alpha1 "github.com/zaya-operator/zaya-operator/api/v1alpha1"
	"github.com/zaya-operator/zaya-operator/controllers/workerpod"
	"github.com/zaya-operator/zaya-operator/internal/testjob"
)

// A trainer that cannot train shrunk says so with ExitNoResize: its pod fails rather than
// restarting in place, the job gets its full width back without a restart counted against
// its budget, and a rank that then waits for a node is waited for, as without elastic.
func TestAWorkerRefusingItsWidthGetsTheFullGangBack(t *testing.T) {
	job := testjob.MakeZayaTrainingJob("llm", "ns").Nodes(4).GPUsPerNode(1).Generation(1).
		Elastic(2, 10*time.Second, 10*time.Second).Defaulted().Obj()
	job.Status.CurrentNodes = 3 // shrunk
	h := newHarness(t, interceptor.Funcs{}, job)
	h.mustReconcile(t, job)
	pods := h.pods(t)
	if len(pods) != 3 {
		t.Fatalf("%d pods of a gang shrunk to 3", len(pods))
	}
	w := &pods["llm-0-1"].Spec.Containers[0]
	if rules := w.RestartPolicyRules; len(rules) != 1 || !slices.Contains(rules[0].ExitCodes.Values, trainingv1alpha1.ExitNoResize) ||
		rules[0].ExitCodes.Operator != corev1.ContainerRestartRuleOnExitCodesOpNotIn {
		t.Fatalf("restart rules %+v: exit %d must fail the pod", rules, trainingv1alpha1.ExitNoResize)
	}
	h.runAll(t)
	h.mustReconcile(t, job)
	h.setPod(t, "llm-0-1", exited("node-llm-0-1", trainingv1alpha1.ExitNoResize, now))
	h.mustReconcile(t, job)
	got := h.get(t, job)
	if got.Status.CurrentNodes != 4 || len(got.Status.RestartTimes) != 0 || got.Status.Resizes != 1 {
		t.Fatalf("currentNodes %d, restartTimes %v, resizes %d: want 4, none counted, one resize", got.Status.CurrentNodes, got.Status.RestartTimes, got.Status.Resizes)
	}
	if c := condition(got, trainingv1alpha1.ConditionShrunk); c == nil || c.Status != metav1.ConditionFalse || c.Reason != trainingv1alpha1.ReasonElasticRefused {
		t.Errorf("Shrunk = %+v, want False/ElasticRefused", c)
	}
	// The gang of 4 is made; its rank 3 finds no node for an hour: no shrink this time.
	for range 3 {
		h.mustReconcile(t, job)
	}
	attempt := h.get(t, job).Status.Attempt()
	for r := range int32(3) {
		h.setPod(t, workerpod.PodName(job, attempt, r), running("node-"+workerpod.PodName(job, attempt, r)))
	}
	h.setPod(t, workerpod.PodName(job, attempt, 3), func(p *corev1.Pod) {
		p.Status = corev1.PodStatus{Phase: corev1.PodPending, Conditions: []corev1.PodCondition{{Type: corev1.PodScheduled, Status: corev1.ConditionFalse,
			Reason: corev1.PodReasonUnschedulable, LastTransitionTime: metav1.NewTime(now.Add(-time.Hour))}}}
	})
	h.r.Clock = clockAt(now.Add(time.Minute))
	h.mustReconcile(t, job)
	got = h.get(t, job)
	if got.Status.CurrentNodes != 4 || got.Status.Attempt() != attempt {
		t.Errorf("after the refusal: currentNodes %d, attempt %d (was %d): want the job to wait at 4", got.Status.CurrentNodes, got.Status.Attempt(), attempt)
	}
	if c := condition(got, trainingv1alpha1.ConditionWaitingForCapacity); c == nil || c.Status != metav1.ConditionTrue {
		t.Errorf("WaitingForCapacity = %+v", c)
	}
}

// A suspend ends a shrink: the job resumes on spec.nodes, with no grow noted and no refusal
// remembered.
func TestASuspendedShrunkJobResumesWhole(t *testing.T) {
	job := testjob.MakeZayaTrainingJob("llm", "ns").Nodes(4).GPUsPerNode(1).Generation(1).
		Elastic(2, 10*time.Second, 10*time.Second).Defaulted().Obj()
	job.Status.CurrentNodes, job.Status.GrowAtStep = 3, ptr.To[int64](50)
	h := newHarness(t, interceptor.Funcs{}, job)
	h.mustReconcile(t, job)
	if n := len(h.pods(t)); n != 3 {
		t.Fatalf("%d pods of a gang shrunk to 3", n)
	}
	h.suspend(t, job, true)
	h.mustReconcile(t, job)
	got := h.get(t, job)
	if got.Status.CurrentNodes != 0 || got.Status.GrowAtStep != nil {
		t.Errorf("suspended: currentNodes %d, growAtStep %v; want neither", got.Status.CurrentNodes, got.Status.GrowAtStep)
	}
	h.suspend(t, job, false)
	for range 3 {
		h.mustReconcile(t, job)
	}
	if got, n := h.get(t, job), len(h.pods(t)); got.Status.CurrentNodes != 4 || n != 4 {
		t.Errorf("resumed: currentNodes %d, %d pods; want the whole gang of 4", got.Status.CurrentNodes, n)
	}
}
