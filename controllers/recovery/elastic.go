package recovery

import (
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"

	"github.com/zaya-operator/zaya-operator/api/contract"
	trainingv1alpha1 "github.com/zaya-operator/zaya-operator/api/v1alpha1"
	"github.com/zaya-operator/zaya-operator/controllers/gang"
	"github.com/zaya-operator/zaya-operator/controllers/liveprogress"
)

// Elastic jobs (spec.elastic). A gang whose ranks have waited for a node (unschedulable) for
// elastic.shrinkAfter restarts on the nodes it still has: the most that keep its
// context-parallel rings whole, never fewer than elastic.minNodes. A shrunk gang holds the
// nodes it misses with pods made as warm spares are (grow holders, the spares past
// faultTolerance.spares); once they have all stood ready for elastic.growAfter, the step the
// gang reached is noted (status.growAtStep) and the gang grows back to spec.nodes when a
// checkpoint at or past it is committed. The workers keep the global batch of spec.nodes
// (ZAYA_TARGET_NODES), so a resize changes no step's mathematics. Both resizes are recreates
// that count no restart against the budget.

// Resize is what an elastic job's gang should do now.
type Resize struct {
	// Nodes is the width to restart at; 0 when no resize is due.
	Nodes int32
	// Reason and Message say why (ReasonShrinking, ReasonGrowing; ReasonCannotShrink with
	// Nodes 0: a shrink is due and cannot happen).
	Reason, Message string
	// Mark is the step the gang grows after (status.growAtStep), when the holders have just
	// stood long enough; Unmark says they no longer stand.
	Mark   *int64
	Unmark bool
	// Wait is when to look again (0: at the next event).
	Wait time.Duration
}

// ShrinkAfter and GrowAfter are elastic's durations, defaulted.
func ShrinkAfter(e *trainingv1alpha1.ElasticSpec) time.Duration {
	if e.ShrinkAfter == nil || e.ShrinkAfter.Duration <= 0 {
		return trainingv1alpha1.DefaultShrinkAfter
	}
	return e.ShrinkAfter.Duration
}

// GrowAfter is elastic.growAfter, defaulted.
func GrowAfter(e *trainingv1alpha1.ElasticSpec) time.Duration {
	if e.GrowAfter == nil || e.GrowAfter.Duration <= 0 {
		return trainingv1alpha1.DefaultGrowAfter
	}
	return e.GrowAfter.Duration
}

// WholeRings is the most nodes, from have down to minNodes, whose GPUs are whole
// context-parallel rings; 0 if none is.
func WholeRings(spec *trainingv1alpha1.ZayaTrainingJobSpec, have int32) int32 {
	cp := max(spec.Parallelism.ContextParallel, 1)
	for w := min(have, spec.Nodes); w >= max(spec.Elastic.MinNodes, 1); w-- {
		if int64(w)*int64(spec.GPUsPerNode)%int64(cp) == 0 {
			return w
		}
	}
	return 0
}

// Shrink says whether the gang restarts on fewer nodes: its ranks that wait for a node have
// waited shrinkAfter, and the placed ones keep whole rings of at least minNodes.
func Shrink(job *trainingv1alpha1.ZayaTrainingJob, g gang.Gang, now time.Time) Resize {
	e := job.Spec.Elastic
	if e == nil || g.Unschedulable == 0 || Refused(&job.Status) {
		return Resize{}
	}
	if wait := g.UnschedulableSince.Add(ShrinkAfter(e)).Sub(now); wait > 0 {
		return Resize{Wait: wait}
	}
	width := job.Width()
	have := width - g.Unschedulable // the ranks that do not wait for a node
	w := WholeRings(&job.Spec, have)
	if w == 0 {
		return Resize{Reason: trainingv1alpha1.ReasonCannotShrink, Message: fmt.Sprintf(
			"%d of %d ranks wait for a node for over %s, and the other %d make no gang of at least elastic.minNodes %d with whole rings of %d GPUs: waiting for capacity",
			g.Unschedulable, width, ShrinkAfter(e), have, e.MinNodes, max(job.Spec.Parallelism.ContextParallel, 1))}
	}
	return Resize{Nodes: w, Reason: trainingv1alpha1.ReasonShrinking, Message: fmt.Sprintf(
		"shrinking from %d to %d nodes: %s, unschedulable for over %s (elastic.shrinkAfter); the gang restarts from its last checkpoint and grows back to %d when nodes stand ready",
		width, w, g.UnschedulableMessage(), ShrinkAfter(e), job.Spec.Nodes)}
}

// Refused says whether the job's trainer refused a shrunk width (contract.ExitNoResize): the
// Shrunk condition says so until the job is suspended.
func Refused(st *trainingv1alpha1.ZayaTrainingJobStatus) bool {
	c := meta.FindStatusCondition(st.Conditions, trainingv1alpha1.ConditionShrunk)
	return c != nil && c.Reason == trainingv1alpha1.ReasonElasticRefused
}

