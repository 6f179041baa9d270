package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	trainingv1alpha1 "github.com/zaya-operator/zaya-operator/api/v1alpha1"
	"github.com/zaya-operator/zaya-operator/controllers"
	"github.com/zaya-operator/zaya-operator/controllers/admission/kueuegate"
	"github.com/zaya-operator/zaya-operator/internal/kueue"
	"github.com/zaya-operator/zaya-operator/internal/testjob"
)

// The operator's side of Kueue's external-framework integration, with the test playing
// Kueue: it admits, evicts and readmits the Workload by writing its status as Kueue's
// scheduler does. hack/kueue-e2e.sh runs the same against a real Kueue.

// startKueueManager starts an operator with --kueue-workloads and makes the flavor the tests'
// admissions name.
func startKueueManager(t *testing.T, g Gomega) {
	t.Helper()
	startManagerConfigured(t, cfg, nil, podMarkSecret, withKueueWorkloads)
	makeFlavor(g)
}

// jobWorkload waits for the job's one Workload and returns it.
func jobWorkload(g Gomega, ns string) *kueue.Workload {
	var wl *kueue.Workload
	g.Eventually(func(g Gomega) {
		list := &kueue.WorkloadList{}
		g.Expect(k8sClient.List(context.Background(), list, client.InNamespace(ns))).To(Succeed())
		g.Expect(list.Items).To(HaveLen(1))
		wl = &list.Items[0]
	}, timeout, interval).Should(Succeed())
	return wl
}

func getWorkload(g Gomega, wl *kueue.Workload) *kueue.Workload {
	got := &kueue.Workload{}
	g.Expect(k8sClient.Get(context.Background(), client.ObjectKeyFromObject(wl), got)).To(Succeed())
	return got
}

// patchWorkloadStatus writes a Workload's status as Kueue does (a merge patch here).
func patchWorkloadStatus(g Gomega, wl *kueue.Workload, status map[string]any) {
	b, err := json.Marshal(map[string]any{"status": status})
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(k8sClient.Status().Patch(context.Background(), wl, rawMergePatch(b))).To(Succeed())
}

func cond(t, status, reason string) map[string]any {
	return map[string]any{"type": t, "status": status, "reason": reason, "message": reason, "lastTransitionTime": metav1.Now().UTC().Format("2006-01-02T15:04:05Z")}
}

// testFlavor is the ResourceFlavor the tests' admissions name.
const testFlavor = "mi300x-a"

// admit plays Kueue's scheduler admitting the Workload with testFlavor on cluster queue "gpus".
func admit(g Gomega, wl *kueue.Workload, topology bool) {
	a := map[string]any{"name": "workers", "flavors": map[string]string{"amd.com/gpu": testFlavor}, "count": wl.Spec.PodSets[0].Count}
	if topology {
		a["topologyAssignment"] = map[string]any{"levels": []string{"kubernetes.io/hostname"}, "slices": []any{}}
	}
	patchWorkloadStatus(g, wl, map[string]any{
		"admission":  map[string]any{"clusterQueue": "gpus", "podSetAssignments": []any{a}},
		"conditions": []any{cond("QuotaReserved", "True", "QuotaReserved"), cond("Admitted", "True", "Admitted")},
	})
}

// withKueueWorkloads runs the operator as main.go does with --kueue-workloads.
func withKueueWorkloads(r *controllers.ZayaTrainingJobReconciler) {
	r.Admission = kueuegate.New(r.Client, r.APIReader, true)
}

// admittedJob creates a 2-node job in queue "team" under an operator with KueueWorkloads,
// admits its Workload and waits for its pods.
func admittedJob(t *testing.T, g *WithT, ns, name string) (*trainingv1alpha1.ZayaTrainingJob, *kueue.Workload) {
	t.Helper()
	startKueueManager(t, g)
	job := testjob.MakeZayaTrainingJob(name, ns).Nodes(2).Label(kueue.QueueNameLabel, "team").Obj()
	g.Expect(k8sClient.Create(context.Background(), job)).To(Succeed())
	wl := jobWorkload(g, ns)
	admit(g, wl, false)
	waitPods(g, ns, name, 2)
	return job, wl
}

// admittedSlowJob is admittedJob whose 2 ranks run on a node and take an hour to stop (no
// kubelet confirms their end: they stay terminating until deleted at once).
func admittedSlowJob(t *testing.T, g *WithT, ns string) (*trainingv1alpha1.ZayaTrainingJob, *kueue.Workload) {
	t.Helper()
	startKueueManager(t, g)
	node := makeReadyNode(g, ns+"-n")
	t.Cleanup(func() {
		_ = k8sClient.Delete(context.Background(), &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: node}})
	})
	job := testjob.MakeZayaTrainingJob("llm", ns).Nodes(2).Label(kueue.QueueNameLabel, "team").Obj()
	job.Spec.Template.Spec.TerminationGracePeriodSeconds = ptr.To[int64](3600)
	g.Expect(k8sClient.Create(context.Background(), job)).To(Succeed())
	wl := jobWorkload(g, ns)
	admit(g, wl, false)
	for _, p := range waitPods(g, ns, "llm", 2) {
		bindAndRun(g, p, node)
	}
	return job, wl
}

// podsGoAtOnce deletes job llm's pods with no grace: their kubelet confirmed their end.
func podsGoAtOnce(g Gomega, ns string) {
	for _, p := range jobPods(g, ns, "llm") {
		g.Expect(k8sClient.Delete(context.Background(), p, client.GracePeriodSeconds(0))).To(Succeed())
	}
}

func workloadCondition(g Gomega, wl *kueue.Workload, t string) *metav1.Condition {
	return meta.FindStatusCondition(getWorkload(g, wl).Status.Conditions, t)
}

func makeFlavor(g Gomega) {
	rf := &kueue.ResourceFlavor{ObjectMeta: metav1.ObjectMeta{Name: testFlavor}, Spec: kueue.ResourceFlavorSpec{
		NodeLabels:  map[string]string{"zaya.dev/pool": testFlavor},
		Tolerations: []corev1.Toleration{{Key: "zaya.dev/reserved", Operator: corev1.TolerationOpEqual, Value: testFlavor, Effect: corev1.TaintEffectNoSchedule}},
	}}
	err := k8sClient.Create(context.Background(), rf)
	g.Expect(client.IgnoreAlreadyExists(err)).To(Succeed())
}

