package controllers

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	trainingv1alpha1 "github.com/zaya-operator/zaya-operator/api/v1alpha1"
	"github.com/zaya-operator/zaya-operator/controllers/gang"
	"github.com/zaya-operator/zaya-operator/controllers/recovery"
	"github.com/zaya-operator/zaya-operator/internal/kueue"
	"github.com/zaya-operator/zaya-operator/internal/testjob"
)

func condition(job *trainingv1alpha1.ZayaTrainingJob, t string) *metav1.Condition {
	return meta.FindStatusCondition(job.Status.Conditions, t)
}

func TestRank0SuccessCompletesTheJobAndCleansUp(t *testing.T) {
	job := testjob.MakeZayaTrainingJob("llm", "ns").Nodes(3).Generation(1).Defaulted().Obj()
	h := newHarness(t, interceptor.Funcs{}, job)
	h.mustReconcile(t, job)
	h.setPod(t, "llm-0-0", exited("n0", 0, now.Add(-recovery.SuccessGrace)))
	h.setPod(t, "llm-0-1", running("n1"))
	h.setPod(t, "llm-0-2", running("n2"))
	h.mustReconcile(t, job)

	got := h.get(t, job)
	if c := condition(got, "Succeeded"); c == nil || c.Status != metav1.ConditionTrue || c.Reason != "Completed" {
		t.Fatalf("Succeeded = %+v", c)
	}
	if c := condition(got, "Running"); c == nil || c.Status != metav1.ConditionFalse {
		t.Errorf("Running = %+v, want False", c)
	}
	if got.Status.CompletionTime == nil || got.Status.ReadyNodes != 0 {
		t.Errorf("completionTime %v, readyNodes %d", got.Status.CompletionTime, got.Status.ReadyNodes)
	}
	// The pass that decides leaves the pods: they go once the decision is stored.
	if n := len(h.pods(t)); n != 3 {
		t.Errorf("%d pods after the deciding pass, want 3", n)
	}
	h.mustReconcile(t, job)
	pods := h.pods(t)
	if _, ok := pods["llm-0-0"]; !ok || len(pods) != 1 {
		t.Errorf("pods left = %v, want only the finished rank 0 (kept for its logs)", keys(pods))
	}
	// Finished jobs stay finished: no pods come back.
	h.mustReconcile(t, job)
	if n := len(h.pods(t)); n != 1 {
		t.Errorf("%d pods after another pass of a finished job", n)
	}
}

// failNextJobStatusWrite fails a job's status write with err while *armed, once.
func failNextJobStatusWrite(armed *bool, err error) interceptor.Funcs {
	return interceptor.Funcs{
		SubResourceUpdate: func(ctx context.Context, c client.Client, sub string, obj client.Object, opts ...client.SubResourceUpdateOption) error {
			if _, ok := obj.(*trainingv1alpha1.ZayaTrainingJob); ok && *armed {
				*armed = false
				return err
			}
			return c.SubResource(sub).Update(ctx, obj, opts...)
		},
	}
}

// TestSuccessSurvivesAFailedStatusWrite: the pass that decides success deletes nothing, so
// when its status write fails the next pass decides the same (it found rank 1 deleted under
// rank 0 and restarted the gang, in the faulty-API integration test).
func TestSuccessSurvivesAFailedStatusWrite(t *testing.T) {
	job := testjob.MakeZayaTrainingJob("llm", "ns").Nodes(2).Generation(1).Defaulted().Obj()
	failWrite := false
	h := newHarness(t, failNextJobStatusWrite(&failWrite, apierrors.NewServiceUnavailable("injected")), job)
	h.mustReconcile(t, job)
	h.setPod(t, "llm-0-1", func(p *corev1.Pod) {
		running("n1")(p)
		p.Finalizers = []string{"test/keep"} // a kubelet takes its time: the pod stays Terminating
	})
	h.setPod(t, "llm-0-0", exited("n0", 0, now.Add(-recovery.SuccessGrace)))
	failWrite = true
	if _, err := h.reconcile(t, job); err == nil {
		t.Fatal("the injected write failure was not reported")
	}
	h.mustReconcile(t, job)
	h.mustReconcile(t, job)
	got := h.get(t, job)
	if c := condition(got, "Succeeded"); c == nil || c.Status != metav1.ConditionTrue || got.Status.Restarts != 0 {
		t.Errorf("Succeeded %+v, restarts %d: want success and no restart", c, got.Status.Restarts)
	}
}

