package integration

import (
	"context"
	"fmt"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	nodev1 "k8s.io/api/node/v1"
	schedulingv1 "k8s.io/api/scheduling/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	trainingv1alpha1 "github.com/zaya-operator/zaya-operator/api/v1alpha1"
	"github.com/zaya-operator/zaya-operator/internal/testjob"
)

// Issue 35's classes on the real API server: what a tenant writes moves its own job only.

// testNode is a Ready node (makeReadyNode) removed when the test ends: nodes are cluster-wide.
func testNode(t *testing.T, g Gomega, name string) string {
	t.Cleanup(func() {
		_ = k8sClient.Delete(context.Background(), &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}})
	})
	return makeReadyNode(g, name)
}

// A job asking for the quarantine taint, whose worker prints a GPU fault line, quarantines the
// node for itself but taints it for nobody: the line is the tenant's word, not a platform
// signal (before, the node was tainted NoSchedule for every workload, for good).
func TestATenantsFaultLineTaintsNoNodeOnTheAPIServer(t *testing.T) {
	g := NewWithT(t)
	ctx := context.Background()
	ns := newNamespace(t)
	nodes := []string{testNode(t, g, ns+"-n0"), testNode(t, g, ns+"-n1"), testNode(t, g, ns+"-n2")}
	startManager(t)
	job := testjob.MakeZayaTrainingJob("llm", ns).Nodes(2).Obj()
	job.Spec.FaultTolerance.RestartMode = trainingv1alpha1.RestartModeRecreate
	job.Spec.FaultTolerance.Quarantine.NodeTaint = trainingv1alpha1.QuarantineTaintNoSchedule
	g.Expect(k8sClient.Create(ctx, job)).To(Succeed())
	pods := waitPods(g, ns, "llm", 2)
	bindAndRun(g, pods["llm-0-0"], nodes[0])
	bindAndRun(g, pods["llm-0-1"], nodes[1])
	g.Eventually(func(g Gomega) {
		g.Expect(meta.IsStatusConditionTrue(getJob(g, job).Status.Conditions, trainingv1alpha1.ConditionRunning)).To(BeTrue())
	}, timeout, interval).Should(Succeed())

	p := pods["llm-0-1"]
	g.Expect(k8sClient.Get(ctx, client.ObjectKeyFromObject(p), p)).To(Succeed())
	setPodStatus(g, p, corev1.PodStatus{Phase: corev1.PodFailed, ContainerStatuses: []corev1.ContainerStatus{{
		Name: "worker", Image: "x", ImageID: "x", State: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{
			ExitCode: 1, Reason: "Error", FinishedAt: metav1.Now(), Message: "hipErrorECCNotCorrectable: uncorrectable ECC error on GPU 3\n"}},
	}}})
	g.Eventually(func(g Gomega) {
		st := getJob(g, job).Status
		g.Expect(st.Restarts).To(Equal(int32(1)))
		g.Expect(st.LastFailure.Category).To(Equal("GPUHardware"))
		g.Expect(st.QuarantinedNodes).To(ContainElement(HaveField("Name", nodes[1])), "the job keeps itself off the node")
	}, timeout, interval).Should(Succeed())
	g.Consistently(func(g Gomega) {
		n := &corev1.Node{}
		g.Expect(k8sClient.Get(ctx, client.ObjectKey{Name: nodes[1]}, n)).To(Succeed())
		g.Expect(n.Spec.Taints).NotTo(ContainElement(HaveField("Key", trainingv1alpha1.QuarantineTaintKey)), "a tenant's words tainted a shared node")
	}, 3*time.Second, interval).Should(Succeed())
}

