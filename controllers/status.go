package controllers

import (
	"context"
	"fmt"
	"regexp"
	"slices"
	"time"

	corev1 "k8s.io/api/core/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"

	trainingv1alpha1 "github.com/zaya-operator/zaya-operator/api/v1alpha1"
	"github.com/zaya-operator/zaya-operator/controllers/admission"
	"github.com/zaya-operator/zaya-operator/controllers/bounded"
	"github.com/zaya-operator/zaya-operator/controllers/liveprogress"
	"github.com/zaya-operator/zaya-operator/controllers/restart"
)

// pass is one reconcile of one job: its steps change job.Status in memory and queue what to
// tell the world about it; Reconcile writes the status once and then emits.
type pass struct {
	r     *ZayaTrainingJobReconciler
	job   *trainingv1alpha1.ZayaTrainingJob
	now   time.Time
	marks *markKey // signs the pods the pass creates
	// restarts carries recovery's verdicts out (controllers/restart), once the pass knows the
	// gang.
	restarts *restart.Executor
	// report is rank 0's latest live progress (nil: none); progressAddrs where ranks 0 and 1
	// serve theirs now.
	report        *liveprogress.Report
	progressAddrs []string
	// stopped are the messages of the gang's failed ranks and latest exits.
	stopped func() []string

	// events are emitted in order at the end of the pass. Those about decisions (status
	// changes), and onStore's metrics of them, only once that status is stored: a pass whose
	// write conflicts or is held back decides again from the stored status, so emitting now
	// would count twice. Events about API calls the pass made go out regardless: the calls
	// happened, and the next pass will not make them again.
	events  []pendingEvent
	onStore []func()

	// pods are the job's own pods as the pass found them.
	pods []corev1.Pod
	// admission is the gate's ticket for this pass: whether the gang may run, and what it
	// places on the pods.
	admission admission.Ticket
}

// pendingEvent is an event waiting for the end of the pass.
type pendingEvent struct {
	eventType, reason, action, note string
	decision                        bool
}

func (p *pass) event(decision bool, eventType, reason, action, format string, args ...any) {
	p.events = append(p.events, pendingEvent{eventType, reason, action, bounded.Message(fmt.Sprintf(format, args...)), decision})
}

// normal and warning queue an event about a decision recorded in status.
func (p *pass) normal(reason, action, format string, args ...any) {
	p.event(true, corev1.EventTypeNormal, reason, action, format, args...)
}

func (p *pass) warning(reason, action, format string, args ...any) {
	p.event(true, corev1.EventTypeWarning, reason, action, format, args...)
}

// acted queues an event about a call to the API server that this pass made.
func (p *pass) acted(eventType, reason, action, format string, args ...any) {
	p.event(false, eventType, reason, action, format, args...)
}

// whenStored queues a metric update for a decision recorded in status.
func (p *pass) whenStored(record func()) {
	p.onStore = append(p.onStore, record)
}

// emit sends the pass's events and metrics; those about decisions only when stored says the
// status that records them was written (or needed no write).
func (p *pass) emit(stored bool) {
	for _, e := range p.events {
		if stored || !e.decision {
			p.r.Recorder.Eventf(p.job, nil, e.eventType, e.reason, e.action, "%s", e.note)
		}
	}
	if !stored {
		return
	}
	for _, record := range p.onStore {
		record()
	}
}

// setCondition sets a condition and reports whether it changed.
func (p *pass) setCondition(condType string, status metav1.ConditionStatus, reason, message string) bool {
	return meta.SetStatusCondition(&p.job.Status.Conditions, metav1.Condition{
		Type:               condType,
		Status:             status,
		Reason:             conditionReason(reason),
		Message:            bounded.Message(message),
		ObservedGeneration: p.job.Generation,
		LastTransitionTime: metav1.NewTime(p.now),
	})
}

// becameTrue sets a condition True and reports whether it was not True before.
func (p *pass) becameTrue(condType, reason, message string) bool {
	was := meta.IsStatusConditionTrue(p.job.Status.Conditions, condType)
	p.setCondition(condType, metav1.ConditionTrue, reason, message)
	return !was
}

// clearCondition sets a condition to False if it is present, and reports whether it changed.
func (p *pass) clearCondition(condType, reason, message string) bool {
	if meta.FindStatusCondition(p.job.Status.Conditions, condType) == nil {
		return false
	}
	return p.setCondition(condType, metav1.ConditionFalse, reason, message)
}

