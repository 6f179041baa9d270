package integration

import (
	"context"
	"path/filepath"
	"slices"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	trainingv1alpha1 "github.com/zaya-operator/zaya-operator/api/v1alpha1"
	"github.com/zaya-operator/zaya-operator/internal/testjob"
)

// TestAnAPIServerThatDropsRestartRulesIsFoundBeforeThePodsAreMade runs the operator against an
// API server of its own with container restart rules off (as before Kubernetes 1.35): the
// operator finds out before it makes the pods, says so once, makes them without rules, and
// a worker's failure recreates the gang as an ordinary restart, not as a kubelet that ignored
// its rules.
func TestAnAPIServerThatDropsRestartRulesIsFoundBeforeThePodsAreMade(t *testing.T) {
	env := &envtest.Environment{
		CRDDirectoryPaths:     []string{filepath.Join(repoRoot, "config", "crd", "bases")},
		ErrorIfCRDPathMissing: true,
	}
	env.ControlPlane.GetAPIServer().Configure().Append("feature-gates", "ContainerRestartRules=false,RestartAllContainersOnContainerExits=false")
	oldCfg, err := env.Start()
	if err != nil {
		_ = env.Stop()
		t.Fatalf("starting a second API server: %v", err)
	}
	t.Cleanup(func() { _ = env.Stop() })
	c, err := client.New(oldCfg, client.Options{Scheme: scheme})
	if err != nil {
		t.Fatal(err)
	}
	g := NewWithT(t)
	ctx := context.Background()
	for _, ns := range []string{podMarkSecret.Namespace, "old"} {
		g.Expect(c.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}})).To(Succeed())
	}
	startManagerAs(t, oldCfg)

	job := testjob.MakeZayaTrainingJob("llm", "old").Nodes(2).Obj()
	g.Expect(c.Create(ctx, job)).To(Succeed())
	pods := func(g Gomega) []corev1.Pod {
		list := &corev1.PodList{}
		g.Expect(c.List(ctx, list, client.InNamespace("old"), client.MatchingLabels{trainingv1alpha1.JobNameLabel: "llm"})).To(Succeed())
		return list.Items
	}
	g.Eventually(func(g Gomega) {
		g.Expect(pods(g)).To(HaveLen(2))
	}, timeout, interval).Should(Succeed())
	got := &trainingv1alpha1.ZayaTrainingJob{}
	g.Eventually(func(g Gomega) {
		g.Expect(c.Get(ctx, client.ObjectKeyFromObject(job), got)).To(Succeed())
		g.Expect(got.Status.RestartMechanism).To(Equal(trainingv1alpha1.RestartMechanismRecreate))
	}, timeout, interval).Should(Succeed())
	for _, p := range pods(g) {
		g.Expect(p.Spec.Containers[0].RestartPolicyRules).To(BeEmpty(), "pod %s", p.Name)
	}
	unsupported := func(g Gomega) int {
		list := &eventsv1.EventList{}
		g.Expect(c.List(ctx, list, client.InNamespace("old"))).To(Succeed())
		return len(slices.DeleteFunc(list.Items, func(e eventsv1.Event) bool {
			return e.Regarding.Name != "llm" || e.Reason != trainingv1alpha1.ReasonInPlaceUnsupported
		}))
	}
	g.Eventually(unsupported, timeout, interval).Should(Equal(1))

	// Rank 1's worker fails: its pod fails (no rules), and the gang is recreated as attempt 1.
	p := &corev1.Pod{}
	g.Expect(c.Get(ctx, client.ObjectKey{Namespace: "old", Name: "llm-0-1"}, p)).To(Succeed())
	p.Status.Phase = corev1.PodFailed
	p.Status.ContainerStatuses = []corev1.ContainerStatus{{Name: "worker", Image: "x", ImageID: "x", State: corev1.ContainerState{
		Terminated: &corev1.ContainerStateTerminated{ExitCode: 1, Reason: "Error", FinishedAt: metav1.NewTime(time.Now())}}}}
	g.Expect(c.Status().Update(ctx, p)).To(Succeed())
	g.Eventually(func(g Gomega) {
		g.Expect(c.Get(ctx, client.ObjectKeyFromObject(job), got)).To(Succeed())
		g.Expect(got.Status.Restarts).To(Equal(int32(1)))
	}, timeout, interval).Should(Succeed())
	g.Expect(got.Status.LastRestartMode).To(Equal(trainingv1alpha1.RestartModeRecreate))
	g.Expect(got.Status.Attempt()).To(Equal(int32(1)))
	g.Expect(meta.IsStatusConditionTrue(got.Status.Conditions, trainingv1alpha1.ConditionFailed)).To(BeFalse())
	g.Consistently(unsupported, 2*time.Second, interval).Should(Equal(1), "the failure was taken for a kubelet that ignored its rules")
}
