package integration

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

// kubelet plays the kubelet for one pod's worker container through the status subresource,
// so the API server checks every transition (a terminated container may only run again when
// its restart rules restart that exit code).
type kubelet struct {
	g   Gomega
	pod client.ObjectKey
}

func (k kubelet) write(mutate func(s *corev1.PodStatus, w *corev1.ContainerStatus)) {
	k.g.Eventually(func() error {
		pod := &corev1.Pod{}
		if err := k8sClient.Get(context.Background(), k.pod, pod); err != nil {
			return err
		}
		if len(pod.Status.ContainerStatuses) == 0 {
			pod.Status.ContainerStatuses = []corev1.ContainerStatus{{Name: "worker", Image: "x", ImageID: "x"}}
		}
		mutate(&pod.Status, &pod.Status.ContainerStatuses[0])
		return k8sClient.Status().Update(context.Background(), pod)
	}, timeout, interval).Should(Succeed())
}

// run starts the container's next process.
func (k kubelet) run(at time.Time) {
	k.write(func(s *corev1.PodStatus, w *corev1.ContainerStatus) {
		s.Phase = corev1.PodRunning
		s.Conditions = []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}, {Type: corev1.PodScheduled, Status: corev1.ConditionTrue}}
		if w.State.Terminated != nil {
			w.LastTerminationState = corev1.ContainerState{Terminated: w.State.Terminated}
			w.RestartCount++
		}
		w.State = corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: metav1.NewTime(at)}}
		w.Ready, w.Started = true, new(true)
	})
}

// exit ends the container's process with code; the pod keeps running (its rules restart it).
func (k kubelet) exit(code int32, at time.Time) {
	k.write(func(s *corev1.PodStatus, w *corev1.ContainerStatus) {
		s.Conditions = []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionFalse}, {Type: corev1.PodScheduled, Status: corev1.ConditionTrue}}
		started := metav1.NewTime(at)
		if w.State.Running != nil {
			started = w.State.Running.StartedAt
		}
		w.State = corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{
			ExitCode: code, Reason: "Error", StartedAt: started, FinishedAt: metav1.NewTime(at), Message: "checkpoint-step=60\n"}}
		w.Ready, w.Started = false, new(false)
	})
}

// kubelets play the kubelets of job llm's first n pods (attempt 0).
func kubelets(g Gomega, ns string, n int) []kubelet {
	ks := make([]kubelet, n)
	for r := range ks {
		ks[r] = kubelet{g: g, pod: client.ObjectKey{Namespace: ns, Name: fmt.Sprintf("llm-0-%d", r)}}
	}
	return ks
}

// TestInPlaceRestartSurvivesAnOperatorRestart: a rank's process dies and its kubelet restarts
// it in place, the operator dies right after counting the restart, and its successor closes
// the same restart once every rank runs again, without a pod written.
func TestInPlaceRestartSurvivesAnOperatorRestart(t *testing.T) {
	g := NewWithT(t)
	ns := newNamespace(t)
	ctx := context.Background()
	stop := startStoppableManager(t)

	job := testjob.MakeZayaTrainingJob("llm", ns).Nodes(4).Obj()
	g.Expect(k8sClient.Create(ctx, job)).To(Succeed())
	pods := waitPods(g, ns, "llm", 4)
	w := pods["llm-0-0"].Spec.Containers[0]
	g.Expect(w.RestartPolicyRules).NotTo(BeEmpty(), "the API server dropped the restart rules (ContainerRestartRules off?)")
	ks := kubelets(g, ns, 4)
	t0 := time.Now().Add(-time.Minute).Truncate(time.Second)
	for _, k := range ks {
		k.run(t0)
	}
	g.Eventually(func(g Gomega) {
		g.Expect(meta.IsStatusConditionTrue(getJob(g, job).Status.Conditions, trainingv1alpha1.ConditionRunning)).To(BeTrue())
	}, timeout, interval).Should(Succeed())

	fault := t0.Add(10 * time.Second)
	ks[2].exit(139, fault)
	ks[2].run(fault.Add(time.Second))
	g.Eventually(func(g Gomega) {
		st := getJob(g, job).Status
		g.Expect(st.Restarts).To(Equal(int32(1)))
		g.Expect(st.InPlaceRestarts).To(Equal(int32(1)))
		g.Expect(*st.LastFailure.Rank).To(Equal(int32(2)))
		g.Expect(*st.LastFailure.ExitCode).To(Equal(int32(139)))
	}, timeout, interval).Should(Succeed())
	stop() // the operator dies mid-restart

	startManager(t)
	for _, r := range []int{0, 1, 3} {
		ks[r].exit(trainingv1alpha1.ExitStopped, fault.Add(2*time.Second))
		ks[r].run(fault.Add(3 * time.Second))
	}
	g.Eventually(func(g Gomega) {
		got := getJob(g, job)
		g.Expect(meta.IsStatusConditionTrue(got.Status.Conditions, trainingv1alpha1.ConditionRunning)).To(BeTrue(), "%+v", got.Status)
		c := meta.FindStatusCondition(got.Status.Conditions, trainingv1alpha1.ConditionRestarting)
		g.Expect(c.Reason).To(Equal(trainingv1alpha1.ReasonRecovered))
		g.Expect(got.Status.Restarts).To(Equal(int32(1)), "the restart was counted twice")
		g.Expect(got.Status.RestartTimes).To(HaveLen(1))
		g.Expect(got.Status.LastRestartMode).To(Equal(trainingv1alpha1.RestartModeInPlace))
		g.Expect(*got.Status.LastRecoverySeconds).To(Equal(int32(3)), "timed from the fault")
		g.Expect(got.Status.LastCheckpoint.Step).To(Equal(int64(60)))
	}, timeout, interval).Should(Succeed())
	after := jobPods(g, ns, "llm")
	g.Expect(after).To(HaveLen(4))
	for name, p := range after {
		g.Expect(p.UID).To(Equal(pods[name].UID), "pod %s was replaced", name)
	}
	g.Eventually(func(g Gomega) {
		g.Expect(eventNotes(g, ns, "llm", trainingv1alpha1.ReasonRecovered)).To(ConsistOf(ContainSubstring("recovered in place")))
	}, timeout, interval).Should(Succeed())
}

