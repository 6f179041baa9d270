package recovery

import (
	"slices"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	trainingv1alpha1 "github.com/zaya-operator/zaya-operator/api/v1alpha1"
	"github.com/zaya-operator/zaya-operator/controllers/gang"
)

// The ladder of an in-place restart that does not converge: each rung gets inPlaceTimeout;
// the ranks not back get new pods once (the middle rung), then the whole gang is recreated.

// MaxReplaced bounds status.replacing (the CRD's MaxItems): more lost ranks than that
// recreate the gang.
const MaxReplaced = 256

// LeaseChecksPerPass bounds the Lease reads of one pass: a fault that leaves more ranks behind
// than that is not one lost node, and the in-place timeout handles it.
const LeaseChecksPerPass = 8

// InPlaceDue is how long until the rung under way of the in-place restart that began at since
// is overdue (<= 0: it is): replacing a laggard's pod (status.replacing) restarts the clock.
func InPlaceDue(st *trainingv1alpha1.ZayaTrainingJobStatus, since time.Time, timeout time.Duration, now time.Time) time.Duration {
	from := since
	for _, r := range st.Replacing {
		if r.Since.After(from) {
			from = r.Since.Time
		}
	}
	return from.Add(timeout).Sub(now)
}

// Laggards are the ranks whose pods are not back from the in-place restart that began at
// since.
func Laggards(g gang.Gang, since time.Time) []int32 {
	var out []int32
	for r, pod := range g.Ranks {
		if pod != nil && !g.Back(r, since) {
			out = append(out, int32(r))
		}
	}
	return out
}

// LostNodeSuspects are the ranks, left on their nodes by the in-place restart that began at
// since, whose nodes' Leases tell whether they are lost: only while most ranks stopped in it
// (back or still between runs: a kubelet's back-off is not a lost node), and at most
// LeaseChecksPerPass of them (more is not one lost node).
func LostNodeSuspects(g gang.Gang, since time.Time) []int32 {
	var left []int32
	stopped := 0
	for r, pod := range g.Ranks {
		if pod == nil {
			continue
		}
		back := g.Back(r, since)
		if back || g.RestartExit(r, since) != nil {
			stopped++
		}
		if !back && pod.Spec.NodeName != "" && pod.DeletionTimestamp.IsZero() {
			left = append(left, int32(r))
		}
	}
	if len(left) > LeaseChecksPerPass || 2*stopped < len(g.Ranks) {
		return nil
	}
	return left
}

// Restarting reports whether a gang restart is under way and since when (its Restarting
// condition; an in-place one's is the fault's time).
func Restarting(st *trainingv1alpha1.ZayaTrainingJobStatus) (time.Time, bool) {
	c := meta.FindStatusCondition(st.Conditions, trainingv1alpha1.ConditionRestarting)
	if c == nil || c.Status != metav1.ConditionTrue {
		return time.Time{}, false
	}
	return c.LastTransitionTime.Time, true
}

// InPlaceUnderWay reports whether an in-place restart is under way, and since the fault.
func InPlaceUnderWay(st *trainingv1alpha1.ZayaTrainingJobStatus) (time.Time, bool) {
	since, ok := Restarting(st)
	return since, ok && st.LastRestartMode == trainingv1alpha1.RestartModeInPlace
}

// BackoffLeft is how long the new attempt must still wait: initial * 2^(k-1), capped at max,
// for the k-th restart counted within the window.
func BackoffLeft(job *trainingv1alpha1.ZayaTrainingJob, now time.Time) time.Duration {
	since, ok := Restarting(&job.Status)
	if !ok {
		return 0
	}
	return since.Add(RestartBackoff(job.Spec.FaultTolerance.Backoff, len(job.Status.RestartTimes))).Sub(now)
}

// KeepCounts records the gang's restart counts as the baseline of the next in-place restart.
func KeepCounts(st *trainingv1alpha1.ZayaTrainingJobStatus, g gang.Gang) {
	st.ContainerRestarts = g.ContainerRestarts
	st.RankRestarts = nil
	if g.ContainerRestarts > 0 {
		st.RankRestarts = slices.Clone(g.Counts)
	}
}
