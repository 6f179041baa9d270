//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	trainingv1alpha1 "github.com/zaya-operator/zaya-operator/api/v1alpha1"
	"github.com/zaya-operator/zaya-operator/workers/train"
)

// elasticSteps is long enough, at 10 ms a step, for a node's loss, a shrink, a node's return
// and a grow to happen while the job trains.
const elasticSteps = 3000

// elasticJob is the reference worker on 4 process nodes of 1 rank each, without context
// parallelism (a gang of 3 keeps whole rings), paced to 10 ms a step.
func elasticJob(procs processNodes, ns, name string, pace string, steps int) *trainingv1alpha1.ZayaTrainingJob {
	job := trainingJob(procs, ns, name, name, steps)
	job.Spec.Nodes, job.Spec.Parallelism.ContextParallel = 4, 1
	w := &job.Spec.Template.Spec.Containers[0]
	w.Args = append(w.Args, "-pace="+pace, "-log-every=10")
	return job
}

// cordon makes a node unschedulable (true) or schedulable again.
func cordon(g Gomega, node string, on bool) {
	patch := fmt.Sprintf(`{"spec":{"unschedulable":%v}}`, on)
	g.Expect(k8sClient.Patch(context.Background(), &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: node}},
		client.RawPatch(types.MergePatchType, []byte(patch)))).To(Succeed())
}

