package gang

import (
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	trainingv1alpha1 "github.com/zaya-operator/zaya-operator/api/v1alpha1"
	"github.com/zaya-operator/zaya-operator/controllers/workerpod"
	"github.com/zaya-operator/zaya-operator/internal/testjob"
)

var now = time.Date(2026, 11, 29, 4, 0, 0, 0, time.UTC)

// pod is rank's pod of the job's current attempt, changed by edit.
func pod(job *trainingv1alpha1.ZayaTrainingJob, rank int32, edit func(*corev1.Pod)) corev1.Pod {
	p := workerpod.Render(job, nil, rank)
	p.UID = types.UID(p.Name + "-uid")
	if edit != nil {
		edit(p)
	}
	return *p
}

func ready(p *corev1.Pod) {
	p.Spec.NodeName = "n-" + p.Name
	p.Status.Phase = corev1.PodRunning
	p.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}
	p.Status.ContainerStatuses = []corev1.ContainerStatus{{Name: "worker", Ready: true, RestartCount: 2,
		State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: metav1.NewTime(now)}},
		LastTerminationState: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: 75,
			Message: "checkpoint-step=40\n"}}}}
}

// The gang is a function of the set of pods, whatever order the cache lists them in: status is
// built from it.
func TestAGangDoesNotDependOnTheListingOrder(t *testing.T) {
	job := testjob.MakeZayaTrainingJob("llm", "ns").Nodes(4).Defaulted().Obj()
	job.Status.Restarts = 1 // attempt 1
	old := testjob.MakeZayaTrainingJob("llm", "ns").Nodes(4).Defaulted().Obj()
	pods := []corev1.Pod{
		pod(job, 0, ready),
		pod(job, 1, ready),
		pod(job, 2, func(p *corev1.Pod) {
			p.Status.Phase = corev1.PodFailed
			p.Status.ContainerStatuses = []corev1.ContainerStatus{{Name: "worker", State: corev1.ContainerState{
				Terminated: &corev1.ContainerStateTerminated{ExitCode: 1, FinishedAt: metav1.NewTime(now), Message: "checkpoint-step=60\n" + trainingv1alpha1.TerminationMessageRestoredPrefix + "40\n"}}}}
		}),
		pod(old, 3, func(p *corev1.Pod) { p.Status.Phase = corev1.PodSucceeded }), // the previous attempt's
		pod(old, 1, nil), // stale
		pod(old, 0, func(p *corev1.Pod) { p.DeletionTimestamp = &metav1.Time{Time: now} }), // draining
	}
	want := Of(job, pods)
	if want.Ready != 2 || want.Ranks[3] != nil || len(want.Failed) != 1 || len(want.Previous) != 1 || len(want.Stale) != 1 ||
		len(want.Draining) != 1 || want.CheckpointStep != 60 || want.Resume.Step != 40 || want.ContainerRestarts != 4 {
		t.Fatalf("gang: ready %d, failed %d, previous %d, stale %d, draining %d, checkpoint %d, resumed %d, restarts %d",
			want.Ready, len(want.Failed), len(want.Previous), len(want.Stale), len(want.Draining), want.CheckpointStep, want.Resume.Step, want.ContainerRestarts)
	}
	if m := want.Missing(); len(m) != 1 || m[0] != 3 {
		t.Errorf("missing %v, want rank 3", m)
	}
	for range 20 {
		shuffled := append([]corev1.Pod(nil), pods...)
		rand.Shuffle(len(shuffled), func(i, j int) { shuffled[i], shuffled[j] = shuffled[j], shuffled[i] })
		if diff := cmp.Diff(want, Of(job, shuffled), cmp.AllowUnexported(Gang{})); diff != "" {
			t.Fatalf("the gang changed with the listing order (-want +got):\n%s", diff)
		}
	}
}

