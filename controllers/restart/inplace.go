package restart

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

// NoticeInPlace starts an in-place restart when a worker container of the current attempt
// exited in a pod that lives on (its restart rules restart it) since the last failure, or was
// restarted since the last pass (the kubelet raised its restartCount): the root cause is the
// earliest exit that was not the cascade's 75. Exits seen while one is under way belong to it.
// It reports whether it started one, or how long to wait for a cause when every exit so far is
// a stop over a peer; a rank failing again and again on one node has the node quarantined and
// the gang recreated instead.
func (e *Executor) NoticeInPlace(ctx context.Context, g gang.Gang) (bool, time.Duration, error) {
	st := &e.Job.Status
	if since, ok := recovery.InPlaceUnderWay(&e.Job.Status); ok {
		// The cascade's restarts are the restart's own: recorded when it ends, not one
		// status write per rank coming back (O(1) writes per restart, whatever the gang's size).
		// Only a cause that shows after the restart began on a stop over a peer is news.
		moved, err := e.rerootLate(ctx, g, since)
		return moved, 0, err
	}
	seen, baseline := st.ContainerRestarts, st.RankRestarts
	recovery.KeepCounts(st, g) // falls when pods are replaced: nothing to count
	fault, pod, wait := recovery.InPlaceFault(e.Job, g, seen, baseline, e.Patterns, e.Stopped, e.Now)
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
		if err := e.quarantine(ctx, recovery.QuarantinedFor(v.Failure)); err != nil {
			return false, 0, err
		}
		e.recover(ctx, v, trainingv1alpha1.RestartModeRecreate)
		return true, 0, nil
	}
	mode := trainingv1alpha1.RestartModeInPlace
	if moved, err := e.quarantineRepeated(ctx, v.Failure); err != nil {
		return false, 0, err
	} else if moved {
		mode = trainingv1alpha1.RestartModeRecreate
	}
	// Its own hang: a stop that names a silent peer blames the peer (its pod still runs).
	own := func() bool { r, _ := gang.Rank(pod); return ptr.Equal(v.Failure.Rank, &r) }
	if s := gang.WorkerStatus(pod); mode == trainingv1alpha1.RestartModeInPlace && v.Failure.Reason == trainingv1alpha1.FailureReasonHang &&
		s != nil && s.State.Terminated != nil && !v.Fatal && own() {
		// The kubelet killed the worker on its liveness probe, and container restart rules
		// cover only a container's own exits: it stays down (seen on kind's real kubelet, where
		// test/nodeagent restarted it). The rank gets a new pod while the others restart in place.
		v.Pod = pod
		if e.replaceRanks(ctx, g, v) {
			return true, 0, nil
		}
	}
	e.recover(ctx, v, mode)
	return true, 0, nil
}

// rerootLate records the cause of an in-place restart that began on a stop over a peer once the
// peer's own exit shows (recovery.LateCause): it can reach the API server after
// recovery.CascadeGrace ran out (a soak on kind: a GPU fault's exit came after its peer's 75
// had been blamed, and the faulty node was never quarantined). The cause replaces the
// bystander's record; a hardware cause, or a node failing again and again, has the node
// quarantined and the gang recreated away from it. It reports whether the gang is recreated.
func (e *Executor) rerootLate(ctx context.Context, g gang.Gang, since time.Time) (bool, error) {
	st := &e.Job.Status
	last := st.LastFailure
	v := recovery.LateCause(e.Job, g, since, e.Patterns, e.Stopped, e.Now)
	if v == nil {
		return false, nil
	}
	f := v.Failure
	e.Host.Loss().Reroot(f)
	// One fault, one failure: the bystander's stop would count against its node.
	if len(st.RecentFailures) > 0 && st.RecentFailures[0].Time.Equal(&last.Time) && ptr.Equal(st.RecentFailures[0].Rank, last.Rank) {
		st.RecentFailures = st.RecentFailures[1:]
	}
	action := last.Action // the restart goes on as it was, unless the node must go
	timeline := last.Recovery
	e.recordFailure(f)
	e.did(action)
	e.keepRecovery(timeline) // detected and decided on the bystander's stop, on its way back since
	moved := false
	if recovery.HardwareRoot(f) {
		if err := e.quarantine(ctx, recovery.QuarantinedFor(f)); err != nil {
			return false, err
		}
		moved = true
	} else if m, err := e.quarantineRepeated(ctx, f); err != nil {
		return false, err
	} else {
		moved = m
	}
	if moved {
		e.escalate(trainingv1alpha1.ReasonInPlaceFailed, fmt.Sprintf(
			"the in-place restart's cause was %s%s: recreating the gang away from %s", f.Message, recovery.CategoryWords(f), f.Node))
		return true, nil
	}
	msg := fmt.Sprintf("restarting the gang in place (restart %d, attempt %d) after: %s%s", st.Restarts, st.Attempt(), f.Message, recovery.CategoryWords(f))
	e.Host.SetCondition(trainingv1alpha1.ConditionRestarting, metav1.ConditionTrue, f.Reason, msg)
	e.Host.Normal(trainingv1alpha1.ReasonRestarting, "Restart", "the in-place restart's cause: %s%s", f.Message, recovery.CategoryWords(f))
	return false, nil
}

