package controllers

import (
	"context"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	trainingv1alpha1 "github.com/zaya-operator/zaya-operator/api/v1alpha1"
	"github.com/zaya-operator/zaya-operator/controllers/recovery"
	"github.com/zaya-operator/zaya-operator/internal/testjob"
)

// runAll marks every live pod of the job Running and ready.
func (h *harness) runAll(t testing.TB) {
	t.Helper()
	for name, p := range h.pods(t) {
		if p.DeletionTimestamp.IsZero() && p.Status.Phase != corev1.PodFailed && p.Status.Phase != corev1.PodSucceeded {
			h.setPod(t, name, running("node-"+name))
		}
	}
}

func podNames(m map[string]*corev1.Pod) []string {
	out := keys(m)
	slicesSort(out)
	return out
}

func TestRetryableFailureRestartsTheWholeGang(t *testing.T) {
	job := testjob.MakeZayaTrainingJob("llm", "ns").Nodes(3).Generation(1).RestartMode(trainingv1alpha1.RestartModeRecreate).Defaulted().Obj()
	h := newHarness(t, interceptor.Funcs{}, job)
	h.mustReconcile(t, job)
	h.runAll(t)
	h.mustReconcile(t, job)
	// Rank 2 crashes first; rank 0 dies later in a collective timeout; rank 1 hangs on.
	h.setPod(t, "llm-0-2", exited("n2", 139, now))
	h.setPod(t, "llm-0-0", exited("n0", 1, now.Add(time.Minute)))
	h.drainEvents()
	h.writes.Store(0)

	h.mustReconcile(t, job)
	got := h.get(t, job)
	if got.Status.Restarts != 1 || len(got.Status.RestartTimes) != 1 {
		t.Fatalf("restarts %d, restartTimes %v; want attempt 1 with one counted restart", got.Status.Restarts, got.Status.RestartTimes)
	}
	if f := got.Status.LastFailure; f == nil || *f.Rank != 2 || *f.ExitCode != 139 || f.Reason != "ExitCode" || f.Attempt != 0 {
		t.Errorf("lastFailure = %+v, want rank 2 exit 139 of attempt 0", f)
	}
	if c := condition(got, "Restarting"); c == nil || c.Status != metav1.ConditionTrue || c.Reason != "ExitCode" {
		t.Errorf("Restarting = %+v", c)
	}
	if c := condition(got, "Running"); c.Status != metav1.ConditionFalse || c.Reason != "Restarting" {
		t.Errorf("Running = %+v", c)
	}
	if w := h.writes.Load(); w != 1 {
		t.Errorf("the deciding pass made %d writes, want only the status write", w)
	}
	if ev := h.drainEvents(); len(ev) != 1 || !strings.HasPrefix(ev[0], "Warning Restarting restarting the whole gang as attempt 1 after: rank 2") {
		t.Errorf("events = %q", ev)
	}

	// Next pass: the old attempt goes (its failed pods stay for their logs) ...
	h.mustReconcile(t, job)
	if diff := cmp.Diff([]string{"llm-0-0", "llm-0-2"}, podNames(h.pods(t))); diff != "" {
		t.Errorf("pods after the old attempt was deleted (-want +got):\n%s", diff)
	}
	// ... then the new one is created, and recovery completes when it runs.
	h.r.Clock = clockAt(now.Add(3 * time.Second))
	h.mustReconcile(t, job)
	if diff := cmp.Diff([]string{"llm-0-0", "llm-0-2", "llm-1-0", "llm-1-1", "llm-1-2"}, podNames(h.pods(t))); diff != "" {
		t.Errorf("pods of attempt 1 (-want +got):\n%s", diff)
	}
	h.runAll(t)
	h.mustReconcile(t, job)
	got = h.get(t, job)
	if !meta.IsStatusConditionTrue(got.Status.Conditions, "Running") {
		t.Error("not Running after the restart")
	}
	if c := condition(got, "Restarting"); c.Status != metav1.ConditionFalse || c.Reason != "Recovered" {
		t.Errorf("Restarting = %+v, want False/Recovered", c)
	}
	if got.Status.LastRecoverySeconds == nil || *got.Status.LastRecoverySeconds != 3 {
		t.Errorf("lastRecoverySeconds = %v, want 3", got.Status.LastRecoverySeconds)
	}
	// A second restart deletes the first attempt's leftovers: only one attempt of logs is kept.
	h.setPod(t, "llm-1-1", exited("n1", 1, now.Add(4*time.Second)))
	h.mustReconcile(t, job)
	h.mustReconcile(t, job)
	for name := range h.pods(t) {
		if strings.HasPrefix(name, "llm-0-") {
			t.Errorf("pod %s of attempt 0 survived the second restart", name)
		}
	}
}

