//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	trainingv1alpha1 "github.com/zaya-operator/zaya-operator/api/v1alpha1"
	"github.com/zaya-operator/zaya-operator/workers/train"
)

// TestAFrozenNodesRankIsReplacedAlone: a node hangs while the gang trains (its kubelet stops
// renewing its Lease, its processes freeze with their sockets open, and nothing marks it
// NotReady). Its peers find the rank silent and stop, the gang restarts in place, the node's
// Lease lapses, and only that rank gets a new pod, same name, on another node; the other
// ranks keep their pods, training advances again from the last checkpoint, the job
// completes with one restart counted, and the frozen node is quarantined. With a warm spare
// held, the new pod goes to the spare's node and a spare is held again afterwards. The log
// lines give the time from the freeze to training steps advancing again, each way.
//
// Without a spare the worker runs alone, rank 1's node freezes and the node's Lease decides.
// With one, rank 0's node freezes, the gang watch's hub with it, under the injected
// zaya-supervisor, whose silence to the operator while a peer's answers decides at once,
// before the Lease lapses (docs/design/fast-node-loss.md); the node then comes back while the
// new gang trains, and the old rank's processes neither disturb it nor write a checkpoint,
// and are gone once their kubelet learns their pod was replaced.
func TestAFrozenNodesRankIsReplacedAlone(t *testing.T) {
	for _, spares := range []int32{0, 1} {
		t.Run(fmt.Sprintf("spares=%d", spares), func(t *testing.T) {
			frozenNodeRun(t, spares)
		})
	}
}

