package integration

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	trainingv1alpha1 "github.com/zaya-operator/zaya-operator/api/v1alpha1"
	"github.com/zaya-operator/zaya-operator/internal/testjob"
)

// unschedulableFor is the status the scheduler gives a pod it found no node for, ago.
func unschedulableFor(ago time.Duration) corev1.PodStatus {
	return corev1.PodStatus{Phase: corev1.PodPending, Conditions: []corev1.PodCondition{{
		Type: corev1.PodScheduled, Status: corev1.ConditionFalse, Reason: corev1.PodReasonUnschedulable,
		Message: "0/3 nodes are available: 3 Insufficient amd.com/gpu.", LastTransitionTime: metav1.NewTime(time.Now().Add(-ago)),
	}}}
}

// readyFor is a running pod ready since ago.
func readyFor(ago time.Duration) corev1.PodStatus {
	return corev1.PodStatus{Phase: corev1.PodRunning, Conditions: []corev1.PodCondition{
		{Type: corev1.PodReady, Status: corev1.ConditionTrue, LastTransitionTime: metav1.NewTime(time.Now().Add(-ago))},
		{Type: corev1.PodScheduled, Status: corev1.ConditionTrue},
	}}
}

func envOf(pod *corev1.Pod, name string) string {
	for _, e := range pod.Spec.Containers[0].Env {
		if e.Name == name {
			return e.Value
		}
	}
	return ""
}

// TestAnElasticJobShrinksWithoutCapacityAndGrowsBack: a 4-node job of minNodes 2 whose rank 3
// finds no node for shrinkAfter restarts on 3 nodes (workers told NNODES 3, target 4), counts
// no restart against its budget, holds a node to grow onto, and once that node has stood ready
// for growAfter grows back to 4 (its workers report no progress here, so at once).
func TestAnElasticJobShrinksWithoutCapacityAndGrowsBack(t *testing.T) {
	g := NewWithT(t)
	ns := newNamespace(t)
	startManager(t)
	explainOnFailure(t, ns, "ej")
	ctx := context.Background()

	job := testjob.MakeZayaTrainingJob("ej", ns).Nodes(4).GPUsPerNode(1).Elastic(2, 10*time.Second, 10*time.Second).Obj()
	// Pods on nodes stay Terminating without a kubelet: let the operator force them at once.
	job.Spec.FaultTolerance.TerminatingTimeout = &metav1.Duration{}
	g.Expect(k8sClient.Create(ctx, job)).To(Succeed())
	nodes := make([]string, 4)
	for i := range nodes {
		nodes[i] = makeReadyNode(g, fmt.Sprintf("%s-n%d", ns, i))
	}
	pods := waitPods(g, ns, "ej", 4)
	for r := range 3 {
		setPodStatus(g, pods[fmt.Sprintf("ej-0-%d", r)], runningReady)
	}
	setPodStatus(g, pods["ej-0-3"], unschedulableFor(time.Minute))

	g.Eventually(func(g Gomega) {
		got := getJob(g, job)
		g.Expect(got.Status.CurrentNodes).To(Equal(int32(3)))
		c := meta.FindStatusCondition(got.Status.Conditions, trainingv1alpha1.ConditionShrunk)
		g.Expect(c).NotTo(BeNil())
		g.Expect(c.Status).To(Equal(metav1.ConditionTrue))
		g.Expect(c.Reason).To(Equal(trainingv1alpha1.ReasonShrinking))
		g.Expect(c.Message).To(ContainSubstring("shrinking from 4 to 3 nodes"))
		g.Expect(c.Message).To(ContainSubstring("Insufficient amd.com/gpu"))
		pods = jobPods(g, ns, "ej")
		g.Expect(slices.Sorted(maps.Keys(pods))).To(Equal([]string{"ej-1-0", "ej-1-1", "ej-1-2"}))
	}, timeout, interval).Should(Succeed())
	w := pods["ej-1-0"]
	g.Expect([]string{envOf(w, "NNODES"), envOf(w, "WORLD_SIZE"), envOf(w, "ZAYA_TARGET_NODES"), envOf(w, "PET_NNODES")}).To(Equal([]string{"3", "3", "4", "3"}))
	for r := range 3 {
		bindAndRun(g, pods[fmt.Sprintf("ej-1-%d", r)], nodes[r])
	}
	var holder string
	g.Eventually(func(g Gomega) {
		got := getJob(g, job)
		g.Expect(meta.IsStatusConditionTrue(got.Status.Conditions, trainingv1alpha1.ConditionRunning)).To(BeTrue())
		g.Expect(got.Status.Restarts).To(Equal(int32(1)))
		g.Expect(got.Status.RestartTimes).To(BeEmpty(), "a resize counted against the restart budget")
		g.Expect(got.Status.Resizes).To(Equal(int32(1)))
		// The shrunk gang holds a node for the rank it misses.
		for name, p := range jobPods(g, ns, "ej") {
			if _, ok := p.Labels[trainingv1alpha1.SpareLabel]; ok {
				holder = name
			}
		}
		g.Expect(holder).NotTo(BeEmpty())
	}, timeout, interval).Should(Succeed())
	// Past growAfter: a holder counted before it runs would have grown the gang by then.
	g.Consistently(func(g Gomega) {
		g.Expect(getJob(g, job).Status.CurrentNodes).To(Equal(int32(3)), "grew with its holder pending")
	}, 12*time.Second, interval).Should(Succeed())
	recovered := getJob(g, job).Status.LastRecoverySeconds

	// The node comes back: the holder runs, and has for longer than growAfter.
	h := jobPods(g, ns, "ej")[holder]
	bindAndRun(g, h, nodes[3])
	setPodStatus(g, h, readyFor(time.Minute))
	g.Eventually(func(g Gomega) {
		got := getJob(g, job)
		g.Expect(got.Status.CurrentNodes).To(Equal(int32(4)))
		c := meta.FindStatusCondition(got.Status.Conditions, trainingv1alpha1.ConditionShrunk)
		g.Expect(c.Status).To(Equal(metav1.ConditionFalse))
		g.Expect(c.Reason).To(Equal(trainingv1alpha1.ReasonGrowing))
		pods = livePods(g, ns, "ej")
		g.Expect(slices.Sorted(maps.Keys(pods))).To(Equal([]string{"ej-2-0", "ej-2-1", "ej-2-2", "ej-2-3"}), "the holder gives its node back")
	}, 3*timeout, interval).Should(Succeed()) // the old pods' grace (10s) runs out first: no kubelet confirms
	g.Expect(envOf(pods["ej-2-3"], "NNODES")).To(Equal("4"))
	for r := range 4 {
		bindAndRun(g, pods[fmt.Sprintf("ej-2-%d", r)], nodes[r])
	}
	g.Eventually(func(g Gomega) {
		got := getJob(g, job)
		g.Expect(meta.IsStatusConditionTrue(got.Status.Conditions, trainingv1alpha1.ConditionRunning)).To(BeTrue())
		g.Expect(got.Status.Resizes).To(Equal(int32(2)))
		g.Expect(got.Status.RestartTimes).To(BeEmpty())
		c := meta.FindStatusCondition(got.Status.Conditions, trainingv1alpha1.ConditionRestarting)
		g.Expect(c.Reason).To(Equal(trainingv1alpha1.ReasonRecovered))
		g.Expect(c.Message).To(MatchRegexp(`^attempt 2 running on 4 nodes \d+s after the grow began`), "a grow follows no failure")
		g.Expect(got.Status.LastRecoverySeconds).To(Equal(recovered), "a grow is no recovery time")
		lost := got.Status.Goodput.Lost
		g.Expect(slices.ContainsFunc(lost, func(l trainingv1alpha1.GoodputLoss) bool { return l.Category == "Resize" })).To(BeTrue(), "the grow's restart is no goodput")
	}, timeout, interval).Should(Succeed())
	g.Eventually(func(g Gomega) {
		list := &eventsv1.EventList{}
		g.Expect(k8sClient.List(ctx, list, client.InNamespace(ns))).To(Succeed())
		var reasons []string
		for _, e := range list.Items {
			if e.Regarding.Name == "ej" {
				reasons = append(reasons, e.Reason)
			}
		}
		g.Expect(reasons).To(ContainElements(trainingv1alpha1.ReasonShrinking, trainingv1alpha1.ReasonGrowing))
	}, timeout, interval).Should(Succeed())
}