func TestFatalExitCodesFailWithoutARestartLoop(t *testing.T) {
	cases := []struct {
		name   string
		code   int32
		mutate func(*trainingv1alpha1.ZayaTrainingJob)
		fatal  bool
	}{
		{"config error 78 is fatal by default", 78, nil, true},
		{"other codes restart by default", 1, nil, false},
		{"a listed fatal code", 3, func(j *trainingv1alpha1.ZayaTrainingJob) { j.Spec.FaultTolerance.ExitCodes.Fatal = []int32{3} }, true},
		{"other: Fail, code unlisted", 1, func(j *trainingv1alpha1.ZayaTrainingJob) {
			j.Spec.FaultTolerance.ExitCodes.Other = trainingv1alpha1.ExitCodeFail
		}, true},
		{"other: Fail, code listed retryable", 143, func(j *trainingv1alpha1.ZayaTrainingJob) {
			j.Spec.FaultTolerance.ExitCodes.Other = trainingv1alpha1.ExitCodeFail
			j.Spec.FaultTolerance.ExitCodes.Retryable = []int32{143}
		}, false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			job := testjob.MakeZayaTrainingJob("llm", "ns").Nodes(2).Generation(1).Defaulted().Obj()
			if c.mutate != nil {
				c.mutate(job)
			}
			h := newHarness(t, interceptor.Funcs{}, job)
			h.mustReconcile(t, job)
			h.runAll(t)
			h.setPod(t, "llm-0-1", exited("n1", c.code, now))
			h.mustReconcile(t, job)
			got := h.get(t, job)
			failed := condition(got, "Failed")
			if c.fatal {
				if failed == nil || failed.Reason != "FatalFailure" || got.Status.Restarts != 0 || got.Status.LastFailure.Reason != "FatalExitCode" {
					t.Fatalf("Failed = %+v, restarts %d, lastFailure %+v", failed, got.Status.Restarts, got.Status.LastFailure)
				}
				if _, ok := h.pods(t)["llm-0-0"]; ok {
					t.Error("the surviving rank was left running after a fatal failure")
				}
				return
			}
			if failed != nil || got.Status.Restarts != 1 {
				t.Errorf("Failed = %+v, restarts = %d; want a restart", failed, got.Status.Restarts)
			}
		})
	}
}

func TestRestartBudgetWithinTheWindow(t *testing.T) {
	job := testjob.MakeZayaTrainingJob("llm", "ns").Nodes(2).Generation(1).Defaulted().Obj()
	job.Spec.FaultTolerance.MaxRestarts = ptr.To[int32](2)
	job.Status.Restarts = 5
	job.Status.RestartTimes = []metav1.Time{
		metav1.NewTime(now.Add(-25 * time.Hour)), // outside the 24h window: no longer counts
		metav1.NewTime(now.Add(-2 * time.Hour)),
	}
	h := newHarness(t, interceptor.Funcs{}, job)
	h.mustReconcile(t, job)
	h.runAll(t)
	h.setPod(t, "llm-5-0", exited("n0", 1, now))
	h.mustReconcile(t, job)
	got := h.get(t, job)
	if got.Status.Restarts != 6 || len(got.Status.RestartTimes) != 2 || condition(got, "Failed") != nil {
		t.Fatalf("restarts %d, restartTimes %v, Failed %+v: want a second counted restart, the expired one pruned",
			got.Status.Restarts, got.Status.RestartTimes, condition(got, "Failed"))
	}

	h.mustReconcile(t, job)
	h.mustReconcile(t, job)
	h.runAll(t)
	h.setPod(t, "llm-6-1", exited("n1", 1, now))
	h.mustReconcile(t, job)
	got = h.get(t, job)
	c := condition(got, "Failed")
	if c == nil || c.Reason != "RestartBudgetExceeded" {
		t.Fatalf("Failed = %+v, want RestartBudgetExceeded", c)
	}
	for _, want := range []string{"2 restarts within 24h0m0s (maxRestarts 2)", "rank 1 (pod llm-6-1", "rank 0 (pod llm-5-0"} {
		if !strings.Contains(c.Message, want) {
			t.Errorf("message %q does not contain %q", c.Message, want)
		}
	}
	if got.Status.Restarts != 6 {
		t.Errorf("restarts = %d after the budget ran out, want 6", got.Status.Restarts)
	}
}

