package controllers

import (
	"context"
	"fmt"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp/cmpopts"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/tools/events"
	clocktesting "k8s.io/utils/clock/testing"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	trainingv1alpha1 "github.com/zaya-operator/zaya-operator/api/v1alpha1"
	"github.com/zaya-operator/zaya-operator/controllers/admission/kueuegate"
	"github.com/zaya-operator/zaya-operator/internal/testjob"
)

var now = time.Date(2026, 11, 21, 8, 0, 0, 0, time.UTC)

func testScheme() *runtime.Scheme {
	s := runtime.NewScheme()
	utilruntime.Must(clientgoscheme.AddToScheme(s))
	utilruntime.Must(trainingv1alpha1.AddToScheme(s))
	return s
}

// harness is a reconciler on a fake client that counts the writes it makes.
type harness struct {
	r      *ZayaTrainingJobReconciler
	events *events.FakeRecorder
	writes atomic.Int32
	uids   atomic.Int64
}

func newHarness(t testing.TB, funcs interceptor.Funcs, objs ...client.Object) *harness {
	t.Helper()
	h := &harness{events: events.NewFakeRecorder(32)}
	count := func() { h.writes.Add(1) }
	if funcs.SubResourceUpdate == nil {
		funcs.SubResourceUpdate = func(ctx context.Context, c client.Client, sub string, obj client.Object, opts ...client.SubResourceUpdateOption) error {
			count()
			return c.SubResource(sub).Update(ctx, obj, opts...)
		}
	}
	funcs.Create = func(ctx context.Context, c client.WithWatch, obj client.Object, opts ...client.CreateOption) error {
		if dryRun(opts) {
			return c.Create(ctx, obj, opts...) // a question, not a write
		}
		count()
		if obj.GetUID() == "" { // as the API server does; the fake client leaves it empty
			obj.SetUID(types.UID(fmt.Sprintf("uid-%s-%d", obj.GetName(), h.uids.Add(1))))
		}
		return c.Create(ctx, obj, opts...)
	}
	funcs.Update = func(ctx context.Context, c client.WithWatch, obj client.Object, opts ...client.UpdateOption) error {
		count()
		return c.Update(ctx, obj, opts...)
	}
	patch := funcs.Patch // a test's own interception, counted too
	funcs.Patch = func(ctx context.Context, c client.WithWatch, obj client.Object, p client.Patch, opts ...client.PatchOption) error {
		count()
		if patch != nil {
			return patch(ctx, c, obj, p, opts...)
		}
		return c.Patch(ctx, obj, p, opts...)
	}
	funcs.Delete = func(ctx context.Context, c client.WithWatch, obj client.Object, opts ...client.DeleteOption) error {
		count()
		return c.Delete(ctx, obj, opts...)
	}
	cl := fake.NewClientBuilder().WithScheme(testScheme()).WithObjects(objs...).
		WithStatusSubresource(&trainingv1alpha1.ZayaTrainingJob{}, &corev1.Pod{}, &corev1.Node{}).WithInterceptorFuncs(funcs).
		WithIndex(&corev1.Pod{}, podOwnerKey, indexOwningJob).
		// The API server selects any kind by metadata.name; the fake client needs an index.
		WithIndex(&corev1.Pod{}, "metadata.name", byName).
		WithIndex(&corev1.Service{}, "metadata.name", byName).
		WithIndex(&corev1.PersistentVolumeClaim{}, "metadata.name", byName).Build()
	h.r = &ZayaTrainingJobReconciler{Client: cl, Recorder: h.events, Clock: clocktesting.NewFakePassiveClock(now),
		Admission: kueuegate.New(cl, nil, false)} // as main.go: Kueue's pod groups are always served
	return h
}

func (h *harness) mustReconcile(t testing.TB, job *trainingv1alpha1.ZayaTrainingJob) ctrl.Result {
	t.Helper()
	res, err := h.reconcile(t, job)
	if err != nil {
		t.Fatalf("reconcile: %v", err)
	}
	return res
}

// pods returns the live pods by name.
func (h *harness) pods(t testing.TB) map[string]*corev1.Pod {
	t.Helper()
	list := &corev1.PodList{}
	if err := h.r.List(context.Background(), list); err != nil {
		t.Fatal(err)
	}
	out := map[string]*corev1.Pod{}
	for i := range list.Items {
		out[list.Items[i].Name] = &list.Items[i]
	}
	return out
}

// setPod changes a pod's node and status as a scheduler and kubelet would.
func (h *harness) setPod(t testing.TB, name string, mutate func(*corev1.Pod)) {
	t.Helper()
	ctx := context.Background()
	pod := &corev1.Pod{}
	if err := h.r.Get(ctx, client.ObjectKey{Namespace: "ns", Name: name}, pod); err != nil {
		t.Fatal(err)
	}
	mutate(pod)
	if pod.Spec.NodeName != "" {
		h.ensureNode(t, pod.Spec.NodeName)
	}
	status := pod.Status
	if err := h.r.Update(ctx, pod); err != nil {
		t.Fatal(err)
	}
	pod.Status = status
	if err := h.r.Status().Update(ctx, pod); err != nil {
		t.Fatal(err)
	}
}