// livePods are the job's pods not being deleted.
func livePods(g Gomega, ns, job string) map[string]*corev1.Pod {
	pods := jobPods(g, ns, job)
	maps.DeleteFunc(pods, func(_ string, p *corev1.Pod) bool { return p.DeletionTimestamp != nil })
	return pods
}

// TestAJobWithoutElasticWaitsForCapacity: the same gang without elastic keeps waiting for its
// fourth node, as before.
func TestAJobWithoutElasticWaitsForCapacity(t *testing.T) {
	g := NewWithT(t)
	ns := newNamespace(t)
	startManager(t)
	job := testjob.MakeZayaTrainingJob("ej", ns).Nodes(4).GPUsPerNode(1).Obj()
	g.Expect(k8sClient.Create(context.Background(), job)).To(Succeed())
	pods := waitPods(g, ns, "ej", 4)
	for r := range 3 {
		setPodStatus(g, pods[fmt.Sprintf("ej-0-%d", r)], runningReady)
	}
	setPodStatus(g, pods["ej-0-3"], unschedulableFor(time.Hour))
	g.Eventually(func(g Gomega) {
		g.Expect(meta.IsStatusConditionTrue(getJob(g, job).Status.Conditions, trainingv1alpha1.ConditionWaitingForCapacity)).To(BeTrue())
	}, timeout, interval).Should(Succeed())
	g.Consistently(func(g Gomega) {
		got := getJob(g, job)
		g.Expect(got.Status.CurrentNodes).To(Equal(int32(4)))
		g.Expect(got.Status.Restarts).To(Equal(int32(0)))
		g.Expect(jobPods(g, ns, "ej")).To(HaveLen(4))
	}, 3*time.Second, interval).Should(Succeed())
}