func TestDisruptionsAreFreeUnlessCounted(t *testing.T) {
	for _, policy := range []trainingv1alpha1.DisruptionRestarts{trainingv1alpha1.DisruptionRestartsFree, trainingv1alpha1.DisruptionRestartsCounted} {
		t.Run(string(policy), func(t *testing.T) {
			job := testjob.MakeZayaTrainingJob("llm", "ns").Nodes(2).Generation(1).Defaulted().Obj()
			job.Spec.FaultTolerance.DisruptionRestarts = policy
			h := newHarness(t, interceptor.Funcs{}, job)
			h.mustReconcile(t, job)
			h.runAll(t)
			h.setPod(t, "llm-0-1", func(p *corev1.Pod) {
				p.Status.Phase = corev1.PodFailed
				p.Status.Conditions = append(p.Status.Conditions, corev1.PodCondition{
					Type: corev1.DisruptionTarget, Status: corev1.ConditionTrue, Reason: "PreemptionByScheduler",
				})
			})
			h.mustReconcile(t, job)
			got := h.get(t, job)
			wantCounted := 0
			if policy == trainingv1alpha1.DisruptionRestartsCounted {
				wantCounted = 1
			}
			if got.Status.Restarts != 1 || len(got.Status.RestartTimes) != wantCounted || got.Status.LastFailure.Reason != "Preempted" {
				t.Errorf("restarts %d, counted %d, reason %q; want 1, %d, Preempted",
					got.Status.Restarts, len(got.Status.RestartTimes), got.Status.LastFailure.Reason, wantCounted)
			}
		})
	}
}

// Kueue stops the pods of a workload it evicts (preemption, among others) by marking them
// with a TerminationTarget condition and deleting them: a preemption, not a pod deleted.
func TestAPodKueueStoppedIsPreempted(t *testing.T) {
	job := testjob.MakeZayaTrainingJob("llm", "ns").Nodes(2).Generation(1).Defaulted().Obj()
	h := newHarness(t, interceptor.Funcs{}, job)
	h.mustReconcile(t, job)
	h.runAll(t)
	ctx := context.Background()
	h.setPod(t, "llm-0-1", func(p *corev1.Pod) {
		p.Finalizers = []string{"kueue.x-k8s.io/managed"}
		p.Status.Conditions = append(p.Status.Conditions, corev1.PodCondition{
			Type: "TerminationTarget", Status: corev1.ConditionTrue, Reason: "WorkloadEvicted", Message: "Preempted to accommodate a workload (UID: 1234)",
		})
	})
	if err := h.r.Delete(ctx, h.pods(t)["llm-0-1"]); err != nil {
		t.Fatal(err)
	}
	h.mustReconcile(t, job)
	got := h.get(t, job)
	if f := got.Status.LastFailure; f == nil || f.Reason != trainingv1alpha1.FailureReasonPreempted || !strings.Contains(f.Message, "Kueue") || len(got.Status.RestartTimes) != 0 {
		t.Errorf("lastFailure %+v, counted %d: want a free restart for Preempted, saying Kueue stopped it", f, len(got.Status.RestartTimes))
	}
}

func TestAPodDeletedUnderTheGangRestartsIt(t *testing.T) {
	job := testjob.MakeZayaTrainingJob("llm", "ns").Nodes(2).Generation(1).Defaulted().Obj()
	h := newHarness(t, interceptor.Funcs{}, job)
	h.mustReconcile(t, job)
	h.runAll(t)
	ctx := context.Background()
	// A finalizer keeps the pod visible while it terminates, as a kubelet's grace period would.
	pod := h.pods(t)["llm-0-0"]
	pod.Finalizers = []string{"test/hold"}
	if err := h.r.Update(ctx, pod); err != nil {
		t.Fatal(err)
	}
	if err := h.r.Delete(ctx, pod); err != nil {
		t.Fatal(err)
	}
	h.mustReconcile(t, job)
	got := h.get(t, job)
	if got.Status.Restarts != 1 || got.Status.LastFailure.Reason != "PodDeleted" || len(got.Status.RestartTimes) != 0 {
		t.Errorf("restarts %d, reason %q, counted %d; want a free restart for PodDeleted",
			got.Status.Restarts, got.Status.LastFailure.Reason, len(got.Status.RestartTimes))
	}
}

