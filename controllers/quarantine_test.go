package controllers

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	trainingv1alpha1 "github.com/zaya-operator/zaya-operator/api/v1alpha1"
	"github.com/zaya-operator/zaya-operator/controllers/nodehealth"
	"github.com/zaya-operator/zaya-operator/internal/testjob"
)

func TestUnhealthyNodeIsQuarantinedAndTheGangRestartsAwayFromIt(t *testing.T) {
	job := testjob.MakeZayaTrainingJob("llm", "ns").Nodes(2).Generation(1).RestartMode(trainingv1alpha1.RestartModeRecreate).Defaulted().Obj()
	h := newHarness(t, interceptor.Funcs{}, job)
	h.mustReconcile(t, job)
	h.setPod(t, "llm-0-0", running("n0"))
	h.setPod(t, "llm-0-1", running("n1"))
	h.mustReconcile(t, job)

	// The device plugin lowers allocatable; the pod keeps running on a bad GPU.
	h.setNode(t, "n1", func(n *corev1.Node) { n.Status.Allocatable["amd.com/gpu"] = resource.MustParse("7") })
	h.mustReconcile(t, job)
	got := h.get(t, job)
	if got.Status.Restarts != 1 || got.Status.LastFailure.Reason != "DeviceUnhealthy" || *got.Status.LastFailure.Rank != 1 {
		t.Fatalf("restarts %d, lastFailure %+v", got.Status.Restarts, got.Status.LastFailure)
	}
	want := []trainingv1alpha1.QuarantinedNode{{Name: "n1", Reason: "DeviceUnhealthy", Since: metav1.NewTime(now)}}
	if diff := cmp.Diff(want, got.Status.QuarantinedNodes); diff != "" {
		t.Errorf("quarantinedNodes (-want +got):\n%s", diff)
	}
	if ev := h.drainEvents(); !containsPrefix(ev, "Warning NodeQuarantined quarantined node n1 for this job: rank 1 (pod llm-0-1): node n1 has 7 amd.com/gpu allocatable of 8") {
		t.Errorf("events = %q", ev)
	}

	h.mustReconcile(t, job) // old attempt deleted
	h.mustReconcile(t, job) // new attempt created
	pod := h.pods(t)["llm-1-0"]
	if pod == nil {
		t.Fatal("no pod for attempt 1")
	}
	wantAffinity := &corev1.NodeAffinity{RequiredDuringSchedulingIgnoredDuringExecution: &corev1.NodeSelector{
		NodeSelectorTerms: []corev1.NodeSelectorTerm{{MatchFields: []corev1.NodeSelectorRequirement{
			{Key: "metadata.name", Operator: corev1.NodeSelectorOpNotIn, Values: []string{"n1"}},
		}}},
	}}
	if diff := cmp.Diff(wantAffinity, pod.Spec.Affinity.NodeAffinity); diff != "" {
		t.Errorf("node affinity of the new attempt (-want +got):\n%s", diff)
	}
	// Tainting is opt-in.
	n := &corev1.Node{}
	if err := h.r.Get(context.Background(), client.ObjectKey{Name: "n1"}, n); err != nil || len(n.Spec.Taints) != 0 {
		t.Errorf("node tainted without quarantine.nodeTaint: %v %v", n.Spec.Taints, err)
	}
}

func TestNodeLossQuarantinesAndTaintsWhenAsked(t *testing.T) {
	job := testjob.MakeZayaTrainingJob("llm", "ns").Nodes(1).Generation(1).Defaulted().Obj()
	job.Spec.FaultTolerance.Quarantine.NodeTaint = trainingv1alpha1.QuarantineTaintNoSchedule
	h := newHarness(t, interceptor.Funcs{}, job)
	h.mustReconcile(t, job)
	h.setPod(t, "llm-0-0", running("n0"))
	h.mustReconcile(t, job)
	h.setNode(t, "n0", func(n *corev1.Node) { n.Status.Conditions[0].Status = corev1.ConditionUnknown })
	h.mustReconcile(t, job)

	got := h.get(t, job)
	if got.Status.LastFailure.Reason != "NodeLost" || len(got.Status.QuarantinedNodes) != 1 {
		t.Fatalf("lastFailure %+v, quarantine %v", got.Status.LastFailure, got.Status.QuarantinedNodes)
	}
	n := &corev1.Node{}
	if err := h.r.Get(context.Background(), client.ObjectKey{Name: "n0"}, n); err != nil {
		t.Fatal(err)
	}
	wantTaint := []corev1.Taint{{Key: "training.zaya.dev/quarantined", Value: "ns.llm", Effect: corev1.TaintEffectNoSchedule}}
	if diff := cmp.Diff(wantTaint, n.Spec.Taints); diff != "" {
		t.Errorf("taints (-want +got):\n%s", diff)
	}
}