func TestKueueAdmitsEvictsAndKeepsRestartsInsideTheAdmission(t *testing.T) {
	g := NewWithT(t)
	ns := newNamespace(t)
	startKueueManager(t, g)
	ctx := context.Background()

	job := testjob.MakeZayaTrainingJob("llm", ns).Nodes(2).Label(kueue.QueueNameLabel, "team").Obj()
	g.Expect(k8sClient.Create(ctx, job)).To(Succeed())

	// Queued: a Workload of the rendered ranks, and no pod before admission.
	wl := jobWorkload(g, ns)
	g.Expect(metav1.IsControlledBy(wl, getJob(g, job))).To(BeTrue())
	g.Expect(wl.Finalizers).To(ContainElement(kueue.ResourceInUseFinalizer))
	g.Expect(wl.Labels).To(HaveKeyWithValue(kueue.JobUIDLabel, string(getJob(g, job).UID)))
	g.Expect(wl.Spec.QueueName).To(Equal("team"))
	g.Expect(wl.Spec.PodSets).To(HaveLen(1))
	g.Expect(wl.Spec.PodSets[0].Count).To(Equal(int32(2)))
	g.Expect(wl.Spec.PodSets[0].Template.Spec.Containers[0].Resources.Requests).To(HaveKeyWithValue(corev1.ResourceName("amd.com/gpu"), resource.MustParse("8")))
	g.Eventually(func(g Gomega) {
		c := meta.FindStatusCondition(getJob(g, job).Status.Conditions, trainingv1alpha1.ConditionQueued)
		g.Expect(c).NotTo(BeNil())
		g.Expect(c.Status).To(Equal(metav1.ConditionTrue))
	}, timeout, interval).Should(Succeed())
	g.Consistently(func(g Gomega) { g.Expect(jobPods(g, ns, "llm")).To(BeEmpty()) }, "1s", interval).Should(Succeed())
	g.Expect(getJob(g, job).Status.StartTime).To(BeNil(), "the queue is no part of the run")

	// Admitted: the ranks start where the flavor says.
	admit(g, wl, false)
	pods := waitPods(g, ns, "llm", 2)
	for _, p := range pods {
		g.Expect(p.Spec.NodeSelector).To(HaveKeyWithValue("zaya.dev/pool", "mi300x-a"))
		g.Expect(p.Spec.Tolerations).To(ContainElement(HaveField("Key", "zaya.dev/reserved")))
		g.Expect(p.Labels).To(HaveKeyWithValue(kueue.PodSetLabel, "workers"))
		g.Expect(p.Spec.SchedulingGates).To(BeEmpty())
	}
	g.Eventually(func(g Gomega) {
		c := meta.FindStatusCondition(getJob(g, job).Status.Conditions, trainingv1alpha1.ConditionQueued)
		g.Expect(c.Status).To(Equal(metav1.ConditionFalse))
		g.Expect(c.Reason).To(Equal(trainingv1alpha1.ReasonAdmitted))
	}, timeout, interval).Should(Succeed())
	for _, p := range pods {
		setPodStatus(g, p, runningReady)
	}
	g.Eventually(func(g Gomega) {
		c := workloadCondition(g, wl, kueue.WorkloadPodsReady)
		g.Expect(c).NotTo(BeNil())
		g.Expect(c.Status).To(Equal(metav1.ConditionTrue))
		g.Expect(c.Reason).To(Equal(kueue.ReasonStarted))
	}, timeout, interval).Should(Succeed())

	// A rank fails: the gang restarts inside the admission (same Workload, still admitted).
	setPodStatus(g, pods["llm-0-1"], failedWith(1))
	var next map[string]*corev1.Pod
	g.Eventually(func(g Gomega) {
		next = jobPods(g, ns, "llm")
		g.Expect(next).To(HaveKey("llm-1-0"))
		g.Expect(next).To(HaveKey("llm-1-1"))
	}, timeout, interval).Should(Succeed())
	g.Eventually(func(g Gomega) {
		c := workloadCondition(g, wl, kueue.WorkloadPodsReady)
		g.Expect(c.Status).To(Equal(metav1.ConditionFalse))
		g.Expect(c.Reason).To(Equal(kueue.ReasonWaitRecovery))
	}, timeout, interval).Should(Succeed())
	now := getWorkload(g, wl)
	g.Expect(now.UID).To(Equal(wl.UID))
	g.Expect(now.Status.Admission).NotTo(BeNil())
	for _, name := range []string{"llm-1-0", "llm-1-1"} {
		g.Expect(next[name].Spec.NodeSelector).To(HaveKeyWithValue("zaya.dev/pool", "mi300x-a"))
		setPodStatus(g, next[name], runningReady)
	}
	g.Eventually(func(g Gomega) {
		c := workloadCondition(g, wl, kueue.WorkloadPodsReady)
		g.Expect(c.Status).To(Equal(metav1.ConditionTrue))
		g.Expect(c.Reason).To(Equal(kueue.ReasonRecovered))
	}, timeout, interval).Should(Succeed())

	// Kueue preempts: the gang stops, the quota goes back, the job queues; no restart counted.
	restarts := getJob(g, job).Status.Restarts
	patchWorkloadStatus(g, wl, map[string]any{"conditions": []any{
		cond("QuotaReserved", "True", "QuotaReserved"), cond("Admitted", "True", "Admitted"),
		cond("PodsReady", "True", "Recovered"), cond("Evicted", "True", "Preempted"),
	}})
	g.Eventually(func(g Gomega) {
		g.Expect(jobPods(g, ns, "llm")).NotTo(HaveKey("llm-1-0"))
		now := getWorkload(g, wl)
		g.Expect(now.Status.Admission).To(BeNil())
		g.Expect(meta.IsStatusConditionFalse(now.Status.Conditions, kueue.WorkloadQuotaReserved)).To(BeTrue())
		r := meta.FindStatusCondition(now.Status.Conditions, kueue.WorkloadRequeued)
		g.Expect(r).NotTo(BeNil())
		g.Expect(r.Status).To(Equal(metav1.ConditionTrue))
		g.Expect(r.Reason).To(Equal("Preempted"))
		got := getJob(g, job)
		c := meta.FindStatusCondition(got.Status.Conditions, trainingv1alpha1.ConditionQueued)
		g.Expect(c.Status).To(Equal(metav1.ConditionTrue))
		g.Expect(c.Reason).To(Equal("KueuePreempted"))
		g.Expect(got.Status.ReadyNodes).To(BeZero())
	}, timeout, interval).Should(Succeed())
	g.Expect(getJob(g, job).Status.Restarts).To(Equal(restarts+1), "the next admission is a new attempt")
	g.Expect(getJob(g, job).Status.RestartTimes).To(HaveLen(1), "an eviction counts against no budget")
	g.Expect(getJob(g, job).Status.RecentFailures).To(HaveLen(1), "an eviction is no failure")

	// Readmitted: a new attempt runs to the end; the Workload finishes and lets go.
	patchWorkloadStatus(g, wl, map[string]any{"conditions": []any{cond("Evicted", "False", "Readmitted"), cond("Requeued", "True", "Preempted")}})
	admit(g, wl, false)
	attempt := fmt.Sprintf("llm-%d-", restarts+1)
	pods = waitPods(g, ns, "llm", 2)
	g.Expect(pods).To(HaveKey(attempt + "0"))
	setPodStatus(g, pods[attempt+"0"], corev1.PodStatus{Phase: corev1.PodSucceeded, ContainerStatuses: []corev1.ContainerStatus{{
		Name: "worker", State: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: 0, Reason: "Completed"}},
	}}})
	g.Eventually(func(g Gomega) {
		now := getWorkload(g, wl)
		c := meta.FindStatusCondition(now.Status.Conditions, kueue.WorkloadFinished)
		g.Expect(c).NotTo(BeNil())
		g.Expect(c.Status).To(Equal(metav1.ConditionTrue))
		g.Expect(c.Reason).To(Equal(kueue.ReasonSucceeded))
		g.Expect(now.Finalizers).NotTo(ContainElement(kueue.ResourceInUseFinalizer))
	}, timeout, interval).Should(Succeed())
}