func TestBackoffDelaysTheNewAttempt(t *testing.T) {
	job := testjob.MakeZayaTrainingJob("llm", "ns").Nodes(1).Generation(1).Defaulted().Obj()
	job.Spec.FaultTolerance.Backoff = trainingv1alpha1.BackoffSpec{Initial: &metav1.Duration{Duration: 10 * time.Second}, Max: &metav1.Duration{Duration: 15 * time.Second}}
	job.Status.RestartTimes = []metav1.Time{metav1.NewTime(now.Add(-time.Hour))}
	h := newHarness(t, interceptor.Funcs{}, job)
	h.mustReconcile(t, job)
	h.runAll(t)
	h.setPod(t, "llm-0-0", exited("n0", 1, now))
	h.mustReconcile(t, job) // decide: the 2nd counted restart waits 10s*2 = 20s, capped at 15s
	h.mustReconcile(t, job) // delete the old attempt
	if res := h.mustReconcile(t, job); res.RequeueAfter != 15*time.Second {
		t.Errorf("RequeueAfter = %v, want 15s of backoff", res.RequeueAfter)
	}
	if _, ok := h.pods(t)["llm-1-0"]; ok {
		t.Fatal("the new attempt started before its backoff")
	}
	h.r.Clock = clockAt(now.Add(15 * time.Second))
	h.mustReconcile(t, job)
	if _, ok := h.pods(t)["llm-1-0"]; !ok {
		t.Error("the new attempt did not start after its backoff")
	}
}

func TestStuckTerminatingPodsAreForceDeleted(t *testing.T) {
	job := testjob.MakeZayaTrainingJob("llm", "ns").Nodes(2).Generation(1).Defaulted().Obj()
	var forced atomic.Int32
	h := newHarness(t, interceptor.Funcs{}, job)
	h.mustReconcile(t, job)
	h.runAll(t)
	ctx := context.Background()
	// Rank 0's node is dead: its pod will never finish terminating by itself.
	pod := h.pods(t)["llm-0-0"]
	pod.Finalizers = []string{"test/dead-kubelet"}
	if err := h.r.Update(ctx, pod); err != nil {
		t.Fatal(err)
	}
	h.setPod(t, "llm-0-1", exited("n1", 1, now))
	h.mustReconcile(t, job) // restart decided
	h.onDelete(func(_ client.Object, o *client.DeleteOptions) {
		if o.GracePeriodSeconds != nil && *o.GracePeriodSeconds == 0 {
			forced.Add(1)
		}
	})
	h.mustReconcile(t, job)                                // the old attempt is deleted; rank 0 stays terminating
	deleted := h.pods(t)["llm-0-0"].DeletionTimestamp.Time // the fake client stamps real time
	h.r.Clock = clockAt(deleted)
	res := h.mustReconcile(t, job)
	if forced.Load() != 0 || res.RequeueAfter != 2*time.Minute {
		t.Fatalf("forced %d, RequeueAfter %v: want a wait of terminatingTimeout (2m)", forced.Load(), res.RequeueAfter)
	}
	if _, ok := h.pods(t)["llm-1-0"]; ok {
		t.Fatal("the new attempt started while an old pod still terminates")
	}
	h.r.Clock = clockAt(deleted.Add(2 * time.Minute))
	h.mustReconcile(t, job)
	if forced.Load() != 1 {
		t.Errorf("force deletions = %d, want 1 after terminatingTimeout", forced.Load())
	}
	// The finalizer (standing in for a dead kubelet here) still holds the pod: the event says
	// so, once, instead of claiming a delete that did not happen.
	if ev := h.drainEvents(); !containsPrefix(ev, "Warning BlockedByFinalizer waiting for pod llm-0-0, terminating for more than 2m0s and held by finalizers test/dead-kubelet") ||
		containsPrefix(ev, "Warning ForceDeleted") {
		t.Errorf("events = %q", ev)
	}
	h.mustReconcile(t, job)
	if ev := h.drainEvents(); len(ev) != 0 {
		t.Errorf("events repeated: %q", ev)
	}
	// Without finalizers a force delete removes the pod: that one is reported as done.
	pod = h.pods(t)["llm-0-0"]
	pod.Finalizers = nil
	if err := h.r.Update(ctx, pod); err != nil && !apierrors.IsNotFound(err) {
		t.Fatal(err)
	}
}

