package controllers

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/workqueue"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	trainingv1alpha1 "github.com/zaya-operator/zaya-operator/api/v1alpha1"
	"github.com/zaya-operator/zaya-operator/controllers/gang"
	"github.com/zaya-operator/zaya-operator/internal/testjob"
)

func TestFirstPassCreatesTheGang(t *testing.T) {
	job := testjob.MakeZayaTrainingJob("llm", "ns").Nodes(16).Generation(3).Defaulted().Obj()
	h := newHarness(t, interceptor.Funcs{}, job)

	if _, err := h.reconcile(t, job); err != nil {
		t.Fatalf("reconcile: %v", err)
	}
	got := h.get(t, job)
	wantStatus := trainingv1alpha1.ZayaTrainingJobStatus{
		ObservedGeneration: 3,
		StartTime:          &metav1.Time{Time: now},
		RestartMechanism:   trainingv1alpha1.RestartMechanismRestartRules,
		CurrentNodes:       16,
		// The start's time is open until the job trains.
		Goodput: &trainingv1alpha1.GoodputStatus{AsOf: metav1.NewMicroTime(now), Open: &trainingv1alpha1.GoodputOpen{Since: metav1.NewMicroTime(now)}},
		Conditions: []metav1.Condition{
			{Type: "Running", Status: "False", Reason: "Starting", Message: "0/16 ranks running", ObservedGeneration: 3},
			{Type: "Created", Status: "True", Reason: "Accepted", Message: "accepted a gang of 16 nodes x 8 GPUs", ObservedGeneration: 3},
		},
	}
	if diff := cmp.Diff(wantStatus, got.Status, ignoreConditionTimes); diff != "" {
		t.Errorf("status (-want +got):\n%s", diff)
	}
	if !got.Status.Conditions[1].LastTransitionTime.Time.Equal(now) {
		t.Errorf("lastTransitionTime = %v, want the injected clock's %v", got.Status.Conditions[1].LastTransitionTime, now)
	}
	ev := h.drainEvents()
	if len(ev) != 3 || ev[0] != "Normal Accepted accepted: world size 128, context parallel 1, network PollaraAINIC" ||
		!strings.HasPrefix(ev[1], "Normal NetworkConfigured network environment: GLOO_SOCKET_IFNAME=eth0 ") ||
		ev[2] != "Normal PodsCreated created 16 worker pods for attempt 0" {
		t.Errorf("events = %q", ev)
	}
	pods := h.pods(t)
	if len(pods) != 16 {
		t.Fatalf("%d pods, want 16", len(pods))
	}
	for r := range 16 {
		if _, ok := pods[fmt.Sprintf("llm-0-%d", r)]; !ok {
			t.Errorf("no pod for rank %d", r)
		}
	}
	if err := h.r.Get(context.Background(), client.ObjectKey{Namespace: "ns", Name: "llm"}, &corev1.Service{}); err != nil {
		t.Errorf("headless service: %v", err)
	}
	if w := h.writes.Load(); w != 18 {
		t.Errorf("first pass made %d writes, want 18 (service, 16 pods, one status)", w)
	}
}

func TestSteadyStateMakesNoWrites(t *testing.T) {
	job := testjob.MakeZayaTrainingJob("llm", "ns").Nodes(4).Generation(1).Defaulted().Obj()
	h := newHarness(t, interceptor.Funcs{}, job)
	h.mustReconcile(t, job)
	for name := range h.pods(t) {
		h.setPod(t, name, running("node-"+name))
	}
	h.mustReconcile(t, job)
	got := h.get(t, job)
	if !meta.IsStatusConditionTrue(got.Status.Conditions, "Running") || got.Status.ReadyNodes != 4 {
		t.Fatalf("not Running with 4 ready nodes: %+v", got.Status)
	}
	h.expectQuiet(t, job, 3)
}

func TestConditionsAreOrderedForTheStatusColumn(t *testing.T) {
	conds := []metav1.Condition{{Type: "Created"}, {Type: "Custom"}, {Type: "Running"}, {Type: "Failed"}, {Type: "Suspended"}}
	sortConditions(conds)
	var got []string
	for _, c := range conds {
		got = append(got, c.Type)
	}
	if diff := cmp.Diff([]string{"Failed", "Suspended", "Running", "Created", "Custom"}, got); diff != "" {
		t.Errorf("order (-want +got):\n%s", diff)
	}
}