// TestAFailedTaintIsRetried: the pass whose taint request fails still records the quarantine;
// the next pass, finding the node listed, must still taint it (the flaky-API test found it
// stopping there).
func TestAFailedTaintIsRetried(t *testing.T) {
	job := testjob.MakeZayaTrainingJob("llm", "ns").Nodes(1).Generation(1).Defaulted().Obj()
	job.Spec.FaultTolerance.Quarantine.NodeTaint = trainingv1alpha1.QuarantineTaintNoSchedule
	failOnce := true
	h := newHarness(t, interceptor.Funcs{
		Patch: func(ctx context.Context, c client.WithWatch, obj client.Object, patch client.Patch, opts ...client.PatchOption) error {
			if _, ok := obj.(*corev1.Node); ok && failOnce {
				failOnce = false
				return apierrors.NewServiceUnavailable("injected")
			}
			return c.Patch(ctx, obj, patch, opts...)
		},
	}, job)
	h.mustReconcile(t, job)
	h.setPod(t, "llm-0-0", running("n0"))
	h.mustReconcile(t, job)
	h.setNode(t, "n0", func(n *corev1.Node) { n.Status.Conditions[0].Status = corev1.ConditionUnknown })
	if _, err := h.reconcile(t, job); err == nil {
		t.Fatal("the failed taint was not reported")
	}
	if got := h.get(t, job); len(got.Status.QuarantinedNodes) != 1 || got.Status.Restarts != 0 {
		t.Fatalf("after the failed taint: quarantine %v, restarts %d", got.Status.QuarantinedNodes, got.Status.Restarts)
	}
	h.mustReconcile(t, job)
	n := &corev1.Node{}
	if err := h.r.Get(context.Background(), client.ObjectKey{Name: "n0"}, n); err != nil {
		t.Fatal(err)
	}
	if !slices.ContainsFunc(n.Spec.Taints, func(t corev1.Taint) bool { return t.Key == trainingv1alpha1.QuarantineTaintKey }) {
		t.Errorf("node not tainted after the retry: %v", n.Spec.Taints)
	}
	if got := h.get(t, job); got.Status.Restarts != 1 {
		t.Errorf("restarts = %d, want 1", got.Status.Restarts)
	}
}

func TestQuarantineIsBoundedAndExpires(t *testing.T) {
	job := testjob.MakeZayaTrainingJob("llm", "ns").Nodes(1).Generation(1).Defaulted().Obj()
	job.Spec.FaultTolerance.Quarantine.MaxNodes = 2
	job.Status.QuarantinedNodes = []trainingv1alpha1.QuarantinedNode{
		{Name: "old", Reason: "NodeLost", Since: metav1.NewTime(now.Add(-25 * time.Hour))},
		{Name: "a", Reason: "NodeLost", Since: metav1.NewTime(now.Add(-2 * time.Hour))},
		{Name: "b", Reason: "NodeLost", Since: metav1.NewTime(now.Add(-1 * time.Hour))},
	}
	h := newHarness(t, interceptor.Funcs{}, job)
	res := h.mustReconcile(t, job)
	got := h.get(t, job)
	if len(got.Status.QuarantinedNodes) != 2 || got.Status.QuarantinedNodes[0].Name != "a" {
		t.Fatalf("quarantine = %v, want a and b (old expired after 24h)", got.Status.QuarantinedNodes)
	}
	if res.RequeueAfter != 22*time.Hour {
		t.Errorf("RequeueAfter = %v, want 22h until a is released", res.RequeueAfter)
	}
	// A third node pushes the oldest out (maxNodes 2).
	h.setPod(t, "llm-0-0", running("c"))
	h.setNode(t, "c", func(n *corev1.Node) { n.Status.Conditions[0].Status = corev1.ConditionFalse })
	h.mustReconcile(t, job)
	var names []string
	for _, q := range h.get(t, job).Status.QuarantinedNodes {
		names = append(names, q.Name)
	}
	if diff := cmp.Diff([]string{"b", "c"}, names); diff != "" {
		t.Errorf("quarantine (-want +got):\n%s", diff)
	}
}