func TestKueueSuspendReleasesTheQuotaAndDeleteFinishesTheWorkload(t *testing.T) {
	g := NewWithT(t)
	ns := newNamespace(t)
	ctx := context.Background()
	job, wl := admittedJob(t, g, ns, "llm")

	// Suspended: pods go, then the Workload goes (no quota held while suspended).
	g.Expect(k8sClient.Patch(ctx, job, rawMergePatch([]byte(`{"spec":{"suspend":true}}`)))).To(Succeed())
	g.Eventually(func(g Gomega) {
		g.Expect(jobPods(g, ns, "llm")).To(BeEmpty())
		list := &kueue.WorkloadList{}
		g.Expect(k8sClient.List(ctx, list, client.InNamespace(ns))).To(Succeed())
		g.Expect(list.Items).To(BeEmpty())
	}, timeout, interval).Should(Succeed())

	// Resumed: queued again with a new Workload, no pod until it is admitted.
	g.Expect(k8sClient.Patch(ctx, job, rawMergePatch([]byte(`{"spec":{"suspend":false}}`)))).To(Succeed())
	wl2 := jobWorkload(g, ns)
	g.Expect(wl2.UID).NotTo(Equal(wl.UID))
	g.Consistently(func(g Gomega) { g.Expect(jobPods(g, ns, "llm")).To(BeEmpty()) }, "1s", interval).Should(Succeed())
	admit(g, wl2, false)
	waitPods(g, ns, "llm", 2)

	// Deleted: the Workload is finished and let go, so neither quota nor GC waits on it.
	g.Expect(k8sClient.Delete(ctx, job, client.PropagationPolicy(metav1.DeletePropagationForeground))).To(Succeed())
	g.Eventually(func(g Gomega) {
		now := getWorkload(g, wl2)
		c := meta.FindStatusCondition(now.Status.Conditions, kueue.WorkloadFinished)
		g.Expect(c).NotTo(BeNil())
		g.Expect(c.Reason).To(Equal(kueue.ReasonOwnerNotFound))
		g.Expect(now.Finalizers).NotTo(ContainElement(kueue.ResourceInUseFinalizer))
	}, timeout, interval).Should(Succeed())
}

func TestKueueTopologyAssignmentGatesRanksForKueuesUngater(t *testing.T) {
	g := NewWithT(t)
	ns := newNamespace(t)
	startKueueManager(t, g)
	ctx := context.Background()

	job := testjob.MakeZayaTrainingJob("ring", ns).Nodes(4).GPUsPerNode(8).ContextParallel(16).
		Label(kueue.QueueNameLabel, "team").
		Annotation(kueue.PreferredTopologyAnnotation, "zaya.dev/spine").
		Annotation(kueue.SliceRequiredTopologyAnnotation, "zaya.dev/rail-block").Obj()
	g.Expect(k8sClient.Create(ctx, job)).To(Succeed())
	wl := jobWorkload(g, ns)
	tr := wl.Spec.PodSets[0].TopologyRequest
	g.Expect(tr).NotTo(BeNil())
	g.Expect(*tr.Preferred).To(Equal("zaya.dev/spine"))
	g.Expect(*tr.PodIndexLabel).To(Equal(trainingv1alpha1.RankLabel))
	g.Expect(*tr.PodSetSliceRequiredTopology).To(Equal("zaya.dev/rail-block"))
	g.Expect(*tr.PodSetSliceSize).To(Equal(int32(2)), "a ring of 16 GPUs spans 2 nodes: one slice")

	admit(g, wl, true)
	for _, p := range waitPods(g, ns, "ring", 4) {
		g.Expect(p.Spec.SchedulingGates).To(ContainElement(corev1.PodSchedulingGate{Name: kueue.TopologyGate}))
		g.Expect(p.Annotations).To(HaveKeyWithValue(kueue.WorkloadAnnotation, wl.Name))
		g.Expect(p.Annotations).To(HaveKeyWithValue(kueue.PreferredTopologyAnnotation, "zaya.dev/spine"))
		g.Expect(p.Labels).To(HaveKey(trainingv1alpha1.RankLabel))
	}
}

func TestKueueMultiKueueJobOnlyGetsAWorkload(t *testing.T) {
	g := NewWithT(t)
	ns := newNamespace(t)
	startKueueManager(t, g)
	ctx := context.Background()

	job := testjob.MakeZayaTrainingJob("far", ns).Nodes(2).Label(kueue.QueueNameLabel, "team").ManagedBy(kueue.MultiKueueController).Obj()
	g.Expect(k8sClient.Create(ctx, job)).To(Succeed())
	wl := jobWorkload(g, ns)
	g.Expect(metav1.IsControlledBy(wl, getJob(g, job))).To(BeTrue())
	admit(g, wl, false)
	g.Consistently(func(g Gomega) {
		g.Expect(jobPods(g, ns, "far")).To(BeEmpty())
		g.Expect(getJob(g, job).Status.Conditions).To(BeEmpty(), "MultiKueue copies the worker cluster's status")
	}, "1s", interval).Should(Succeed())
	patchWorkloadStatus(g, wl, map[string]any{"conditions": []any{cond("Finished", "True", "Succeeded")}})
	g.Eventually(func(g Gomega) {
		g.Expect(getWorkload(g, wl).Finalizers).NotTo(ContainElement(kueue.ResourceInUseFinalizer))
	}, timeout, interval).Should(Succeed())

	// One that cannot be queued says why in an event (its status is the worker cluster's).
	bad := testjob.MakeZayaTrainingJob("bad", ns).Nodes(2).Label(kueue.QueueNameLabel, "Team_A").ManagedBy(kueue.MultiKueueController).Obj()
	g.Expect(k8sClient.Create(ctx, bad)).To(Succeed())
	g.Eventually(func(g Gomega) {
		g.Expect(eventNotes(g, ns, "bad", trainingv1alpha1.ReasonWaitingForKueue)).To(ContainElement(ContainSubstring(`"Team_A" is not a LocalQueue name`)))
	}, timeout, interval).Should(Succeed())
	g.Expect(getJob(g, bad).Status.Conditions).To(BeEmpty())
}