// TestRank0SuccessWaitsForItsPeers: rank 0's exit 0 is not success while another rank of
// the attempt failed or was stopped, in whichever order the operator sees them.
func TestRank0SuccessWaitsForItsPeers(t *testing.T) {
	for _, tc := range []struct {
		name  string
		peer  func(*corev1.Pod)
		after time.Duration // when the pass runs after rank 0 exited
		want  string        // Succeeded, Restarting or "" (still waiting)
	}{
		{"peer still running within the grace", running("n1"), time.Second, ""},
		{"peer still running after the grace", running("n1"), recovery.SuccessGrace, "Succeeded"},
		{"peer finished too", exited("n1", 0, now), time.Second, "Succeeded"},
		{"peer failed before rank 0 exited", exited("n1", 143, now.Add(-time.Minute)), time.Second, "Restarting"},
		{"peer failed after rank 0 exited", exited("n1", 143, now.Add(time.Minute)), recovery.SuccessGrace, "Restarting"},
		{"peer stopped because another was (exit 75)", func(p *corev1.Pod) {
			// Long enough ago that no cause of its own is still to come (recovery.CascadeGrace).
			exited("n1", trainingv1alpha1.ExitStopped, now.Add(-recovery.CascadeGrace-time.Second))(p)
			p.Status.ContainerStatuses[0].State.Terminated.Message = trainingv1alpha1.TerminationMessageStoppedPrefix + " peer rank 2 was stopped at step 16"
		}, time.Second, "Restarting"},
		{"peer being stopped (evicted)", func(p *corev1.Pod) {
			running("n1")(p)
			p.Finalizers = []string{"test/keep"} // so the fake client keeps it while deleting
		}, recovery.SuccessGrace, "Restarting"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			job := testjob.MakeZayaTrainingJob("llm", "ns").Nodes(2).Generation(1).Defaulted().Obj()
			h := newHarness(t, interceptor.Funcs{}, job)
			h.mustReconcile(t, job)
			h.setPod(t, "llm-0-1", tc.peer)
			if tc.name == "peer being stopped (evicted)" {
				if err := h.r.Delete(context.Background(), h.pods(t)["llm-0-1"]); err != nil {
					t.Fatal(err)
				}
			}
			h.setPod(t, "llm-0-0", exited("n0", 0, now.Add(-tc.after)))
			res := h.mustReconcile(t, job)
			got := h.get(t, job)
			switch tc.want {
			case "":
				if condition(got, "Succeeded") != nil || got.Status.Restarts != 0 || res.RequeueAfter <= 0 || res.RequeueAfter > recovery.SuccessGrace {
					t.Errorf("want a wait: succeeded %v, restarts %d, requeue %v", condition(got, "Succeeded"), got.Status.Restarts, res.RequeueAfter)
				}
			case "Succeeded":
				if c := condition(got, "Succeeded"); c == nil || c.Status != metav1.ConditionTrue {
					t.Errorf("Succeeded = %+v", c)
				}
			case "Restarting":
				if c := condition(got, "Succeeded"); c != nil || got.Status.Restarts != 1 {
					t.Errorf("want a restart: succeeded %+v, restarts %d", c, got.Status.Restarts)
				}
			}
		})
	}
}

func TestTerminationMessagesReportTheLastCheckpoint(t *testing.T) {
	job := testjob.MakeZayaTrainingJob("llm", "ns").Nodes(2).Generation(1).Defaulted().Obj()
	h := newHarness(t, interceptor.Funcs{}, job)
	h.mustReconcile(t, job)
	withMessage := func(code int32, msg string) func(*corev1.Pod) {
		return func(p *corev1.Pod) {
			exited("n", code, now)(p)
			p.Status.ContainerStatuses[0].State.Terminated.Message = msg
		}
	}
	h.setPod(t, "llm-0-0", withMessage(0, "saved\ncheckpoint-step=1200\n"))
	h.setPod(t, "llm-0-1", withMessage(0, "checkpoint-step=900"))
	h.mustReconcile(t, job)
	got := h.get(t, job).Status.LastCheckpoint
	if got == nil || got.Step != 1200 || !got.Time.Time.Equal(now) {
		t.Errorf("lastCheckpoint = %+v, want step 1200 at %v", got, now)
	}
}