func TestQuarantineJoinsEveryTemplateAffinityTerm(t *testing.T) {
	ps := &corev1.PodSpec{Affinity: &corev1.Affinity{NodeAffinity: &corev1.NodeAffinity{
		RequiredDuringSchedulingIgnoredDuringExecution: &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{
			{MatchExpressions: []corev1.NodeSelectorRequirement{{Key: "pool", Operator: corev1.NodeSelectorOpIn, Values: []string{"a"}}}},
			{MatchExpressions: []corev1.NodeSelectorRequirement{{Key: "pool", Operator: corev1.NodeSelectorOpIn, Values: []string{"b"}}}},
		}},
	}}}
	avoidQuarantined(ps, []trainingv1alpha1.QuarantinedNode{{Name: "x"}, {Name: "y"}})
	for i, term := range ps.Affinity.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution.NodeSelectorTerms {
		if len(term.MatchExpressions) != 1 || len(term.MatchFields) != 2 {
			t.Errorf("term %d = %+v, want its own expression and both exclusions", i, term)
		}
	}
}

// TestARefusedTaintDoesNotBlockTheRestart: a taint the API server refuses for good (RBAC
// without node patch, say) is reported, and the gang restarts away from the node anyway.
func TestARefusedTaintDoesNotBlockTheRestart(t *testing.T) {
	job := testjob.MakeZayaTrainingJob("llm", "ns").Nodes(1).Generation(1).Defaulted().Obj()
	job.Spec.FaultTolerance.Quarantine.NodeTaint = trainingv1alpha1.QuarantineTaintNoSchedule
	h := newHarness(t, interceptor.Funcs{
		Patch: func(ctx context.Context, c client.WithWatch, obj client.Object, patch client.Patch, opts ...client.PatchOption) error {
			if _, ok := obj.(*corev1.Node); ok {
				return apierrors.NewForbidden(corev1.Resource("nodes"), obj.GetName(), errors.New("injected"))
			}
			return c.Patch(ctx, obj, patch, opts...)
		},
	}, job)
	h.mustReconcile(t, job)
	h.setPod(t, "llm-0-0", running("n0"))
	h.mustReconcile(t, job)
	h.setNode(t, "n0", func(n *corev1.Node) { n.Status.Conditions[0].Status = corev1.ConditionUnknown })
	h.mustReconcile(t, job)
	got := h.get(t, job)
	if got.Status.Restarts != 1 || len(got.Status.QuarantinedNodes) != 1 {
		t.Fatalf("restarts %d, quarantine %v", got.Status.Restarts, got.Status.QuarantinedNodes)
	}
	if ev := h.drainEvents(); !containsPrefix(ev, "Warning NodeQuarantined could not taint node n0") {
		t.Errorf("events %v", ev)
	}
}

// nodeTaints are the taints on a harness node.
func nodeTaints(t *testing.T, h *harness, name string) []corev1.Taint {
	t.Helper()
	n := &corev1.Node{}
	if err := h.r.Get(context.Background(), client.ObjectKey{Name: name}, n); err != nil {
		t.Fatal(err)
	}
	return n.Spec.Taints
}