func TestOnlyMissingPodsAreRecreated(t *testing.T) {
	job := testjob.MakeZayaTrainingJob("llm", "ns").Nodes(4).Generation(1).Defaulted().Obj()
	h := newHarness(t, interceptor.Funcs{}, job)
	h.mustReconcile(t, job)
	h.mustReconcile(t, job) // the pass the pods' creation brings: the cache shows them
	if err := h.r.Delete(context.Background(), h.pods(t)["llm-0-2"]); err != nil {
		t.Fatal(err)
	}
	h.writes.Store(0)
	h.mustReconcile(t, job)
	if w := h.writes.Load(); w != 1 {
		t.Errorf("%d writes, want 1 (the missing pod)", w)
	}
	if _, ok := h.pods(t)["llm-0-2"]; !ok {
		t.Error("rank 2 was not recreated")
	}
}

func TestNewGenerationIsObserved(t *testing.T) {
	job := testjob.MakeZayaTrainingJob("llm", "ns").Generation(1).Suspend(true).Defaulted().Obj()
	h := newHarness(t, interceptor.Funcs{}, job)
	h.mustReconcile(t, job)
	stored := h.get(t, job)
	stored.Spec.Nodes = 4
	stored.Generation = 2 // the fake client does not bump generations
	if err := h.r.Update(context.Background(), stored); err != nil {
		t.Fatal(err)
	}
	h.mustReconcile(t, job)
	got := h.get(t, job)
	if got.Status.ObservedGeneration != 2 || got.Status.Conditions[0].ObservedGeneration != 2 {
		t.Errorf("observedGeneration = %d, condition's = %d, want 2 and 2",
			got.Status.ObservedGeneration, got.Status.Conditions[0].ObservedGeneration)
	}
}

func TestReconcileRefusesATemplateThatFightsTheOperator(t *testing.T) {
	job := testjob.MakeZayaTrainingJob("llm", "ns").Generation(1).WorkerLimit("amd.com/gpu", "8").Defaulted().Obj()
	h := newHarness(t, interceptor.Funcs{}, job)
	if _, err := h.reconcile(t, job); err != nil {
		t.Fatalf("reconcile: %v", err)
	}
	got := h.get(t, job)
	if len(got.Status.Conditions) != 1 {
		t.Fatalf("conditions = %v, want only Created", got.Status.Conditions)
	}
	c := got.Status.Conditions[0]
	if c.Type != trainingv1alpha1.ConditionCreated || c.Status != metav1.ConditionFalse || c.Reason != trainingv1alpha1.ReasonInvalidSpec {
		t.Errorf("condition = %+v, want Created=False/InvalidSpec", c)
	}
	if !strings.Contains(c.Message, "spec.template.spec.containers[0].resources.limits[amd.com/gpu]") {
		t.Errorf("message %q does not name the field", c.Message)
	}
	ev := h.drainEvents()
	if len(ev) != 1 || !strings.HasPrefix(ev[0], "Warning InvalidSpec ") {
		t.Errorf("events = %v, want one InvalidSpec warning", ev)
	}
}

func TestReconcileLeavesOtherControllersJobsAlone(t *testing.T) {
	job := testjob.MakeZayaTrainingJob("llm", "ns").ManagedBy("kueue.x-k8s.io/multikueue").Defaulted().Obj()
	h := newHarness(t, interceptor.Funcs{}, job)
	if _, err := h.reconcile(t, job); err != nil {
		t.Fatal(err)
	}
	if got := h.get(t, job); len(got.Status.Conditions) != 0 || h.writes.Load() != 0 {
		t.Errorf("touched a job managed elsewhere: %d writes, status %+v", h.writes.Load(), got.Status)
	}
}

func TestReconcileOfADeletedJobIsANoOp(t *testing.T) {
	h := newHarness(t, interceptor.Funcs{})
	res, err := h.r.Reconcile(context.Background(), ctrl.Request{NamespacedName: client.ObjectKey{Namespace: "ns", Name: "gone"}})
	if err != nil || res != (ctrl.Result{}) {
		t.Errorf("Reconcile(gone) = %v, %v; want empty result and no error", res, err)
	}
}