// ensureNode creates a healthy node the first time a pod lands on it.
func (h *harness) ensureNode(t testing.TB, name string) {
	t.Helper()
	err := h.r.Create(context.Background(), testjob.HealthyNode(name))
	if err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	h.writes.Add(-1) // test setup, not the operator's write
}

// setNode changes a node as its kubelet, the device plugin or an exporter would.
func (h *harness) setNode(t testing.TB, name string, mutate func(*corev1.Node)) {
	t.Helper()
	ctx := context.Background()
	n := &corev1.Node{}
	if err := h.r.Get(ctx, client.ObjectKey{Name: name}, n); err != nil {
		t.Fatal(err)
	}
	mutate(n)
	status := n.Status
	if err := h.r.Update(ctx, n); err != nil {
		t.Fatal(err)
	}
	n.Status = status
	if err := h.r.Status().Update(ctx, n); err != nil {
		t.Fatal(err)
	}
	h.writes.Add(-2)
}

func running(node string) func(*corev1.Pod) {
	return func(p *corev1.Pod) {
		p.Spec.NodeName = node
		p.Status.Phase = corev1.PodRunning
		p.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}
	}
}

func exited(node string, code int32, at time.Time) func(*corev1.Pod) {
	return func(p *corev1.Pod) {
		p.Spec.NodeName = node
		p.Status.Phase = corev1.PodSucceeded
		reason := "Completed"
		if code != 0 {
			p.Status.Phase = corev1.PodFailed
			reason = "Error"
		}
		p.Status.ContainerStatuses = []corev1.ContainerStatus{{Name: "worker", State: corev1.ContainerState{
			Terminated: &corev1.ContainerStateTerminated{ExitCode: code, Reason: reason, FinishedAt: metav1.NewTime(at)},
		}}}
	}
}

func unschedulable(msg string) func(*corev1.Pod) {
	return func(p *corev1.Pod) {
		p.Status.Phase = corev1.PodPending
		p.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodScheduled, Status: corev1.ConditionFalse, Reason: "Unschedulable", Message: msg,
			LastTransitionTime: metav1.NewTime(now.Add(-time.Second))}}
	}
}

func (h *harness) reconcile(t testing.TB, job *trainingv1alpha1.ZayaTrainingJob) (ctrl.Result, error) {
	t.Helper()
	return h.r.Reconcile(context.Background(), ctrl.Request{NamespacedName: client.ObjectKeyFromObject(job)})
}

func (h *harness) get(t testing.TB, job *trainingv1alpha1.ZayaTrainingJob) *trainingv1alpha1.ZayaTrainingJob {
	t.Helper()
	got := &trainingv1alpha1.ZayaTrainingJob{}
	if err := h.r.Get(context.Background(), client.ObjectKeyFromObject(job), got); err != nil {
		t.Fatalf("get: %v", err)
	}
	return got
}

// suspend sets the stored job's spec.suspend, as a user or Kueue does.
func (h *harness) suspend(t testing.TB, job *trainingv1alpha1.ZayaTrainingJob, on bool) {
	t.Helper()
	stored := h.get(t, job)
	stored.Spec.Suspend = on
	if err := h.r.Update(context.Background(), stored); err != nil {
		t.Fatal(err)
	}
}

// drainEvents returns the events emitted so far.
func (h *harness) drainEvents() []string {
	var out []string
	for {
		select {
		case e := <-h.events.Events:
			out = append(out, e)
		default:
			return out
		}
	}
}

var ignoreConditionTimes = cmpopts.IgnoreFields(metav1.Condition{}, "LastTransitionTime")

func clockAt(t time.Time) *clocktesting.FakePassiveClock { return clocktesting.NewFakePassiveClock(t) }

func reqFor(job *trainingv1alpha1.ZayaTrainingJob) ctrl.Request {
	return ctrl.Request{NamespacedName: client.ObjectKeyFromObject(job)}
}

func slicesSort(s []string) { slices.Sort(s) }

// expectQuiet runs passes reconciles of job and fails if any of them wrote to the API server
// or emitted an event.
func (h *harness) expectQuiet(t testing.TB, job *trainingv1alpha1.ZayaTrainingJob, passes int) {
	t.Helper()
	h.drainEvents()
	h.writes.Store(0)
	for range passes {
		h.mustReconcile(t, job)
	}
	if w := h.writes.Load(); w != 0 {
		t.Errorf("%d passes with nothing changed made %d writes, want 0", passes, w)
	}
	if ev := h.drainEvents(); len(ev) != 0 {
		t.Errorf("%d passes with nothing changed emitted %q", passes, ev)
	}
}

func byName(o client.Object) []string { return []string{o.GetName()} }

// dryRun reports whether create options ask for a dry run.
func dryRun(opts []client.CreateOption) bool {
	o := (&client.CreateOptions{}).ApplyOptions(opts)
	return len(o.DryRun) > 0
}