func TestForceDeleteIsReportedWhenItHappens(t *testing.T) {
	job := testjob.MakeZayaTrainingJob("llm", "ns").Nodes(1).Generation(1).Defaulted().Obj()
	h := newHarness(t, interceptor.Funcs{}, job)
	h.r.Clock = clockAt(now.Add(time.Hour))
	terminating := &corev1.Pod{}
	terminating.Name, terminating.Namespace, terminating.Spec.NodeName = "llm-0-0", "ns", "n0"
	terminating.DeletionTimestamp = &metav1.Time{Time: now}
	p := &pass{r: h.r, job: job, now: now.Add(time.Hour)}
	if _, err := p.clearStuck(context.Background(), []*corev1.Pod{terminating}); err != nil {
		t.Fatal(err)
	}
	if len(p.events) != 1 || !strings.HasPrefix(p.events[0].note, "force-deleted pod llm-0-0 on n0") {
		t.Errorf("events = %+v", p.events)
	}
}

func TestAnOperatorRestartMidRecoveryNeitherDoublesNorLosesTheRestart(t *testing.T) {
	job := testjob.MakeZayaTrainingJob("llm", "ns").Nodes(2).Generation(1).Defaulted().Obj()
	h := newHarness(t, interceptor.Funcs{}, job)
	h.mustReconcile(t, job)
	h.runAll(t)
	h.setPod(t, "llm-0-1", exited("n1", 1, now))
	h.mustReconcile(t, job) // restart decided and stored; then the operator "crashes"

	// A fresh reconciler knows only what the API holds.
	fresh := &ZayaTrainingJobReconciler{Client: h.r.Client, Recorder: h.events, Clock: clockAt(now.Add(time.Second))}
	for range 3 {
		if _, err := fresh.Reconcile(context.Background(), reqFor(job)); err != nil {
			t.Fatal(err)
		}
	}
	got := h.get(t, job)
	if got.Status.Restarts != 1 || len(got.Status.RestartTimes) != 1 {
		t.Errorf("restarts %d, restartTimes %d after the operator restart; want 1 and 1", got.Status.Restarts, len(got.Status.RestartTimes))
	}
	if diff := cmp.Diff([]string{"llm-0-1", "llm-1-0", "llm-1-1"}, podNames(h.pods(t))); diff != "" {
		t.Errorf("pods (-want +got):\n%s", diff)
	}
}

func TestJudge(t *testing.T) {
	spec := &testjob.MakeZayaTrainingJob("j", "ns").Defaulted().Obj().Spec
	base := func(mut func(*corev1.Pod)) *corev1.Pod {
		p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "j-0-3", Labels: map[string]string{trainingv1alpha1.RankLabel: "3"}},
			Spec: corev1.PodSpec{NodeName: "n3", Containers: []corev1.Container{{Name: "worker"}}}}
		mut(p)
		return p
	}
	cases := []struct {
		name          string
		pod           *corev1.Pod
		reason        string
		fatal, counts bool
	}{
		{"exit 1", base(exited("n3", 1, now)), "ExitCode", false, true},
		{"exit 137 (killed)", base(exited("n3", 137, now)), "ExitCode", false, true},
		{"exit 78 (config)", base(exited("n3", 78, now)), "FatalExitCode", true, false},
		{"kubelet eviction", base(func(p *corev1.Pod) { p.Status.Phase = corev1.PodFailed; p.Status.Reason = "Evicted" }), "Evicted", false, false},
		{"node shutdown", base(func(p *corev1.Pod) { p.Status.Phase = corev1.PodFailed; p.Status.Reason = "NodeShutdown" }), "NodeLost", false, false},
		{"taint manager", base(func(p *corev1.Pod) {
			p.Status.Conditions = []corev1.PodCondition{{Type: corev1.DisruptionTarget, Status: corev1.ConditionTrue, Reason: "DeletionByTaintManager"}}
		}), "NodeLost", false, false},
		{"failed without a container status", base(func(p *corev1.Pod) { p.Status.Phase = corev1.PodFailed }), "ExitCode", false, true},
		{"killed by the heartbeat probe", base(func(p *corev1.Pod) {
			exited("n3", 137, now)(p)
			p.Status.ContainerStatuses[0].State.Terminated.Message = "checkpoint-step=10\nzaya: hang: no heartbeat for 1800s\n"
		}), "Hang", false, true},
		{"deleted while running", base(func(p *corev1.Pod) { p.DeletionTimestamp = &metav1.Time{Time: now} }), "PodDeleted", false, false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			v := recovery.Judge(spec, c.pod, now, 0, nil)
			if v.Failure.Reason != c.reason || v.Fatal != c.fatal || v.Counted != c.counts {
				t.Errorf("judge = reason %q fatal %v counted %v; want %q %v %v", v.Failure.Reason, v.Fatal, v.Counted, c.reason, c.fatal, c.counts)
			}
			if *v.Failure.Rank != 3 || v.Failure.Node != "n3" {
				t.Errorf("failure = %+v, want rank 3 on n3", v.Failure)
			}
		})
	}
}

