package controllers

import (
	"context"
	"fmt"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	trainingv1alpha1 "github.com/zaya-operator/zaya-operator/api/v1alpha1"
	"github.com/zaya-operator/zaya-operator/controllers/gang"
	"github.com/zaya-operator/zaya-operator/controllers/recovery"
)

// In-place gang restart. With restartMode InPlace the worker container carries container
// restart rules (KEP-5307) on every exit code that would restart the gang: when a rank's
// process dies the kubelet restarts its container in the same pod, its peers' collectives
// break, they exit 75 (the cascade) and restart too, and the ranks meet again at the
// rendezvous. The operator writes nothing to pods: it notices the restart from the
// kubelet-written restartCount, counts it, and closes it once every rank runs again.

// noticeInPlace starts an in-place restart when a worker container of the current attempt
// exited in a pod that lives on (its restart rules restart it) since the last failure, or was
// restarted since the last pass (the kubelet raised its restartCount): the root cause is the
// earliest exit that was not the cascade's 75. Exits seen while one is under way belong to it.
// It reports whether it started one, or how long to wait for a cause when every exit so far is
// a stop over a peer; a rank failing again and again on one node has the node quarantined and
// the gang recreated instead.
func (p *pass) noticeInPlace(ctx context.Context, g gang.Gang) (bool, time.Duration, error) {
	st := &p.job.Status
	if since, ok := p.inPlaceUnderWay(); ok {
		// The cascade's restarts are the restart's own: recorded when it ends, not one
		// status write per rank coming back (O(1) writes per restart, whatever the gang's size).
		// Only a cause that shows after the restart began on a stop over a peer is news.
		moved, err := p.rerootLate(ctx, g, since)
		return moved, 0, err
	}
	seen, baseline := st.ContainerRestarts, st.RankRestarts
	p.keepCounts(g) // falls when pods are replaced: nothing to count
	fault, pod, wait := recovery.InPlaceFault(p.job, g, seen, baseline, p.r.failurePatterns(), p.r.gate().Stopped, p.now)
	if wait > 0 {
		st.ContainerRestarts, st.RankRestarts = seen, baseline
		return false, wait, nil
	}
	if fault == nil {
		return false, 0, nil
	}
	v := *fault
	// The restart is over once every rank's count rose past what it was before the fault
	// (spelt out: containerRestarts no longer says they were all 0).
	st.RankRestarts = g.Base
	if recovery.HardwareRoot(v.Failure) && !v.Fatal {
		// The rank's node is at fault: keep the gang off it. Its process has already restarted
		// in place there and rejoined its peers, so replacing only its pod would tear the
		// gang's new rendezvous apart; the gang is recreated away from the node instead.
		if err := p.quarantine(ctx, recovery.QuarantinedFor(v.Failure)); err != nil {
			return false, 0, err
		}
		p.recover(ctx, v, trainingv1alpha1.RestartModeRecreate)
		return true, 0, nil
	}
	mode := trainingv1alpha1.RestartModeInPlace
	if moved, err := p.quarantineRepeated(ctx, v.Failure); err != nil {
		return false, 0, err
	} else if moved {
		mode = trainingv1alpha1.RestartModeRecreate
	}
	if s := gang.WorkerStatus(pod); mode == trainingv1alpha1.RestartModeInPlace && v.Failure.Reason == trainingv1alpha1.FailureReasonHang &&
		s != nil && s.State.Terminated != nil && !v.Fatal {
		// The kubelet killed the worker on its liveness probe, and container restart rules
		// cover only a container's own exits: it stays down (seen on kind's real kubelet, where
		// test/nodeagent restarted it). The rank gets a new pod while the others restart in place.
		v.Pod = pod
		if p.replaceRanks(ctx, g, v) {
			return true, 0, nil
		}
	}
	p.recover(ctx, v, mode)
	return true, 0, nil
}

// rerootLate records the cause of an in-place restart that began on a stop over a peer once the
// peer's own exit shows (recovery.LateCause): it can reach the API server after
// recovery.CascadeGrace ran out (a soak on kind: a GPU fault's exit came after its peer's 75
// had been blamed, and the faulty node was never quarantined). The cause replaces the
// bystander's record; a hardware cause, or a node failing again and again, has the node
// quarantined and the gang recreated away from it. It reports whether the gang is recreated.
func (p *pass) rerootLate(ctx context.Context, g gang.Gang, since time.Time) (bool, error) {
	st := &p.job.Status
	last := st.LastFailure
	v := recovery.LateCause(p.job, g, since, p.r.failurePatterns(), p.r.gate().Stopped, p.now)
	if v == nil {
		return false, nil
	}
	f := v.Failure
	p.ledger().Reroot(f)
	// One fault, one failure: the bystander's stop would count against its node.
	if len(st.RecentFailures) > 0 && st.RecentFailures[0].Time.Equal(&last.Time) && ptr.Equal(st.RecentFailures[0].Rank, last.Rank) {
		st.RecentFailures = st.RecentFailures[1:]
	}
	p.recordFailure(f)
	moved := false
	if recovery.HardwareRoot(f) {
		if err := p.quarantine(ctx, recovery.QuarantinedFor(f)); err != nil {
			return false, err
		}
		moved = true
	} else if m, err := p.quarantineRepeated(ctx, f); err != nil {
		return false, err
	} else {
		moved = m
	}
	if moved {
		p.escalate(trainingv1alpha1.ReasonInPlaceFailed, fmt.Sprintf(
			"the in-place restart's cause was %s%s: recreating the gang away from %s", f.Message, recovery.CategoryWords(f), f.Node))
		return true, nil
	}
	msg := fmt.Sprintf("restarting the gang in place (restart %d, attempt %d) after: %s%s", st.Restarts, st.Attempt(), f.Message, recovery.CategoryWords(f))
	p.setCondition(trainingv1alpha1.ConditionRestarting, metav1.ConditionTrue, f.Reason, msg)
	p.normal(trainingv1alpha1.ReasonRestarting, "Restart", "the in-place restart's cause: %s%s", f.Message, recovery.CategoryWords(f))
	return false, nil
}

