package controllers

import (
	"context"
	"fmt"
	"math"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/log"

	trainingv1alpha1 "github.com/zaya-operator/zaya-operator/api/v1alpha1"
	"github.com/zaya-operator/zaya-operator/controllers/gang"
	"github.com/zaya-operator/zaya-operator/controllers/recovery"
)

// maxRecentFailures bounds status.recentFailures (the CRD's MaxItems).
const maxRecentFailures = 8

// recover acts on the first failure of the current attempt: it fails the job, or counts a
// gang restart. A Recreate restart moves to the next attempt and only changes status: the
// next pass (which the status write triggers) deletes the old attempt's pods and, after the
// backoff, creates the new ones, so a crash between the two never loses or doubles a restart.
// An InPlace restart keeps the attempt: the kubelet is already restarting the containers.
func (p *pass) recover(ctx context.Context, v recovery.Verdict, mode trainingv1alpha1.RestartMode) {
	job := p.job
	st := &job.Status
	f := v.Failure
	if f.Category == "" {
		p.attribute(&f, nil)
	}
	p.recordFailure(f)
	var stopped []string
	if p.stopped != nil {
		stopped = p.stopped()
	}
	p.ledger().Failed(ctx, f, stopped)
	category, cascaded := f.Category, float64(f.Cascaded)
	p.whenStored(func() {
		failuresTotal.WithLabelValues(category, "root").Inc()
		failuresTotal.WithLabelValues(category, "cascade").Add(cascaded)
	})
	v.Failure = f // as named
	recent, reason, why := recovery.Budget(job, v, p.now)
	if reason != "" {
		p.fail(reason, why)
		return
	}
	st.RestartTimes = recent
	st.Restarts = addCount(st.Restarts, 1)
	st.LastRestartMode = mode
	var msg string
	if mode == trainingv1alpha1.RestartModeInPlace {
		st.InPlaceRestarts = addCount(st.InPlaceRestarts, 1)
		msg = fmt.Sprintf("restarting the gang in place (restart %d, attempt %d) after: %s%s", st.Restarts, st.Attempt(), f.Message, recovery.CategoryWords(f))
	} else {
		st.ReadyNodes = 0
		msg = fmt.Sprintf("restarting the whole gang as attempt %d after: %s%s", st.Attempt(), f.Message, recovery.CategoryWords(f))
	}
	p.setCondition(trainingv1alpha1.ConditionRestarting, metav1.ConditionTrue, f.Reason, msg)
	if mode == trainingv1alpha1.RestartModeInPlace {
		// Timed from the fault the kubelet saw, which a later pass may only now notice.
		c := meta.FindStatusCondition(st.Conditions, trainingv1alpha1.ConditionRestarting)
		c.LastTransitionTime = f.Time
	}
	p.setCondition(trainingv1alpha1.ConditionRunning, metav1.ConditionFalse, trainingv1alpha1.ReasonRestarting, msg)
	p.warning(trainingv1alpha1.ReasonRestarting, "Restart", "%s", msg)
	attempt := st.Attempt()
	mechanism := recovery.RestartedBy(v.Pod, mode)
	p.whenStored(func() {
		restartsTotal.WithLabelValues(f.Reason, string(mode), string(mechanism)).Inc()
		log.FromContext(ctx).Info("restarting the gang", "mode", mode, "attempt", attempt, "reason", f.Reason, "rank", f.Rank, "node", f.Node, "counted", v.Counted)
	})
}

// recordFailure makes f the last failure and the newest of the recent ones.
func (p *pass) recordFailure(f trainingv1alpha1.JobFailure) {
	if f.Category == "" {
		p.attribute(&f, nil)
	}
	st := &p.job.Status
	st.LastFailure = &f
	st.RecentFailures = append([]trainingv1alpha1.JobFailure{f}, st.RecentFailures...)
	if len(st.RecentFailures) > maxRecentFailures {
		st.RecentFailures = st.RecentFailures[:maxRecentFailures]
	}
}

// restarting reports whether a gang restart is under way and since when.
func (p *pass) restarting() (time.Time, bool) {
	c := meta.FindStatusCondition(p.job.Status.Conditions, trainingv1alpha1.ConditionRestarting)
	if c == nil || c.Status != metav1.ConditionTrue {
		return time.Time{}, false
	}
	return c.LastTransitionTime.Time, true
}

// backoffLeft is how long the new attempt must still wait: initial * 2^(k-1), capped at max,
// for the k-th restart counted within the window.
func (p *pass) backoffLeft() time.Duration {
	since, ok := p.restarting()
	if !ok {
		return 0
	}
	return since.Add(recovery.RestartBackoff(p.job.Spec.FaultTolerance.Backoff, len(p.job.Status.RestartTimes))).Sub(p.now)
}