// onDelete calls seen with every delete the reconciler makes from now on, and its options.
func (h *harness) onDelete(seen func(client.Object, *client.DeleteOptions)) {
	h.r.Client = interceptor.NewClient(h.r.Client.(client.WithWatch), interceptor.Funcs{
		Delete: func(ctx context.Context, c client.WithWatch, obj client.Object, opts ...client.DeleteOption) error {
			o := &client.DeleteOptions{}
			o.ApplyOptions(opts)
			seen(obj, o)
			return c.Delete(ctx, obj, opts...)
		},
	})
}

func containsPrefix(list []string, prefix string) bool {
	for _, s := range list {
		if strings.HasPrefix(s, prefix) {
			return true
		}
	}
	return false
}

func TestFailedGangsStopBrieflySuspendedOnesGracefully(t *testing.T) {
	var mu sync.Mutex // deletes run concurrently
	graces := map[string]*int64{}
	job := testjob.MakeZayaTrainingJob("llm", "ns").Nodes(3).Generation(1).Defaulted().Obj()
	job.Spec.Template.Spec.TerminationGracePeriodSeconds = ptr.To[int64](120)
	h := newHarness(t, interceptor.Funcs{}, job)
	h.mustReconcile(t, job)
	h.runAll(t)
	h.onDelete(func(obj client.Object, o *client.DeleteOptions) {
		mu.Lock()
		defer mu.Unlock()
		graces[obj.GetName()] = o.GracePeriodSeconds
	})
	h.setPod(t, "llm-0-0", exited("n0", 1, now))
	h.mustReconcile(t, job) // decide
	h.mustReconcile(t, job) // drain
	for _, name := range []string{"llm-0-1", "llm-0-2"} {
		if g := graces[name]; g == nil || *g != 10 {
			t.Errorf("%s deleted with grace %v, want 10s after a failure", name, g)
		}
	}

	h.mustReconcile(t, job) // new attempt
	h.runAll(t)
	h.suspend(t, job, true)
	h.mustReconcile(t, job)
	if g, ok := graces["llm-1-0"]; !ok || g != nil {
		t.Errorf("suspend deleted llm-1-0 with grace %v (present %v), want the pod's own", g, ok)
	}
}

func TestAWorkerStoppedByAPeerIsNeverTheRootCause(t *testing.T) {
	h, job := inPlaceGang(t, func(j *trainingv1alpha1.ZayaTrainingJob) {
		j.Spec.FaultTolerance.RestartMode = trainingv1alpha1.RestartModeRecreate
	})
	// Rank 0's clock runs behind: its 75 looks older than rank 2's own crash.
	h.setPod(t, "llm-0-0", exited("n0", trainingv1alpha1.ExitStopped, now))
	h.setPod(t, "llm-0-2", exited("n2", 134, now.Add(time.Second)))
	h.mustReconcile(t, job)
	if f := h.get(t, job).Status.LastFailure; f == nil || *f.Rank != 2 || *f.ExitCode != 134 {
		t.Errorf("lastFailure = %+v, want rank 2's exit 134", f)
	}
}