func TestKueuePrebuiltWorkloadIsAdopted(t *testing.T) {
	g := NewWithT(t)
	manager, ns := newNamespace(t), newNamespace(t)
	startKueueManager(t, g)
	ctx := context.Background()

	// MultiKueue copies the manager cluster's Workload (the operator's own, for the job there)
	// into the worker cluster and names it on the job's copy.
	far := testjob.MakeZayaTrainingJob("near", manager).Nodes(2).Label(kueue.QueueNameLabel, "team").ManagedBy(kueue.MultiKueueController).Obj()
	g.Expect(k8sClient.Create(ctx, far)).To(Succeed())
	original := jobWorkload(g, manager)
	prebuilt := &kueue.Workload{
		ObjectMeta: metav1.ObjectMeta{Name: "far-abc12", Namespace: ns, Finalizers: []string{kueue.ResourceInUseFinalizer}},
		Spec:       kueue.WorkloadSpec{QueueName: "team", PodSets: original.Spec.PodSets},
	}
	g.Expect(k8sClient.Create(ctx, prebuilt)).To(Succeed())

	// A copy asking for other pods is refused, naming the annotation.
	other := testjob.MakeZayaTrainingJob("other", ns).Nodes(4).Label(kueue.QueueNameLabel, "team").
		Annotation(kueue.PrebuiltWorkloadLabel, prebuilt.Name).Obj()
	g.Expect(k8sClient.Create(ctx, other)).To(Succeed())
	g.Eventually(func(g Gomega) {
		c := meta.FindStatusCondition(getJob(g, other).Status.Conditions, trainingv1alpha1.ConditionQueued)
		g.Expect(c).NotTo(BeNil())
		g.Expect(c.Message).To(ContainSubstring(kueue.PrebuiltWorkloadLabel))
		g.Expect(getWorkload(g, prebuilt).OwnerReferences).To(BeEmpty())
	}, timeout, interval).Should(Succeed())
	g.Expect(k8sClient.Delete(ctx, other)).To(Succeed())

	job := testjob.MakeZayaTrainingJob("near", ns).Nodes(2).Label(kueue.QueueNameLabel, "team").
		Annotation(kueue.PrebuiltWorkloadLabel, prebuilt.Name).Obj()
	g.Expect(k8sClient.Create(ctx, job)).To(Succeed())
	g.Eventually(func(g Gomega) {
		wl := getWorkload(g, prebuilt)
		g.Expect(metav1.IsControlledBy(wl, getJob(g, job))).To(BeTrue())
		g.Expect(wl.Labels).To(HaveKeyWithValue(kueue.JobUIDLabel, string(getJob(g, job).UID)))
	}, timeout, interval).Should(Succeed())
	list := &kueue.WorkloadList{}
	g.Expect(k8sClient.List(ctx, list, client.InNamespace(ns))).To(Succeed())
	g.Expect(list.Items).To(HaveLen(1), "no Workload of its own")
	admit(g, getWorkload(g, prebuilt), false)
	waitPods(g, ns, "near", 2)
}

// TestKueueWorkloadsNeedOnlyTheKueueOverlaysRules runs a queued job's life (admission, a
// restart, eviction, suspension, the end) under the generated role plus
// config/kueue/operator_role.yaml's, and no more.
func TestKueueWorkloadsNeedOnlyTheKueueOverlaysRules(t *testing.T) {
	g := NewWithT(t)
	ctx := context.Background()
	ns := newNamespace(t)
	makeFlavor(g)

	var rules []rbacv1.PolicyRule
	for _, f := range []string{filepath.Join("rbac", "role.yaml"), filepath.Join("kueue", "operator_role.yaml")} {
		b, err := os.ReadFile(filepath.Join("..", "..", "config", f))
		g.Expect(err).NotTo(HaveOccurred())
		role := &rbacv1.ClusterRole{}
		g.Expect(yaml.Unmarshal([]byte(strings.Split(string(b), "\n---\n")[0]), role)).To(Succeed())
		g.Expect(role.Rules).NotTo(BeEmpty(), f)
		rules = append(rules, role.Rules...)
	}
	role := &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: "zaya-kueue-" + ns}, Rules: rules}
	binding := &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: role.Name},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: role.Name},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: "zaya-operator", Namespace: "zaya-system"}},
	}
	for _, o := range []client.Object{role, binding} {
		g.Expect(k8sClient.Create(ctx, o)).To(Succeed())
		t.Cleanup(func() { _ = k8sClient.Delete(context.Background(), o) })
	}
	podMarkRole(t, g)
	namespaceRole(t, g, "failure_patterns_role.yaml")
	opCfg := rest.CopyConfig(cfg)
	opCfg.Impersonate = rest.ImpersonationConfig{UserName: "system:serviceaccount:zaya-system:zaya-operator",
		Groups: []string{"system:serviceaccounts", "system:serviceaccounts:zaya-system", "system:authenticated"}}
	startManagerConfigured(t, opCfg, nil, podMarkSecret, withKueueWorkloads)

	job := testjob.MakeZayaTrainingJob("llm", ns).Nodes(2).Label(kueue.QueueNameLabel, "team").Obj()
	job.Spec.Template.Spec.PriorityClassName = "system-cluster-critical" // read for the Workload's priority
	g.Expect(k8sClient.Create(ctx, job)).To(Succeed())
	wl := jobWorkload(g, ns)
	g.Expect(wl.Spec.PriorityClassRef).NotTo(BeNil())
	g.Expect(*wl.Spec.Priority).To(Equal(int32(2000000000)))
	admit(g, wl, false)
	pods := waitPods(g, ns, "llm", 2)
	for _, p := range pods {
		setPodStatus(g, p, runningReady)
	}
	g.Eventually(func(g Gomega) {
		g.Expect(meta.IsStatusConditionTrue(getWorkload(g, wl).Status.Conditions, kueue.WorkloadPodsReady)).To(BeTrue())
	}, timeout, interval).Should(Succeed())
	patchWorkloadStatus(g, wl, map[string]any{"conditions": []any{cond("Evicted", "True", "PodsReadyTimeout")}})
	g.Eventually(func(g Gomega) {
		g.Expect(getWorkload(g, wl).Status.Admission).To(BeNil())
	}, timeout, interval).Should(Succeed())
	g.Expect(k8sClient.Patch(ctx, job, rawMergePatch([]byte(`{"spec":{"suspend":true}}`)))).To(Succeed())
	g.Eventually(func(g Gomega) {
		list := &kueue.WorkloadList{}
		g.Expect(k8sClient.List(ctx, list, client.InNamespace(ns))).To(Succeed())
		g.Expect(list.Items).To(BeEmpty())
	}, timeout, interval).Should(Succeed())
}