func TestStatusConflictWaitsForTheNewerVersion(t *testing.T) {
	job := testjob.MakeZayaTrainingJob("llm", "ns").Generation(1).Defaulted().Obj()
	conflict := apierrors.NewConflict(schema.GroupResource{Group: "training.zaya.dev", Resource: "zayatrainingjobs"}, "llm", errors.New("stale"))
	h := newHarness(t, interceptor.Funcs{
		SubResourceUpdate: func(context.Context, client.Client, string, client.Object, ...client.SubResourceUpdateOption) error {
			return conflict
		},
	}, job)
	if _, err := h.reconcile(t, job); err != nil {
		t.Errorf("a conflict must not surface as an error (the watch brings the newer version): %v", err)
	}
	// The pods were created, so that is news; acceptance was not stored, so it is not yet.
	if diff := cmp.Diff([]string{"Normal PodsCreated created 2 worker pods for attempt 0"}, h.drainEvents()); diff != "" {
		t.Errorf("events after a conflicting status write (-want +got):\n%s", diff)
	}
}

func TestStatusWriteErrorIsReturned(t *testing.T) {
	job := testjob.MakeZayaTrainingJob("llm", "ns").Generation(1).Defaulted().Obj()
	h := newHarness(t, interceptor.Funcs{
		SubResourceUpdate: func(context.Context, client.Client, string, client.Object, ...client.SubResourceUpdateOption) error {
			return apierrors.NewServiceUnavailable("etcd is sad")
		},
	}, job)
	if _, err := h.reconcile(t, job); err == nil || !apierrors.IsServiceUnavailable(errors.Unwrap(err)) {
		t.Errorf("want the 503 returned so the workqueue backs off, got %v", err)
	}
}

func TestLaunchProgressWritesAreCoalesced(t *testing.T) {
	job := testjob.MakeZayaTrainingJob("llm", "ns").Nodes(8).Generation(1).Defaulted().Obj()
	h := newHarness(t, interceptor.Funcs{}, job)
	clk := clockAt(now)
	h.r.Clock = clk
	h.mustReconcile(t, job) // creates the gang and writes status
	names := []string{}
	for r := range 8 {
		names = append(names, fmt.Sprintf("llm-0-%d", r))
	}

	// Ranks come up one by one within the same second: their progress is held back.
	version := h.get(t, job).ResourceVersion
	for _, name := range names[:5] {
		h.setPod(t, name, running("node-"+name))
		res := h.mustReconcile(t, job)
		if res.RequeueAfter <= 0 || res.RequeueAfter > time.Second {
			t.Fatalf("a held-back progress write should requeue within the interval, got %v", res.RequeueAfter)
		}
	}
	if got := h.get(t, job); got.ResourceVersion != version || got.Status.ReadyNodes != 0 {
		t.Errorf("5 progress-only passes within 1 s wrote status (readyNodes %d)", got.Status.ReadyNodes)
	}

	// Once the interval has passed, the next pass writes the progress.
	clk.SetTime(now.Add(1100 * time.Millisecond))
	h.mustReconcile(t, job)
	if got := h.get(t, job).Status.ReadyNodes; got != 5 {
		t.Errorf("after the interval: readyNodes %d, want 5", got)
	}

	// The last rank flips Running: a condition change is written at once.
	for _, name := range names[5:] {
		h.setPod(t, name, running("node-"+name))
	}
	h.mustReconcile(t, job)
	got := h.get(t, job)
	if !meta.IsStatusConditionTrue(got.Status.Conditions, trainingv1alpha1.ConditionRunning) || got.Status.ReadyNodes != 8 {
		t.Errorf("all ranks running but status %+v", got.Status)
	}
}

func TestPodsTheCacheHasNotShownYetAreNotCreatedTwice(t *testing.T) {
	job := testjob.MakeZayaTrainingJob("llm", "ns").Nodes(4).Generation(1).Defaulted().Obj()
	var stale atomic.Bool
	var creates atomic.Int32
	h := newHarness(t, interceptor.Funcs{
		List: func(ctx context.Context, c client.WithWatch, list client.ObjectList, opts ...client.ListOption) error {
			if _, pods := list.(*corev1.PodList); pods && stale.Load() {
				return nil // a cache that has not caught up with the creations yet
			}
			return c.List(ctx, list, opts...)
		},
	}, job)
	clk := clockAt(now)
	h.r.Clock = clk
	inner := h.r.Client
	h.r.Client = interceptor.NewClient(inner.(client.WithWatch), interceptor.Funcs{
		Create: func(ctx context.Context, c client.WithWatch, obj client.Object, opts ...client.CreateOption) error {
			if _, ok := obj.(*corev1.Pod); ok && !dryRun(opts) {
				creates.Add(1)
			}
			return c.Create(ctx, obj, opts...)
		},
	})
	h.mustReconcile(t, job)
	if n := creates.Load(); n != 4 {
		t.Fatalf("first pass created %d pods, want 4", n)
	}
	stale.Store(true)
	res := h.mustReconcile(t, job)
	if n := creates.Load(); n != 4 {
		t.Errorf("a pass on a stale cache tried %d creates again", n-4)
	}
	if res.RequeueAfter <= 0 || res.RequeueAfter > gang.ExpectationTTL {
		t.Errorf("RequeueAfter %v: want a look once the expectations expire", res.RequeueAfter)
	}
	// Still unseen after the TTL: the pods may have gone, so the ranks count as missing again.
	clk.SetTime(now.Add(gang.ExpectationTTL))
	h.mustReconcile(t, job)
	if n := creates.Load(); n != 8 {
		t.Errorf("after the TTL %d creates, want 8 (4 retried)", n)
	}
}

