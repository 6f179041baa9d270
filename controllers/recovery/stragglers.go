package recovery

import (
	"fmt"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	trainingv1alpha1 "github.com/zaya-operator/zaya-operator/api/v1alpha1"
	"github.com/zaya-operator/zaya-operator/controllers/attribution"
	"github.com/zaya-operator/zaya-operator/controllers/bounded"
	"github.com/zaya-operator/zaya-operator/controllers/gang"
	"github.com/zaya-operator/zaya-operator/controllers/liveprogress"
)

// Stragglers: a rank whose steps keep it busy longer than the other ranks' median by
// faultTolerance.stragglers.marginPercent, in several of rank 0's reports in a row
// (liveprogress), holds back every step of the gang. The job says so (condition Straggling,
// an event naming the node); with action Replace, once a checkpoint is committed after it was
// found (so the replacement trains nothing again), its pod is replaced away from the node,
// which the job quarantines, as a failure of category Straggler.

// Straggling is what rank 0's latest report says of stragglers.
type Straggling struct {
	// Message is the Straggling condition's: which rank straggles, or that none does.
	Message string
	// Found says a rank straggles; Detail is the warning that names it and its node.
	Found  bool
	Detail string
	// Replace is the verdict that replaces the straggler, when that is due.
	Replace *Verdict
}

// Stragglers reads rank 0's latest report (rep) of the run that trains since trainingSince;
// false while there is no word from it (a report of the run before, or a loss still open).
func Stragglers(job *trainingv1alpha1.ZayaTrainingJob, g gang.Gang, rep *liveprogress.Report, trainingSince, now time.Time) (Straggling, bool) {
	if gp := job.Status.Goodput; rep == nil || (gp != nil && gp.Open != nil) || rep.TrainingSince.Before(trainingSince) {
		return Straggling{}, false
	}
	margin := StragglerMargin(&job.Spec.FaultTolerance)
	s := rep.Straggler
	if s == nil || s.Rank >= len(g.Ranks) || g.Ranks[s.Rank] == nil {
		return Straggling{Message: fmt.Sprintf("no rank is busier per step than the others' median by more than %d%%", margin)}, true
	}
	pod := g.Ranks[s.Rank]
	out := Straggling{
		Found: true,
		Message: fmt.Sprintf("rank %d (pod %s on node %s) is busier per step than the other ranks' median by more than %d%%, in %d reports in a row since step %d",
			s.Rank, pod.Name, pod.Spec.NodeName, margin, liveprogress.StragglerReports, s.Step),
		Detail: fmt.Sprintf("straggler: rank %d (pod %s) on node %s is busy %.3fs per step, the other ranks %.3fs (median)",
			s.Rank, pod.Name, pod.Spec.NodeName, s.Seconds, s.Others),
	}
	if job.Spec.FaultTolerance.Stragglers.Action != trainingv1alpha1.StragglerActionReplace || rep.CheckpointStep < s.Step {
		return out, true
	}
	f := trainingv1alpha1.JobFailure{
		Time: metav1.Time{Time: now}, Reason: trainingv1alpha1.FailureReasonStraggler, Category: string(attribution.Straggler),
		Attempt: job.Status.Restarts, Node: pod.Spec.NodeName, Rank: ptr.To(int32(s.Rank)),
		Message: bounded.Message(fmt.Sprintf("%s: replaced after checkpoint step %d (faultTolerance.stragglers.action Replace)", out.Message, rep.CheckpointStep)),
	}
	out.Replace = &Verdict{Failure: f, Counted: true, Pod: pod}
	return out, true
}

// StragglerMargin is faultTolerance.stragglers.marginPercent, defaulted.
func StragglerMargin(ft *trainingv1alpha1.FaultToleranceSpec) int32 {
	if ft.Stragglers.MarginPercent <= 0 {
		return trainingv1alpha1.DefaultStragglerMarginPercent
	}
	return ft.Stragglers.MarginPercent
}
