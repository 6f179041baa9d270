package controllers

import (
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	trainingv1alpha1 "github.com/zaya-operator/zaya-operator/api/v1alpha1"
	"github.com/zaya-operator/zaya-operator/controllers/gang"
)

// successGrace is how long the Rank0 policy waits, after rank 0 exits 0, for the other ranks
// to finish too. A rank that fails or is stopped within it makes the attempt a failure, so the
// verdict does not depend on which exit the operator saw first; ranks still running after it
// are deleted (a rank stuck in a final barrier must not hold the job).
const successGrace = 30 * time.Second

// succeeded applies the success policy. An attempt with a failed or stopped rank never
// succeeds, whatever rank 0 says: the worker contract's exit 0 means the run is complete, and
// a peer's failure says it may not be. wait > 0 asks for another look after it.
func (p *pass) succeeded(g gang.Gang) (done bool, wait time.Duration) {
	job := p.job
	if g.FirstFailure() != nil {
		return false, 0
	}
	switch job.Spec.SuccessPolicy {
	case trainingv1alpha1.SuccessAllRanks:
		if g.Succeeded != job.Spec.Nodes {
			return false, 0
		}
	default:
		rank0 := g.Ranks[0]
		if rank0 == nil || rank0.Status.Phase != corev1.PodSucceeded {
			return false, 0
		}
		if g.Succeeded != job.Spec.Nodes {
			// A kubelet always reports when the worker stopped; without it there is nothing to
			// wait from. A finish time ahead of this clock (skew) counts from now.
			at := gang.FinishedAt(rank0)
			if !at.IsZero() && at.After(p.now) {
				at = p.now
			}
			if wait := at.Add(successGrace).Sub(p.now); !at.IsZero() && wait > 0 {
				return false, wait
			}
		}
	}
	p.setCondition(trainingv1alpha1.ConditionSucceeded, metav1.ConditionTrue, trainingv1alpha1.ReasonCompleted,
		fmt.Sprintf("%s: training finished", job.Spec.SuccessPolicy))
	p.complete()
	p.normal(trainingv1alpha1.ReasonCompleted, "Complete", "succeeded (%s)", job.Spec.SuccessPolicy)
	return true, 0
}