// Anyone who may write a job's status can set Created=True on a spec the operator refused; the
// refused spec still runs nothing (before, it was taken for "accepted before an upgrade").
func TestAForgedAcceptanceRunsNoRefusedSpecOnTheAPIServer(t *testing.T) {
	g := NewWithT(t)
	ctx := context.Background()
	ns := newNamespace(t)
	startManager(t)
	job := testjob.MakeZayaTrainingJob("llm", ns).Nodes(2).Obj()
	job.Spec.Template.Spec.Volumes = []corev1.Volume{{Name: "zaya-shm", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}}}
	g.Expect(k8sClient.Create(ctx, job)).To(Succeed())
	refused := func(g Gomega) {
		c := meta.FindStatusCondition(getJob(g, job).Status.Conditions, trainingv1alpha1.ConditionCreated)
		g.Expect(c).NotTo(BeNil())
		g.Expect(c.Reason).To(Equal(trainingv1alpha1.ReasonInvalidSpec))
	}
	g.Eventually(refused, timeout, interval).Should(Succeed())

	g.Eventually(func() error {
		got := getJob(g, job)
		meta.SetStatusCondition(&got.Status.Conditions, metav1.Condition{Type: trainingv1alpha1.ConditionCreated, Status: metav1.ConditionTrue,
			Reason: trainingv1alpha1.ReasonAccepted, Message: "forged", ObservedGeneration: got.Generation})
		return k8sClient.Status().Update(ctx, got)
	}, timeout, interval).Should(Succeed())
	g.Eventually(refused, timeout, interval).Should(Succeed())
	g.Consistently(func(g Gomega) {
		g.Expect(jobPods(g, ns, "llm")).To(BeEmpty())
	}, 3*time.Second, interval).Should(Succeed())
}

// Warm spares are good neighbours: no template priority class (idle pause pods preempted
// another team's ranks before), the template's runtime class, and no peer in the rendezvous
// Service.
func TestSparesAreGoodNeighboursOnTheAPIServer(t *testing.T) {
	g := NewWithT(t)
	ctx := context.Background()
	ns := newNamespace(t)
	startManager(t)
	pc := &schedulingv1.PriorityClass{ObjectMeta: metav1.ObjectMeta{Name: ns + "-urgent"}, Value: 1000000}
	rc := &nodev1.RuntimeClass{ObjectMeta: metav1.ObjectMeta{Name: ns + "-rocm"}, Handler: "rocm"}
	for _, o := range []client.Object{pc, rc} {
		g.Expect(k8sClient.Create(ctx, o)).To(Succeed())
		t.Cleanup(func() { _ = k8sClient.Delete(context.Background(), o) })
	}
	job := testjob.MakeZayaTrainingJob("llm", ns).Nodes(2).Obj()
	job.Spec.FaultTolerance.Spares = 1
	job.Spec.FaultTolerance.RestartMode = trainingv1alpha1.RestartModeInPlace
	job.Spec.Template.Spec.PriorityClassName = pc.Name
	job.Spec.Template.Spec.RuntimeClassName = &rc.Name
	// Spares are made for a placed gang.
	g.Expect(k8sClient.Create(ctx, job)).To(Succeed())
	for r, p := range []string{"llm-0-0", "llm-0-1"} {
		node := testNode(t, g, fmt.Sprintf("%s-n%d", ns, r))
		bindAndRun(g, waitPods(g, ns, "llm", 2)[p], node)
	}
	var spare corev1.Pod
	g.Eventually(func(g Gomega) {
		list := &corev1.PodList{}
		g.Expect(k8sClient.List(ctx, list, client.InNamespace(ns), client.HasLabels{trainingv1alpha1.SpareLabel})).To(Succeed())
		g.Expect(list.Items).To(HaveLen(1))
		spare = list.Items[0]
	}, timeout, interval).Should(Succeed())
	g.Expect(spare.Spec.PriorityClassName).To(BeEmpty(), "a spare must not preempt")
	g.Expect(spare.Spec.RuntimeClassName).To(HaveValue(Equal(rc.Name)))
	svc := &corev1.Service{}
	g.Expect(k8sClient.Get(ctx, client.ObjectKey{Namespace: ns, Name: "llm"}, svc)).To(Succeed())
	matches := len(svc.Spec.Selector) > 0
	for k, v := range svc.Spec.Selector {
		matches = matches && spare.Labels[k] == v
	}
	g.Expect(matches).To(BeFalse(), "the rendezvous Service %v would publish the spare as a peer", svc.Spec.Selector)
}
