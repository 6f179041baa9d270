package restart

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	trainingv1alpha1 "github.com/zaya-operator/zaya-operator/api/v1alpha1"
	"github.com/zaya-operator/zaya-operator/controllers/attribution"
	"github.com/zaya-operator/zaya-operator/controllers/gang"
	"github.com/zaya-operator/zaya-operator/controllers/recovery"
	"github.com/zaya-operator/zaya-operator/internal/testjob"
)

var at = time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)

// executor is an Executor for a fresh two-rank job whose Host records what it is asked.
func executor(t *testing.T, edit func(*trainingv1alpha1.ZayaTrainingJob)) (*Executor, *host) {
	t.Helper()
	job := testjob.MakeZayaTrainingJob("llm", "team-a").Nodes(2).Defaulted().Obj()
	if edit != nil {
		edit(job)
	}
	h := &host{job: job}
	c := fake.NewClientBuilder().WithObjects(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n0"}}, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1"}}).Build()
	return &Executor{Job: job, Now: at, Host: h, Cluster: c, Live: c, Patterns: attribution.Default()}, h
}

func exitVerdict(code int32, fatal bool) recovery.Verdict {
	return recovery.Verdict{Fatal: fatal, Counted: true, Failure: trainingv1alpha1.JobFailure{
		Time: metav1.Time{Time: at}, Reason: trainingv1alpha1.FailureReasonExitCode, ExitCode: ptr.To(code),
		Rank: ptr.To[int32](1), Node: "n1", Message: "rank 1 exited",
	}}
}

// A retryable exit restarts the gang as the next attempt, once, in status alone; a fatal one
// fails the job and counts no restart.
func TestActRecreatesTheGangOrFailsTheJob(t *testing.T) {
	e, h := executor(t, nil)
	if err := e.Act(context.Background(), exitVerdict(1, false), gang.Gang{}); err != nil {
		t.Fatal(err)
	}
	st := e.Job.Status
	if st.Restarts != 1 || st.LastRestartMode != trainingv1alpha1.RestartModeRecreate || st.LastFailure == nil || *st.LastFailure.Rank != 1 ||
		!meta.IsStatusConditionTrue(st.Conditions, trainingv1alpha1.ConditionRestarting) || h.failed != "" {
		t.Fatalf("status after a retryable exit: restarts %d, mode %q, last failure %+v, failed %q", st.Restarts, st.LastRestartMode, st.LastFailure, h.failed)
	}
	if !slices.ContainsFunc(h.events, func(s string) bool {
		return strings.HasPrefix(s, "Warning Restarting restarting the whole gang as attempt 1")
	}) {
		t.Errorf("events %q: want the restart's warning", h.events)
	}

	e, h = executor(t, nil)
	if err := e.Act(context.Background(), exitVerdict(2, true), gang.Gang{}); err != nil {
		t.Fatal(err)
	}
	if e.Job.Status.Restarts != 0 || h.failed == "" || e.Job.Status.LastFailure.Action != trainingv1alpha1.FailureActionFailedJob {
		t.Fatalf("a fatal exit: restarts %d, failed %q, action %q; want none, the job failed, FailedJob", e.Job.Status.Restarts, h.failed, e.Job.Status.LastFailure.Action)
	}
}

// The third failure on one node within the window quarantines it, and the gang restarts away
// from it; a quarantine past its expiry is released with an event.
func TestRepeatedFailuresQuarantineTheNodeUntilTheyExpire(t *testing.T) {
	e, h := executor(t, nil)
	for i := range 3 {
		e.Now = at.Add(time.Duration(i) * time.Minute)
		v := exitVerdict(1, false)
		v.Failure.Time = metav1.Time{Time: e.Now}
		if err := e.Act(context.Background(), v, gang.Gang{}); err != nil {
			t.Fatal(err)
		}
		if q := recovery.Quarantined(&e.Job.Status, "n1"); q != (i == 2) {
			t.Fatalf("after failure %d on n1: quarantined %v", i+1, q)
		}
	}
	e.Now = at.Add(2*time.Minute + e.Job.Spec.FaultTolerance.Quarantine.ExpireAfter.Duration + time.Second)
	if e.ExpireQuarantine(); recovery.Quarantined(&e.Job.Status, "n1") {
		t.Fatal("the quarantine stayed past expireAfter")
	}
	if !slices.ContainsFunc(h.events, func(s string) bool { return strings.HasPrefix(s, "Normal "+trainingv1alpha1.ReasonNodeReleased) }) {
		t.Errorf("events %q: want the release", h.events)
	}
}

// Spares are made only once every rank is placed, as many as wanted, through the Host.
func TestSparesAreMadeOnceTheGangIsPlaced(t *testing.T) {
	e, h := executor(t, func(j *trainingv1alpha1.ZayaTrainingJob) {
		j.Spec.FaultTolerance.RestartMode = trainingv1alpha1.RestartModeInPlace
		j.Spec.FaultTolerance.Spares = 2
	})
	if _, err := e.EnsureSpares(context.Background(), gang.Gang{Scheduled: 1}); err != nil || len(h.events) != 0 {
		t.Fatalf("with a rank unplaced: %v, events %q; want no spare", err, h.events)
	}
	if _, err := e.EnsureSpares(context.Background(), gang.Gang{Scheduled: 2}); err != nil {
		t.Fatal(err)
	}
	if want := "Normal " + trainingv1alpha1.ReasonSparesCreated + " created warm spares spare-0, spare-1"; !slices.Contains(h.events, want) {
		t.Errorf("events %q: want %q", h.events, want)
	}
}

