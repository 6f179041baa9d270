package integration

import (
	"context"
	"testing"

	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	trainingv1alpha1 "github.com/zaya-operator/zaya-operator/api/v1alpha1"
	"github.com/zaya-operator/zaya-operator/internal/testjob"
)

// TestARankWhosePodVanishesRestartsTheGang: a running rank's pod removed unseen (a forced
// delete, or its Node object deleted: the pod garbage collector forces those; here while the
// operator is down) is a pod deleted under the gang: the gang restarts, the failure names the
// rank; it is not made again alone in the same attempt, next to peers that wait on it.
func TestARankWhosePodVanishesRestartsTheGang(t *testing.T) {
	g := NewWithT(t)
	ns := newNamespace(t)
	job := testjob.MakeZayaTrainingJob("llm", ns).Nodes(2).RestartMode(trainingv1alpha1.RestartModeRecreate).Obj()
	stop, pods := readyGangUnderStoppableOperator(t, g, job)
	vanishUnseen(g, stop, pods["llm-0-1"])
	startManager(t)
	g.Eventually(func(g Gomega) {
		got := getJob(g, job)
		g.Expect(got.Status.Restarts).To(Equal(int32(1)))
		g.Expect(got.Status.LastFailure).NotTo(BeNil())
		g.Expect(got.Status.LastFailure.Reason).To(Equal(trainingv1alpha1.FailureReasonPodDeleted))
		g.Expect(*got.Status.LastFailure.Rank).To(Equal(int32(1)))
		g.Expect(got.Status.LastFailure.Message).To(ContainSubstring("vanished"))
		// The gang stops (no kubelet here confirms it): no rank is made again in attempt 0.
		left := jobPods(g, ns, "llm")
		g.Expect(left).NotTo(HaveKey("llm-0-1"))
		g.Expect(left["llm-0-0"].DeletionTimestamp).NotTo(BeNil())
	}, timeout, interval).Should(Succeed())
}

// TestARankWhosePodVanishesIsReplacedInPlace: with in-place restarts, the vanished rank gets a
// new pod of its name and its peers restart in theirs, as for any rank whose pod was deleted.
func TestARankWhosePodVanishesIsReplacedInPlace(t *testing.T) {
	g := NewWithT(t)
	ns := newNamespace(t)
	job := testjob.MakeZayaTrainingJob("llm", ns).Nodes(2).Obj()
	stop, pods := readyGangUnderStoppableOperator(t, g, job)
	g.Expect(getJob(g, job).Status.RestartMechanism).To(Equal(trainingv1alpha1.RestartMechanismRestartRules))
	old := pods["llm-0-1"].UID
	vanishUnseen(g, stop, pods["llm-0-1"])
	startManager(t)
	g.Eventually(func(g Gomega) {
		got := getJob(g, job)
		g.Expect(got.Status.LastFailure).NotTo(BeNil())
		g.Expect(got.Status.LastFailure.Message).To(ContainSubstring("vanished"))
		g.Expect(got.Status.InPlaceRestarts).To(Equal(int32(1)))
		now := jobPods(g, ns, "llm")
		g.Expect(now).To(HaveKey("llm-0-1"))
		g.Expect(now["llm-0-1"].UID).NotTo(Equal(old))
		g.Expect(now["llm-0-0"].UID).To(Equal(pods["llm-0-0"].UID), "the peer restarts in its pod")
	}, timeout, interval).Should(Succeed())
}

// readyGangUnderStoppableOperator runs job's 2 ranks on a node until the stored status has them
// ready, under an operator the caller can stop.
func readyGangUnderStoppableOperator(t *testing.T, g *WithT, job *trainingv1alpha1.ZayaTrainingJob) (func(), map[string]*corev1.Pod) {
	t.Helper()
	stop := startStoppableManager(t)
	ctx := context.Background()
	node := makeReadyNode(g, job.Namespace+"-n")
	t.Cleanup(func() {
		_ = k8sClient.Delete(context.Background(), &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: node}})
	})
	g.Expect(k8sClient.Create(ctx, job)).To(Succeed())
	pods := waitPods(g, job.Namespace, job.Name, 2)
	for _, p := range pods {
		bindAndRun(g, p, node)
	}
	g.Eventually(func(g Gomega) {
		g.Expect(getJob(g, job).Status.ReadyNodes).To(Equal(int32(2)))
	}, timeout, interval).Should(Succeed())
	return stop, pods
}

// vanishUnseen removes pod while no operator runs.
func vanishUnseen(g *WithT, stop func(), pod *corev1.Pod) {
	stop()
	g.Expect(k8sClient.Delete(context.Background(), pod, client.GracePeriodSeconds(0))).To(Succeed())
	g.Eventually(func(g Gomega) {
		g.Expect(jobPods(g, pod.Namespace, pod.Labels[trainingv1alpha1.JobNameLabel])).NotTo(HaveKey(pod.Name))
	}, timeout, interval).Should(Succeed())
}
