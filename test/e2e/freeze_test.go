//go:build e2e

package e2e

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	trainingv1alpha1 "github.com/zaya-operator/zaya-operator/api/v1alpha1"
	"github.com/zaya-operator/zaya-operator/test/nodeagent"
	"github.com/zaya-operator/zaya-operator/workers/train"
)

// TestAFrozenNodesRankIsReplacedAlone: a node hangs while the gang trains (its kubelet stops
// renewing its Lease, its processes freeze with their sockets open, and nothing marks it
// NotReady). Its peers find the rank silent and stop, the gang restarts in place, the node's
// Lease lapses, and only that rank gets a new pod, same name, on another node; the other
// ranks keep their pods, training advances again from the last checkpoint, the job
// completes with one restart counted, and the frozen node is quarantined. The log line gives
// the time from the freeze to training steps advancing again.
func TestAFrozenNodesRankIsReplacedAlone(t *testing.T) {
	const steps = 600
	a := processCluster(t, trainNodes+1)
	ns := newNamespace(t)
	ctx := context.Background()
	g := NewWithT(t)
	sharedClaim(t, ns, "frozen")
	job := trainingJob(ns, "frozen", "frozen", steps)
	job.Spec.FaultTolerance.RestartMode = trainingv1alpha1.RestartModeInPlace
	g.Expect(k8sClient.Create(ctx, job)).To(Succeed())
	waitRunning(g, job, 0)

	pods := func(g Gomega) map[string]corev1.Pod {
		list := &corev1.PodList{}
		g.Expect(k8sClient.List(ctx, list, client.InNamespace(ns), client.MatchingLabels{trainingv1alpha1.JobNameLabel: job.Name})).To(Succeed())
		out := map[string]corev1.Pod{}
		for _, p := range list.Items {
			out[p.Name] = p
		}
		return out
	}
	rank0Run := func(restarts int32) string {
		b, _ := os.ReadFile(nodeagent.RunLogPath(filepath.Join(a.PodDir(ns, job.Name+"-0-0"), "worker.log"), restarts))
		return string(b)
	}
	// Let it train past a checkpoint.
	g.Eventually(func() int64 { return train.ParseLog(rank0Run(0)).Last }, 2*time.Minute, 20*time.Millisecond).
		Should(BeNumerically(">=", 2*ckptEvery+5), "no progress:\n%s", rank0Run(0))

	before := pods(g)
	victim := job.Name + "-0-1"
	node := a.NodeOf(ns, victim)
	g.Expect(node).NotTo(BeEmpty())
	t.Logf("freezing node %s (rank 1, pod %s)", node, victim)
	frozen := time.Now()
	g.Expect(a.Freeze(node)).To(Succeed())

	// Rank 0 restarts in place (its restart count rises) and its new run trains again.
	var advancing time.Duration
	g.Eventually(func(g Gomega) {
		p := pods(g)[job.Name+"-0-0"]
		s := p.Status.ContainerStatuses
		g.Expect(s).NotTo(BeEmpty())
		restarts := s[0].RestartCount
		g.Expect(restarts).To(BeNumerically(">", 0))
		run := train.ParseLog(rank0Run(restarts))
		g.Expect(run.Last).To(BeNumerically(">", run.Resumed), "rank 0's run %d has not trained yet", restarts)
		advancing = time.Since(frozen)
	}, 2*time.Minute, 50*time.Millisecond).Should(Succeed())

	after := pods(g)
	g.Expect(after).To(HaveLen(len(before)), "pods: %v", after)
	for name, p := range before {
		if name == victim {
			g.Expect(after[name].UID).NotTo(Equal(p.UID), "the frozen rank kept its pod")
			g.Expect(after[name].Spec.NodeName).NotTo(Equal(node), "the new pod landed on the frozen node")
			continue
		}
		g.Expect(after[name].UID).To(Equal(p.UID), "rank pod %s was replaced", name)
	}
	t.Logf("node frozen -> training advancing again: %v (1 pod replaced of %d)", advancing.Round(10*time.Millisecond), len(before))

	done := waitSucceeded(t, job, 5*time.Minute)
	g.Expect(done.Status.Restarts).To(Equal(int32(1)))
	g.Expect(done.Status.PodsReplaced).To(Equal(int32(1)))
	g.Expect(done.Status.QuarantinedNodes).To(ContainElement(HaveField("Name", node)))
	g.Expect(done.Status.LastFailure).NotTo(BeNil())
	t.Logf("last failure %s: %s", done.Status.LastFailure.Reason, done.Status.LastFailure.Message)
}
