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
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"

	trainingv1alpha1 "github.com/zaya-operator/zaya-operator/api/v1alpha1"
)

// maxRecentFailures bounds status.recentFailures (the CRD's MaxItems).
const maxRecentFailures = 8

// verdict is what a failure does to the job.
type verdict struct {
	failure trainingv1alpha1.JobFailure
	fatal   bool // fail the job, no restart
	counted bool // the restart counts against maxRestarts
}

// disruptionReasons are pod failures caused by the cluster rather than the worker.
var disruptionReasons = map[string]string{
	"Evicted":                trainingv1alpha1.FailureReasonEvicted,
	"Preempting":             trainingv1alpha1.FailureReasonPreempted,
	"PreemptionByScheduler":  trainingv1alpha1.FailureReasonPreempted,
	"EvictionByEvictionAPI":  trainingv1alpha1.FailureReasonEvicted,
	"DeletionByTaintManager": trainingv1alpha1.FailureReasonNodeLost,
	"DeletionByPodGC":        trainingv1alpha1.FailureReasonNodeLost,
	"TerminationByKubelet":   trainingv1alpha1.FailureReasonEvicted,
	"NodeShutdown":           trainingv1alpha1.FailureReasonNodeLost,
	"Shutdown":               trainingv1alpha1.FailureReasonNodeLost,
	"Terminated":             trainingv1alpha1.FailureReasonNodeLost,
}

// judge classifies the failure of a pod of the current attempt: a disruption by the cluster,
// a worker exit code (fatal, retryable or other, by spec.faultTolerance.exitCodes), or a pod
// deleted under the running gang.
func judge(spec *trainingv1alpha1.ZayaTrainingJobSpec, pod *corev1.Pod, now time.Time, attempt int32) verdict {
	f := failureOf(pod, now, attempt)
	ft := &spec.FaultTolerance
	disruption := func(reason string) verdict {
		f.Reason = reason
		return verdict{failure: f, counted: ft.DisruptionRestarts == trainingv1alpha1.DisruptionRestartsCounted}
	}
	if c := podCondition(pod, corev1.DisruptionTarget); c != nil && c.Status == corev1.ConditionTrue {
		if r, ok := disruptionReasons[c.Reason]; ok {
			return disruption(r)
		}
		return disruption(trainingv1alpha1.FailureReasonEvicted)
	}
	if r, ok := disruptionReasons[pod.Status.Reason]; ok {
		return disruption(r)
	}
	if !pod.DeletionTimestamp.IsZero() && pod.Status.Phase != corev1.PodFailed {
		f.Message = truncate(fmt.Sprintf("rank %d (pod %s on %s) was deleted while the gang ran", *f.Rank, pod.Name, pod.Spec.NodeName))
		return disruption(trainingv1alpha1.FailureReasonPodDeleted)
	}
	if hung(pod) {
		f.Reason = trainingv1alpha1.FailureReasonHang
		return verdict{failure: f, counted: true}
	}
	if f.ExitCode == nil {
		return verdict{failure: f, counted: true}
	}
	code := *f.ExitCode
	switch {
	case slices.Contains(ft.ExitCodes.Fatal, code):
		f.Reason = trainingv1alpha1.FailureReasonFatalExitCode
		return verdict{failure: f, fatal: true}
	case slices.Contains(ft.ExitCodes.Retryable, code):
		return verdict{failure: f, counted: true}
	case ft.ExitCodes.Other == trainingv1alpha1.ExitCodeFail:
		f.Reason = trainingv1alpha1.FailureReasonFatalExitCode
		return verdict{failure: f, fatal: true}
	}
	return verdict{failure: f, counted: true}
}

// hung reports whether the heartbeat probe killed the worker.
func hung(pod *corev1.Pod) bool {
	s := workerStatus(pod)
	if s == nil || s.State.Terminated == nil {
		return false
	}
	for line := range strings.Lines(s.State.Terminated.Message) {
		if strings.HasPrefix(strings.TrimSpace(line), trainingv1alpha1.TerminationMessageHangPrefix) {
			return true
		}
	}
	return false
}

