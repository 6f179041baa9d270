// Package restart carries recovery's verdicts out, for one pass: it records a failure and
// counts the gang restart (or fails the job when the budget is spent), notices and closes an
// in-place restart, climbs its ladder (replace the ranks that are not back, then recreate the
// gang), replaces the ranks of a lost node or a hung rank (reading the node's Lease), keeps the
// warm spares, and quarantines nodes (the job's list, its taint, the cluster-wide hardware
// suspicion). The verdicts themselves are controllers/recovery's pure functions; the writes
// are the job's status (the pass's copy), events and pods through Host, and Node patches.
//
// The core makes one Executor per pass and calls its steps in order (FirstFailure, Act,
// NoticeInPlace, LostNodes, InPlaceOverdue, DeleteReplaced, EnsureSpares, Finish); it knows
// nothing of a spare's name, a Lease or a quarantine's taint.
package restart

import (
	"context"
	"fmt"
	"math"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"

	trainingv1alpha1 "github.com/zaya-operator/zaya-operator/api/v1alpha1"
	"github.com/zaya-operator/zaya-operator/controllers/attribution"
	"github.com/zaya-operator/zaya-operator/controllers/bounded"
	"github.com/zaya-operator/zaya-operator/controllers/gang"
	"github.com/zaya-operator/zaya-operator/controllers/nodehealth"
	"github.com/zaya-operator/zaya-operator/controllers/recovery"
)

// Host is what the pass lends the executor: its status conditions, its events (decisions go
// out once the status that records them is stored), its pod writes and its account.
type Host interface {
	SetCondition(condType string, status metav1.ConditionStatus, reason, message string) bool
	// Fail ends the job as failed.
	Fail(reason, message string)
	// Normal and Warning queue an event about a decision recorded in status; Acted one about
	// an API call made.
	Normal(reason, action, format string, args ...any)
	Warning(reason, action, format string, args ...any)
	Acted(eventType, reason, action, format string, args ...any)
	// WhenStored runs record once the status is stored (metrics of decisions).
	WhenStored(record func())
	// Loss is the job's goodput account as the pass knows it.
	Loss() Loss
	// DeletePods deletes pods, each given at most maxGrace seconds (nil: its own).
	DeletePods(ctx context.Context, pods []*corev1.Pod, maxGrace *int64) error
	// Spares is how many warm spares the admission allows of want; CreateSpare makes spare i
	// (rendered, placed and marked as the core does every pod) and returns its name.
	Spares(want int32) int32
	CreateSpare(ctx context.Context, i int32) (string, error)
	// NamespaceGoing reports whether the job's namespace is being deleted (read live).
	NamespaceGoing(ctx context.Context) bool
}

// Loss is the part of the job's goodput account (controllers/accounting's Ledger) a restart
// moves: a failure opens a loss, a broken restart makes the gang start over, a cause found
// late moves the loss to its category.
type Loss interface {
	Failed(ctx context.Context, f trainingv1alpha1.JobFailure, messages []string)
	Broken()
	Reroot(found trainingv1alpha1.JobFailure)
}

// Executor carries out one pass's recovery of one job.
type Executor struct {
	Job  *trainingv1alpha1.ZayaTrainingJob // the pass's copy: its status is what the pass writes
	Now  time.Time
	Host Host
	// Spares are the job's warm spare pods (recovery.SplitSpares).
	Spares []*corev1.Pod
	// Cluster reads Nodes from the cache and patches them (quarantine and suspicion taints);
	// Live reads node Leases from the API server.
	Cluster client.Client
	Live    client.Reader
	// Patterns read failures (recovery.Attribute); Stopped is the admission's word on a pod it
	// stopped; Exits are the messages of the gang's stopped ranks (read once, when needed).
	Patterns *attribution.Table
	Stopped  recovery.Stopped
	Exits    func() []string
	// HardwareTaint is the cluster-wide suspicion of nodes; TaintMax bounds a quarantine taint.
	HardwareTaint nodehealth.HardwareTaintPolicy
	TaintMax      time.Duration
	// Reach asks the supervisors of pods, at once, whether they run, and reports what came
	// back in their order (controllers/supervisorprobe; nil: never asked, the Leases decide).
	Reach func(ctx context.Context, pods ...*corev1.Pod) []recovery.Reach
}

// maxRecentFailures bounds status.recentFailures (the CRD's MaxItems).
const maxRecentFailures = 8

// attribute names what f was. pod, when known, is the failed rank's pod as it failed.
func (e *Executor) attribute(f *trainingv1alpha1.JobFailure, pod *corev1.Pod) {
	recovery.Attribute(e.Patterns, f, pod)
}