// TestARankReplacedBeforeThePodsWereSeenIsCreatedAtOnce: the cache shows a rank's pod for the
// first time already failed, so no pass saw it run; its replacement must not wait out the
// expectation of the first creation (30 s of a gang held at the rendezvous).
func TestARankReplacedBeforeThePodsWereSeenIsCreatedAtOnce(t *testing.T) {
	job := testjob.MakeZayaTrainingJob("llm", "ns").Nodes(2).RestartMode(trainingv1alpha1.RestartModeInPlace).Generation(1).Defaulted().Obj()
	h := newHarness(t, interceptor.Funcs{}, job)
	h.r.Clock = clockAt(now)
	h.mustReconcile(t, job)
	first := h.pods(t)
	if len(first) != 2 {
		t.Fatalf("first pass created %d pods, want 2", len(first))
	}
	h.setPod(t, "llm-0-0", running("node-a"))
	h.setPod(t, "llm-0-1", func(p *corev1.Pod) {
		p.Spec.NodeName = "node-b"
		p.Status = corev1.PodStatus{Phase: corev1.PodFailed, Reason: "OutOfamd.com/gpu", Message: "Pod was rejected"}
	})
	for range 4 { // the failure, the deletion, the creation
		h.mustReconcile(t, job)
	}
	got := h.pods(t)
	if p := got["llm-0-1"]; p == nil || p.UID == first["llm-0-1"].UID {
		t.Fatalf("the rejected rank has no new pod after 4 passes (pods %v)", slices.Collect(maps.Keys(got)))
	}
	if p := got["llm-0-0"]; p == nil || p.UID != first["llm-0-0"].UID {
		t.Errorf("the healthy rank lost its pod")
	}
}

// TestPodProgressIsBatchedAndFailuresAreNot: progress, and the exits of workers that stopped
// because a peer failed (75), wait for the batch; a fault of a worker's own goes at once.
func TestPodProgressIsBatchedAndFailuresAreNot(t *testing.T) {
	job := testjob.MakeZayaTrainingJob("llm", "ns").Obj()
	job.UID = "u1"
	owned := func(mutate func(*corev1.Pod)) *corev1.Pod {
		p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "llm-0-0", Namespace: "ns",
			OwnerReferences: []metav1.OwnerReference{*metav1.NewControllerRef(job, trainingv1alpha1.GroupVersion.WithKind("ZayaTrainingJob"))}}}
		mutate(p)
		return p
	}
	worker := func(restarts int32, state corev1.ContainerState) func(*corev1.Pod) {
		return func(p *corev1.Pod) {
			p.Spec.Containers = []corev1.Container{{Name: "worker"}}
			p.Status.Phase = corev1.PodRunning
			p.Status.ContainerStatuses = []corev1.ContainerStatus{{Name: "worker", RestartCount: restarts, State: state}}
		}
	}
	running := corev1.ContainerState{Running: &corev1.ContainerStateRunning{}}
	for _, tc := range []struct {
		name      string
		pod       *corev1.Pod
		immediate bool
		old       *corev1.Pod // nil: the same as pod
	}{
		{"worker started", owned(worker(0, running)), false,
			owned(func(p *corev1.Pod) { p.Spec.Containers = []corev1.Container{{Name: "worker"}} })},
		{"worker exited in a living pod", owned(worker(0, corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: 1}})), true, nil},
		{"worker restarted in place", owned(worker(1, running)), true, owned(worker(0, running))},
		{"worker stopped for a peer (75): the cascade", owned(worker(0, corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: trainingv1alpha1.ExitStopped}})), false, nil},
		{"worker restarted in place after a 75", owned(func(p *corev1.Pod) {
			worker(1, running)(p)
			p.Status.ContainerStatuses[0].LastTerminationState.Terminated = &corev1.ContainerStateTerminated{ExitCode: trainingv1alpha1.ExitStopped}
		}), false, owned(worker(0, running))},
		{"started", owned(func(p *corev1.Pod) { p.Status.Phase = corev1.PodRunning }), false, nil},
		{"failed", owned(func(p *corev1.Pod) { p.Status.Phase = corev1.PodFailed }), true, nil},
		{"evicted", owned(func(p *corev1.Pod) { p.Status.Reason = "Evicted" }), true, nil},
		{"deleting", owned(func(p *corev1.Pod) { p.DeletionTimestamp = &metav1.Time{Time: now} }), true, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			q := workqueue.NewTypedRateLimitingQueue(workqueue.DefaultTypedControllerRateLimiter[reconcile.Request]())
			defer q.ShutDown()
			old := tc.old
			if old == nil {
				old = tc.pod
			}
			podEvents{}.Update(context.Background(), event.UpdateEvent{ObjectOld: old, ObjectNew: tc.pod}, q)
			if got := q.Len() == 1; got != tc.immediate {
				t.Fatalf("queued at once: %v, want %v", got, tc.immediate)
			}
			if !tc.immediate {
				for deadline := time.Now().Add(10 * progressBatch); q.Len() == 0; time.Sleep(10 * time.Millisecond) {
					if time.Now().After(deadline) {
						t.Fatal("a progress event never enqueued its job")
					}
				}
			}
			if item, _ := q.Get(); item.Name != "llm" || item.Namespace != "ns" {
				t.Errorf("enqueued %v, want ns/llm", item)
			}
		})
	}
	q := workqueue.NewTypedRateLimitingQueue(workqueue.DefaultTypedControllerRateLimiter[reconcile.Request]())
	defer q.ShutDown()
	podEvents{}.Delete(context.Background(), event.DeleteEvent{Object: &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "stray", Namespace: "ns"}}}, q)
	if q.Len() != 0 {
		t.Error("a pod no job owns enqueued something")
	}
}