// recover acts on the first failure of the current attempt: it fails the job, or starts a
// gang restart by moving to the next attempt. It only changes status: the next pass (which
// the status write triggers) deletes the old attempt's pods and, after the backoff, creates
// the new ones, so a crash between the two never loses or doubles a restart.
func (p *pass) recover(ctx context.Context, v verdict) {
	job := p.job
	st := &job.Status
	f := v.failure
	st.LastFailure = &f
	st.RecentFailures = append([]trainingv1alpha1.JobFailure{f}, st.RecentFailures...)
	if len(st.RecentFailures) > maxRecentFailures {
		st.RecentFailures = st.RecentFailures[:maxRecentFailures]
	}
	if v.fatal {
		p.fail(trainingv1alpha1.ReasonFatalFailure, f.Message)
		return
	}

	ft := &job.Spec.FaultTolerance
	since := p.now.Add(-ft.RestartWindow.Duration)
	recent := slices.DeleteFunc(slices.Clone(st.RestartTimes), func(t metav1.Time) bool { return t.Time.Before(since) })
	if v.counted {
		if int32(len(recent)) >= *ft.MaxRestarts {
			p.fail(trainingv1alpha1.ReasonRestartBudgetExceeded, fmt.Sprintf(
				"%d restarts within %s (maxRestarts %d); last failures: %s",
				len(recent), ft.RestartWindow.Duration, *ft.MaxRestarts, recentFailureSummary(st.RecentFailures)))
			return
		}
		recent = append(recent, metav1.Time{Time: p.now})
	}
	st.RestartTimes = recent
	st.Restarts++
	st.ReadyNodes = 0
	restartsTotal.WithLabelValues(f.Reason).Inc()
	msg := fmt.Sprintf("restarting the whole gang as attempt %d after: %s", st.Restarts, f.Message)
	p.setCondition(trainingv1alpha1.ConditionRestarting, metav1.ConditionTrue, f.Reason, msg)
	p.setCondition(trainingv1alpha1.ConditionRunning, metav1.ConditionFalse, trainingv1alpha1.ReasonRestarting, msg)
	p.warning(trainingv1alpha1.ReasonRestarting, "Restart", "%s", msg)
	log.FromContext(ctx).Info("restarting the gang", "attempt", st.Restarts, "reason", f.Reason, "rank", f.Rank, "node", f.Node, "counted", v.counted)
}

func recentFailureSummary(fs []trainingv1alpha1.JobFailure) string {
	parts := make([]string, 0, 3)
	for i, f := range fs {
		if i == 3 {
			break
		}
		parts = append(parts, fmt.Sprintf("%s (%s)", f.Message, f.Reason))
	}
	return strings.Join(parts, "; ")
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
	b := p.job.Spec.FaultTolerance.Backoff
	k := len(p.job.Status.RestartTimes)
	if b.Initial == nil || b.Initial.Duration <= 0 || k == 0 {
		return 0
	}
	d := time.Duration(float64(b.Initial.Duration) * math.Pow(2, float64(k-1)))
	if b.Max != nil && (d > b.Max.Duration || d <= 0) {
		d = b.Max.Duration
	}
	return since.Add(d).Sub(p.now)
}

// finishRecovery closes a gang restart once every rank of the new attempt runs.
func (p *pass) finishRecovery() {
	since, ok := p.restarting()
	if !ok {
		return
	}
	took := p.now.Sub(since)
	secs := int32(math.Ceil(took.Seconds()))
	p.job.Status.LastRecoverySeconds = &secs
	recoverySeconds.Observe(took.Seconds())
	p.setCondition(trainingv1alpha1.ConditionRestarting, metav1.ConditionFalse, trainingv1alpha1.ReasonRecovered,
		fmt.Sprintf("attempt %d running %ds after the failure", p.job.Status.Restarts, secs))
	p.normal(trainingv1alpha1.ReasonRecovered, "Restart", "recovered: attempt %d has all %d ranks running, %ds after the failure",
		p.job.Status.Restarts, p.job.Spec.Nodes, secs)
}

// clearStuck force-deletes pods of old attempts that have been terminating longer than
// terminatingTimeout (a dead node's kubelet never confirms), so a restart never waits on them.
// It returns how long until the next one is due, or 0.
func (p *pass) clearStuck(ctx context.Context, draining []*corev1.Pod) (time.Duration, error) {
	timeout := p.job.Spec.FaultTolerance.TerminatingTimeout.Duration
	var next time.Duration
	for _, pod := range draining {
		due := pod.DeletionTimestamp.Add(timeout).Sub(p.now)
		if due > 0 {
			if next == 0 || due < next {
				next = due
			}
			continue
		}
		err := p.r.Delete(ctx, pod, client.GracePeriodSeconds(0), client.Preconditions{UID: &pod.UID})
		if client.IgnoreNotFound(err) != nil {
			return 0, fmt.Errorf("force-deleting pod %s: %w", pod.Name, err)
		}
		p.warning(trainingv1alpha1.ReasonForceDeleted, "Delete", "force-deleted pod %s on %s: terminating for more than %s",
			pod.Name, pod.Spec.NodeName, timeout)
	}
	return next, nil
}