// InPlaceOverdue escalates an in-place restart that did not bring every rank back within
// inPlaceTimeout to a full recreate: the same restart (no more budget), a new attempt. It
// returns how long until it is due (0: not under way, or escalated now).
func (e *Executor) InPlaceOverdue(ctx context.Context, g gang.Gang) (time.Duration, bool) {
	since, ok := recovery.InPlaceUnderWay(&e.Job.Status)
	if !ok || g.RestartedSince(since) {
		return 0, false
	}
	timeout := e.Job.Spec.FaultTolerance.InPlaceTimeout.Duration
	if due := recovery.InPlaceDue(&e.Job.Status, since, timeout, e.Now); due > 0 {
		return due, false
	}
	if len(e.Job.Status.Replacing) == 0 && e.replaceLaggards(ctx, g, since, timeout) {
		return timeout, false
	}
	laggards := 0
	for _, pod := range g.Ranks {
		if pod == nil || !gang.Ready(pod) {
			laggards++
		}
	}
	e.escalate(trainingv1alpha1.ReasonInPlaceTimedOut, fmt.Sprintf(
		"the in-place restart did not bring every rank back within %s (%d not ready): recreating the gang", timeout, laggards))
	return 0, true
}

// escalate turns the in-place restart under way into a recreate of the whole gang: the
// restart was counted once, so only the attempt moves.
func (e *Executor) escalate(reason, msg string) {
	e.Host.Loss().Broken()
	st := &e.Job.Status
	e.did(trainingv1alpha1.FailureActionRecreated)
	st.InPlaceRestarts = max(st.InPlaceRestarts-1, 0)
	st.Replacing = nil // the whole gang goes
	st.LastRestartMode = trainingv1alpha1.RestartModeRecreate
	st.ReadyNodes = 0
	cause := trainingv1alpha1.ReasonRestarting
	if st.LastFailure != nil {
		cause = st.LastFailure.Reason
	}
	msg = fmt.Sprintf("%s (attempt %d)", msg, st.Attempt())
	e.Host.SetCondition(trainingv1alpha1.ConditionRestarting, metav1.ConditionTrue, cause, msg)
	e.Host.Warning(reason, "Restart", "%s", msg)
	e.Host.WhenStored(func() { escalationsTotal.WithLabelValues(reason).Inc() })
}

// recoverFrom acts on a failed or lost pod of the current attempt. A rank whose node or pod
// failed gets a new pod while the others restart in place (replace.go). Otherwise, during an
// in-place restart it is the same restart going wrong: the gang is recreated without counting
// it again. A pod that failed on an exit its restart rules cover tells that its kubelet ignored
// them.
func (e *Executor) recoverFrom(ctx context.Context, v recovery.Verdict, g gang.Gang) error {
	if recovery.Replaceable(v, &e.Job.Spec.FaultTolerance) && e.replaceRanks(ctx, g, v) {
		return nil
	}
	if _, ok := recovery.InPlaceUnderWay(&e.Job.Status); ok && !v.Fatal {
		e.recordFailure(v.Failure)
		e.escalate(trainingv1alpha1.ReasonInPlaceFailed, fmt.Sprintf("%s during the in-place restart: recreating the gang", v.Failure.Message))
		return nil
	}
	if f := v.Failure; v.Pod != nil && !v.Fatal && f.ExitCode != nil && f.Reason == trainingv1alpha1.FailureReasonExitCode &&
		recovery.RulesRestart(recovery.PodRestartRules(v.Pod), *f.ExitCode) {
		e.Host.Warning(trainingv1alpha1.ReasonInPlaceUnsupported, "Restart",
			"rank %d on %s exited %d, which its container restart rules restart in place, but its pod failed: the kubelet there does not honour container restart rules (ContainerRestartRules, Kubernetes 1.35+); recreating the gang",
			ptr.Deref(f.Rank, -1), f.Node, *f.ExitCode)
	}
	if !v.Fatal {
		if _, err := e.quarantineRepeated(ctx, v.Failure); err != nil {
			return err
		}
	}
	e.recover(ctx, v, trainingv1alpha1.RestartModeRecreate)
	return nil
}