// A job whose passes keep failing is tried again within maxRetryBackoff, not after the
// 1,000 s client-go's default limiter grows to; its first retries stay as quick.
func TestAFailingJobIsRetriedWithinTheCap(t *testing.T) {
	rl := retryRateLimiter()
	job := reconcile.Request{NamespacedName: types.NamespacedName{Namespace: "ns", Name: "llm"}}
	if d := rl.When(job); d > 10*time.Millisecond {
		t.Errorf("first retry after %v, want milliseconds", d)
	}
	var last time.Duration
	for range 40 {
		last = rl.When(job)
	}
	if last != maxRetryBackoff {
		t.Errorf("after 40 failures the wait is %v, want the cap %v", last, maxRetryBackoff)
	}
	rl.Forget(job)
	if d := rl.When(job); d > 10*time.Millisecond {
		t.Errorf("after a success the first retry waits %v", d)
	}
}

// A status write refused with 409 is looked at again after a second, then less often while
// the refusals go on (no pass per second per job against a webhook that always refuses), and
// as soon as a write goes through the next refusal waits a second again.
func TestAConflictingStatusWriteIsLookedAtAgainLessAndLessOften(t *testing.T) {
	var refuse atomic.Bool
	refuse.Store(true)
	job := testjob.MakeZayaTrainingJob("llm", "ns").Nodes(1).Defaulted().Obj()
	h := newHarness(t, interceptor.Funcs{
		SubResourceUpdate: func(ctx context.Context, c client.Client, sub string, obj client.Object, opts ...client.SubResourceUpdateOption) error {
			if refuse.Load() {
				return apierrors.NewConflict(schema.GroupResource{Resource: "zayatrainingjobs"}, obj.GetName(), errors.New("refused"))
			}
			return c.SubResource(sub).Update(ctx, obj, opts...)
		},
	}, job)
	var got []time.Duration
	for range 9 {
		got = append(got, h.mustReconcile(t, job).RequeueAfter)
	}
	want := []time.Duration{time.Second, 2 * time.Second, 4 * time.Second, 8 * time.Second, 16 * time.Second, 32 * time.Second, time.Minute, time.Minute, time.Minute}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("rechecks (-want +got):\n%s", diff)
	}
	refuse.Store(false)
	h.mustReconcile(t, job)
	h.setPod(t, "llm-0-0", exited("n1", 1, now)) // a failure: something to write
	refuse.Store(true)
	if d := h.mustReconcile(t, job).RequeueAfter; d != time.Second {
		t.Errorf("after a write went through the next refusal waits %v, want 1s", d)
	}
}
