package recovery

import (
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/utils/ptr"

	trainingv1alpha1 "github.com/zaya-operator/zaya-operator/api/v1alpha1"
	"github.com/zaya-operator/zaya-operator/controllers/gang"
)

// SuccessGrace is how long the Rank0 policy waits, after rank 0 exits 0, for the other ranks
// to finish too. A rank that fails or is stopped within it makes the attempt a failure, so the
// verdict does not depend on which exit the operator saw first; ranks still running after it
// are deleted (a rank stuck in a final barrier must not hold the job).
const SuccessGrace = 30 * time.Second

// Finished reports whether the job is over: Succeeded or Failed.
func Finished(job *trainingv1alpha1.ZayaTrainingJob) bool {
	return meta.IsStatusConditionTrue(job.Status.Conditions, trainingv1alpha1.ConditionSucceeded) ||
		meta.IsStatusConditionTrue(job.Status.Conditions, trainingv1alpha1.ConditionFailed)
}

// RestartGrace caps how long the pods of a failed gang may take to stop: its workers are
// stuck in collectives and cannot checkpoint anyway.
const RestartGrace = 10 * time.Second

// Briefly is the grace period, in seconds, for the pods of a broken gang.
func Briefly() *int64 { return ptr.To(int64(RestartGrace.Seconds())) }

// Succeeded applies the success policy to the gang. An attempt with a failed or stopped rank
// never succeeds, whatever rank 0 says: the worker contract's exit 0 means the run is complete,
// and a peer's failure says it may not be. wait > 0 asks for another look after it.
func Succeeded(spec *trainingv1alpha1.ZayaTrainingJobSpec, g gang.Gang, now time.Time) (done bool, wait time.Duration) {
	if g.FirstFailure() != nil {
		return false, 0
	}
	switch spec.SuccessPolicy {
	case trainingv1alpha1.SuccessAllRanks:
		return g.Succeeded == spec.Nodes, 0
	default:
		rank0 := g.Ranks[0]
		if rank0 == nil || rank0.Status.Phase != corev1.PodSucceeded {
			return false, 0
		}
		if g.Succeeded != spec.Nodes {
			// A kubelet always reports when the worker stopped; without it there is nothing to
			// wait from. A finish time ahead of this clock (skew) counts from now.
			at := gang.FinishedAt(rank0)
			if !at.IsZero() && at.After(now) {
				at = now
			}
			if wait := at.Add(SuccessGrace).Sub(now); !at.IsZero() && wait > 0 {
				return false, wait
			}
		}
	}
	return true, 0
}