// A refused spare stops the pass's creates: a quota that refuses one refuses the rest, and a
// shrunk gang may want thousands of grow holders.
func TestARefusedSpareEndsThePassCreates(t *testing.T) {
	e, h := executor(t, func(j *trainingv1alpha1.ZayaTrainingJob) {
		j.Spec.FaultTolerance.Spares = 3
	})
	h.refuse = errors.New(`pods "spare-0" is forbidden: exceeded quota`)
	if _, err := e.EnsureSpares(context.Background(), gang.Gang{Scheduled: 2}); err != nil {
		t.Fatal(err)
	}
	if h.creates != 1 || len(h.events) != 1 || !strings.HasPrefix(h.events[0], "Warning "+trainingv1alpha1.ReasonSpareUnavailable+" warm spare spare-0: ") {
		t.Errorf("%d creates, events %q: want one refused create and its warning", h.creates, h.events)
	}
}

// A shrunk gang that cannot shrink further is still Shrunk: the condition says the width.
func TestAShrunkGangThatCannotShrinkStaysShrunk(t *testing.T) {
	for cur, want := range map[int32]metav1.ConditionStatus{4: metav1.ConditionFalse, 3: metav1.ConditionTrue} {
		e, _ := executor(t, func(j *trainingv1alpha1.ZayaTrainingJob) {
			j.Spec.Nodes, j.Spec.GPUsPerNode = 4, 1
			j.Spec.Elastic = &trainingv1alpha1.ElasticSpec{MinNodes: 2}
			j.Status.CurrentNodes = cur
		})
		e.Elastic(context.Background(), recovery.Resize{Reason: trainingv1alpha1.ReasonCannotShrink, Message: "no gang of at least 2"})
		c := meta.FindStatusCondition(e.Job.Status.Conditions, trainingv1alpha1.ConditionShrunk)
		if c == nil || c.Status != want || c.Reason != trainingv1alpha1.ReasonCannotShrink {
			t.Errorf("on %d of 4 nodes: Shrunk %+v, want %s", cur, c, want)
		}
	}
}

// A lost node found during the in-place restart a bystander's stop began takes that stop's
// record: one fault, one failure, and the node's rank is replaced.
func TestALostNodeTakesTheBystandersRecord(t *testing.T) {
	e, _ := executor(t, nil)
	st := &e.Job.Status
	stop := trainingv1alpha1.JobFailure{Time: metav1.NewTime(at.Add(-5 * time.Second)), Reason: trainingv1alpha1.FailureReasonExitCode,
		ExitCode: ptr.To[int32](trainingv1alpha1.ExitStopped), Rank: ptr.To[int32](0), Node: "n0", Category: "Unknown", Action: trainingv1alpha1.FailureActionInPlace,
		Recovery: &trainingv1alpha1.RecoveryTimeline{LastStep: trainingv1alpha1.Stamp(at.Add(-6 * time.Second)),
			Detected: trainingv1alpha1.Stamp(at.Add(-5 * time.Second)), Decided: trainingv1alpha1.Stamp(at.Add(-5 * time.Second))}}
	st.LastFailure, st.RecentFailures = stop.DeepCopy(), []trainingv1alpha1.JobFailure{stop}
	st.Restarts, st.InPlaceRestarts, st.LastRestartMode = 1, 1, trainingv1alpha1.RestartModeInPlace
	meta.SetStatusCondition(&st.Conditions, metav1.Condition{Type: trainingv1alpha1.ConditionRestarting, Status: metav1.ConditionTrue, Reason: "ExitCode",
		LastTransitionTime: metav1.NewTime(at.Add(-5 * time.Second))})
	pod := func(r int32, node string) *corev1.Pod {
		return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("llm-0-%d", r), UID: types.UID(fmt.Sprintf("u%d", r))}, Spec: corev1.PodSpec{NodeName: node}}
	}
	lost := recovery.Verdict{Counted: true, Failure: trainingv1alpha1.JobFailure{Time: metav1.NewTime(at), Reason: trainingv1alpha1.FailureReasonNodeLost,
		Rank: ptr.To[int32](1), Node: "n1", Message: "node n1 is lost"}}
	if err := e.Act(context.Background(), lost, gang.Gang{Ranks: []*corev1.Pod{pod(0, "n0"), pod(1, "n1")}}); err != nil {
		t.Fatal(err)
	}
	if len(st.RecentFailures) != 1 || st.RecentFailures[0].Reason != trainingv1alpha1.FailureReasonNodeLost || st.RecentFailures[0].Action != trainingv1alpha1.FailureActionReplacedPods {
		t.Errorf("recent failures %+v: want the lost node's alone, its rank replaced", st.RecentFailures)
	}
	if st.Restarts != 1 || len(st.Replacing) != 1 || st.Replacing[0].Rank != 1 {
		t.Errorf("restarts %d, replacing %+v: want the same restart, rank 1 replaced", st.Restarts, st.Replacing)
	}
	// The restart's way back goes on: detected on the stop, decided again when the rank's
	// pod was replaced.
	want := &trainingv1alpha1.RecoveryTimeline{LastStep: trainingv1alpha1.Stamp(at.Add(-6 * time.Second)),
		Detected: trainingv1alpha1.Stamp(at.Add(-5 * time.Second)), Decided: trainingv1alpha1.Stamp(at)}
	if diff := cmp.Diff(want, st.LastFailure.Recovery); diff != "" {
		t.Errorf("lastFailure's timeline (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff(want, st.RecentFailures[0].Recovery); diff != "" {
		t.Errorf("the recent failure's timeline (-want +got):\n%s", diff)
	}
}