// addKueuePodFinalizer plays Kueue's pod webhook, which puts its finalizer on every pod of a
// group it manages.
func addKueuePodFinalizer(g Gomega, pod *corev1.Pod) {
	b, _ := json.Marshal(map[string]any{"metadata": map[string]any{"finalizers": []string{kueue.ManagedFinalizer}}})
	g.Expect(k8sClient.Patch(context.Background(), pod, rawMergePatch(b))).To(Succeed())
}

// TestKueuePodGroupsNeverBlockARestartOrADelete: with Kueue's pod integration (queue label in
// the template) each attempt is a group of `nodes` ranks, and the groups the job leaves are let
// go — not retriable, Kueue's finalizer off the deleted pods — so no restart, suspension or
// delete waits on them.
func TestKueuePodGroupsNeverBlockARestartOrADelete(t *testing.T) {
	g := NewWithT(t)
	ns := newNamespace(t)
	startManager(t)
	ctx := context.Background()

	job := testjob.MakeZayaTrainingJob("llm", ns).Nodes(2).Obj()
	job.Spec.Template.Labels = map[string]string{kueue.QueueNameLabel: "team", kueue.PodGroupNameLabel: "mine"}
	job.Spec.Template.Annotations = map[string]string{kueue.PodGroupTotalCount: "5"}
	job.Spec.FaultTolerance.Spares = 1 // no spare: it would be a pod outside the group
	g.Expect(k8sClient.Create(ctx, job)).To(Succeed())

	pods := waitPods(g, ns, "llm", 2)
	group0 := pods["llm-0-0"].Labels[kueue.PodGroupNameLabel]
	g.Expect(group0).To(HavePrefix("llm-"))
	g.Expect(group0).To(HaveSuffix("-0"))
	for _, p := range pods {
		g.Expect(p.Labels).To(HaveKeyWithValue(kueue.PodGroupNameLabel, group0))
		g.Expect(p.Annotations).To(HaveKeyWithValue(kueue.PodGroupTotalCount, "2"))
		g.Expect(p.Annotations).To(HaveKeyWithValue(kueue.PodGroupPodIndexLabel, trainingv1alpha1.RankLabel))
		addKueuePodFinalizer(g, p)
		setPodStatus(g, p, runningReady)
	}

	// A rank fails: the old group is let go and the next attempt is a new group.
	setPodStatus(g, pods["llm-0-1"], failedWith(1))
	var next map[string]*corev1.Pod
	g.Eventually(func(g Gomega) {
		next = jobPods(g, ns, "llm")
		g.Expect(next).To(HaveKey("llm-1-0"))
		g.Expect(next).To(HaveKey("llm-1-1"))
	}, timeout, interval).Should(Succeed())
	group1 := next["llm-1-0"].Labels[kueue.PodGroupNameLabel]
	g.Expect(group1).To(HaveSuffix("-1"))
	for name, p := range next {
		if p.Labels[kueue.PodGroupNameLabel] == group0 {
			g.Expect(p.Annotations).To(HaveKeyWithValue(kueue.RetriableInGroup, "false"), name)
		}
	}

	// Suspended: the pods go although Kueue's finalizer is on them.
	for _, name := range []string{"llm-1-0", "llm-1-1"} {
		addKueuePodFinalizer(g, next[name])
	}
	g.Expect(k8sClient.Patch(ctx, job, rawMergePatch([]byte(`{"spec":{"suspend":true}}`)))).To(Succeed())
	g.Eventually(func(g Gomega) {
		for name, p := range jobPods(g, ns, "llm") {
			g.Expect(p.DeletionTimestamp).To(BeNil(), "%s terminates with finalizers %v", name, p.Finalizers)
			g.Expect(p.Labels[kueue.PodGroupNameLabel]).NotTo(Equal(group1))
		}
	}, timeout, interval).Should(Succeed())

	// Resumed and deleted: the garbage-collected pods do not wait on Kueue's finalizer.
	g.Expect(k8sClient.Patch(ctx, job, rawMergePatch([]byte(`{"spec":{"suspend":false}}`)))).To(Succeed())
	var last map[string]*corev1.Pod
	g.Eventually(func(g Gomega) {
		last = map[string]*corev1.Pod{}
		for name, p := range jobPods(g, ns, "llm") {
			if p.DeletionTimestamp == nil && !terminal(p) {
				last[name] = p
			}
		}
		g.Expect(last).To(HaveLen(2))
	}, timeout, interval).Should(Succeed())
	for _, p := range last {
		addKueuePodFinalizer(g, p)
	}
	g.Expect(k8sClient.Delete(ctx, job)).To(Succeed())
	for _, p := range last {
		g.Expect(k8sClient.Delete(ctx, p)).To(Succeed()) // envtest runs no garbage collector
	}
	g.Eventually(func(g Gomega) {
		g.Expect(jobPods(g, ns, "llm")).To(BeEmpty())
	}, timeout, interval).Should(Succeed())
}

// TestKueueMissingPriorityClassIsSaidOnTheJob: a WorkloadPriorityClass that does not exist
// keeps the job out of the queue, says so on the job, and queues it once the class exists.
func TestKueueMissingPriorityClassIsSaidOnTheJob(t *testing.T) {
	g := NewWithT(t)
	ns := newNamespace(t)
	startKueueManager(t, g)
	ctx := context.Background()
	class := "urgent-" + ns

	job := testjob.MakeZayaTrainingJob("llm", ns).Nodes(2).Label(kueue.QueueNameLabel, "team").Label(kueue.PriorityClassLabel, class).Obj()
	g.Expect(k8sClient.Create(ctx, job)).To(Succeed())
	g.Eventually(func(g Gomega) {
		c := meta.FindStatusCondition(getJob(g, job).Status.Conditions, trainingv1alpha1.ConditionQueued)
		g.Expect(c).NotTo(BeNil())
		g.Expect(c.Message).To(ContainSubstring(class))
		g.Expect(c.Message).To(ContainSubstring(kueue.PriorityClassLabel))
	}, timeout, interval).Should(Succeed())
	wpc := &kueue.WorkloadPriorityClass{ObjectMeta: metav1.ObjectMeta{Name: class}, Value: 5000}
	g.Expect(k8sClient.Create(ctx, wpc)).To(Succeed())
	t.Cleanup(func() { _ = k8sClient.Delete(context.Background(), wpc) })
	wl := jobWorkload(g, ns)
	g.Expect(*wl.Spec.Priority).To(Equal(int32(5000)))
	g.Expect(wl.Spec.PriorityClassRef.Kind).To(Equal("WorkloadPriorityClass"))
	g.Expect(jobPods(g, ns, "llm")).To(BeEmpty())
}