// TestAnElasticJobShrinksAndGrowsBackBitIdentical: a 4-node job of elastic.minNodes 2 loses
// a node while the cluster's only other node is cordoned. Within shrinkAfter and a restart it
// trains on 3; the node is uncordoned and, once its holder stood growAfter, the gang grows
// back to 4 at its next checkpoint. The job ends with the parameters of a run that never
// lost a node. The same job without elastic, with a node lost, waits for capacity.
func TestAnElasticJobShrinksAndGrowsBackBitIdentical(t *testing.T) {
	kwokOnly(t, "resizes are the operator's decisions, not the kubelet's: the kind suite's time goes to what real kubelets do")
	a := processCluster(t, 5)
	procs := kwokProcesses{a}
	spare := a.Nodes()[4]
	g := NewWithT(t)
	ctx := context.Background()
	cordon(g, spare, true) // the cluster has no free node
	ns := newNamespace(t)

	// Uninterrupted, unpaced: the pace changes no step.
	procs.sharedClaim(t, ns, "ref")
	ref := elasticJob(procs, ns, "ref", "0s", elasticSteps)
	g.Expect(k8sClient.Create(ctx, ref)).To(Succeed())
	began := time.Now()
	waitSucceeded(t, ref, 5*time.Minute)
	t.Logf("uninterrupted: %d steps on 4 nodes in %v", elasticSteps, time.Since(began).Round(time.Millisecond))
	want, err := os.ReadFile(filepath.Join(a.VolumeDir(ns, "ref"), "final-params"))
	g.Expect(err).NotTo(HaveOccurred())

	procs.sharedClaim(t, ns, "el")
	job := elasticJob(procs, ns, "el", "10ms", elasticSteps)
	job.Spec.Elastic = &trainingv1alpha1.ElasticSpec{MinNodes: 2,
		ShrinkAfter: &metav1.Duration{Duration: 10 * time.Second}, GrowAfter: &metav1.Duration{Duration: 10 * time.Second}}
	g.Expect(k8sClient.Create(ctx, job)).To(Succeed())
	waitRunning(g, job, 0)
	g.Eventually(func() int64 { return train.ParseLog(rank0Log(a, job, 0)).Last }, time.Minute, 20*time.Millisecond).
		Should(BeNumerically(">=", 2*ckptEvery+5), "no progress:\n%s", rank0Log(a, job, 0))

	lost := procs.nodeOf(ns, "el-0-2")
	t.Logf("node %s (rank 2) goes down; %s, the only other node, is cordoned", lost, spare)
	down := time.Now()
	procs.down(t, g, lost)

	var shrunk *trainingv1alpha1.ZayaTrainingJob
	g.Eventually(func(g Gomega) {
		shrunk = getJob(g, job)
		g.Expect(shrunk.Status.CurrentNodes).To(Equal(int32(3)))
		g.Expect(meta.IsStatusConditionTrue(shrunk.Status.Conditions, trainingv1alpha1.ConditionRunning)).To(BeTrue())
		run := train.ParseLog(rank0Log(a, job, shrunk.Status.Attempt()))
		g.Expect(run.Last).To(BeNumerically(">", run.Resumed), "the shrunk gang has not trained yet")
	}, 2*time.Minute, 50*time.Millisecond).Should(Succeed())
	t.Logf("node lost -> training on 3 nodes: %v (elastic.shrinkAfter 10s)", time.Since(down).Round(10*time.Millisecond))
	for _, p := range rankPods(g, job, shrunk.Status.Attempt()) {
		env := map[string]string{}
		for _, e := range p.Spec.Containers[0].Env {
			env[e.Name] = e.Value
		}
		g.Expect([]string{env["NNODES"], env["WORLD_SIZE"], env["ZAYA_TARGET_NODES"]}).To(Equal([]string{"3", "3", "4"}), "pod %s", p.Name)
	}
	shrunkAttempt := shrunk.Status.Attempt()

	cordon(g, spare, false)
	back := time.Now()
	var grown *trainingv1alpha1.ZayaTrainingJob
	g.Eventually(func(g Gomega) {
		grown = getJob(g, job)
		g.Expect(grown.Status.CurrentNodes).To(Equal(int32(4)))
		g.Expect(grown.Status.ReadyNodes).To(Equal(int32(4)))
	}, 2*time.Minute, 50*time.Millisecond).Should(Succeed())
	t.Logf("node schedulable again -> gang of 4 running: %v (elastic.growAfter 10s, then the next checkpoint)", time.Since(back).Round(10*time.Millisecond))

	// The grow came at a checkpoint: the grown gang resumed from the step it grew at, and
	// the shrunk run trained nothing past it.
	var grewAt int64 = -1
	events := &eventsv1.EventList{}
	g.Expect(k8sClient.List(ctx, events, client.InNamespace(ns))).To(Succeed())
	for _, e := range events.Items {
		if e.Regarding.Name == job.Name && e.Reason == trainingv1alpha1.ReasonGrowing {
			if _, at, ok := strings.Cut(e.Note, " at checkpoint step "); ok {
				_, _ = fmt.Sscanf(at, "%d", &grewAt)
			}
		}
	}
	g.Expect(grewAt).To(BeNumerically(">", 0), "no Growing event names its checkpoint")
	shrunkRun := train.ParseLog(rank0Log(a, job, shrunkAttempt))
	g.Expect(slices.Contains(shrunkRun.Committed, grewAt)).To(BeTrue(), "the shrunk run never committed step %d: %v", grewAt, shrunkRun.Committed)
	g.Eventually(func() int64 { return train.ParseLog(rank0Log(a, job, grown.Status.Attempt())).Resumed }, time.Minute, interval).
		Should(BeNumerically(">=", grewAt))
	t.Logf("grew at checkpoint %d; the shrunk run reached step %d (%d steps past it, trained again by the gang of 4)", grewAt, shrunkRun.Last, shrunkRun.Last-grewAt)

	done := waitSucceeded(t, job, 5*time.Minute)
	got, err := os.ReadFile(filepath.Join(a.VolumeDir(ns, "el"), "final-params"))
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(got).To(Equal(want), "4 -> 3 -> 4 nodes ended with other parameters than the run that never shrank")
	g.Expect(done.Status.Resizes).To(Equal(int32(2)))
	g.Expect(done.Status.RestartTimes).To(HaveLen(1), "only the node's loss counts against the budget")
	t.Logf("goodput %s; lost %+v", done.Status.Goodput.EffectiveTrainingTime, done.Status.Goodput.Lost)

	// Without elastic, the same loss leaves the job waiting for its fourth node.
	down2 := procs.nodeOf(ns, "el-2-1")
	cordon(g, down2, true) // 3 schedulable nodes remain for a 4-node gang
	procs.sharedClaim(t, ns, "plain")
	plain := elasticJob(procs, ns, "plain", "10ms", elasticSteps)
	g.Expect(k8sClient.Create(ctx, plain)).To(Succeed())
	g.Eventually(func(g Gomega) {
		got := getJob(g, plain)
		g.Expect(meta.IsStatusConditionTrue(got.Status.Conditions, trainingv1alpha1.ConditionWaitingForCapacity)).To(BeTrue())
	}, time.Minute, interval).Should(Succeed())
	g.Consistently(func(g Gomega) {
		got := getJob(g, plain)
		g.Expect(got.Status.CurrentNodes).To(Equal(int32(4)))
		g.Expect(got.Status.Restarts).To(BeZero())
		g.Expect(meta.IsStatusConditionTrue(got.Status.Conditions, trainingv1alpha1.ConditionWaitingForCapacity)).To(BeTrue())
	}, 15*time.Second, time.Second).Should(Succeed())
	g.Expect(k8sClient.Delete(ctx, plain)).To(Succeed())
}