// A rank held by a scheduling gate that whatever admits the job lifts (Kueue's) waits; one held
// by a gate nobody the operator knows lifts is unschedulable, and the message names the gate.
func TestOnlyForeignSchedulingGatesMakeARankUnschedulable(t *testing.T) {
	job := testjob.MakeZayaTrainingJob("llm", "ns").Nodes(1).Defaulted().Obj()
	gated := func(gate string) []corev1.Pod {
		return []corev1.Pod{pod(job, 0, func(p *corev1.Pod) {
			p.Spec.SchedulingGates = []corev1.PodSchedulingGate{{Name: gate}}
			p.Status.Phase = corev1.PodPending
			p.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodScheduled, Status: corev1.ConditionFalse,
				Reason: corev1.PodReasonSchedulingGated, LastTransitionTime: metav1.NewTime(now)}}
		})}
	}
	if g := Of(job, gated("kueue.x-k8s.io/admission"), "kueue.x-k8s.io/admission"); g.Unschedulable != 0 {
		t.Errorf("a rank waiting on the admission's own gate counts as unschedulable")
	}
	g := Of(job, gated("example.com/hold"), "kueue.x-k8s.io/admission")
	if g.Unschedulable != 1 || !strings.Contains(g.UnschedulableMessage(), "example.com/hold") {
		t.Errorf("unschedulable %d (%q), want rank 0 held by example.com/hold", g.Unschedulable, g.UnschedulableMessage())
	}
}

// A pod this process created is not created again before the cache shows it, for ExpectationTTL.
func TestCreationsHoldBackWhatTheCacheHasNotShown(t *testing.T) {
	job := testjob.MakeZayaTrainingJob("llm", "ns").Nodes(2).Defaulted().Obj()
	var c Creations
	c.Created(job, workerpod.PodName(job, 0, 1), now)
	g := Of(job, nil)
	got, next := c.Pending(job, g, g.Missing(), now.Add(time.Second))
	if len(got) != 1 || got[0] != 0 || next != ExpectationTTL-time.Second {
		t.Fatalf("to create %v, next %s; want rank 0 now and rank 1 held %s", got, next, ExpectationTTL-time.Second)
	}
	if got, _ := c.Pending(job, g, g.Missing(), now.Add(ExpectationTTL)); len(got) != 2 {
		t.Errorf("after the TTL, to create %v, want both ranks", got)
	}
}

// A rank stopped in an in-place restart with its last run's end, whether its kubelet has
// restarted it yet or not; a run that ended before the restart, or none, is no stop of it.
func TestARestartsExitIsTheRunEndedInIt(t *testing.T) {
	job := testjob.MakeZayaTrainingJob("llm", "ns").Nodes(1).Generation(1).Defaulted().Obj()
	since := now.Add(-2 * time.Second)
	exit := func(at time.Time) *corev1.ContainerStateTerminated {
		return &corev1.ContainerStateTerminated{ExitCode: 75, FinishedAt: metav1.NewTime(at.Truncate(time.Second))}
	}
	for _, tc := range []struct {
		name string
		edit func(*corev1.Pod)
		want bool
	}{
		{"exited, not yet restarted", func(p *corev1.Pod) {
			ready(p)
			p.Status.ContainerStatuses[0].State = corev1.ContainerState{Terminated: exit(since.Add(300 * time.Millisecond))}
		}, true},
		{"waiting in its back-off", func(p *corev1.Pod) {
			ready(p)
			p.Status.ContainerStatuses[0].State = corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: "CrashLoopBackOff"}}
			p.Status.ContainerStatuses[0].LastTerminationState.Terminated = exit(since)
		}, true},
		{"back", func(p *corev1.Pod) {
			ready(p)
			p.Status.ContainerStatuses[0].LastTerminationState.Terminated = exit(since.Add(time.Second))
		}, true},
		{"exited before the restart", func(p *corev1.Pod) {
			ready(p)
			p.Status.ContainerStatuses[0].State = corev1.ContainerState{Terminated: exit(since.Add(-time.Minute))}
		}, false},
		{"running its old run", func(p *corev1.Pod) {
			ready(p)
			p.Status.ContainerStatuses[0].RestartCount = 0 // as many as before the restart
			p.Status.ContainerStatuses[0].State.Running.StartedAt = metav1.NewTime(now.Add(-time.Hour))
			p.Status.ContainerStatuses[0].LastTerminationState.Terminated = exit(now.Add(-2 * time.Hour))
		}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g := Of(job, []corev1.Pod{pod(job, 0, tc.edit)})
			if got := g.RestartExit(0, since) != nil; got != tc.want {
				t.Errorf("RestartExit = %t, want %t", got, tc.want)
			}
		})
	}
}