func TestReportedCheckpointIgnoresGarbage(t *testing.T) {
	for msg, want := range map[string]int64{
		"checkpoint-step=42":         42,
		"  checkpoint-step=7  \nbye": 7,
		"checkpoint-step=-3":         -1,
		"checkpoint-step=lots":       -1,
		"step=5":                     -1,
		"":                           -1,
	} {
		pod := &corev1.Pod{Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "worker"}}}}
		exited("n", 1, now)(pod)
		pod.Status.ContainerStatuses[0].State.Terminated.Message = msg
		got, ok := gang.ReportedCheckpoint(pod)
		if !ok {
			got = -1
		}
		if got != want {
			t.Errorf("gang.ReportedCheckpoint(%q) = %d, want %d", msg, got, want)
		}
	}
}

func TestAllRanksPolicyWaitsForEveryRank(t *testing.T) {
	job := testjob.MakeZayaTrainingJob("llm", "ns").Nodes(2).Generation(1).Defaulted().Obj()
	job.Spec.SuccessPolicy = trainingv1alpha1.SuccessAllRanks
	h := newHarness(t, interceptor.Funcs{}, job)
	h.mustReconcile(t, job)
	h.setPod(t, "llm-0-0", exited("n0", 0, now))
	h.setPod(t, "llm-0-1", running("n1"))
	h.mustReconcile(t, job)
	if finished(h.get(t, job)) {
		t.Fatal("finished while rank 1 still runs")
	}
	h.setPod(t, "llm-0-1", exited("n1", 0, now))
	h.mustReconcile(t, job)
	if c := condition(h.get(t, job), "Succeeded"); c == nil || c.Status != metav1.ConditionTrue {
		t.Errorf("Succeeded = %+v", c)
	}
}

func TestSuspendAndResume(t *testing.T) {
	job := testjob.MakeZayaTrainingJob("llm", "ns").Nodes(2).Generation(1).NewCheckpoint("1Ti", "").Defaulted().Obj()
	h := newHarness(t, interceptor.Funcs{}, job)
	h.mustReconcile(t, job)
	ctx := context.Background()

	h.suspend(t, job, true)
	h.mustReconcile(t, job)
	got := h.get(t, job)
	if c := condition(got, "Suspended"); c == nil || c.Status != metav1.ConditionTrue {
		t.Fatalf("Suspended = %+v", c)
	}
	if n := len(h.pods(t)); n != 0 {
		t.Errorf("%d pods while suspended", n)
	}
	if got.Status.StartTime != nil {
		t.Error("startTime kept while suspended: the deadline would count suspended time")
	}
	if err := h.r.Get(ctx, client.ObjectKey{Namespace: "ns", Name: "llm-checkpoints"}, &corev1.PersistentVolumeClaim{}); err != nil {
		t.Errorf("checkpoint claim gone while suspended: %v", err)
	}

	h.suspend(t, job, false)
	h.mustReconcile(t, job)
	got = h.get(t, job)
	if c := condition(got, "Suspended"); c == nil || c.Status != metav1.ConditionFalse || c.Reason != "Resumed" {
		t.Errorf("Suspended = %+v, want False/Resumed", c)
	}
	if n := len(h.pods(t)); n != 2 {
		t.Errorf("%d pods after resume, want 2", n)
	}
}

// The edit that suspends a job can beat the status write of the pass that created its pods
// (a conflict): no start time is stored, and no pass saw the pods before they were deleted.
// Resuming must create the gang at once, not wait for those pods' creation expectations.
func TestResumeRightAfterALostFirstStatusWrite(t *testing.T) {
	job := testjob.MakeZayaTrainingJob("llm", "ns").Nodes(2).Generation(1).Defaulted().Obj()
	conflict := true
	h := newHarness(t, failNextJobStatusWrite(&conflict,
		apierrors.NewConflict(trainingv1alpha1.GroupVersion.WithResource("zayatrainingjobs").GroupResource(), "llm", nil)), job)
	ctx := context.Background()
	if _, err := h.reconcile(t, job); err != nil {
		t.Fatal(err)
	}
	if n := len(h.pods(t)); n != 2 || h.get(t, job).Status.StartTime != nil {
		t.Fatalf("%d pods, start time %v: want the gang created and its status write lost", n, h.get(t, job).Status.StartTime)
	}
	for _, suspend := range []bool{true, false} {
		stored := h.get(t, job)
		stored.Spec.Suspend = suspend
		stored.Generation++
		if err := h.r.Update(ctx, stored); err != nil {
			t.Fatal(err)
		}
		h.mustReconcile(t, job)
	}
	if n := len(h.pods(t)); n != 2 {
		t.Errorf("%d pods in the first pass after resume, want 2", n)
	}
}