// inPlaceOverdue escalates an in-place restart that did not bring every rank back within
// inPlaceTimeout to a full recreate: the same restart (no more budget), a new attempt. It
// returns how long until it is due (0: not under way, or escalated now).
func (p *pass) inPlaceOverdue(ctx context.Context, g gang.Gang) (time.Duration, bool) {
	since, ok := p.inPlaceUnderWay()
	if !ok || g.RestartedSince(since) {
		return 0, false
	}
	timeout := p.job.Spec.FaultTolerance.InPlaceTimeout.Duration
	if due := recovery.InPlaceDue(&p.job.Status, since, timeout, p.now); due > 0 {
		return due, false
	}
	if len(p.job.Status.Replacing) == 0 && p.replaceLaggards(ctx, g, since, timeout) {
		return timeout, false
	}
	laggards := 0
	for _, pod := range g.Ranks {
		if pod == nil || !gang.Ready(pod) {
			laggards++
		}
	}
	p.escalate(trainingv1alpha1.ReasonInPlaceTimedOut, fmt.Sprintf(
		"the in-place restart did not bring every rank back within %s (%d not ready): recreating the gang", timeout, laggards))
	return 0, true
}

// escalate turns the in-place restart under way into a recreate of the whole gang: the
// restart was counted once, so only the attempt moves.
func (p *pass) escalate(reason, msg string) {
	p.ledger().Broken()
	st := &p.job.Status
	st.InPlaceRestarts = max(st.InPlaceRestarts-1, 0)
	st.Replacing = nil // the whole gang goes
	st.LastRestartMode = trainingv1alpha1.RestartModeRecreate
	st.ReadyNodes = 0
	cause := trainingv1alpha1.ReasonRestarting
	if st.LastFailure != nil {
		cause = st.LastFailure.Reason
	}
	msg = fmt.Sprintf("%s (attempt %d)", msg, st.Attempt())
	p.setCondition(trainingv1alpha1.ConditionRestarting, metav1.ConditionTrue, cause, msg)
	p.warning(reason, "Restart", "%s", msg)
	p.whenStored(func() { escalationsTotal.WithLabelValues(reason).Inc() })
}

// recoverFrom acts on a failed or lost pod of the current attempt. A rank whose node or pod
// failed gets a new pod while the others restart in place (replace.go). Otherwise, during an
// in-place restart it is the same restart going wrong: the gang is recreated without counting
// it again. A pod that failed on an exit its restart rules cover tells that its kubelet ignored
// them.
func (p *pass) recoverFrom(ctx context.Context, v recovery.Verdict, g gang.Gang) error {
	if recovery.Replaceable(v, &p.job.Spec.FaultTolerance) && p.replaceRanks(ctx, g, v) {
		return nil
	}
	if _, ok := p.inPlaceUnderWay(); ok && !v.Fatal {
		p.recordFailure(v.Failure)
		p.escalate(trainingv1alpha1.ReasonInPlaceFailed, fmt.Sprintf("%s during the in-place restart: recreating the gang", v.Failure.Message))
		return nil
	}
	if f := v.Failure; v.Pod != nil && !v.Fatal && f.ExitCode != nil && f.Reason == trainingv1alpha1.FailureReasonExitCode &&
		recovery.RulesRestart(recovery.PodRestartRules(v.Pod), *f.ExitCode) {
		p.warning(trainingv1alpha1.ReasonInPlaceUnsupported, "Restart",
			"rank %d on %s exited %d, which its container restart rules restart in place, but its pod failed: the kubelet there does not honour container restart rules (ContainerRestartRules, Kubernetes 1.35+); recreating the gang",
			ptr.Deref(f.Rank, -1), f.Node, *f.ExitCode)
	}
	if !v.Fatal {
		if _, err := p.quarantineRepeated(ctx, v.Failure); err != nil {
			return err
		}
	}
	p.recover(ctx, v, trainingv1alpha1.RestartModeRecreate)
	return nil
}