// finishRecovery closes a gang restart once every rank of the new attempt runs: an in-place
// one as of when its last rank came back, since that is known exactly and a pass may come later.
func (p *pass) finishRecovery(g gang.Gang) {
	since, ok := p.restarting()
	if !ok {
		return
	}
	end := p.now
	if back := g.BackAt(); p.job.Status.LastRestartMode == trainingv1alpha1.RestartModeInPlace && back.After(since) && back.Before(end) {
		end = back
	}
	p.job.Status.Replacing = nil
	if st := &p.job.Status; st.LastRestartMode == trainingv1alpha1.RestartModeInPlace && st.LastFailure != nil {
		// The cascade is over: every other rank whose container it restarted.
		if n := recovery.CascadeSince(g, since, ptr.Deref(st.LastFailure.Rank, -1)); n > st.LastFailure.Cascaded {
			category, more := st.LastFailure.Category, float64(n-st.LastFailure.Cascaded)
			p.whenStored(func() { failuresTotal.WithLabelValues(category, "cascade").Add(more) })
			st.LastFailure.Cascaded = n
			if len(st.RecentFailures) > 0 && st.RecentFailures[0].Time.Equal(&st.LastFailure.Time) {
				st.RecentFailures[0].Cascaded = n
			}
		}
	}
	p.keepCounts(g) // the restart's cascade, accounted for: the next restart's baseline
	took := end.Sub(since)
	secs := int32(min(max(math.Ceil(took.Seconds()), 0), math.MaxInt32)) // a clock step back is 0, not a status the schema refuses
	p.job.Status.LastRecoverySeconds = &secs
	mode := string(p.job.Status.LastRestartMode)
	p.whenStored(func() { recoverySeconds.WithLabelValues(mode).Observe(took.Seconds()) })
	p.setCondition(trainingv1alpha1.ConditionRestarting, metav1.ConditionFalse, trainingv1alpha1.ReasonRecovered,
		fmt.Sprintf("attempt %d running %ds after the failure (%s)", p.job.Status.Attempt(), secs, p.job.Status.LastRestartMode))
	p.normal(trainingv1alpha1.ReasonRecovered, "Restart", "recovered %s: attempt %d has all %d ranks running, %ds after the failure",
		restartModeWords(p.job.Status.LastRestartMode), p.job.Status.Attempt(), p.job.Spec.Nodes, secs)
}

// clearStuck force-deletes pods of old attempts that have been terminating longer than
// terminatingTimeout (a dead node's kubelet never confirms), so a restart never waits on them.
// It returns how long until the next one is due, or 0.
func (p *pass) clearStuck(ctx context.Context, draining []*corev1.Pod) (time.Duration, error) {
	timeout := p.job.Spec.FaultTolerance.TerminatingTimeout.Duration
	var next time.Duration
	var stuck []*corev1.Pod
	for _, pod := range draining {
		if due := pod.DeletionTimestamp.Add(timeout).Sub(p.now); due > 0 {
			if next == 0 || due < next {
				next = due
			}
			continue
		}
		stuck = append(stuck, pod)
	}
	// A force delete removes nothing while finalizers remain: say who holds the pod instead
	// of claiming a delete that did not happen.
	if err := p.deletePods(ctx, stuck, ptr.To[int64](0)); err != nil {
		return 0, err
	}
	held := slices.DeleteFunc(slices.Clone(stuck), func(pod *corev1.Pod) bool { return len(pod.Finalizers) == 0 })
	stuck = slices.DeleteFunc(stuck, func(pod *corev1.Pod) bool { return len(pod.Finalizers) > 0 })
	for _, pod := range stuck {
		p.acted(corev1.EventTypeWarning, trainingv1alpha1.ReasonForceDeleted, "Delete",
			"force-deleted pod %s on %s: terminating for more than %s", pod.Name, pod.Spec.NodeName, timeout)
	}
	if len(held) > 0 {
		pod := held[0]
		msg := fmt.Sprintf("waiting for pod %s, terminating for more than %s and held by finalizers %s the operator does not own: "+
			"remove them (kubectl patch pod %s -n %s --type=merge -p '{\"metadata\":{\"finalizers\":null}}') once whatever added them is done",
			pod.Name, timeout, strings.Join(pod.Finalizers, ", "), pod.Name, pod.Namespace)
		if len(held) > 1 {
			msg += fmt.Sprintf(" (and %d more pods)", len(held)-1)
		}
		if p.setCondition(trainingv1alpha1.ConditionRunning, metav1.ConditionFalse, trainingv1alpha1.ReasonBlockedByFinalizer, msg) {
			p.warning(trainingv1alpha1.ReasonBlockedByFinalizer, "Delete", "%s", msg)
		}
	}
	return next, nil
}

// restartModeWords says how a restart happened, for events.
func restartModeWords(m trainingv1alpha1.RestartMode) string {
	if m == trainingv1alpha1.RestartModeInPlace {
		return "in place"
	}
	return "by recreating the gang"
}

// keepCounts records the gang's restart counts as the baseline of the next in-place restart.
func (p *pass) keepCounts(g gang.Gang) {
	st := &p.job.Status
	st.ContainerRestarts = g.ContainerRestarts
	st.RankRestarts = nil
	if g.ContainerRestarts > 0 {
		st.RankRestarts = slices.Clone(g.Counts)
	}
}

// inPlaceUnderWay reports whether an in-place restart is under way, and since the fault.
func (p *pass) inPlaceUnderWay() (time.Time, bool) {
	since, ok := p.restarting()
	return since, ok && p.job.Status.LastRestartMode == trainingv1alpha1.RestartModeInPlace
}