// TestStalledInPlaceRestartIsEscalated: a rank never comes back from an in-place restart, so
// after inPlaceTimeout the operator replaces its pod; when the new one does not come up
// either, one more inPlaceTimeout later it recreates the gang, as the same counted restart.
func TestStalledInPlaceRestartIsEscalated(t *testing.T) {
	g := NewWithT(t)
	ns := newNamespace(t)
	ctx := context.Background()
	startManager(t)

	job := testjob.MakeZayaTrainingJob("llm", ns).Nodes(3).Obj()
	job.Spec.FaultTolerance.InPlaceTimeout = &metav1.Duration{Duration: 10 * time.Second}
	g.Expect(k8sClient.Create(ctx, job)).To(Succeed())
	waitPods(g, ns, "llm", 3)
	ks := kubelets(g, ns, 3)
	t0 := time.Now().Truncate(time.Second)
	for _, k := range ks {
		k.run(t0)
	}
	ks[1].exit(1, t0.Add(time.Second)) // and is never started again (its node's runtime is stuck)
	g.Eventually(func(g Gomega) {
		g.Expect(getJob(g, job).Status.Restarts).To(Equal(int32(1)))
	}, timeout, interval).Should(Succeed())
	// The others restart, rank 1 does not.
	before := jobPods(g, ns, "llm")
	for _, r := range []int{0, 2} {
		ks[r].exit(trainingv1alpha1.ExitStopped, t0.Add(2*time.Second))
		ks[r].run(t0.Add(3 * time.Second))
	}
	g.Eventually(func(g Gomega) {
		pods := jobPods(g, ns, "llm")
		g.Expect(pods).To(HaveLen(3))
		g.Expect(pods["llm-0-1"].UID).NotTo(Equal(before["llm-0-1"].UID), "rank 1's pod was not replaced")
		g.Expect(pods["llm-0-0"].UID).To(Equal(before["llm-0-0"].UID))
		g.Expect(pods["llm-0-2"].UID).To(Equal(before["llm-0-2"].UID))
	}, 2*timeout, interval).Should(Succeed())
	g.Expect(getJob(g, job).Status.PodsReplaced).To(Equal(int32(1)))
	// Its new pod never starts (no kubelet here): the gang is recreated.
	g.Eventually(func(g Gomega) {
		pods := jobPods(g, ns, "llm")
		for r := range 3 {
			g.Expect(pods).To(HaveKey(fmt.Sprintf("llm-1-%d", r)))
		}
	}, 2*timeout, interval).Should(Succeed())
	st := getJob(g, job).Status
	g.Expect(st.Restarts).To(Equal(int32(1)))
	g.Expect(st.InPlaceRestarts).To(BeZero())
	g.Expect(st.LastRestartMode).To(Equal(trainingv1alpha1.RestartModeRecreate))
	g.Eventually(func(g Gomega) {
		g.Expect(eventNotes(g, ns, "llm", trainingv1alpha1.ReasonReplacingPods)).To(ConsistOf(ContainSubstring("replacing rank 1 (pod llm-0-1")))
		g.Expect(eventNotes(g, ns, "llm", trainingv1alpha1.ReasonInPlaceTimedOut)).To(HaveLen(1))
	}, timeout, interval).Should(Succeed())
}