func TestActiveDeadline(t *testing.T) {
	job := testjob.MakeZayaTrainingJob("llm", "ns").Nodes(1).Generation(1).Defaulted().Obj()
	job.Spec.ActiveDeadlineSeconds = ptr.To[int64](600)
	job.Status.StartTime = &metav1.Time{Time: now.Add(-9 * time.Minute)}
	h := newHarness(t, interceptor.Funcs{}, job)
	res := h.mustReconcile(t, job)
	if res.RequeueAfter != time.Minute {
		t.Errorf("RequeueAfter = %v, want the minute left", res.RequeueAfter)
	}

	h.r.Clock = clockAt(now.Add(time.Minute))
	h.mustReconcile(t, job)
	got := h.get(t, job)
	if c := condition(got, "Failed"); c == nil || c.Reason != "DeadlineExceeded" {
		t.Errorf("Failed = %+v, want DeadlineExceeded", c)
	}
	if n := len(h.pods(t)); n != 0 {
		t.Errorf("%d pods left after the deadline", n)
	}
}

func TestTTLAfterFinished(t *testing.T) {
	job := testjob.MakeZayaTrainingJob("llm", "ns").Nodes(1).Generation(1).Defaulted().Obj()
	job.Spec.TTLSecondsAfterFinished = ptr.To[int32](100)
	job.Status.Conditions = []metav1.Condition{{Type: "Succeeded", Status: "True", Reason: "Completed", LastTransitionTime: metav1.NewTime(now)}}
	job.Status.CompletionTime = &metav1.Time{Time: now.Add(-40 * time.Second)}
	h := newHarness(t, interceptor.Funcs{}, job)
	if res := h.mustReconcile(t, job); res.RequeueAfter != 60*time.Second {
		t.Errorf("RequeueAfter = %v, want 60s", res.RequeueAfter)
	}
	h.r.Clock = clockAt(now.Add(time.Minute))
	h.mustReconcile(t, job)
	err := h.r.Get(context.Background(), client.ObjectKeyFromObject(job), &trainingv1alpha1.ZayaTrainingJob{})
	if !apierrors.IsNotFound(err) {
		t.Errorf("job still there after its TTL: %v", err)
	}
}

func TestUnschedulableRanksSetWaitingForCapacity(t *testing.T) {
	job := testjob.MakeZayaTrainingJob("llm", "ns").Nodes(3).Generation(1).Defaulted().Obj()
	h := newHarness(t, interceptor.Funcs{}, job)
	h.mustReconcile(t, job)
	h.setPod(t, "llm-0-0", running("n0"))
	h.setPod(t, "llm-0-1", unschedulable("0/1 nodes are available: 1 Insufficient amd.com/gpu."))
	h.setPod(t, "llm-0-2", unschedulable("0/1 nodes are available: 1 Insufficient amd.com/gpu."))
	// A verdict one second old is not news yet: ask again by the time the grace period is
	// over (sooner when held-back launch progress is due).
	if res := h.mustReconcile(t, job); res.RequeueAfter <= 0 || res.RequeueAfter > capacityGrace-time.Second {
		t.Errorf("RequeueAfter = %v, want at most %v", res.RequeueAfter, capacityGrace-time.Second)
	}
	if c := condition(h.get(t, job), "WaitingForCapacity"); c != nil {
		t.Fatalf("WaitingForCapacity reported within the grace period: %+v", c)
	}
	h.r.Clock = clockAt(now.Add(capacityGrace))
	h.mustReconcile(t, job)
	c := condition(h.get(t, job), "WaitingForCapacity")
	if c == nil || c.Status != metav1.ConditionTrue || c.Reason != "Unschedulable" {
		t.Fatalf("WaitingForCapacity = %+v", c)
	}
	if want := "1/3 ranks placed, 2 unschedulable: rank 1: 0/1 nodes are available: 1 Insufficient amd.com/gpu."; c.Message != want {
		t.Errorf("message = %q, want %q", c.Message, want)
	}

	h.setPod(t, "llm-0-1", running("n1"))
	h.setPod(t, "llm-0-2", running("n2"))
	h.mustReconcile(t, job)
	got := h.get(t, job)
	if c := condition(got, "WaitingForCapacity"); c.Status != metav1.ConditionFalse || c.Reason != "Placed" {
		t.Errorf("WaitingForCapacity = %+v, want False/Placed", c)
	}
	if !meta.IsStatusConditionTrue(got.Status.Conditions, "Running") {
		t.Error("not Running once placed")
	}
}

