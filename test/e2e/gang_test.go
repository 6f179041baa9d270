//go:build e2e

package e2e

import (
	"context"
	"testing"

	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	trainingv1alpha1 "github.com/zaya-operator/zaya-operator/api/v1alpha1"
	"github.com/zaya-operator/zaya-operator/internal/testjob"
)

// TestAGangRunsOnePodPerNode: a gang as large as the cluster holds (16 nodes on kwok, every
// worker on kind) runs one pod per node.
func TestAGangRunsOnePodPerNode(t *testing.T) {
	g := NewWithT(t)
	ns := newNamespace(t)
	ctx := context.Background()

	job := testjob.MakeZayaTrainingJob("gang", ns).Nodes(gangNodes).Obj()
	w.idle(job)
	g.Expect(k8sClient.Create(ctx, job)).To(Succeed())
	t.Cleanup(func() { _ = k8sClient.Delete(context.Background(), job) })

	g.Eventually(func(g Gomega) {
		got := &trainingv1alpha1.ZayaTrainingJob{}
		g.Expect(k8sClient.Get(ctx, client.ObjectKeyFromObject(job), got)).To(Succeed())
		g.Expect(got.Status.ReadyNodes).To(Equal(gangNodes))
		g.Expect(meta.IsStatusConditionTrue(got.Status.Conditions, trainingv1alpha1.ConditionRunning)).To(BeTrue())
	}, gangTimeout, interval).Should(Succeed())

	pods := &corev1.PodList{}
	g.Expect(k8sClient.List(ctx, pods, client.InNamespace(ns), client.MatchingLabels{trainingv1alpha1.JobNameLabel: "gang"})).To(Succeed())
	g.Expect(pods.Items).To(HaveLen(int(gangNodes)))
	nodes := map[string]string{}
	for _, p := range pods.Items {
		g.Expect(p.Status.Phase).To(Equal(corev1.PodRunning))
		g.Expect(nodes).NotTo(HaveKey(p.Spec.NodeName), "ranks %s and %s share node %s", nodes[p.Spec.NodeName], p.Name, p.Spec.NodeName)
		nodes[p.Spec.NodeName] = p.Name
	}

	out, err := kubectl("get", "ztj", "gang", "-n", ns)
	g.Expect(err).NotTo(HaveOccurred(), out)
	g.Expect(out).To(MatchRegexp(`gang\s+%d\s+8\s+%d\s+`, gangNodes, gangNodes))
}

func TestTooBigAGangReportsWhyItCannotBePlaced(t *testing.T) {
	g := NewWithT(t)
	ns := newNamespace(t)
	ctx := context.Background()

	nodes := &corev1.NodeList{}
	g.Expect(k8sClient.List(ctx, nodes)).To(Succeed())
	want := int32(len(nodes.Items) + 4)
	job := testjob.MakeZayaTrainingJob("too-big", ns).Nodes(want).Obj()
	w.idle(job)
	g.Expect(k8sClient.Create(ctx, job)).To(Succeed())
	t.Cleanup(func() { _ = k8sClient.Delete(context.Background(), job) })

	g.Eventually(func(g Gomega) {
		got := &trainingv1alpha1.ZayaTrainingJob{}
		g.Expect(k8sClient.Get(ctx, client.ObjectKeyFromObject(job), got)).To(Succeed())
		c := meta.FindStatusCondition(got.Status.Conditions, trainingv1alpha1.ConditionWaitingForCapacity)
		g.Expect(c).NotTo(BeNil())
		g.Expect(c.Status).To(Equal(metav1.ConditionTrue))
		g.Expect(c.Message).To(ContainSubstring("Insufficient amd.com/gpu"))
		g.Expect(c.Message).To(MatchRegexp(`\d+/%d ranks placed, \d+ unschedulable`, want))
		g.Expect(meta.IsStatusConditionTrue(got.Status.Conditions, trainingv1alpha1.ConditionRunning)).To(BeFalse())
	}, gangTimeout, interval).Should(Succeed())
}

func TestDeletingAJobKeepsItsCheckpoints(t *testing.T) {
	g := NewWithT(t)
	ns := newNamespace(t)
	ctx := context.Background()

	keep := testjob.MakeZayaTrainingJob("keep", ns).Nodes(2).NewCheckpoint("1Ti", "").Obj()
	drop := testjob.MakeZayaTrainingJob("drop", ns).Nodes(2).NewCheckpoint("1Ti", "").Obj()
	drop.Spec.Checkpoint.RetainOnDelete = ptr.To(false)
	w.claimVolumes(t, ns, "keep-checkpoints", "drop-checkpoints")
	for _, j := range []*trainingv1alpha1.ZayaTrainingJob{keep, drop} {
		w.idle(j)
		g.Expect(k8sClient.Create(ctx, j)).To(Succeed())
	}
	for _, j := range []*trainingv1alpha1.ZayaTrainingJob{keep, drop} {
		g.Eventually(func(g Gomega) {
			got := &trainingv1alpha1.ZayaTrainingJob{}
			g.Expect(k8sClient.Get(ctx, client.ObjectKeyFromObject(j), got)).To(Succeed())
			g.Expect(meta.IsStatusConditionTrue(got.Status.Conditions, trainingv1alpha1.ConditionRunning)).To(BeTrue())
		}, gangTimeout, interval).Should(Succeed())
		g.Expect(k8sClient.Delete(ctx, j)).To(Succeed())
	}

	// The garbage collector takes the pods and the Service; the retained claim stays.
	g.Eventually(func(g Gomega) {
		pods := &corev1.PodList{}
		g.Expect(k8sClient.List(ctx, pods, client.InNamespace(ns))).To(Succeed())
		g.Expect(pods.Items).To(BeEmpty())
		svcs := &corev1.ServiceList{}
		g.Expect(k8sClient.List(ctx, svcs, client.InNamespace(ns))).To(Succeed())
		g.Expect(svcs.Items).To(BeEmpty())
		pvcs := &corev1.PersistentVolumeClaimList{}
		g.Expect(k8sClient.List(ctx, pvcs, client.InNamespace(ns))).To(Succeed())
		var names []string
		for _, p := range pvcs.Items {
			if p.DeletionTimestamp.IsZero() {
				names = append(names, p.Name)
			}
		}
		g.Expect(names).To(ConsistOf("keep-checkpoints"))
	}, gangTimeout, interval).Should(Succeed())
}