// recover acts on the first failure of the current attempt: it fails the job, or counts a
// gang restart. A Recreate restart moves to the next attempt and only changes status: the
// next pass (which the status write triggers) deletes the old attempt's pods and, after the
// backoff, creates the new ones, so a crash between the two never loses or doubles a restart.
// An InPlace restart keeps the attempt: the kubelet is already restarting the containers.
func (e *Executor) recover(ctx context.Context, v recovery.Verdict, mode trainingv1alpha1.RestartMode) {
	job := e.Job
	st := &job.Status
	f := v.Failure
	if f.Category == "" {
		e.attribute(&f, nil)
	}
	e.recordFailure(f)
	var stopped []string
	if e.Exits != nil {
		stopped = e.Exits()
	}
	e.Host.Loss().Failed(ctx, f, stopped)
	category, cascaded := f.Category, float64(f.Cascaded)
	e.Host.WhenStored(func() {
		failuresTotal.WithLabelValues(category, "root").Inc()
		failuresTotal.WithLabelValues(category, "cascade").Add(cascaded)
	})
	v.Failure = f // as named
	recent, reason, why := recovery.Budget(job, v, e.Now)
	if reason != "" {
		e.did(trainingv1alpha1.FailureActionFailedJob)
		e.Host.Fail(reason, why)
		return
	}
	if mode == trainingv1alpha1.RestartModeInPlace {
		e.did(trainingv1alpha1.FailureActionInPlace)
	} else {
		e.did(trainingv1alpha1.FailureActionRecreated)
	}
	st.RestartTimes = recent
	st.Restarts = bounded.Count(st.Restarts, 1)
	st.LastRestartMode = mode
	var msg string
	if mode == trainingv1alpha1.RestartModeInPlace {
		st.InPlaceRestarts = bounded.Count(st.InPlaceRestarts, 1)
		msg = fmt.Sprintf("restarting the gang in place (restart %d, attempt %d) after: %s%s", st.Restarts, st.Attempt(), f.Message, recovery.CategoryWords(f))
	} else {
		st.ReadyNodes = 0
		msg = fmt.Sprintf("restarting the whole gang as attempt %d after: %s%s", st.Attempt(), f.Message, recovery.CategoryWords(f))
	}
	e.Host.SetCondition(trainingv1alpha1.ConditionRestarting, metav1.ConditionTrue, f.Reason, msg)
	if mode == trainingv1alpha1.RestartModeInPlace {
		// Timed from the fault the kubelet saw, which a later pass may only now notice.
		c := meta.FindStatusCondition(st.Conditions, trainingv1alpha1.ConditionRestarting)
		c.LastTransitionTime = f.Time
	}
	e.Host.SetCondition(trainingv1alpha1.ConditionRunning, metav1.ConditionFalse, trainingv1alpha1.ReasonRestarting, msg)
	e.Host.Warning(trainingv1alpha1.ReasonRestarting, "Restart", "%s", msg)
	attempt := st.Attempt()
	mechanism := recovery.RestartedBy(v.Pod, mode)
	e.Host.WhenStored(func() {
		restartsTotal.WithLabelValues(f.Reason, string(mode), string(mechanism)).Inc()
		log.FromContext(ctx).Info("restarting the gang", "mode", mode, "attempt", attempt, "reason", f.Reason, "rank", f.Rank, "node", f.Node, "counted", v.Counted)
	})
}

// reroot records f, a cause found while the restart under way goes on, as that restart's own:
// the loss moves to f's category and, where the restart began on a bystander's stop over a
// peer (exit 75), or on the hang such a stop blamed on f's own rank, f takes that record's place. One fault, one failure: the stop would count
// against its rank's node, and kubectl zaya why would tell two roots (a chaos run's lost node
// showed both).
func (e *Executor) reroot(f trainingv1alpha1.JobFailure) {
	e.Host.Loss().Reroot(f) // reads the bystander's record: before it goes
	st := &e.Job.Status
	var timeline *trainingv1alpha1.RecoveryTimeline
	// The stop's record: a bystander's exit 75, or the hang it blamed on this very rank (a
	// silent peer, recovery.BlameSilentPeer) that turns out to be its node's loss.
	if last := st.LastFailure; last != nil && (ptr.Deref(last.ExitCode, 0) == trainingv1alpha1.ExitStopped ||
		(last.ExitCode == nil && last.Reason == trainingv1alpha1.FailureReasonHang && f.Rank != nil && ptr.Equal(last.Rank, f.Rank))) &&
		len(st.RecentFailures) > 0 && st.RecentFailures[0].Time.Equal(&last.Time) && ptr.Equal(st.RecentFailures[0].Rank, last.Rank) {
		st.RecentFailures = st.RecentFailures[1:]
		timeline = last.Recovery // the restart's own: detected and decided on the bystander's stop
	}
	e.recordFailure(f)
	e.keepRecovery(timeline)
}

// keepRecovery gives the failure just recorded the timeline of the restart it takes over
// (none: it keeps its own).
func (e *Executor) keepRecovery(timeline *trainingv1alpha1.RecoveryTimeline) {
	if timeline != nil {
		e.Job.Status.StampRecovery(func(r *trainingv1alpha1.RecoveryTimeline) { *r = *timeline.DeepCopy() })
	}
}