// TestKueueWorkloadDeletedByHandStopsTheGangAndQueuesAgain: a Workload someone deletes takes
// the admission with it: the gang stops, the finalizer goes once no pod runs, a new Workload
// queues the job.
func TestKueueWorkloadDeletedByHandStopsTheGangAndQueuesAgain(t *testing.T) {
	g := NewWithT(t)
	ns := newNamespace(t)
	ctx := context.Background()
	job, wl := admittedJob(t, g, ns, "llm")
	g.Expect(k8sClient.Delete(ctx, wl)).To(Succeed())
	g.Eventually(func(g Gomega) {
		g.Expect(jobPods(g, ns, "llm")).To(BeEmpty())
		list := &kueue.WorkloadList{}
		g.Expect(k8sClient.List(ctx, list, client.InNamespace(ns))).To(Succeed())
		g.Expect(list.Items).To(HaveLen(1))
		g.Expect(list.Items[0].UID).NotTo(Equal(wl.UID))
		g.Expect(list.Items[0].Status.Admission).To(BeNil())
	}, timeout, interval).Should(Succeed())
	g.Expect(meta.IsStatusConditionTrue(getJob(g, job).Status.Conditions, trainingv1alpha1.ConditionQueued)).To(BeTrue())
}

// TestKueueJobCannotTakeAnotherJobsWorkload: a job naming another job's Workload as
// MultiKueue's prebuilt one gets neither that Workload nor pods, and the other job runs on.
func TestKueueJobCannotTakeAnotherJobsWorkload(t *testing.T) {
	g := NewWithT(t)
	ns := newNamespace(t)
	ctx := context.Background()
	victim, wl := admittedJob(t, g, ns, "victim")

	thief := testjob.MakeZayaTrainingJob("thief", ns).Nodes(2).Label(kueue.QueueNameLabel, "team").
		Annotation(kueue.PrebuiltWorkloadLabel, wl.Name).Obj()
	g.Expect(k8sClient.Create(ctx, thief)).To(Succeed())
	g.Eventually(func(g Gomega) {
		c := meta.FindStatusCondition(getJob(g, thief).Status.Conditions, trainingv1alpha1.ConditionRunning)
		g.Expect(c).NotTo(BeNil())
		g.Expect(c.Reason).To(Equal(trainingv1alpha1.ReasonNameConflict))
	}, timeout, interval).Should(Succeed())
	g.Consistently(func(g Gomega) {
		g.Expect(jobPods(g, ns, "thief")).To(BeEmpty())
		g.Expect(jobPods(g, ns, "victim")).To(HaveLen(2))
		now := getWorkload(g, wl)
		g.Expect(metav1.IsControlledBy(now, getJob(g, victim))).To(BeTrue())
		g.Expect(now.OwnerReferences).To(HaveLen(1))
	}, "1s", interval).Should(Succeed())
}

// TestKueueEvictedGangOnALostNodeHandsTheQuotaBackAfterTerminatingTimeout: pods whose kubelet
// never confirms their deletion (envtest has none: a lost node) are force-deleted after
// terminatingTimeout, and only then does the quota go back.
func TestKueueEvictedGangOnALostNodeHandsTheQuotaBackAfterTerminatingTimeout(t *testing.T) {
	g := NewWithT(t)
	ns := newNamespace(t)
	startKueueManager(t, g)
	ctx := context.Background()
	node := makeReadyNode(g, ns+"-lost")
	t.Cleanup(func() {
		_ = k8sClient.Delete(context.Background(), &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: node}})
	})

	job := testjob.MakeZayaTrainingJob("llm", ns).Nodes(2).Label(kueue.QueueNameLabel, "team").Obj()
	job.Spec.FaultTolerance.TerminatingTimeout = &metav1.Duration{Duration: 2 * time.Second}
	job.Spec.Template.Spec.TerminationGracePeriodSeconds = ptr.To[int64](1) // due 1 s + 2 s after the delete
	g.Expect(k8sClient.Create(ctx, job)).To(Succeed())
	wl := jobWorkload(g, ns)
	admit(g, wl, false)
	for _, p := range waitPods(g, ns, "llm", 2) {
		bindAndRun(g, p, node)
	}
	patchWorkloadStatus(g, wl, map[string]any{"conditions": []any{
		cond("QuotaReserved", "True", "QuotaReserved"), cond("Admitted", "True", "Admitted"), cond("Evicted", "True", "NodeFailures"),
	}})
	g.Eventually(func(g Gomega) {
		for _, p := range jobPods(g, ns, "llm") {
			g.Expect(p.DeletionTimestamp).NotTo(BeNil())
		}
	}, timeout, interval).Should(Succeed())
	g.Expect(getWorkload(g, wl).Status.Admission).NotTo(BeNil(), "quota handed back while pods still hold the devices")
	g.Eventually(func(g Gomega) {
		g.Expect(jobPods(g, ns, "llm")).To(BeEmpty())
		g.Expect(getWorkload(g, wl).Status.Admission).To(BeNil())
	}, timeout, interval).Should(Succeed())
}