// TestANodeReplacementSurvivesAnOperatorRestartAndAProcessFault: a node is lost under a
// running gang, so its rank's pod is replaced while the others restart in place; the operator
// dies before the new pod runs, and meanwhile another rank's process crashes. Its successor
// finishes the same restart: the replacement is not replaced again, the crash is part of the
// restart under way (counted once), only the lost rank got a new pod, and it avoids the node.
func TestANodeReplacementSurvivesAnOperatorRestartAndAProcessFault(t *testing.T) {
	g := NewWithT(t)
	ns := newNamespace(t)
	ctx := context.Background()
	stop := startStoppableManager(t)

	nodes := make([]string, 5)
	for i := range nodes {
		nodes[i] = makeReadyNode(g, fmt.Sprintf("%s-n%d", ns, i))
		t.Cleanup(func() {
			_ = k8sClient.Delete(context.Background(), &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: nodes[i]}})
		})
	}
	job := testjob.MakeZayaTrainingJob("llm", ns).Nodes(4).Obj()
	g.Expect(k8sClient.Create(ctx, job)).To(Succeed())
	pods := waitPods(g, ns, "llm", 4)
	for r := range 4 {
		bindAndRun(g, pods[fmt.Sprintf("llm-0-%d", r)], nodes[r])
	}
	g.Eventually(func(g Gomega) {
		g.Expect(meta.IsStatusConditionTrue(getJob(g, job).Status.Conditions, trainingv1alpha1.ConditionRunning)).To(BeTrue())
	}, timeout, interval).Should(Succeed())
	ks := kubelets(g, ns, 4)

	// n2 is lost: rank 2's pod is replaced, the others restart in place.
	n2 := &corev1.Node{}
	g.Expect(k8sClient.Get(ctx, client.ObjectKey{Name: nodes[2]}, n2)).To(Succeed())
	n2.Status.Conditions = []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionUnknown, Reason: "NodeStatusUnknown"}}
	g.Expect(k8sClient.Status().Update(ctx, n2)).To(Succeed())
	var replacement *corev1.Pod
	g.Eventually(func(g Gomega) {
		st := getJob(g, job).Status
		g.Expect(st.Restarts).To(Equal(int32(1)))
		g.Expect(st.Replacing).To(ConsistOf(And(HaveField("Rank", int32(2)), HaveField("UID", string(pods["llm-0-2"].UID)))))
		now := jobPods(g, ns, "llm")
		g.Expect(now).To(HaveKey("llm-0-2"))
		g.Expect(now["llm-0-2"].UID).NotTo(Equal(pods["llm-0-2"].UID))
		replacement = now["llm-0-2"]
	}, timeout, interval).Should(Succeed())
	stop() // the operator dies before the new pod runs

	// Meanwhile rank 0 crashes and its kubelet restarts it; ranks 1 and 3 lost peers and restart.
	fault := time.Now()
	ks[0].exit(1, fault)
	ks[0].run(fault.Add(time.Second))
	for _, r := range []int{1, 3} {
		ks[r].exit(trainingv1alpha1.ExitStopped, fault)
		ks[r].run(fault.Add(time.Second))
	}
	startManager(t)
	g.Expect(replacement.Spec.Affinity.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution.NodeSelectorTerms[0].MatchFields).
		To(ContainElement(HaveField("Values", ContainElement(nodes[2]))), "the new pod may land on the lost node")
	g.Expect(k8sClient.SubResource("binding").Create(ctx, replacement, &corev1.Binding{
		ObjectMeta: metav1.ObjectMeta{Name: replacement.Name, Namespace: ns},
		Target:     corev1.ObjectReference{Kind: "Node", Name: nodes[4]},
	})).To(Succeed())
	ks[2].run(time.Now())

	g.Eventually(func(g Gomega) {
		got := getJob(g, job)
		c := meta.FindStatusCondition(got.Status.Conditions, trainingv1alpha1.ConditionRestarting)
		g.Expect(c).NotTo(BeNil())
		g.Expect(c.Reason).To(Equal(trainingv1alpha1.ReasonRecovered), "%+v", got.Status)
		g.Expect(meta.IsStatusConditionTrue(got.Status.Conditions, trainingv1alpha1.ConditionRunning)).To(BeTrue())
		g.Expect(got.Status.Restarts).To(Equal(int32(1)), "a fault was counted twice")
		g.Expect(got.Status.InPlaceRestarts).To(Equal(int32(1)))
		g.Expect(got.Status.PodsReplaced).To(Equal(int32(1)))
		g.Expect(got.Status.Replacing).To(BeEmpty())
		g.Expect(got.Status.LastRestartMode).To(Equal(trainingv1alpha1.RestartModeInPlace))
		g.Expect(got.Status.QuarantinedNodes).To(ConsistOf(HaveField("Name", nodes[2])))
	}, timeout, interval).Should(Succeed())
	after := jobPods(g, ns, "llm")
	g.Expect(after).To(HaveLen(4))
	for name, p := range after {
		if name == "llm-0-2" {
			g.Expect(p.UID).To(Equal(replacement.UID), "the replacement was replaced again")
			continue
		}
		g.Expect(p.UID).To(Equal(pods[name].UID), "pod %s was replaced", name)
	}
}
