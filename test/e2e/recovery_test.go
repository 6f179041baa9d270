//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	trainingv1alpha1 "github.com/zaya-operator/zaya-operator/api/v1alpha1"
	"github.com/zaya-operator/zaya-operator/internal/testjob"
)

// runningJob creates a job of runningJobNodes nodes and waits until all its ranks run.
func runningJob(t *testing.T, ns, name string, mutate func(*trainingv1alpha1.ZayaTrainingJob)) *trainingv1alpha1.ZayaTrainingJob {
	t.Helper()
	g := NewWithT(t)
	job := testjob.MakeZayaTrainingJob(name, ns).Nodes(runningJobNodes).Obj()
	w.idle(job)
	if mutate != nil {
		mutate(job)
	}
	g.Expect(k8sClient.Create(context.Background(), job)).To(Succeed())
	t.Cleanup(func() { _ = k8sClient.Delete(context.Background(), job) })
	waitRunning(g, job, 0)
	return job
}

// waitRunning waits for the job to run attempt `attempt` with every rank ready.
func waitRunning(g Gomega, job *trainingv1alpha1.ZayaTrainingJob, attempt int32) *trainingv1alpha1.ZayaTrainingJob {
	return waitRunningWithin(g, job, attempt, gangTimeout)
}

// rankPods are the live pods of one attempt by rank.
func rankPods(g Gomega, job *trainingv1alpha1.ZayaTrainingJob, attempt int32) map[string]corev1.Pod {
	list := &corev1.PodList{}
	g.Expect(k8sClient.List(context.Background(), list, client.InNamespace(job.Namespace), client.MatchingLabels{
		trainingv1alpha1.JobNameLabel: job.Name, trainingv1alpha1.AttemptLabel: fmt.Sprint(attempt),
	})).To(Succeed())
	out := map[string]corev1.Pod{}
	for _, p := range list.Items {
		if p.DeletionTimestamp.IsZero() {
			out[p.Labels[trainingv1alpha1.RankLabel]] = p
		}
	}
	return out
}

// expectAvoids checks that no rank of the attempt runs on node.
func expectAvoids(g Gomega, job *trainingv1alpha1.ZayaTrainingJob, attempt int32, node string) {
	pods := rankPods(g, job, attempt)
	g.Expect(pods).To(HaveLen(int(job.Spec.Nodes)))
	for _, p := range pods {
		g.Expect(p.Spec.NodeName).NotTo(Equal(node), "rank %s was placed on quarantined node %s", p.Labels[trainingv1alpha1.RankLabel], node)
	}
}

func TestRetryableExitRestartsTheGang(t *testing.T) {
	g := NewWithT(t)
	ns := newNamespace(t)
	job := runningJob(t, ns, "retry", nil)
	last := runningJobNodes - 1
	w.exitWorker(g, rankPods(g, job, 0)[fmt.Sprint(last)], 1)

	got := waitRunning(g, job, 1)
	g.Expect(got.Status.LastFailure.Reason).To(Equal(trainingv1alpha1.FailureReasonExitCode))
	g.Expect(*got.Status.LastFailure.Rank).To(Equal(last))
	g.Expect(got.Status.RestartTimes).To(HaveLen(1))
	g.Expect(got.Status.LastCheckpoint).NotTo(BeNil())
	g.Expect(got.Status.LastCheckpoint.Step).To(Equal(int64(300)))
	g.Expect(got.Status.LastRecoverySeconds).NotTo(BeNil())
	g.Expect(meta.FindStatusCondition(got.Status.Conditions, trainingv1alpha1.ConditionRestarting).Reason).To(Equal(trainingv1alpha1.ReasonRecovered))
}

func TestFatalExitFailsTheJob(t *testing.T) {
	g := NewWithT(t)
	ns := newNamespace(t)
	job := runningJob(t, ns, "fatal", nil)
	w.exitWorker(g, rankPods(g, job, 0)["1"], trainingv1alpha1.ExitCodeConfigError)

	g.Eventually(func(g Gomega) {
		got := &trainingv1alpha1.ZayaTrainingJob{}
		g.Expect(k8sClient.Get(context.Background(), client.ObjectKeyFromObject(job), got)).To(Succeed())
		c := meta.FindStatusCondition(got.Status.Conditions, trainingv1alpha1.ConditionFailed)
		g.Expect(c).NotTo(BeNil())
		g.Expect(c.Reason).To(Equal(trainingv1alpha1.ReasonFatalFailure))
		g.Expect(got.Status.Restarts).To(BeZero())
		// The other ranks are not left hanging in a collective.
		for _, p := range rankPods(g, job, 0) {
			g.Expect(p.Status.Phase).To(Equal(corev1.PodFailed))
		}
	}, gangTimeout, interval).Should(Succeed())
}

// recreating makes a job recreate its gang on every fault.
func recreating(j *trainingv1alpha1.ZayaTrainingJob) {
	j.Spec.FaultTolerance.RestartMode = trainingv1alpha1.RestartModeRecreate
}

func TestUnhealthyGPUQuarantinesTheNode(t *testing.T) {
	g := NewWithT(t)
	ns := newNamespace(t)
	// kwok restarts no container, so only a recreate brings a kwok gang back; replacing one
	// rank while the others restart in place is TestAFrozenNodesRankIsReplacedAlone's, on
	// process-backed nodes, and TestRecoveryOnRealKubelets on kind.
	job := runningJob(t, ns, "gpu", recreating)
	bad := rankPods(g, job, 0)["1"].Spec.NodeName
	w.unhealthyGPU(t, g, bad)

	got := waitRunning(g, job, 1)
	g.Expect(got.Status.LastFailure.Reason).To(Equal(trainingv1alpha1.FailureReasonDeviceUnhealthy))
	g.Expect(got.Status.QuarantinedNodes).To(ContainElement(HaveField("Name", bad)))
	expectAvoids(g, job, 1, bad)
}

func TestLostNodeIsAvoided(t *testing.T) {
	g := NewWithT(t)
	ns := newNamespace(t)
	job := runningJob(t, ns, "lost", func(j *trainingv1alpha1.ZayaTrainingJob) {
		recreating(j) // as above: kwok restarts no container
		j.Spec.FaultTolerance.TerminatingTimeout = &metav1.Duration{Duration: 5 * time.Second}
	})
	dead := rankPods(g, job, 0)[fmt.Sprint(runningJobNodes-1)].Spec.NodeName
	w.loseNode(t, g, dead)

	got := waitRunning(g, job, 1)
	g.Expect(got.Status.LastFailure.Reason).To(Equal(trainingv1alpha1.FailureReasonNodeLost))
	g.Expect(got.Status.LastFailure.Node).To(Equal(dead))
	g.Expect(got.Status.QuarantinedNodes).To(ContainElement(HaveField("Name", dead)))
	expectAvoids(g, job, 1, dead)
}
