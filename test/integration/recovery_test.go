package integration

import (
	"context"
	"fmt"
	"testing"

	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	trainingv1alpha1 "github.com/zaya-operator/zaya-operator/api/v1alpha1"
	"github.com/zaya-operator/zaya-operator/internal/testjob"
)

func failedWith(code int32) corev1.PodStatus {
	return corev1.PodStatus{Phase: corev1.PodFailed, ContainerStatuses: []corev1.ContainerStatus{{
		Name: "worker", State: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{
			ExitCode: code, Reason: "Error", FinishedAt: metav1.Now(), Message: "checkpoint-step=40",
		}},
	}}}
}

// TestOperatorRestartMidRecovery stops the operator right after it decided a gang restart and
// starts a new one: the restart happens exactly once and completes.
func TestOperatorRestartMidRecovery(t *testing.T) {
	g := NewWithT(t)
	ns := newNamespace(t)
	stop := startStoppableManager(t)

	job := testjob.MakeZayaTrainingJob("llm", ns).Nodes(4).Obj()
	pods := runGang(g, job, 4)

	setPodStatus(g, pods["llm-0-2"], failedWith(1))
	g.Eventually(func(g Gomega) {
		g.Expect(getJob(g, job).Status.Restarts).To(Equal(int32(1)))
	}, timeout, interval).Should(Succeed())
	stop() // the operator dies mid-recovery

	startManager(t) // its successor knows only what the API holds
	g.Eventually(func(g Gomega) {
		pods = jobPods(g, ns, "llm")
		for r := range 4 {
			g.Expect(pods).To(HaveKey(fmt.Sprintf("llm-1-%d", r)))
		}
	}, timeout, interval).Should(Succeed())
	for r := range 4 {
		setPodStatus(g, pods[fmt.Sprintf("llm-1-%d", r)], runningReady)
	}
	g.Eventually(func(g Gomega) {
		got := getJob(g, job)
		g.Expect(meta.IsStatusConditionTrue(got.Status.Conditions, trainingv1alpha1.ConditionRunning)).To(BeTrue())
		c := meta.FindStatusCondition(got.Status.Conditions, trainingv1alpha1.ConditionRestarting)
		g.Expect(c.Reason).To(Equal(trainingv1alpha1.ReasonRecovered))
		g.Expect(got.Status.Restarts).To(Equal(int32(1)), "the restart was counted twice")
		g.Expect(got.Status.RestartTimes).To(HaveLen(1))
		g.Expect(got.Status.LastCheckpoint.Step).To(Equal(int64(40)))
	}, timeout, interval).Should(Succeed())
	// One gang only: the failed rank's pod of attempt 0 (kept for logs) and attempt 1.
	g.Expect(jobPods(g, ns, "llm")).To(HaveLen(5))
}

func TestRestartBudgetIsEnforced(t *testing.T) {
	g := NewWithT(t)
	ns := newNamespace(t)
	ctx := context.Background()
	startManager(t)

	job := testjob.MakeZayaTrainingJob("llm", ns).Nodes(2).Obj()
	zero := int32(0)
	job.Spec.FaultTolerance.MaxRestarts = &zero
	g.Expect(k8sClient.Create(ctx, job)).To(Succeed())
	pods := waitPods(g, ns, "llm", 2)
	setPodStatus(g, pods["llm-0-0"], runningReady)
	setPodStatus(g, pods["llm-0-1"], failedWith(1))
	g.Eventually(func(g Gomega) {
		got := getJob(g, job)
		c := meta.FindStatusCondition(got.Status.Conditions, trainingv1alpha1.ConditionFailed)
		g.Expect(c).NotTo(BeNil())
		g.Expect(c.Reason).To(Equal(trainingv1alpha1.ReasonRestartBudgetExceeded))
		g.Expect(got.Status.Restarts).To(BeZero())
	}, timeout, interval).Should(Succeed())
}