// writeStatus stores the pass's status if it changed from old. It reports whether the stored
// status now holds the pass's decisions, and how soon to come back for a write it held back.
func (r *ZayaTrainingJobReconciler) writeStatus(ctx context.Context, p *pass, old *trainingv1alpha1.ZayaTrainingJobStatus) (bool, time.Duration, error) {
	sortConditions(p.job.Status.Conditions)
	if apiequality.Semantic.DeepEqual(old, &p.job.Status) {
		return true, 0, nil
	}
	key := types.NamespacedName{Namespace: p.job.Namespace, Name: p.job.Name}
	if wait := r.progressWait(key, old, &p.job.Status, p.now); wait > 0 {
		// At 1024 ranks a write per rank coming up would be ~1000 requests for a number
		// nobody reads that fast: write it at most once per interval.
		return false, wait, nil
	}
	if err := r.Status().Update(ctx, p.job); err != nil {
		return false, 0, err
	}
	r.lastWrite.Store(key, p.now)
	return true, 0, nil
}

// progressWait is how long to hold back a status write that only reports launch progress
// (readyNodes and the message of an unchanged Running=False condition) because the job's
// status was written less than ProgressInterval ago; 0 means write now.
func (r *ZayaTrainingJobReconciler) progressWait(key types.NamespacedName, old, cur *trainingv1alpha1.ZayaTrainingJobStatus, now time.Time) time.Duration {
	last, ok := r.lastWrite.Load(key)
	if !ok || !progressOnly(old, cur) {
		return 0
	}
	interval := r.ProgressInterval
	if interval <= 0 {
		interval = time.Second
	}
	return max(last.(time.Time).Add(interval).Sub(now), 0)
}

// progressOnly reports whether cur differs from old only in launch progress.
func progressOnly(old, cur *trainingv1alpha1.ZayaTrainingJobStatus) bool {
	a, b := old.DeepCopy(), cur.DeepCopy()
	a.ReadyNodes, b.ReadyNodes = 0, 0
	ra := meta.FindStatusCondition(a.Conditions, trainingv1alpha1.ConditionRunning)
	rb := meta.FindStatusCondition(b.Conditions, trainingv1alpha1.ConditionRunning)
	if ra == nil || rb == nil || ra.Status != metav1.ConditionFalse || rb.Status != metav1.ConditionFalse || ra.Reason != rb.Reason {
		return false
	}
	ra.Message, rb.Message = "", ""
	return apiequality.Semantic.DeepEqual(a, b)
}

// conditionTypes lists every condition the operator sets, most significant first: kubectl's
// STATUS column shows the first True one, and the jobs metric reports each.
var conditionTypes = []string{
	trainingv1alpha1.ConditionFailed,
	trainingv1alpha1.ConditionSucceeded,
	trainingv1alpha1.ConditionSuspended,
	trainingv1alpha1.ConditionRestarting,
	trainingv1alpha1.ConditionWaitingForCapacity,
	trainingv1alpha1.ConditionShrunk,
	trainingv1alpha1.ConditionRunning,
	trainingv1alpha1.ConditionCreated,
}

// sortConditions orders conditions as conditionTypes does; others go last.
func sortConditions(conds []metav1.Condition) {
	rank := func(t string) int {
		if i := slices.Index(conditionTypes, t); i >= 0 {
			return i
		}
		return len(conditionTypes)
	}
	slices.SortStableFunc(conds, func(a, b metav1.Condition) int { return rank(a.Type) - rank(b.Type) })
}

// soonest is the result that requeues first (results that do not requeue lose).
func soonest(results ...ctrl.Result) ctrl.Result {
	var out ctrl.Result
	for _, r := range results {
		if out.RequeueAfter == 0 || (r.RequeueAfter != 0 && r.RequeueAfter < out.RequeueAfter) {
			out = r
		}
	}
	return out
}

// conditionReasonPattern is what metav1.Condition's schema allows as a reason.
var conditionReasonPattern = regexp.MustCompile(`^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$`)

// conditionReason is reason as a condition can hold it. Some reasons are copied from status
// others write (status.lastFailure.reason, whose own schema bounds only its length): one a
// condition's schema refuses ("exit 1") would have every status write refused, and the
// restart it names never escalated.
func conditionReason(reason string) string {
	if len(reason) <= 1024 && conditionReasonPattern.MatchString(reason) {
		return reason
	}
	return trainingv1alpha1.ReasonUnrecognized
}