// TestKueueQueuedJobCannotSlipPastKueue: removing the queue label from a queued job does
// not let it past Kueue, a bad Kueue label keeps it out of the queue naming the label, and
// spares added to an admitted job never outgrow the admission.
func TestKueueQueuedJobCannotSlipPastKueue(t *testing.T) {
	g := NewWithT(t)
	ns := newNamespace(t)
	startKueueManager(t, g)
	ctx := context.Background()

	job := testjob.MakeZayaTrainingJob("llm", ns).Nodes(2).Label(kueue.QueueNameLabel, "team").Obj()
	g.Expect(k8sClient.Create(ctx, job)).To(Succeed())
	wl := jobWorkload(g, ns)
	g.Expect(k8sClient.Patch(ctx, job, rawMergePatch([]byte(`{"metadata":{"labels":{"kueue.x-k8s.io/queue-name":null}}}`)))).To(Succeed())
	g.Consistently(func(g Gomega) {
		g.Expect(jobPods(g, ns, "llm")).To(BeEmpty())
		g.Expect(getWorkload(g, wl).UID).To(Equal(wl.UID))
	}, "2s", interval).Should(Succeed())

	bad := testjob.MakeZayaTrainingJob("bad", ns).Nodes(2).Label(kueue.QueueNameLabel, "team").Label(kueue.MaxExecTimeLabel, "soon").Obj()
	g.Expect(k8sClient.Create(ctx, bad)).To(Succeed())
	g.Eventually(func(g Gomega) {
		c := meta.FindStatusCondition(getJob(g, bad).Status.Conditions, trainingv1alpha1.ConditionQueued)
		g.Expect(c).NotTo(BeNil())
		g.Expect(c.Message).To(ContainSubstring(kueue.MaxExecTimeLabel))
		g.Expect(c.Message).To(ContainSubstring(`"soon"`))
	}, timeout, interval).Should(Succeed())
	g.Expect(jobPods(g, ns, "bad")).To(BeEmpty())
	// A label value Kueue's Workload would refuse as a queue name, named before Kueue does.
	badQueue := testjob.MakeZayaTrainingJob("bad-queue", ns).Nodes(2).Label(kueue.QueueNameLabel, "Team_A").Obj()
	g.Expect(k8sClient.Create(ctx, badQueue)).To(Succeed())
	g.Eventually(func(g Gomega) {
		c := meta.FindStatusCondition(getJob(g, badQueue).Status.Conditions, trainingv1alpha1.ConditionQueued)
		g.Expect(c).NotTo(BeNil())
		g.Expect(c.Message).To(ContainSubstring(`"Team_A" is not a LocalQueue name`))
	}, timeout, interval).Should(Succeed())
	g.Expect(jobPods(g, ns, "bad-queue")).To(BeEmpty())

	// Admitted without spares; spares added since get no pod outside the admission, and the
	// Workload stays (its admission is the job's until it stops).
	admit(g, wl, false)
	node := makeReadyNode(g, ns+"-n")
	t.Cleanup(func() {
		_ = k8sClient.Delete(context.Background(), &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: node}})
	})
	for _, p := range waitPods(g, ns, "llm", 2) {
		bindAndRun(g, p, node) // spares come once every rank is placed
	}
	g.Expect(k8sClient.Patch(ctx, job, rawMergePatch([]byte(`{"spec":{"faultTolerance":{"spares":2}}}`)))).To(Succeed())
	g.Consistently(func(g Gomega) {
		g.Expect(jobPods(g, ns, "llm")).To(HaveLen(2))
		g.Expect(getWorkload(g, wl).UID).To(Equal(wl.UID))
	}, "2s", interval).Should(Succeed())
}

// TestKueueAPrebuiltNameAddedLaterCannotTakeTheJobPastKueue: a running job whose queue label
// is swapped for a prebuilt Workload's name keeps its own Workload: Kueue's eviction still
// stops the gang, and suspending still lets its quota go.
func TestKueueAPrebuiltNameAddedLaterCannotTakeTheJobPastKueue(t *testing.T) {
	g := NewWithT(t)
	ns := newNamespace(t)
	ctx := context.Background()
	job, wl := admittedJob(t, g, ns, "llm")

	g.Expect(k8sClient.Patch(ctx, job, rawMergePatch([]byte(`{"metadata":{"labels":{"kueue.x-k8s.io/queue-name":null},`+
		`"annotations":{"kueue.x-k8s.io/prebuilt-workload-name":"elsewhere"}}}`)))).To(Succeed())
	g.Consistently(func(g Gomega) { g.Expect(jobPods(g, ns, "llm")).To(HaveLen(2)) }, "1s", interval).Should(Succeed())

	patchWorkloadStatus(g, wl, map[string]any{"conditions": []any{
		cond("QuotaReserved", "True", "QuotaReserved"), cond("Admitted", "True", "Admitted"), cond("Evicted", "True", "Preempted"),
	}})
	g.Eventually(func(g Gomega) {
		g.Expect(jobPods(g, ns, "llm")).To(BeEmpty(), "the gang ran on past Kueue's eviction")
		g.Expect(getWorkload(g, wl).Status.Admission).To(BeNil(), "the evicted Workload kept its quota")
	}, timeout, interval).Should(Succeed())

	g.Expect(k8sClient.Patch(ctx, job, rawMergePatch([]byte(`{"spec":{"suspend":true}}`)))).To(Succeed())
	g.Eventually(func(g Gomega) {
		err := k8sClient.Get(ctx, client.ObjectKeyFromObject(wl), &kueue.Workload{})
		g.Expect(apierrors.IsNotFound(err)).To(BeTrue(), "the suspended job's Workload stayed: %v", err)
	}, timeout, interval).Should(Succeed())
}

// TestKueueAJobReshapedWhileSuspendedNeverRunsUnderItsOldAdmission: suspended, grown from 2
// to 4 ranks and resumed while its old pods still stop, the job makes no pod under the
// admission for 2; once they are gone its Workload is replaced by one asking for 4.
func TestKueueAJobReshapedWhileSuspendedNeverRunsUnderItsOldAdmission(t *testing.T) {
	g := NewWithT(t)
	ns := newNamespace(t)
	ctx := context.Background()
	job, wl := admittedSlowJob(t, g, ns)

	g.Expect(k8sClient.Patch(ctx, job, rawMergePatch([]byte(`{"spec":{"suspend":true}}`)))).To(Succeed())
	g.Eventually(func(g Gomega) {
		for _, p := range jobPods(g, ns, "llm") {
			g.Expect(p.DeletionTimestamp).NotTo(BeNil())
		}
	}, timeout, interval).Should(Succeed())
	g.Expect(k8sClient.Patch(ctx, job, rawMergePatch([]byte(`{"spec":{"nodes":4}}`)))).To(Succeed())
	g.Expect(k8sClient.Patch(ctx, job, rawMergePatch([]byte(`{"spec":{"suspend":false}}`)))).To(Succeed())
	g.Eventually(func(g Gomega) {
		c := meta.FindStatusCondition(getJob(g, job).Status.Conditions, trainingv1alpha1.ConditionQueued)
		g.Expect(c).NotTo(BeNil())
		g.Expect(c.Message).To(ContainSubstring("changed while it was suspended"))
	}, timeout, interval).Should(Succeed())
	g.Consistently(func(g Gomega) {
		g.Expect(jobPods(g, ns, "llm")).To(HaveLen(2), "a pod was made under the admission for the old shape")
	}, "2s", interval).Should(Succeed())

	podsGoAtOnce(g, ns) // the kubelet confirms their end at last
	g.Eventually(func(g Gomega) {
		list := &kueue.WorkloadList{}
		g.Expect(k8sClient.List(ctx, list, client.InNamespace(ns))).To(Succeed())
		g.Expect(list.Items).To(HaveLen(1))
		g.Expect(list.Items[0].UID).NotTo(Equal(wl.UID))
		g.Expect(list.Items[0].Spec.PodSets[0].Count).To(Equal(int32(4)))
	}, timeout, interval).Should(Succeed())
	g.Expect(jobPods(g, ns, "llm")).To(BeEmpty(), "pods came before the new Workload was admitted")
}

