package main

import (
	"context"
	"fmt"
	"os"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	trainingv1alpha1 "github.com/zaya-operator/zaya-operator/api/v1alpha1"
	"github.com/zaya-operator/zaya-operator/hack/bench/internal/stats"
	"github.com/zaya-operator/zaya-operator/internal/testjob"
)

// The elastic windows of the resize case: the shortest the API takes, so the table shows the
// operator's and the cluster's time, not the waits a user would choose.
const (
	shrinkAfter = 10 * time.Second
	growAfter   = 10 * time.Second
)

// resizeSample is one elastic job's shrink and grow.
type resizeSample struct {
	shrinkDecided, shrunk time.Duration // node lost → shrink recorded; → every rank of the smaller gang running
	growDecided, grown    time.Duration // a node schedulable again → grow recorded; → every rank running
	width                 int32         // the shrunk gang's
	deleted, created      int           // rank pods of the job, holders not counted
	writes, requests, cpu float64       // the operator's, over the shrink and the grow
}

// resizes measures runs elastic jobs of b.nodes ranks (minNodes half of them) on a cluster with
// no free node: a rank's node is lost, the gang shrinks once the replacement has waited
// shrinkAfter; a cordoned node is made schedulable, the grow holder runs there for growAfter,
// and the gang grows back.
// The operator runs without progress polls (kwok's pods serve none), so the grow waits for no
// checkpoint. Prints one row, prefixed "resize|" for hack/bench-resize.sh.
func (b *bench) resizes(ctx context.Context, suffix string, runs int) {
	var samples []resizeSample
	for i := range runs {
		s := b.resize(ctx, fmt.Sprintf("e%d-%s-%d", b.nodes, suffix, i))
		fmt.Fprintf(os.Stderr, "Elastic run %d: shrink decided %.2fs, %d ranks running %.2fs; grow decided %.2fs, running %.2fs; pods deleted %d created %d, writes %.0f, requests %.0f, cpu %.2fs\n",
			i, s.shrinkDecided.Seconds(), s.width, s.shrunk.Seconds(), s.growDecided.Seconds(), s.grown.Seconds(), s.deleted, s.created, s.writes, s.requests, s.cpu)
		samples = append(samples, s)
	}
	med := func(f func(resizeSample) float64) float64 { return stats.Median(samples, f) }
	// | nodes | runs | lost → shrink decided | shrink decided → smaller gang running | back → grow decided | grow decided → gang running | pods deleted | pods created | writes | requests | CPU |
	fmt.Printf("resize|| %d → %d → %d | %d | %.2f s | %.2f s | %.2f s | %.2f s | %.0f | %.0f | %.0f | %.0f | %.2f s |\n",
		b.nodes, samples[0].width, b.nodes, len(samples),
		med(func(s resizeSample) float64 { return s.shrinkDecided.Seconds() }),
		med(func(s resizeSample) float64 { return (s.shrunk - s.shrinkDecided).Seconds() }),
		med(func(s resizeSample) float64 { return s.growDecided.Seconds() }),
		med(func(s resizeSample) float64 { return (s.grown - s.growDecided).Seconds() }),
		med(func(s resizeSample) float64 { return float64(s.deleted) }), med(func(s resizeSample) float64 { return float64(s.created) }),
		med(func(s resizeSample) float64 { return s.writes }), med(func(s resizeSample) float64 { return s.requests }),
		med(func(s resizeSample) float64 { return s.cpu }))
}

func (b *bench) resize(ctx context.Context, name string) resizeSample {
	job := testjob.MakeZayaTrainingJob(name, b.ns).Nodes(b.nodes).Elastic(max(b.nodes/2, 1), shrinkAfter, growAfter).Obj()
	check(b.c.Create(ctx, job))
	b.waitJob(ctx, name, 10*time.Minute, func(j *trainingv1alpha1.ZayaTrainingJob) bool {
		return j.Status.ReadyNodes == b.nodes && meta.IsStatusConditionTrue(j.Status.Conditions, trainingv1alpha1.ConditionRunning)
	})
	pods := b.pods(ctx, name)
	victim := pods[len(pods)/2]
	// No free node: every node without a rank of the job is cordoned for the run.
	used := map[string]bool{}
	for _, p := range pods {
		used[p.Spec.NodeName] = true
	}
	nodes := &corev1.NodeList{}
	check(b.c.List(ctx, nodes))
	var cordoned []string
	for _, n := range nodes.Items {
		if !used[n.Name] && !n.Spec.Unschedulable {
			b.cordon(ctx, n.Name, true)
			cordoned = append(cordoned, n.Name)
		}
	}
	if len(cordoned) == 0 {
		check(fmt.Errorf("job %s: no node to spare, for capacity to come back on", name))
	}

	var s resizeSample
	count := b.countPods(ctx, name, pods)
	writes, requests, cpu := b.operatorCounts()

	start := time.Now()
	b.loseNode(ctx, victim.Spec.NodeName)
	j := b.waitJob(ctx, name, 10*time.Minute, func(j *trainingv1alpha1.ZayaTrainingJob) bool {
		if j.Status.Resizes >= 1 && s.shrinkDecided == 0 {
			s.shrinkDecided = time.Since(start)
		}
		return j.Status.Resizes == 1 && j.Status.CurrentNodes < b.nodes && j.Status.ReadyNodes == j.Status.CurrentNodes &&
			meta.IsStatusConditionTrue(j.Status.Conditions, trainingv1alpha1.ConditionRunning)
	})
	s.shrunk, s.width = time.Since(start), j.Status.CurrentNodes

	// Capacity comes back as another node: the lost one is kept from the job (quarantined).
	b.cordon(ctx, cordoned[0], false)
	back := time.Now()
	b.waitJob(ctx, name, 10*time.Minute, func(j *trainingv1alpha1.ZayaTrainingJob) bool {
		if j.Status.Resizes >= 2 && s.growDecided == 0 {
			s.growDecided = time.Since(back)
		}
		return j.Status.Resizes == 2 && j.Status.CurrentNodes == b.nodes && j.Status.ReadyNodes == b.nodes &&
			meta.IsStatusConditionTrue(j.Status.Conditions, trainingv1alpha1.ConditionRunning)
	})
	s.grown = time.Since(back)
	w, r, c := b.operatorCounts()
	s.writes, s.requests, s.cpu = w-writes, r-requests, c-cpu
	s.created, s.deleted = count.stop()

	check(b.c.Delete(ctx, job, client.PropagationPolicy(metav1.DeletePropagationForeground)))
	for _, n := range cordoned[1:] {
		b.cordon(ctx, n, false)
	}
	b.restoreNode(ctx, victim.Spec.NodeName)
	b.drain(ctx)
	return s
}

// cordon makes a node unschedulable (true) or schedulable again.
func (b *bench) cordon(ctx context.Context, node string, on bool) {
	patch := fmt.Sprintf(`{"spec":{"unschedulable":%v}}`, on)
	check(b.c.Patch(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: node}}, client.RawPatch(types.MergePatchType, []byte(patch))))
}
