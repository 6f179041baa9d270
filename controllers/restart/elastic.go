package restart

import (
	"context"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/log"

	trainingv1alpha1 "github.com/zaya-operator/zaya-operator/api/v1alpha1"
	"github.com/zaya-operator/zaya-operator/controllers/bounded"
	"github.com/zaya-operator/zaya-operator/controllers/recovery"
)

// ResizeCategory is the goodput category of the time a grow costs: the gang stops training
// to restart on more nodes.
const ResizeCategory = "Resize"

// Elastic carries out an elastic job's resize verdict (recovery.Shrink, recovery.Grow) and
// reports whether the gang restarts. A resize is a recreate at r.Nodes, from the last
// checkpoint: status.currentNodes takes the width, the attempt moves on (the next pass
// deletes the old pods and makes the new ones), and no restart is counted against the
// budget: the node's loss that led to a shrink was counted when it happened.
func (e *Executor) Elastic(ctx context.Context, r recovery.Resize) bool {
	job := e.Job
	st := &job.Status
	switch {
	case r.Unmark:
		st.GrowAtStep = nil
	case r.Mark != nil:
		if st.GrowAtStep == nil {
			e.Host.Normal(r.Reason, "Resize", "%s", r.Message)
		}
		st.GrowAtStep = r.Mark
	case r.Nodes == 0 && r.Reason == trainingv1alpha1.ReasonCannotShrink:
		shrunk := metav1.ConditionFalse // True while the gang is shrunk, whatever else it cannot do
		if job.Width() < job.Spec.Nodes {
			shrunk = metav1.ConditionTrue
		}
		if e.Host.SetCondition(trainingv1alpha1.ConditionShrunk, shrunk, r.Reason, r.Message) {
			e.Host.Warning(r.Reason, "Resize", "%s", r.Message)
		}
	}
	if r.Nodes == 0 || r.Nodes == job.Width() {
		return false
	}
	from := job.Width()
	if r.Nodes > from {
		// Training stops for the restart: that time is lost to the resize.
		e.Host.Loss().Failed(ctx, trainingv1alpha1.JobFailure{Time: metav1.Time{Time: e.Now}, Reason: r.Reason, Category: ResizeCategory, Attempt: st.Restarts}, nil)
	}
	st.CurrentNodes = r.Nodes
	st.Resizes = bounded.Count(st.Resizes, 1)
	st.GrowAtStep = nil
	st.Restarts = bounded.Count(st.Restarts, 1)
	st.LastRestartMode = trainingv1alpha1.RestartModeRecreate
	st.ReadyNodes = 0
	st.Replacing = nil
	shrunk := metav1.ConditionFalse
	if r.Nodes < job.Spec.Nodes {
		shrunk = metav1.ConditionTrue
	}
	e.Host.SetCondition(trainingv1alpha1.ConditionShrunk, shrunk, r.Reason, r.Message)
	// A shrink during a restart keeps its start: the recovery is timed from the fault.
	e.Host.SetCondition(trainingv1alpha1.ConditionRestarting, metav1.ConditionTrue, r.Reason, r.Message)
	e.Host.SetCondition(trainingv1alpha1.ConditionRunning, metav1.ConditionFalse, r.Reason, r.Message)
	if r.Nodes < from {
		e.Host.Warning(r.Reason, "Resize", "%s", r.Message)
	} else {
		e.Host.Normal(r.Reason, "Resize", "%s", r.Message)
	}
	direction, attempt := "shrink", st.Attempt()
	if r.Nodes > from {
		direction = "grow"
	}
	e.Host.WhenStored(func() {
		resizesTotal.WithLabelValues(direction).Inc()
		log.FromContext(ctx).Info("resizing the gang", "from", from, "to", r.Nodes, "attempt", attempt)
	})
	return true
}
