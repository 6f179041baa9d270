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

	trainingv1alpha1 "github.com/zaya-operator/zaya-operator/api/v1alpha1"
	"github.com/zaya-operator/zaya-operator/internal/testjob"
)

// failoverTimeout covers a crashed leader's Lease running out (15 s) and the follower's
// launch or recovery after it.
const failoverTimeout = 60 * time.Second

// TestFollowerFinishesWhatTheCrashedLeaderStarted runs two operator replicas with leader
// election, crashes the leader (SIGKILL: no lease released) in the middle of a launch and
// again in the middle of a gang restart, and checks that the follower finishes each exactly
// once: one pod per rank, one restart counted, the job Running.
func TestFollowerFinishesWhatTheCrashedLeaderStarted(t *testing.T) {
	g := NewWithT(t)
	ns := newNamespace(t)
	pauseSuiteOperator(t)
	id := fmt.Sprintf("failover-%d", time.Now().UnixNano()%100000)
	flags := []string{"--leader-elect", "--leader-election-namespace=" + ns, "--leader-election-id=" + id}
	replicas := []*operatorProcess{}
	start := func() {
		o, err := startOperator(flags...)
		g.Expect(err).NotTo(HaveOccurred())
		replicas = append(replicas, o)
		t.Cleanup(o.stop)
	}
	leader := func() *operatorProcess {
		var l *operatorProcess
		g.Eventually(func() *operatorProcess {
			for _, o := range replicas {
				select {
				case <-o.exited:
					continue
				default:
				}
				if strings.Contains(strings.ToLower(o.log()), "successfully acquired lease") {
					l = o
					return o
				}
			}
			return nil
		}, failoverTimeout, interval).ShouldNot(BeNil(), "no replica became leader")
		return l
	}
	start()
	start()
	first := leader()

	// Mid-launch: the leader has created the gang (or part of it) and dies before the job runs.
	job := testjob.MakeZayaTrainingJob("failover", ns).Nodes(8).Obj()
	g.Expect(k8sClient.Create(context.Background(), job)).To(Succeed())
	g.Eventually(func() int { return len(rankPods(g, job, 0)) }, timeout, 10*time.Millisecond).Should(BeNumerically(">", 0))
	first.kill()
	t.Logf("leader killed mid-launch: %d of 8 pods existed, job Running: %v", len(rankPods(g, job, 0)),
		meta.IsStatusConditionTrue(getJob(g, job).Status.Conditions, trainingv1alpha1.ConditionRunning))

	second := leader()
	g.Expect(second).NotTo(BeIdenticalTo(first))
	got := waitRunningWithin(g, job, 0, failoverTimeout)
	g.Expect(got.Status.Restarts).To(BeZero())
	g.Expect(jobPodCount(g, job)).To(Equal(8), "one pod per rank, none twice")

	// Mid-recovery: a rank fails, the leader decides the restart and dies; a fresh replica
	// joins as the follower.
	start()
	exitWorker(g, rankPods(g, job, 0)["3"], 1)
	g.Eventually(func() int32 { return getJob(g, job).Status.Restarts }, timeout, 10*time.Millisecond).Should(Equal(int32(1)))
	second.kill()
	third := leader()
	g.Expect(third).NotTo(BeIdenticalTo(second))
	got = waitRunningWithin(g, job, 1, failoverTimeout)
	g.Expect(got.Status.Restarts).To(Equal(int32(1)), "the restart was counted twice")
	g.Expect(got.Status.RestartTimes).To(HaveLen(1))
	g.Expect(len(rankPods(g, job, 1))).To(Equal(8))
	g.Expect(rankPods(g, job, 2)).To(BeEmpty(), "a second restart happened")
}

// jobPodCount counts the job's live pods of every attempt.
func jobPodCount(g Gomega, job *trainingv1alpha1.ZayaTrainingJob) int {
	n := 0
	for a := range getJob(g, job).Status.Restarts + 1 {
		n += len(rankPods(g, job, a))
	}
	return n
}

// waitRunningWithin waits, up to within, for the job to run attempt `attempt` with every
// rank ready.
func waitRunningWithin(g Gomega, job *trainingv1alpha1.ZayaTrainingJob, attempt int32, within time.Duration) *trainingv1alpha1.ZayaTrainingJob {
	var got *trainingv1alpha1.ZayaTrainingJob
	g.Eventually(func(g Gomega) {
		got = getJob(g, job)
		g.Expect(got.Status.Restarts).To(Equal(attempt))
		g.Expect(got.Status.ReadyNodes).To(Equal(job.Spec.Nodes))
		g.Expect(meta.IsStatusConditionTrue(got.Status.Conditions, trainingv1alpha1.ConditionRunning)).To(BeTrue())
	}, within, interval).Should(Succeed())
	return got
}
