package controllers

import (
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	trainingv1alpha1 "github.com/zaya-operator/zaya-operator/api/v1alpha1"
	"github.com/zaya-operator/zaya-operator/internal/testjob"
)

// A gang held by Kueue's admission gate for longer than its activeDeadlineSeconds is queued,
// not failed; once admitted it starts its clock then, and the deadline runs from there.
func TestAQueuedGangWaitsOutsideItsDeadline(t *testing.T) {
	job := testjob.MakeZayaTrainingJob("llm", "ns").Nodes(2).Generation(1).Defaulted().Obj()
	job.Spec.ActiveDeadlineSeconds = ptr.To[int64](3600)
	h := newHarness(t, interceptor.Funcs{}, job)
	at := func(d time.Duration) time.Time { h.r.Clock = clockAt(now.Add(d)); return now.Add(d) }
	at(0)
	h.mustReconcile(t, job)
	gate := func(p *corev1.Pod) {
		p.Spec.SchedulingGates = []corev1.PodSchedulingGate{{Name: "kueue.x-k8s.io/admission"}}
	}
	for name := range h.pods(t) {
		h.setPod(t, name, gate) // as Kueue's webhook does at creation
	}
	at(2 * time.Hour)
	h.mustReconcile(t, job)
	got := h.get(t, job)
	if c := meta.FindStatusCondition(got.Status.Conditions, trainingv1alpha1.ConditionQueued); finished(got) || c == nil || c.Status != "True" || c.Reason != trainingv1alpha1.ReasonWaitingForKueue {
		t.Fatalf("after 2 h gated: finished %v, Queued %+v: want queued, not past a 1 h deadline", finished(got), c)
	}

	admitted := at(2*time.Hour + time.Minute)
	for name := range h.pods(t) {
		h.setPod(t, name, func(p *corev1.Pod) { p.Spec.SchedulingGates = nil; running("n-" + name)(p) })
	}
	h.mustReconcile(t, job)
	got = h.get(t, job)
	if c := meta.FindStatusCondition(got.Status.Conditions, trainingv1alpha1.ConditionQueued); c == nil || c.Status != "False" || c.Reason != trainingv1alpha1.ReasonAdmitted {
		t.Errorf("Queued %+v after admission, want False/Admitted", c)
	}
	if got.Status.StartTime == nil || !got.Status.StartTime.Time.Equal(admitted) {
		t.Errorf("startTime %v, want the admission, %v", got.Status.StartTime, admitted)
	}
	if g := got.Status.Goodput; g != nil && g.WallMilliseconds > 0 {
		t.Errorf("goodput wall %d ms at admission: the queue is no part of the job's time", g.WallMilliseconds)
	}

	at(2*time.Hour + time.Minute + 59*time.Minute)
	h.mustReconcile(t, job)
	if finished(h.get(t, job)) {
		t.Fatal("failed 59 min after admission with a 1 h deadline")
	}
	at(2*time.Hour + time.Minute + time.Hour)
	h.mustReconcile(t, job)
	if c := condition(h.get(t, job), trainingv1alpha1.ConditionFailed); c == nil || c.Reason != trainingv1alpha1.ReasonDeadlineExceeded {
		t.Errorf("Failed %+v an hour after admission, want DeadlineExceeded", c)
	}
}