// What a tenant's workers print, how often they crash and what rank 0 reports are the
// tenant's word: with quarantine.nodeTaint: NoSchedule each keeps the node from that job,
// never from everyone (the hostile tenant's GPU-fault line, its RepeatedFailures on a node it
// pinned itself to, its invented straggler, in place and recreated).
func TestATenantsOwnWordsNeverTaintANode(t *testing.T) {
	taint := func(j *trainingv1alpha1.ZayaTrainingJob) {
		j.Spec.FaultTolerance.Quarantine.NodeTaint = trainingv1alpha1.QuarantineTaintNoSchedule
	}
	t.Run("a GPU fault it printed, recreated", func(t *testing.T) {
		h, job := inPlaceGang(t, taint, func(j *trainingv1alpha1.ZayaTrainingJob) {
			j.Spec.FaultTolerance.RestartMode = trainingv1alpha1.RestartModeRecreate
		})
		h.setPod(t, "llm-0-2", exitedSaying("n2", 134, now, "", gpuFaultLine))
		h.mustReconcile(t, job)
		if q := quarantinedNames(h.get(t, job)); len(q) != 1 || q[0] != "n2/GPUHardware" {
			t.Fatalf("quarantined %v, want n2 for this job", q)
		}
		if ts := nodeTaints(t, h, "n2"); len(ts) != 0 {
			t.Errorf("node n2 tainted %v on the tenant's word", ts)
		}
	})
	t.Run("a GPU fault it printed, in place", func(t *testing.T) {
		h, job := inPlaceGang(t, taint)
		fault := now.Add(-3 * time.Second)
		h.setPod(t, "llm-0-1", func(p *corev1.Pod) {
			restartedInPlace("n1", 1, 134, fault, fault.Add(time.Second))(p)
			p.Status.ContainerStatuses[0].LastTerminationState.Terminated.Message = gpuFaultLine
		})
		h.mustReconcile(t, job)
		if q := quarantinedNames(h.get(t, job)); len(q) != 1 {
			t.Fatalf("quarantined %v, want n1 for this job", q)
		}
		if ts := nodeTaints(t, h, "n1"); len(ts) != 0 {
			t.Errorf("node n1 tainted %v on the tenant's word", ts)
		}
	})
	t.Run("its repeated crashes", func(t *testing.T) {
		h, job := inPlaceGang(t, taint, func(j *trainingv1alpha1.ZayaTrainingJob) {
			for i := range 2 {
				j.Status.RecentFailures = append(j.Status.RecentFailures, trainingv1alpha1.JobFailure{
					Time: metav1.NewTime(now.Add(-time.Duration(i+1) * time.Minute)), Node: "n1", Rank: ptr.To[int32](1),
					Reason: trainingv1alpha1.FailureReasonExitCode, Category: "Unknown",
				})
			}
		})
		fault := now.Add(-3 * time.Second)
		h.setPod(t, "llm-0-1", restartedInPlace("n1", 1, 1, fault, fault.Add(time.Second)))
		h.mustReconcile(t, job)
		if q := quarantinedNames(h.get(t, job)); len(q) != 1 || q[0] != "n1/RepeatedFailures" {
			t.Fatalf("quarantined %v, want n1 for RepeatedFailures", q)
		}
		if ts := nodeTaints(t, h, "n1"); len(ts) != 0 {
			t.Errorf("node n1 tainted %v on the tenant's crashes", ts)
		}
	})
}

// A platform signal taints the node for a while the platform bounds, and the operator itself
// takes the taint off when it expires; a taint with no expiry on record (an older operator's)
// is given one.
func TestAQuarantineTaintExpiresAndTheOperatorRemovesIt(t *testing.T) {
	job := testjob.MakeZayaTrainingJob("llm", "ns").Nodes(1).Generation(1).Defaulted().Obj()
	job.Spec.FaultTolerance.Quarantine.NodeTaint = trainingv1alpha1.QuarantineTaintNoSchedule
	job.Spec.FaultTolerance.Quarantine.ExpireAfter = &metav1.Duration{Duration: 8760 * time.Hour} // the tenant's year
	h := newHarness(t, interceptor.Funcs{}, job)
	h.r.QuarantineTaintMax = 2 * time.Hour
	h.mustReconcile(t, job)
	h.setPod(t, "llm-0-0", running("n0"))
	h.mustReconcile(t, job)
	h.setNode(t, "n0", func(n *corev1.Node) { n.Status.Conditions[0].Status = corev1.ConditionUnknown })
	h.mustReconcile(t, job)
	if ts := nodeTaints(t, h, "n0"); len(ts) != 1 || ts[0].Key != trainingv1alpha1.QuarantineTaintKey {
		t.Fatalf("taints %v, want the quarantine taint for a lost node", ts)
	}
	n := &corev1.Node{}
	if err := h.r.Get(context.Background(), client.ObjectKey{Name: "n0"}, n); err != nil {
		t.Fatal(err)
	}
	if got, want := n.Annotations[trainingv1alpha1.QuarantineTaintUntilAnnotation], now.Add(2*time.Hour).UTC().Format(time.RFC3339); got != want {
		t.Errorf("taint expires %q, want %q (the platform's bound, not the job's year)", got, want)
	}
	ctx := context.Background()
	expiry := &nodehealth.TaintExpiry{Client: h.r.Client, Now: func() time.Time { return now.Add(time.Hour) }}
	if err := expiry.Expire(ctx); err != nil || len(nodeTaints(t, h, "n0")) != 1 {
		t.Fatalf("the taint went before it expired (%v)", err)
	}
	expiry.Now = func() time.Time { return now.Add(3 * time.Hour) }
	if err := expiry.Expire(ctx); err != nil || len(nodeTaints(t, h, "n0")) != 0 {
		t.Fatalf("the taint stayed after it expired (%v): %v", err, nodeTaints(t, h, "n0"))
	}

	// An older operator's taint, with no expiry on record.
	h.setNode(t, "n0", func(n *corev1.Node) {
		n.Spec.Taints = []corev1.Taint{{Key: trainingv1alpha1.QuarantineTaintKey, Value: "ns.old", Effect: corev1.TaintEffectNoSchedule}}
	})
	expiry.QuarantineMax = time.Hour
	if err := expiry.Expire(ctx); err != nil || len(nodeTaints(t, h, "n0")) != 1 {
		t.Fatalf("an older taint went at once (%v)", err)
	}
	expiry.Now = func() time.Time { return now.Add(5 * time.Hour) }
	if err := expiry.Expire(ctx); err != nil || len(nodeTaints(t, h, "n0")) != 0 {
		t.Fatalf("an older taint stayed past the expiry it was given (%v)", err)
	}
}

