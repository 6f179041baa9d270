//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	trainingv1alpha1 "github.com/zaya-operator/zaya-operator/api/v1alpha1"
	"github.com/zaya-operator/zaya-operator/workers/train"
)

// TestAStragglerIsFoundAndReplaced slows one node's worker down mid-run (the real worker's
// "slow" fault: its steps take twice as long). Rank 0's progress, polled by the operator,
// names it: the job says Straggling, naming the node; with stragglers.action Replace, its
// pod is replaced away from that node at the next checkpoint, the ranks restart in place, the
// condition clears, and the job completes.
func TestAStragglerIsFoundAndReplaced(t *testing.T) {
	procs := w.processes(t, int(trainNodes)+2)
	ns := newNamespace(t)
	ctx := context.Background()
	procs.sharedClaim(t, ns, "slow")
	job := trainingJob(procs, ns, "slow", "slow", 900)
	job.Spec.FaultTolerance.Stragglers.Action = trainingv1alpha1.StragglerActionReplace
	g := NewWithT(t)
	g.Expect(k8sClient.Create(ctx, job)).To(Succeed())
	waitRunning(g, job, 0)
	g.Eventually(func() int64 { return train.ParseLog(procs.runLog(ns, job.Name+"-0-0", 0)).Last }, 2*time.Minute, 50*time.Millisecond).
		Should(BeNumerically(">=", 40))

	victim := trainNodes - 1
	pod := fmt.Sprintf("%s-0-%d", job.Name, victim)
	node := procs.nodeOf(ns, pod)
	procs.fault(g, ns, pod, "slow")
	slowed := time.Now()

	var found *metav1.Condition
	g.Eventually(func(g Gomega) {
		got := getJob(g, job)
		found = meta.FindStatusCondition(got.Status.Conditions, trainingv1alpha1.ConditionStraggling)
		g.Expect(found).NotTo(BeNil())
		g.Expect(found.Status).To(Equal(metav1.ConditionTrue))
	}, time.Minute, 100*time.Millisecond).Should(Succeed())
	t.Logf("straggler found %v after the slow-down: %s", time.Since(slowed).Round(time.Millisecond), found.Message)
	g.Expect(found.Message).To(ContainSubstring(fmt.Sprintf("rank %d (pod %s on node %s)", victim, pod, node)))

	var replaced *trainingv1alpha1.JobFailure
	g.Eventually(func(g Gomega) {
		got := getJob(g, job)
		g.Expect(got.Status.Restarts).To(BeNumerically(">=", 1))
		replaced = got.Status.LastFailure
		g.Expect(replaced).NotTo(BeNil())
	}, time.Minute, 100*time.Millisecond).Should(Succeed())
	g.Expect(replaced.Category).To(Equal("Straggler"), "%+v", replaced)
	g.Expect(replaced.Node).To(Equal(node))
	g.Expect(*replaced.Rank).To(Equal(victim))
	t.Logf("replaced %v after the slow-down: %s", time.Since(slowed).Round(time.Millisecond), replaced.Message)

	got := waitRunning(g, job, 1)
	g.Expect(got.Status.LastRestartMode).To(Equal(trainingv1alpha1.RestartModeInPlace))
	g.Expect(got.Status.PodsReplaced).To(Equal(int32(1)), "only the straggler's pod is replaced")
	expectAvoids(g, got, got.Status.Attempt(), node)
	g.Eventually(func(g Gomega) {
		c := meta.FindStatusCondition(getJob(g, job).Status.Conditions, trainingv1alpha1.ConditionStraggling)
		g.Expect(c).NotTo(BeNil())
		g.Expect(c.Status).To(Equal(metav1.ConditionFalse))
	}, time.Minute, 100*time.Millisecond).Should(Succeed())
	done := waitSucceeded(t, job, 3*time.Minute)
	if gp := done.Status.Goodput; gp == nil || !strings.Contains(fmt.Sprint(gp.Lost), "Straggler") {
		t.Errorf("goodput %+v does not count the straggler's replacement", gp)
	}
}