// A scheduling gate the operator did not set (in the template, or added by a webhook) holds
// the ranks for good, and the scheduler only says "blocked": the job names the gate, as it
// names any other reason its ranks are not placed. Kueue's gates, which Kueue lifts, are not
// reported.
func TestAForeignSchedulingGateIsNamed(t *testing.T) {
	job := testjob.MakeZayaTrainingJob("llm", "ns").Nodes(2).Generation(1).Defaulted().Obj()
	h := newHarness(t, interceptor.Funcs{}, job)
	h.mustReconcile(t, job)
	gated := func(gates ...string) func(*corev1.Pod) {
		return func(p *corev1.Pod) {
			p.Spec.SchedulingGates = nil
			for _, g := range gates {
				p.Spec.SchedulingGates = append(p.Spec.SchedulingGates, corev1.PodSchedulingGate{Name: g})
			}
			p.Status.Phase = corev1.PodPending
			p.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodScheduled, Status: corev1.ConditionFalse, Reason: corev1.PodReasonSchedulingGated,
				Message: "Scheduling is blocked due to non-empty scheduling gates", LastTransitionTime: metav1.NewTime(now.Add(-time.Second))}}
		}
	}
	h.setPod(t, "llm-0-0", gated(kueue.TopologyGate))
	h.setPod(t, "llm-0-1", gated("example.com/hold", kueue.TopologyGate))
	h.r.Clock = clockAt(now.Add(capacityGrace))
	h.mustReconcile(t, job)
	c := condition(h.get(t, job), "WaitingForCapacity")
	if want := "0/2 ranks placed, 1 unschedulable: rank 1: held by scheduling gates the operator did not set (example.com/hold)"; c == nil ||
		c.Status != metav1.ConditionTrue || !strings.HasPrefix(c.Message, want) {
		t.Fatalf("WaitingForCapacity = %+v, want True starting %q", c, want)
	}
	if ev := h.drainEvents(); !slices.ContainsFunc(ev, func(e string) bool { return strings.Contains(e, "example.com/hold") }) {
		t.Errorf("events %q: want a warning naming the gate", ev)
	}
}

