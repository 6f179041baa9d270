package recovery

import (
	"time"

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
// since, whose nodes' Leases tell whether they are lost: only while most ranks are back (a
// slow restart is not a lost node), and at most LeaseChecksPerPass of them (more is not one
// lost node).
func LostNodeSuspects(g gang.Gang, since time.Time) []int32 {
	var left []int32
	back := 0
	for r, pod := range g.Ranks {
		switch {
		case pod == nil:
		case g.Back(r, since):
			back++
		case pod.Spec.NodeName != "" && pod.DeletionTimestamp.IsZero():
			left = append(left, int32(r))
		}
	}
	if len(left) > LeaseChecksPerPass || 2*back < len(g.Ranks) {
		return nil
	}
	return left
}