// GrowHolders is how many pods hold nodes for a shrunk gang to grow onto: the nodes it misses.
func GrowHolders(job *trainingv1alpha1.ZayaTrainingJob) int32 {
	if job.Spec.Elastic == nil {
		return 0
	}
	return job.Spec.Nodes - job.Width()
}

// checkpointSteps is spec.checkpoint.interval.steps, 0 when checkpoints are not counted in steps.
func checkpointSteps(job *trainingv1alpha1.ZayaTrainingJob) int64 {
	if c := job.Spec.Checkpoint; c != nil && c.Interval != nil && c.Interval.Steps != nil {
		return int64(max(*c.Interval.Steps, 0))
	}
	return 0
}

// readySince is when pod last became ready; false if it is not ready.
func readySince(pod *corev1.Pod) (time.Time, bool) {
	c := gang.Condition(pod, corev1.PodReady)
	if c == nil || c.Status != corev1.ConditionTrue || !pod.DeletionTimestamp.IsZero() {
		return time.Time{}, false
	}
	return c.LastTransitionTime.Time, true
}

// Grow says whether a shrunk gang grows back to spec.nodes. holders are the job's grow
// holders (spares past faultTolerance.spares); rep is rank 0's latest report of the current
// run, nil when the workers report no progress. Every holder must have stood ready for
// growAfter: one that went away and came back starts its time again, so a node that comes and
// goes is never grown onto. The step then reached is noted, and the gang grows once a
// checkpoint at or past it is committed, so a resize trains nothing again; a gang whose
// workers report no progress grows at once.
func Grow(job *trainingv1alpha1.ZayaTrainingJob, holders []*corev1.Pod, rep *liveprogress.Report, now time.Time) Resize {
	e, st := job.Spec.Elastic, &job.Status
	missing := GrowHolders(job)
	if e == nil || missing <= 0 {
		return Resize{Unmark: st.GrowAtStep != nil}
	}
	after := GrowAfter(e)
	var stood, young int32 // ready for growAfter; ready, not yet for long enough
	var wait time.Duration
	for _, h := range holders {
		since, ok := readySince(h)
		if !ok {
			continue
		}
		if left := since.Add(after).Sub(now); left > 0 {
			wait, young = max(wait, left), young+1
			continue
		}
		stood++
	}
	if stood < missing {
		r := Resize{Unmark: st.GrowAtStep != nil}
		if stood+young >= missing {
			r.Wait = wait // every node is there: look again when the last has stood
		}
		return r
	}
	grow := Resize{Nodes: job.Spec.Nodes, Reason: trainingv1alpha1.ReasonGrowing}
	switch {
	case rep == nil:
		grow.Message = fmt.Sprintf("growing from %d to %d nodes: the %d missing stood ready for %s (elastic.growAfter); the workers report no progress, so the gang restarts from its last checkpoint now",
			job.Width(), job.Spec.Nodes, missing, after)
		return grow
	case job.Spec.Checkpoint == nil && rep.CheckpointStep == 0:
		// No checkpoint to wait for: none named, and the workers have committed none.
		grow.Message = fmt.Sprintf("growing from %d to %d nodes: the %d missing stood ready for %s (elastic.growAfter); the job keeps no checkpoint (spec.checkpoint) to wait for, so the gang restarts now",
			job.Width(), job.Spec.Nodes, missing, after)
		return grow
	case st.GrowAtStep == nil:
		mark := rep.Step + 1
		return Resize{Mark: &mark, Reason: trainingv1alpha1.ReasonCapacityBack, Message: fmt.Sprintf(
			"the %d missing nodes stood ready for %s (elastic.growAfter): growing back to %d nodes once a checkpoint at step %d or later is committed",
			missing, after, job.Spec.Nodes, mark)}
	case rep.CheckpointStep < *st.GrowAtStep:
		mark := min(*st.GrowAtStep, contract.MaxStep) // status others may write: bounded as a report's steps are
		if every := checkpointSteps(job); every == 0 || rep.Step < mark+2*every {
			return Resize{}
		}
		// Two intervals past the mark and no checkpoint: the workers are not making one.
		grow.Message = fmt.Sprintf("growing from %d to %d nodes: no checkpoint was committed in the %d steps since step %d, twice checkpoint.interval.steps; the gang restarts from its last checkpoint",
			job.Width(), job.Spec.Nodes, rep.Step-mark, mark)
		return grow
	}
	grow.Message = fmt.Sprintf("growing from %d to %d nodes at checkpoint step %d: the %d missing stood ready for %s (elastic.growAfter)",
		job.Width(), job.Spec.Nodes, rep.CheckpointStep, missing, after)
	return grow
}