// A placed rank whose worker keeps waiting to start says so in Running, naming the rank, its
// node and the kubelet's reason, with one warning: an error soon, ContainerCreating (also a
// large image being pulled) only after minutes.
func TestARankThatDoesNotStartIsNamed(t *testing.T) {
	waiting := func(node, reason, msg string) func(*corev1.Pod) {
		return func(p *corev1.Pod) {
			p.Spec.NodeName = node
			p.Status.Phase = corev1.PodPending
			p.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodScheduled, Status: corev1.ConditionTrue, LastTransitionTime: metav1.NewTime(now)}}
			p.Status.ContainerStatuses = []corev1.ContainerStatus{{Name: "worker", State: corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: reason, Message: msg}}}}
		}
	}
	for _, c := range []struct {
		reason, msg string
		grace       time.Duration
		want        string
	}{
		{"ImagePullBackOff", `Back-off pulling image "registry.example/llm:v9"`, startErrorGrace, `ImagePullBackOff: Back-off pulling image "registry.example/llm:v9"`},
		{"ContainerCreating", "", createGrace, "a volume that does not attach or mount"},
	} {
		t.Run(c.reason, func(t *testing.T) {
			job := testjob.MakeZayaTrainingJob("llm", "ns").Nodes(2).Generation(1).Defaulted().Obj()
			h := newHarness(t, interceptor.Funcs{}, job)
			h.mustReconcile(t, job)
			h.setPod(t, "llm-0-0", running("n0"))
			h.setPod(t, "llm-0-1", waiting("n1", c.reason, c.msg))
			h.r.Clock = clockAt(now.Add(c.grace - time.Second))
			if res := h.mustReconcile(t, job); res.RequeueAfter <= 0 || res.RequeueAfter > time.Second {
				t.Errorf("requeue after %v, want at most 1s: when the wait is news", res.RequeueAfter)
			}
			if r := condition(h.get(t, job), "Running"); r.Reason != trainingv1alpha1.ReasonStarting {
				t.Fatalf("Running %+v within the grace, want Starting", r)
			}
			h.drainEvents()
			h.r.Clock = clockAt(now.Add(c.grace))
			h.mustReconcile(t, job)
			r := condition(h.get(t, job), "Running")
			if want := "1/2 ranks running; rank 1 on node n1 has not started since it was placed at 2026-11-21T08:00:00Z: " + c.reason; r.Reason != trainingv1alpha1.ReasonRankNotStarting ||
				!strings.HasPrefix(r.Message, want) || !strings.Contains(r.Message, c.want) {
				t.Fatalf("Running %+v, want RankNotStarting %q ... %q", r, want, c.want)
			}
			h.mustReconcile(t, job)
			if ev := h.drainEvents(); len(slices.DeleteFunc(ev, func(e string) bool { return !strings.Contains(e, "RankNotStarting") })) != 1 {
				t.Errorf("events %q, want one RankNotStarting warning", ev)
			}
		})
	}
}

func TestCheckpointClaimIsCreatedOnceAndExistingClaimsAreNot(t *testing.T) {
	ctx := context.Background()
	job := testjob.MakeZayaTrainingJob("llm", "ns").Nodes(1).Generation(1).NewCheckpoint("10Ti", "ibmc-vpc-file-3000-iops").Defaulted().Obj()
	h := newHarness(t, interceptor.Funcs{}, job)
	h.mustReconcile(t, job)
	pvc := &corev1.PersistentVolumeClaim{}
	if err := h.r.Get(ctx, client.ObjectKey{Namespace: "ns", Name: "llm-checkpoints"}, pvc); err != nil {
		t.Fatalf("claim: %v", err)
	}
	if *pvc.Spec.StorageClassName != "ibmc-vpc-file-3000-iops" {
		t.Errorf("class = %q", *pvc.Spec.StorageClassName)
	}

	other := testjob.MakeZayaTrainingJob("other", "ns").Nodes(1).Generation(1).ClaimCheckpoint("shared").Defaulted().Obj()
	h2 := newHarness(t, interceptor.Funcs{}, other)
	h2.mustReconcile(t, other)
	list := &corev1.PersistentVolumeClaimList{}
	if err := h2.r.List(ctx, list); err != nil || len(list.Items) != 0 {
		t.Errorf("claims created for an existing claim: %v %v", list.Items, err)
	}
}

func TestAPodTheAPIServerRefusesFailsTheJob(t *testing.T) {
	job := testjob.MakeZayaTrainingJob("llm", "ns").Nodes(2).Generation(1).Defaulted().Obj()
	invalid := apierrors.NewInvalid(schema.GroupKind{Kind: "Pod"}, "llm-0-0",
		field.ErrorList{field.Invalid(field.NewPath("spec", "containers").Index(0).Child("name"), "Bad_Name", "a lowercase RFC 1123 label")})
	h := newHarness(t, interceptor.Funcs{}, job)
	h.r.Client = interceptor.NewClient(h.r.Client.(client.WithWatch), interceptor.Funcs{
		Create: func(ctx context.Context, c client.WithWatch, obj client.Object, opts ...client.CreateOption) error {
			if _, ok := obj.(*corev1.Pod); ok {
				return invalid
			}
			return c.Create(ctx, obj, opts...)
		},
	})
	h.mustReconcile(t, job)
	c := condition(h.get(t, job), "Failed")
	if c == nil || c.Reason != "InvalidPodTemplate" || !strings.Contains(c.Message, "spec.containers[0].name") {
		t.Errorf("Failed = %+v", c)
	}
}

func keys(m map[string]*corev1.Pod) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	return out
}