// TestKubeletRejectedRankRestartsTheGang: a kubelet that refuses a rank after scheduling
// (a GPU went unhealthy in between) fails the pod with reason OutOfamd.com/gpu, which is no
// valid condition reason; the restart must still be recorded, not refused on every pass.
// Restarting in place, only the rejected rank gets a new pod (same name); recreating, the
// whole gang does.
func TestKubeletRejectedRankRestartsTheGang(t *testing.T) {
	for _, mode := range []trainingv1alpha1.RestartMode{trainingv1alpha1.RestartModeInPlace, trainingv1alpha1.RestartModeRecreate} {
		t.Run(string(mode), func(t *testing.T) {
			g := NewWithT(t)
			ns := newNamespace(t)
			startManager(t)

			job := testjob.MakeZayaTrainingJob("llm", ns).Nodes(2).Obj()
			job.Spec.FaultTolerance.RestartMode = mode
			g.Expect(k8sClient.Create(context.Background(), job)).To(Succeed())
			pods := waitPods(g, ns, "llm", 2)
			setPodStatus(g, pods["llm-0-0"], runningReady)
			setPodStatus(g, pods["llm-0-1"], corev1.PodStatus{Phase: corev1.PodFailed, Reason: "OutOfamd.com/gpu",
				Message: "Pod was rejected: Node didn't have enough resource: amd.com/gpu, requested: 8, used: 0, capacity: 7"})

			g.Eventually(func(g Gomega) {
				got := getJob(g, job)
				g.Expect(got.Status.Restarts).To(Equal(int32(1)))
				g.Expect(got.Status.LastFailure).NotTo(BeNil())
				g.Expect(got.Status.LastFailure.Reason).To(Equal(trainingv1alpha1.FailureReasonNodeRejected))
				g.Expect(got.Status.LastFailure.Message).To(ContainSubstring("OutOfamd.com/gpu"))
			}, timeout, interval).Should(Succeed())
			g.Eventually(func(g Gomega) {
				now := jobPods(g, ns, "llm")
				if mode == trainingv1alpha1.RestartModeRecreate {
					g.Expect(now).To(HaveKey("llm-1-1"))
					return
				}
				g.Expect(now).To(HaveKey("llm-0-1"))
				g.Expect(now["llm-0-1"].UID).NotTo(Equal(pods["llm-0-1"].UID), "the rejected rank was not given a new pod")
				g.Expect(now["llm-0-0"].UID).To(Equal(pods["llm-0-0"].UID), "the healthy rank lost its pod")
				g.Expect(getJob(g, job).Status.PodsReplaced).To(Equal(int32(1)))
			}, timeout, interval).Should(Succeed())
		})
	}
}

// TestRefusedPodsAreReportedAsEvents: a namespace enforcing Pod Security "baseline" refuses
// the IPC_LOCK capability RDMA profiles add; the user sees why in a FailedCreate event and in
// the Running condition (no silent wait), and the job is neither failed nor restarted.
func TestRefusedPodsAreReportedAsEvents(t *testing.T) {
	g := NewWithT(t)
	ctx := context.Background()
	ns := newNamespaceEnforcing(t, "baseline")
	startManager(t)

	job := testjob.MakeZayaTrainingJob("rdma", ns).Nodes(2).Profile(trainingv1alpha1.NetworkPollaraAINIC).Obj()
	g.Expect(k8sClient.Create(ctx, job)).To(Succeed())
	g.Eventually(func(g Gomega) {
		g.Expect(eventNotes(g, ns, "rdma", trainingv1alpha1.ReasonFailedCreate)).To(ContainElement(And(ContainSubstring("PodSecurity"), ContainSubstring("IPC_LOCK"))))
		c := meta.FindStatusCondition(getJob(g, job).Status.Conditions, trainingv1alpha1.ConditionRunning)
		g.Expect(c).NotTo(BeNil())
		g.Expect(c.Reason).To(Equal(trainingv1alpha1.ReasonFailedCreate))
		g.Expect(c.Message).To(And(ContainSubstring("PodSecurity"), ContainSubstring("IPC_LOCK")))
	}, timeout, interval).Should(Succeed())
	got := getJob(g, job)
	g.Expect(got.Status.Restarts).To(BeZero())
	g.Expect(meta.IsStatusConditionTrue(got.Status.Conditions, trainingv1alpha1.ConditionFailed)).To(BeFalse())
	g.Expect(jobPods(g, ns, "rdma")).To(BeEmpty())
}