// TestElasticGoodputBench is a measurement for BENCHMARKS.md, not a check make test runs: the
// same schedule for the job with and without elastic, each on a cluster of its own with no
// free node. A node is lost at step 100; ZAYA_E2E_ELASTIC_DOWN later (default 60s) another
// node becomes schedulable; the job trains on for about 90 s of steps more. hack/bench-elastic.sh runs it (ZAYA_E2E_ELASTIC_BENCH=1).
func TestElasticGoodputBench(t *testing.T) {
	if os.Getenv("ZAYA_E2E_ELASTIC_BENCH") != "1" {
		t.Skip("a measurement: hack/bench-elastic.sh runs it")
	}
	down := time.Minute
	if v := os.Getenv("ZAYA_E2E_ELASTIC_DOWN"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil {
			t.Fatal(err)
		}
		down = d
	}
	// Long enough to train past the node's return and a grow: ~13 ms a step on a 2-core machine.
	steps := int((down + 90*time.Second) / (10 * time.Millisecond))
	for _, elastic := range []bool{false, true} {
		t.Run(fmt.Sprintf("elastic=%v", elastic), func(t *testing.T) {
			a := processCluster(t, 5)
			procs := kwokProcesses{a}
			spare := a.Nodes()[4]
			g := NewWithT(t)
			ctx := context.Background()
			cordon(g, spare, true)
			ns := newNamespace(t)
			procs.sharedClaim(t, ns, "job")
			job := elasticJob(procs, ns, "job", "10ms", steps)
			if elastic {
				job.Spec.Elastic = &trainingv1alpha1.ElasticSpec{MinNodes: 2,
					ShrinkAfter: &metav1.Duration{Duration: 10 * time.Second}, GrowAfter: &metav1.Duration{Duration: 10 * time.Second}}
			}
			began := time.Now()
			g.Expect(k8sClient.Create(ctx, job)).To(Succeed())
			waitRunning(g, job, 0)
			g.Eventually(func() int64 { return train.ParseLog(rank0Log(a, job, 0)).Last }, time.Minute, 20*time.Millisecond).Should(BeNumerically(">=", 100))
			procs.down(t, g, procs.nodeOf(ns, "job-0-2"))
			time.Sleep(down)
			cordon(g, spare, false)
			done := waitSucceeded(t, job, 10*time.Minute)
			gp := done.Status.Goodput
			t.Logf("elastic %v, node lost for %v: %d steps in %v, goodput %s (training %.1f s, lost %.1f s: %+v), resizes %d, restarts %d",
				elastic, down, steps, time.Since(began).Round(100*time.Millisecond), gp.EffectiveTrainingTime,
				float64(gp.TrainingMilliseconds)/1000, float64(gp.LostMilliseconds)/1000, gp.Lost, done.Status.Resizes, done.Status.Restarts)
		})
	}
}