// recordFailure makes f the last failure and the newest of the recent ones.
func (e *Executor) recordFailure(f trainingv1alpha1.JobFailure) {
	if f.Category == "" {
		e.attribute(&f, nil)
	}
	st := &e.Job.Status
	f.Recovery = &trainingv1alpha1.RecoveryTimeline{Detected: trainingv1alpha1.Stamp(e.Now)}
	st.LastFailure = f.DeepCopy() // its own timeline: the two records are edited apart
	st.RecentFailures = append([]trainingv1alpha1.JobFailure{f}, st.RecentFailures...)
	if len(st.RecentFailures) > maxRecentFailures {
		st.RecentFailures = st.RecentFailures[:maxRecentFailures]
	}
}

// did records what the operator did about the last failure, on both its records.
func (e *Executor) did(a trainingv1alpha1.FailureAction) {
	st := &e.Job.Status
	last := st.LastFailure
	if last == nil {
		return
	}
	last.Action = a
	if len(st.RecentFailures) > 0 && st.RecentFailures[0].Time.Equal(&last.Time) && ptr.Equal(st.RecentFailures[0].Rank, last.Rank) {
		st.RecentFailures[0].Action = a
	}
	// The last decision counts: an in-place restart escalated to a recreate was decided then.
	st.StampRecovery(func(r *trainingv1alpha1.RecoveryTimeline) {
		*r = trainingv1alpha1.RecoveryTimeline{LastStep: r.LastStep, Detected: r.Detected, Decided: trainingv1alpha1.Stamp(e.Now)}
	})
}

// Finish closes a gang restart once every rank of the new attempt runs: an in-place one as of
// when its last rank came back, since that is known exactly and a pass may come later.
func (e *Executor) Finish(g gang.Gang) {
	st := &e.Job.Status
	since, ok := recovery.Restarting(st)
	if !ok {
		return
	}
	end := e.Now
	if back := g.BackAt(); st.LastRestartMode == trainingv1alpha1.RestartModeInPlace && back.After(since) && back.Before(end) {
		end = back
	}
	st.Replacing = nil
	if st.LastRestartMode == trainingv1alpha1.RestartModeInPlace && st.LastFailure != nil {
		// The cascade is over: every other rank whose container it restarted.
		if n := recovery.CascadeSince(g, since, ptr.Deref(st.LastFailure.Rank, -1)); n > st.LastFailure.Cascaded {
			category, more := st.LastFailure.Category, float64(n-st.LastFailure.Cascaded)
			e.Host.WhenStored(func() { failuresTotal.WithLabelValues(category, "cascade").Add(more) })
			st.LastFailure.Cascaded = n
			if len(st.RecentFailures) > 0 && st.RecentFailures[0].Time.Equal(&st.LastFailure.Time) {
				st.RecentFailures[0].Cascaded = n
			}
		}
	}
	recovery.KeepCounts(st, g) // the restart's cascade, accounted for: the next restart's baseline
	took := end.Sub(since)
	secs := int32(min(max(math.Ceil(took.Seconds()), 0), math.MaxInt32)) // a clock step back is 0, not a status the schema refuses
	if c := meta.FindStatusCondition(st.Conditions, trainingv1alpha1.ConditionRestarting); c != nil && c.Reason == trainingv1alpha1.ReasonGrowing {
		// A grow recovers from no failure: it is not a recovery time, nor told as one.
		e.Host.SetCondition(trainingv1alpha1.ConditionRestarting, metav1.ConditionFalse, trainingv1alpha1.ReasonRecovered,
			fmt.Sprintf("attempt %d running on %d nodes %ds after the grow began (%s)", st.Attempt(), e.Job.Width(), secs, st.LastRestartMode))
		e.Host.Normal(trainingv1alpha1.ReasonRecovered, "Restart", "grown %s: attempt %d has all %d ranks running, %ds after the grow began",
			restartModeWords(st.LastRestartMode), st.Attempt(), e.Job.Width(), secs)
		return
	}
	st.LastRecoverySeconds = &secs
	st.StampRecovery(func(r *trainingv1alpha1.RecoveryTimeline) {
		if r.Running == nil {
			r.Running = trainingv1alpha1.Stamp(end)
		}
	})
	mode := string(st.LastRestartMode)
	e.Host.WhenStored(func() { recoverySeconds.WithLabelValues(mode).Observe(took.Seconds()) })
	e.Host.SetCondition(trainingv1alpha1.ConditionRestarting, metav1.ConditionFalse, trainingv1alpha1.ReasonRecovered,
		fmt.Sprintf("attempt %d running %ds after the failure (%s)", st.Attempt(), secs, st.LastRestartMode))
	e.Host.Normal(trainingv1alpha1.ReasonRecovered, "Restart", "recovered %s: attempt %d has all %d ranks running, %ds after the failure",
		restartModeWords(st.LastRestartMode), st.Attempt(), e.Job.Width(), secs)
}

// restartModeWords says how a restart happened, for events.
func restartModeWords(m trainingv1alpha1.RestartMode) string {
	if m == trainingv1alpha1.RestartModeInPlace {
		return "in place"
	}
	return "by recreating the gang"
}