// TestKueueADeletedJobsQuotaGoesBackOnlyWithItsPods: a job deleted while its pods take their
// time to stop keeps its Workload's quota until they are gone.
func TestKueueADeletedJobsQuotaGoesBackOnlyWithItsPods(t *testing.T) {
	g := NewWithT(t)
	ns := newNamespace(t)
	ctx := context.Background()
	job, wl := admittedSlowJob(t, g, ns)

	g.Expect(k8sClient.Delete(ctx, job, client.PropagationPolicy(metav1.DeletePropagationForeground))).To(Succeed())
	g.Eventually(func(g Gomega) {
		pods := jobPods(g, ns, "llm")
		g.Expect(pods).To(HaveLen(2))
		for _, p := range pods {
			g.Expect(p.DeletionTimestamp).NotTo(BeNil())
		}
	}, timeout, interval).Should(Succeed())
	g.Consistently(func(g Gomega) {
		now := getWorkload(g, wl)
		g.Expect(now.Finalizers).To(ContainElement(kueue.ResourceInUseFinalizer), "quota let go while the pods still stop")
		g.Expect(meta.IsStatusConditionTrue(now.Status.Conditions, kueue.WorkloadFinished)).To(BeFalse())
	}, "2s", interval).Should(Succeed())

	podsGoAtOnce(g, ns) // the kubelet confirms their end at last
	g.Eventually(func(g Gomega) {
		now := getWorkload(g, wl)
		g.Expect(now.Finalizers).NotTo(ContainElement(kueue.ResourceInUseFinalizer))
		c := meta.FindStatusCondition(now.Status.Conditions, kueue.WorkloadFinished)
		g.Expect(c).NotTo(BeNil())
		g.Expect(c.Reason).To(Equal(kueue.ReasonOwnerNotFound))
	}, timeout, interval).Should(Succeed())
}

// TestKueueAJobMadeAgainUnderItsNameLetsTheOldWorkloadGoWithItsPods: deleted (in the
// background) and made again under its name while the old pods still stop, the old job's
// Workload keeps its quota until they are gone, then lets it go; the new job queues anew.
func TestKueueAJobMadeAgainUnderItsNameLetsTheOldWorkloadGoWithItsPods(t *testing.T) {
	g := NewWithT(t)
	ns := newNamespace(t)
	ctx := context.Background()
	job, old := admittedSlowJob(t, g, ns)

	g.Expect(k8sClient.Delete(ctx, job, client.PropagationPolicy(metav1.DeletePropagationBackground))).To(Succeed())
	for _, p := range jobPods(g, ns, "llm") { // the garbage collector's part: envtest runs none
		g.Expect(k8sClient.Delete(ctx, p)).To(Succeed())
	}
	again := job.DeepCopy()
	again.ObjectMeta = metav1.ObjectMeta{Name: job.Name, Namespace: job.Namespace, Labels: job.Labels}
	again.Status = trainingv1alpha1.ZayaTrainingJobStatus{}
	g.Expect(k8sClient.Create(ctx, again)).To(Succeed())
	g.Eventually(func(g Gomega) {
		list := &kueue.WorkloadList{}
		g.Expect(k8sClient.List(ctx, list, client.InNamespace(ns))).To(Succeed())
		g.Expect(list.Items).To(HaveLen(2), "the new job queues with a Workload of its own")
	}, timeout, interval).Should(Succeed())
	g.Consistently(func(g Gomega) {
		g.Expect(getWorkload(g, old).Finalizers).To(ContainElement(kueue.ResourceInUseFinalizer), "quota let go while the old pods still stop")
	}, "2s", interval).Should(Succeed())

	podsGoAtOnce(g, ns) // the kubelet confirms their end at last
	g.Eventually(func(g Gomega) {
		now := getWorkload(g, old)
		g.Expect(now.Finalizers).NotTo(ContainElement(kueue.ResourceInUseFinalizer), "the old job's Workload kept its quota")
		g.Expect(meta.IsStatusConditionTrue(now.Status.Conditions, kueue.WorkloadFinished)).To(BeTrue())
	}, timeout, interval).Should(Succeed())
}

// TestKueueOrphanedPodsKeepTheirJobsQuota: a job deleted with --cascade=orphan leaves its pods
// running, as asked (the operator deletes none); they keep the old Workload's quota until
// they are gone, so orphaning is no way around Kueue.
func TestKueueOrphanedPodsKeepTheirJobsQuota(t *testing.T) {
	g := NewWithT(t)
	ns := newNamespace(t)
	ctx := context.Background()
	job, wl := admittedJob(t, g, ns, "llm")

	g.Expect(k8sClient.Delete(ctx, job, client.PropagationPolicy(metav1.DeletePropagationOrphan))).To(Succeed())
	g.Consistently(func(g Gomega) {
		for _, p := range jobPods(g, ns, "llm") {
			g.Expect(p.DeletionTimestamp).To(BeNil(), "the operator deleted a pod the user orphaned")
		}
		g.Expect(getWorkload(g, wl).Finalizers).To(ContainElement(kueue.ResourceInUseFinalizer))
	}, "2s", interval).Should(Succeed())

	// The garbage collector's part (envtest runs none): every dependent loses its owner, the
	// job goes.
	for _, p := range jobPods(g, ns, "llm") {
		g.Expect(k8sClient.Patch(ctx, p, rawMergePatch([]byte(`{"metadata":{"ownerReferences":null}}`)))).To(Succeed())
	}
	g.Expect(k8sClient.Patch(ctx, wl, rawMergePatch([]byte(`{"metadata":{"ownerReferences":null}}`)))).To(Succeed())
	g.Expect(k8sClient.Patch(ctx, job, rawMergePatch([]byte(`{"metadata":{"finalizers":null}}`)))).To(Succeed())
	g.Eventually(func(g Gomega) {
		err := k8sClient.Get(ctx, client.ObjectKeyFromObject(job), &trainingv1alpha1.ZayaTrainingJob{})
		g.Expect(apierrors.IsNotFound(err)).To(BeTrue())
	}, timeout, interval).Should(Succeed())
	g.Consistently(func(g Gomega) {
		g.Expect(getWorkload(g, wl).Finalizers).To(ContainElement(kueue.ResourceInUseFinalizer), "quota let go while orphaned pods run")
	}, "2s", interval).Should(Succeed())

	podsGoAtOnce(g, ns) // the kubelet confirms their end at last
	g.Eventually(func(g Gomega) {
		g.Expect(getWorkload(g, wl).Finalizers).NotTo(ContainElement(kueue.ResourceInUseFinalizer))
	}, timeout, interval).Should(Succeed())
}