// TestATrainerThatCannotResizeGetsItsFullGangBack: the same shrink for a trainer that cannot
// train at another width (the reference worker's -fixed-width). Its workers on the shrunk gang
// exit ExitNoResize; the operator gives the job its 4 nodes back and waits for capacity there,
// shrinks it no more, and the job trains on once a node is free.
func TestATrainerThatCannotResizeGetsItsFullGangBack(t *testing.T) {
	kwokOnly(t, "a refusal is the operator's reading of an exit code: the kind suite's time goes to what real kubelets do")
	a := processCluster(t, 5)
	procs := kwokProcesses{a}
	spare := a.Nodes()[4]
	g := NewWithT(t)
	ctx := context.Background()
	cordon(g, spare, true)
	ns := newNamespace(t)
	procs.sharedClaim(t, ns, "fixed")
	job := elasticJob(procs, ns, "fixed", "10ms", 1000)
	w := &job.Spec.Template.Spec.Containers[0]
	w.Args = append(w.Args, "-fixed-width")
	job.Spec.Elastic = &trainingv1alpha1.ElasticSpec{MinNodes: 2,
		ShrinkAfter: &metav1.Duration{Duration: 10 * time.Second}, GrowAfter: &metav1.Duration{Duration: 10 * time.Second}}
	g.Expect(k8sClient.Create(ctx, job)).To(Succeed())
	waitRunning(g, job, 0)
	g.Eventually(func() int64 { return train.ParseLog(rank0Log(a, job, 0)).Last }, time.Minute, 20*time.Millisecond).
		Should(BeNumerically(">=", ckptEvery+5), "no progress:\n%s", rank0Log(a, job, 0))

	procs.down(t, g, procs.nodeOf(ns, "fixed-0-2"))
	var refused *trainingv1alpha1.ZayaTrainingJob
	g.Eventually(func(g Gomega) {
		refused = getJob(g, job)
		c := meta.FindStatusCondition(refused.Status.Conditions, trainingv1alpha1.ConditionShrunk)
		g.Expect(c).NotTo(BeNil())
		g.Expect(c.Reason).To(Equal(trainingv1alpha1.ReasonElasticRefused))
		g.Expect(c.Status).To(Equal(metav1.ConditionFalse))
	}, 2*time.Minute, 50*time.Millisecond).Should(Succeed())
	g.Expect(refused.Status.CurrentNodes).To(Equal(int32(4)))
	g.Expect(refused.Status.Resizes).To(Equal(int32(2)), "a shrink, then the full width back")
	g.Expect(refused.Status.RestartTimes).To(HaveLen(1), "only the node's loss counts against the budget")
	shrunkAttempt := refused.Status.Attempt() - 1
	g.Expect(rank0Log(a, job, shrunkAttempt)).To(ContainSubstring("-fixed-width"), "the shrunk gang's rank 0 did not refuse")
	t.Logf("the shrunk gang refused its width; back to 4 nodes: %s", meta.FindStatusCondition(refused.Status.Conditions, trainingv1alpha1.ConditionShrunk).Message)

	// No capacity, and no second shrink: the job waits at its full width past shrinkAfter.
	g.Eventually(func(g Gomega) {
		g.Expect(meta.IsStatusConditionTrue(getJob(g, job).Status.Conditions, trainingv1alpha1.ConditionWaitingForCapacity)).To(BeTrue())
	}, time.Minute, interval).Should(Succeed())
	g.Consistently(func(g Gomega) {
		got := getJob(g, job)
		g.Expect(got.Status.CurrentNodes).To(Equal(int32(4)))
		g.Expect(got.Status.Resizes).To(Equal(int32(2)))
	}, 15*time.Second, time.Second).Should(Succeed())

	cordon(g, spare, false)
	done := waitSucceeded(t, job, 5*time.Minute)
	g.Expect(done.Status.Resizes).To(Equal(int32(2)))
	g.Expect(done.Status.CurrentNodes).To(Equal(int32(4)))
}
