package controllers

import (
	"fmt"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	trainingv1alpha1 "github.com/zaya-operator/zaya-operator/api/v1alpha1"
	"github.com/zaya-operator/zaya-operator/controllers/attribution"
	"github.com/zaya-operator/zaya-operator/controllers/bounded"
	"github.com/zaya-operator/zaya-operator/controllers/gang"
	"github.com/zaya-operator/zaya-operator/controllers/liveprogress"
	"github.com/zaya-operator/zaya-operator/controllers/recovery"
)

// Stragglers: a rank whose steps keep it busy longer than the other ranks' median by
// faultTolerance.stragglers.marginPercent, in several of rank 0's reports in a row
// (liveprogress), holds back every step of the gang. The job says so (condition Straggling,
// an event naming the node); with action Replace, once a checkpoint is committed after it was
// found (so the replacement trains nothing again), its pod is replaced away from the node,
// which the job quarantines, as a failure of category Straggler.

// judgeStragglers sets the Straggling condition from rank 0's latest report and returns the
// verdict that replaces the straggler, when that is due.
func (p *pass) judgeStragglers(g gang.Gang) *recovery.Verdict {
	rep := p.report
	if gp := p.job.Status.Goodput; rep == nil || (gp != nil && gp.Open != nil) || rep.TrainingSince.Before(p.ledger().TrainingSince()) {
		return nil // no word yet from the run that trains now: a report of the one before is no news
	}
	margin := stragglerMargin(&p.job.Spec.FaultTolerance)
	s := rep.Straggler
	if s == nil || s.Rank >= len(g.Ranks) || g.Ranks[s.Rank] == nil {
		p.clearCondition(trainingv1alpha1.ConditionStraggling, trainingv1alpha1.ReasonNoStraggler,
			fmt.Sprintf("no rank is busier per step than the others' median by more than %d%%", margin))
		return nil
	}
	pod := g.Ranks[s.Rank]
	msg := fmt.Sprintf("rank %d (pod %s on node %s) is busier per step than the other ranks' median by more than %d%%, in %d reports in a row since step %d",
		s.Rank, pod.Name, pod.Spec.NodeName, margin, liveprogress.StragglerReports, s.Step)
	if p.becameTrue(trainingv1alpha1.ConditionStraggling, trainingv1alpha1.ReasonStragglerDetected, msg) {
		p.warning(trainingv1alpha1.ReasonStragglerDetected, "Detect", "straggler: rank %d (pod %s) on node %s is busy %.3fs per step, the other ranks %.3fs (median)",
			s.Rank, pod.Name, pod.Spec.NodeName, s.Seconds, s.Others)
	}
	if p.job.Spec.FaultTolerance.Stragglers.Action != trainingv1alpha1.StragglerActionReplace || rep.CheckpointStep < s.Step {
		return nil
	}
	f := trainingv1alpha1.JobFailure{
		Time: metav1.Time{Time: p.now}, Reason: trainingv1alpha1.FailureReasonStraggler, Category: string(attribution.Straggler),
		Attempt: p.job.Status.Restarts, Node: pod.Spec.NodeName, Rank: ptr.To(int32(s.Rank)),
		Message: bounded.Message(fmt.Sprintf("%s: replaced after checkpoint step %d (faultTolerance.stragglers.action Replace)", msg, rep.CheckpointStep)),
	}
	return &recovery.Verdict{Failure: f, Counted: true, Pod: pod}
}

// stragglerMargin is faultTolerance.stragglers.marginPercent, defaulted.
func stragglerMargin(ft *trainingv1alpha1.FaultToleranceSpec) int32 {
	if ft.Stragglers.MarginPercent <= 0 {
		return trainingv1alpha1.DefaultStragglerMarginPercent
	}
	return ft.Stragglers.MarginPercent
}