func frozenNodeRun(t *testing.T, spares int32) {
	const steps = 600
	// The gang, a node for the frozen rank's new pod, and one more per spare (the spare the
	// new pod takes is held again elsewhere). On kwok a cluster of its own: the frozen node
	// stays frozen (and schedulable) until it ends.
	// The supervised run's nodes hold a kubelet's 40 s Lease, so that the Lease cannot decide
	// before the operator asks (its half lapses 20 s after the last renewal; the peers are
	// back 6–8 s after the freeze).
	supervised := spares > 0
	nodes := w.processes
	if supervised {
		nodes = w.kubeletProcesses
	}
	procs := nodes(t, int(trainNodes)+1+int(spares))
	ns := newNamespace(t)
	ctx := context.Background()
	g := NewWithT(t)
	dir := procs.sharedClaim(t, ns, "frozen")
	job := trainingJob(procs, ns, "frozen", "frozen", steps)
	job.Spec.FaultTolerance.RestartMode = trainingv1alpha1.RestartModeInPlace
	job.Spec.FaultTolerance.Spares = spares
	if supervised {
		job.Spec.FaultTolerance.Supervisor = trainingv1alpha1.SupervisorInject
		procs.inject(t, &job.Spec.Template.Spec.Containers[0])
	}
	g.Expect(k8sClient.Create(ctx, job)).To(Succeed())
	waitRunning(g, job, 0)

	// The ranks' pods, and the spares' apart.
	pods := func(g Gomega) (ranks, spareNodes map[string]corev1.Pod) {
		list := &corev1.PodList{}
		g.Expect(k8sClient.List(ctx, list, client.InNamespace(ns), client.MatchingLabels{trainingv1alpha1.JobNameLabel: job.Name})).To(Succeed())
		ranks, spareNodes = map[string]corev1.Pod{}, map[string]corev1.Pod{}
		for _, p := range list.Items {
			if _, spare := p.Labels[trainingv1alpha1.SpareLabel]; spare {
				if p.DeletionTimestamp.IsZero() && p.Spec.NodeName != "" {
					spareNodes[p.Spec.NodeName] = p
				}
				continue
			}
			ranks[p.Name] = p
		}
		return ranks, spareNodes
	}
	rank0Run := func(restarts int32) string { return procs.runLog(ns, job.Name+"-0-0", restarts) }
	// Let it train past a checkpoint, with its spares held.
	g.Eventually(func() int64 { return train.ParseLog(rank0Run(0)).Last }, 2*time.Minute, 20*time.Millisecond).
		Should(BeNumerically(">=", 2*ckptEvery+5), "no progress:\n%s", rank0Run(0))
	g.Eventually(func() int32 { return getJob(g, job).Status.ReadySpares }, time.Minute, interval).Should(Equal(spares))

	before, heldOn := pods(g)
	// The supervised run freezes rank 0's node: the gang watch's hub freezes with it.
	victimRank := 1
	if supervised {
		victimRank = 0
	}
	victim := fmt.Sprintf("%s-0-%d", job.Name, victimRank)
	node := procs.nodeOf(ns, victim)
	g.Expect(node).NotTo(BeEmpty())
	oldAttempt := newestAttempt(g, dir)
	t.Logf("freezing node %s (rank %d, pod %s, checkpoint attempt %d)", node, victimRank, victim, oldAttempt)
	if supervised {
		g.Expect(procs.running(g, node)).To(ContainElement(string(before[victim].UID)), "the victim's processes are not seen where they run")
	}
	frozen := time.Now()
	procs.freeze(t, g, node)

	// Rank 0 restarts (in place, its restart count rising, or in a new pod) and its new run
	// trains again from a checkpoint.
	var advancing time.Duration
	g.Eventually(func(g Gomega) {
		ranks, _ := pods(g)
		p := ranks[job.Name+"-0-0"]
		s := p.Status.ContainerStatuses
		g.Expect(s).NotTo(BeEmpty())
		restarts := s[0].RestartCount
		g.Expect(restarts > 0 || p.UID != before[p.Name].UID).To(BeTrue(), "rank 0 has not restarted")
		run := train.ParseLog(rank0Run(restarts))
		g.Expect(run.Resumed).To(BeNumerically(">", 0), "rank 0's new run has not resumed")
		g.Expect(run.Last).To(BeNumerically(">", run.Resumed), "rank 0's run %d has not trained yet", restarts)
		advancing = time.Since(frozen)
	}, 2*time.Minute, 50*time.Millisecond).Should(Succeed())
	var written []string
	if supervised {
		// The node comes back while the new gang trains (a partition that heals): the
		// replaced rank's processes, its hub's included, run on from where they froze until
		// its kubelet stops them. They must not disturb the new gang (one restart in all) nor
		// write a checkpoint file (the worker's fences).
		written = attemptFiles(g, dir, oldAttempt)
		procs.thaw(t, g, node)
		g.Eventually(func(g Gomega) []string { return procs.running(g, node) }, time.Minute, interval).
			ShouldNot(ContainElement(string(before[victim].UID)), "the replaced rank's processes outlived its node's return")
		t.Logf("node %s back; its replaced rank's processes gone %v after the freeze", node, time.Since(frozen).Round(10*time.Millisecond))
	}

	after, _ := pods(g)
	g.Expect(after).To(HaveLen(len(before)), "pods: %v", after)
	for name, p := range before {
		if name == victim {
			g.Expect(after[name].UID).NotTo(Equal(p.UID), "the frozen rank kept its pod")
			g.Expect(after[name].Spec.NodeName).NotTo(Equal(node), "the new pod landed on the frozen node")
			if spares > 0 {
				g.Expect(heldOn).To(HaveKey(after[name].Spec.NodeName), "the new pod did not take a spare's node")
			}
			continue
		}
		g.Expect(after[name].UID).To(Equal(p.UID), "rank pod %s was replaced", name)
	}
	t.Logf("spares %d, supervised %t: node frozen -> training advancing again: %v (1 pod replaced of %d)", spares, supervised, advancing.Round(10*time.Millisecond), len(before))
	if spares > 0 {
		// Replenished, off the frozen node and the taken one.
		g.Eventually(func(g Gomega) {
			_, held := pods(g)
			g.Expect(held).To(HaveLen(int(spares)))
			g.Expect(held).NotTo(HaveKey(node))
			g.Expect(getJob(g, job).Status.ReadySpares).To(Equal(spares))
		}, time.Minute, interval).Should(Succeed())
	}

	done := waitSucceeded(t, job, 5*time.Minute)
	g.Expect(done.Status.Restarts).To(Equal(int32(1)))
	g.Expect(done.Status.PodsReplaced).To(Equal(int32(1)))
	g.Expect(done.Status.SparesTaken).To(Equal(spares))
	g.Expect(done.Status.QuarantinedNodes).To(ContainElement(HaveField("Name", node)))
	g.Expect(done.Status.LastFailure).NotTo(BeNil())
	t.Logf("last failure %s: %s", done.Status.LastFailure.Reason, done.Status.LastFailure.Message)
	decided := "stopped renewing its Lease"
	if supervised {
		decided = "its supervisor did not answer the operator while a peer's did"
	}
	g.Expect(done.Status.LastFailure.Reason).To(Equal(trainingv1alpha1.FailureReasonNodeLost))
	g.Expect(done.Status.LastFailure.Message).To(ContainSubstring(decided))
	if supervised {
		g.Expect(written).To(ContainElements(attemptFiles(g, dir, oldAttempt)), "the replaced rank's old run wrote checkpoint files after its node came back")
	}
	_, held := pods(g)
	g.Eventually(func(g Gomega) map[string]corev1.Pod { _, held = pods(g); return held }, time.Minute, interval).Should(BeEmpty(), "spares outlived the job")
}

// newestAttempt is the newest gang attempt that fenced the checkpoint folder (-1: none):
// workers/checkpoint names every file it writes with its attempt.
func newestAttempt(g Gomega, dir string) int {
	fences, err := filepath.Glob(filepath.Join(dir, "attempt-*"))
	g.Expect(err).NotTo(HaveOccurred())
	newest := -1
	for _, f := range fences {
		if n, err := strconv.Atoi(strings.TrimPrefix(filepath.Base(f), "attempt-")); err == nil {
			newest = max(newest, n)
		}
	}
	return newest
}

// attemptFiles are the checkpoint files (shards, shard lists, manifests) attempt wrote in dir.
func attemptFiles(g Gomega, dir string, attempt int) []string {
	files, err := filepath.Glob(filepath.Join(dir, "step-*", fmt.Sprintf("*.a%d.*", attempt)))
	g.Expect(err).NotTo(HaveOccurred())
	return files
}