// A node with a broken GPU still has room for a rank that asks for fewer GPUs than it has (the
// device plugin lowers allocatable by the broken ones), and the scheduler would place one there
// that the operator fails at once as DeviceUnhealthy (the chaos soak: a new job restarted
// before its first fault). New ranks and spares are kept off such nodes where the scheduler
// can place them elsewhere: a node may look unhealthy for seconds only (joining, a device
// plugin restarting), and a required rule would keep a pod Pending for good where it was the
// node left.
func TestNewRanksAndSparesKeepOffNodesAlreadyUnhealthy(t *testing.T) {
	job := testjob.MakeZayaTrainingJob("llm", "ns").Nodes(2).GPUsPerNode(1).Generation(1).Defaulted().Obj()
	job.Spec.FaultTolerance.Spares = 1
	h := newHarness(t, interceptor.Funcs{}, job, testjob.HealthyNode("ok"), testjob.HealthyNode("bad-gpu"), testjob.HealthyNode("bad-nic"))
	h.setNode(t, "bad-gpu", func(n *corev1.Node) { n.Status.Allocatable["amd.com/gpu"] = resource.MustParse("7") })
	h.setNode(t, "bad-nic", func(n *corev1.Node) { n.Status.Allocatable["amd.com/nic"] = resource.MustParse("7") })
	h.mustReconcile(t, job)
	want := []corev1.PreferredSchedulingTerm{{Weight: 100, Preference: corev1.NodeSelectorTerm{MatchFields: []corev1.NodeSelectorRequirement{
		{Key: "metadata.name", Operator: corev1.NodeSelectorOpNotIn, Values: []string{"bad-gpu"}},
		{Key: "metadata.name", Operator: corev1.NodeSelectorOpNotIn, Values: []string{"bad-nic"}},
	}}}}
	pods := h.pods(t)
	for _, name := range []string{"llm-0-0", "llm-0-1"} {
		p := pods[name]
		if p == nil || p.Spec.Affinity == nil || p.Spec.Affinity.NodeAffinity == nil {
			t.Fatalf("pod %s: %+v", name, p)
		}
		if diff := cmp.Diff(want, p.Spec.Affinity.NodeAffinity.PreferredDuringSchedulingIgnoredDuringExecution); diff != "" {
			t.Errorf("%s keeps off (-want +got):\n%s", name, diff)
		}
		if r := p.Spec.Affinity.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution; r != nil {
			t.Errorf("%s must keep off unhealthy nodes only when it can: required %+v", name, r)
		}
	}
	h.setPod(t, "llm-0-0", running("ok"))
	h.setPod(t, "llm-0-1", running("ok"))
	h.mustReconcile(t, job)
	var spare *corev1.Pod
	for _, p := range h.pods(t) {
		if p.Labels[trainingv1alpha1.SpareLabel] != "" {
			spare = p
		}
	}
	if spare == nil {
		t.Fatal("no spare was made")
	}
	if diff := cmp.Diff(want, spare.Spec.Affinity.NodeAffinity.PreferredDuringSchedulingIgnoredDuringExecution); diff != "" {
		t.Errorf("the spare keeps off (-want +got):\n%s", diff)
	}
}
