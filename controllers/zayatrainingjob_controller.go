// Package controllers reconciles ZayaTrainingJobs into gangs of AMD GPU worker pods and
// keeps them alive.
package controllers

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"sync"
	"time"
	"unicode/utf8"

	corev1 "k8s.io/api/core/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"k8s.io/client-go/tools/events"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	trainingv1alpha1 "github.com/zaya-operator/zaya-operator/api/v1alpha1"
)

// maxMessageLength bounds condition messages (the API allows 32768; status stays small).
const maxMessageLength = 1024

// capacityGrace is how long the scheduler must have found no room for a rank before the job
// reports WaitingForCapacity: a claim still binding or a node still registering is not news.
const capacityGrace = 10 * time.Second

// defaultCreateParallelism bounds concurrent pod creations of one job.
const defaultCreateParallelism = 128

// ZayaTrainingJobReconciler reconciles ZayaTrainingJob objects.
type ZayaTrainingJobReconciler struct {
	client.Client
	Recorder events.EventRecorder
	Clock    clock.PassiveClock
	// CreateParallelism bounds concurrent pod creations per job (default 128).
	CreateParallelism int
	// ProgressInterval spaces a job's status writes that only report launch progress
	// (readyNodes ticking up while ranks start); 0 means 1 s. Condition changes are
	// written at once.
	ProgressInterval time.Duration

	lastWrite sync.Map  // types.NamespacedName → time.Time of the job's last status write
	creations creations // pods created but not yet in the cache
}

// Least privilege: reads come from the informers' caches (list, watch), never a live get;
// status is written with update only. test/integration's TestOperatorNeedsExactlyTheGeneratedRBAC
// runs a job's whole life under exactly these rules and fails on any unused one.
// +kubebuilder:rbac:groups=training.zaya.dev,resources=zayatrainingjobs,verbs=list;watch;delete
// +kubebuilder:rbac:groups=training.zaya.dev,resources=zayatrainingjobs/status,verbs=update
// +kubebuilder:rbac:groups="",resources=pods,verbs=list;watch;create;delete
// +kubebuilder:rbac:groups="",resources=services,verbs=list;watch;create
// +kubebuilder:rbac:groups="",resources=persistentvolumeclaims,verbs=list;watch;create
// +kubebuilder:rbac:groups="",resources=nodes,verbs=list;watch;patch
// +kubebuilder:rbac:groups=events.k8s.io,resources=events,verbs=create;patch

// Reconcile brings one job one step closer to its spec and writes its status once.
func (r *ZayaTrainingJobReconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	job := &trainingv1alpha1.ZayaTrainingJob{}
	if err := r.Get(ctx, req.NamespacedName, job); err != nil {
		if apierrors.IsNotFound(err) {
			r.lastWrite.Delete(req.NamespacedName)
			r.creations.forget(req.NamespacedName)
		}
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	if !job.DeletionTimestamp.IsZero() || !job.ManagedByOperator() {
		return ctrl.Result{}, nil
	}
	logger := log.FromContext(ctx).WithValues("job", klog.KObj(job))
	ctx = log.IntoContext(ctx, logger)

	// The pass only reads pods, so it may share the cache's copies: at 1024 ranks a deep copy
	// per pass would dominate its cost.
	pods := &corev1.PodList{}
	if err := r.List(ctx, pods, client.InNamespace(job.Namespace), client.MatchingFields{podOwnerKey: job.Name},
		client.UnsafeDisableDeepCopy); err != nil {
		return ctrl.Result{}, fmt.Errorf("listing pods: %w", err)
	}

	oldStatus := job.Status.DeepCopy()
	p := &pass{r: r, job: job, now: r.Clock.Now()}
	result, err := p.run(ctx, pods.Items)
	sortConditions(job.Status.Conditions)

	if !apiequality.Semantic.DeepEqual(oldStatus, &job.Status) {
		if wait := r.progressWait(req.NamespacedName, oldStatus, &job.Status, p.now); wait > 0 {
			// At 1024 ranks a write per rank coming up would be ~1000 requests for a number
			// nobody reads that fast: write it at most once per interval.
			result = soonest(result, ctrl.Result{RequeueAfter: wait})
		} else {
			if uerr := r.Status().Update(ctx, job); uerr != nil {
				if apierrors.IsNotFound(uerr) {
					return ctrl.Result{}, err // deleted meanwhile (or by this pass, after its TTL)
				}
				if apierrors.IsConflict(uerr) {
					// A newer version is on its way through the watch; it triggers the next pass.
					logger.V(1).Info("status update conflicted, waiting for the newer version")
					return ctrl.Result{}, err
				}
				return ctrl.Result{}, fmt.Errorf("updating status: %w", uerr)
			}
			r.lastWrite.Store(req.NamespacedName, p.now)
			p.observe(oldStatus)
		}
	}
	for _, e := range p.events {
		r.Recorder.Eventf(job, nil, e.eventType, e.reason, e.action, "%s", e.note)
	}
	return result, err
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

// pendingEvent is an event to emit once the status it describes is stored.
type pendingEvent struct {
	eventType, reason, action, note string
}

// pass is one reconcile of one job: the steps change job.Status in memory and queue events.
type pass struct {
	r      *ZayaTrainingJobReconciler
	job    *trainingv1alpha1.ZayaTrainingJob
	now    time.Time
	events []pendingEvent
}

func (p *pass) normal(reason, action, format string, args ...any) {
	p.events = append(p.events, pendingEvent{corev1.EventTypeNormal, reason, action, truncate(fmt.Sprintf(format, args...))})
}

func (p *pass) warning(reason, action, format string, args ...any) {
	p.events = append(p.events, pendingEvent{corev1.EventTypeWarning, reason, action, truncate(fmt.Sprintf(format, args...))})
}

// setCondition sets a condition and reports whether it changed.
func (p *pass) setCondition(condType string, status metav1.ConditionStatus, reason, message string) bool {
	return meta.SetStatusCondition(&p.job.Status.Conditions, metav1.Condition{
		Type:               condType,
		Status:             status,
		Reason:             reason,
		Message:            truncate(message),
		ObservedGeneration: p.job.Generation,
		LastTransitionTime: metav1.NewTime(p.now),
	})
}

// clearCondition sets a condition to False if it is present, and reports whether it changed.
func (p *pass) clearCondition(condType, reason, message string) bool {
	if meta.FindStatusCondition(p.job.Status.Conditions, condType) == nil {
		return false
	}
	return p.setCondition(condType, metav1.ConditionFalse, reason, message)
}

// run is the list of steps of one pass.
func (p *pass) run(ctx context.Context, pods []corev1.Pod) (ctrl.Result, error) {
	job := p.job
	job.Status.ObservedGeneration = job.Generation

	if finished(job) {
		return p.finish(ctx, pods)
	}
	if !p.accept(ctx) {
		return ctrl.Result{}, nil
	}
	if job.Spec.Suspend {
		return ctrl.Result{}, p.suspend(ctx, pods)
	}
	p.resume()
	if err := p.ensureService(ctx); err != nil {
		return ctrl.Result{}, err
	}
	if err := p.ensureCheckpointClaim(ctx); err != nil {
		return ctrl.Result{}, err
	}
	if job.Status.StartTime == nil {
		job.Status.StartTime = &metav1.Time{Time: p.now}
	}
	if p.deadlineExceeded() {
		return p.finish(ctx, pods)
	}

	releaseIn := p.expireQuarantine()
	gang := classify(job, pods)
	p.recordCheckpoint(gang)
	if p.succeeded(gang) {
		return p.finish(ctx, pods)
	}
	v, err := p.firstFailure(ctx, gang)
	if err != nil {
		return ctrl.Result{}, err
	}
	if v != nil {
		if quarantines(v.failure.Reason) {
			if err := p.quarantine(ctx, &v.failure); err != nil {
				return ctrl.Result{}, err
			}
		}
		p.recover(ctx, *v)
		if finished(job) {
			return p.finish(ctx, pods)
		}
		return ctrl.Result{}, nil // the status write brings the next pass
	}

	// A new attempt starts only once the old one is gone: its pods hold the GPUs and answer
	// to the same hostnames.
	_, restarting := p.restarting()
	if err := p.deletePods(ctx, gang.stale, restarting); err != nil {
		return ctrl.Result{}, err
	}
	if len(gang.stale) > 0 || len(gang.draining) > 0 {
		next, err := p.clearStuck(ctx, gang.draining)
		return soonest(ctrl.Result{RequeueAfter: next}, p.requeueForDeadline()), err
	}
	if wait := p.backoffLeft(); wait > 0 {
		return soonest(ctrl.Result{RequeueAfter: wait}, p.requeueForDeadline()), nil
	}
	recheck, err := p.createMissing(ctx, gang)
	if err != nil {
		return ctrl.Result{}, err
	}
	return soonest(soonest(soonest(p.updateProgress(gang), p.requeueForDeadline()), ctrl.Result{RequeueAfter: releaseIn}),
		ctrl.Result{RequeueAfter: recheck}), nil
}

// firstFailure is the failure that ends the current attempt: a failed or deleted pod, else a
// rank on a node that lost its health (the device plugin never evicts those pods).
func (p *pass) firstFailure(ctx context.Context, g gang) (*verdict, error) {
	if pod := g.firstFailure(); pod != nil {
		v := judge(&p.job.Spec, pod, p.now, p.job.Status.Restarts)
		return &v, nil
	}
	f, err := p.unhealthyRank(ctx, g)
	if f == nil || err != nil {
		return nil, err
	}
	return &verdict{failure: *f, counted: true}, nil
}

// soonest is the result that requeues first.
func soonest(a, b ctrl.Result) ctrl.Result {
	if a.RequeueAfter == 0 || (b.RequeueAfter != 0 && b.RequeueAfter < a.RequeueAfter) {
		return b
	}
	return a
}

// finished reports whether the job reached Succeeded or Failed.
func finished(job *trainingv1alpha1.ZayaTrainingJob) bool {
	return meta.IsStatusConditionTrue(job.Status.Conditions, trainingv1alpha1.ConditionSucceeded) ||
		meta.IsStatusConditionTrue(job.Status.Conditions, trainingv1alpha1.ConditionFailed)
}

// maxPodBytes keeps worker pods well inside what the API server stores: etcd refuses
// requests over 1.5 MiB by default, and a job near the API's 3 MiB limit (long env values,
// say) would otherwise be accepted and then never get a pod.
const maxPodBytes = 1 << 20

// podSizeErrors refuses a spec whose worker pod (the last rank's: the longest names) would
// be too large to store.
func podSizeErrors(job *trainingv1alpha1.ZayaTrainingJob) field.ErrorList {
	b, err := json.Marshal(newWorkerPod(job, networkEnv(&job.Spec), job.Spec.Nodes-1))
	if err != nil || len(b) <= maxPodBytes {
		return nil
	}
	return field.ErrorList{field.Invalid(field.NewPath("spec", "template"), "(omitted)", fmt.Sprintf(
		"the worker pod would be %d bytes, more than the %d the operator creates (etcd stores at most 1.5 MiB per object): shorten env values, annotations or the template",
		len(b), maxPodBytes))}
}

// accept validates what the CRD cannot and sets Created.
func (p *pass) accept(ctx context.Context) bool {
	job := p.job
	errs := trainingv1alpha1.ValidateSpec(&job.Spec)
	if len(errs) == 0 && !meta.IsStatusConditionTrue(job.Status.Conditions, trainingv1alpha1.ConditionCreated) {
		errs = podSizeErrors(job) // once: it builds and encodes a pod
	}
	if len(errs) > 0 {
		msg := errs.ToAggregate().Error()
		if p.setCondition(trainingv1alpha1.ConditionCreated, metav1.ConditionFalse, trainingv1alpha1.ReasonInvalidSpec, msg) {
			p.warning(trainingv1alpha1.ReasonInvalidSpec, "Validate", "%s", msg)
			log.FromContext(ctx).Info("job spec is invalid", "errors", msg)
		}
		return false
	}
	if p.setCondition(trainingv1alpha1.ConditionCreated, metav1.ConditionTrue, trainingv1alpha1.ReasonAccepted,
		fmt.Sprintf("accepted a gang of %d nodes x %d GPUs", job.Spec.Nodes, job.Spec.GPUsPerNode)) {
		p.normal(trainingv1alpha1.ReasonAccepted, "Create", "accepted: world size %d, context parallel %d, network %s",
			job.Spec.WorldSize(), job.Spec.Parallelism.ContextParallel, job.Spec.Network.Profile)
		p.normal(trainingv1alpha1.ReasonNetworkConfigured, "Create", "%s", formatEnv(networkEnv(&job.Spec)))
	}
	return true
}

// suspend deletes every pod and keeps everything else (checkpoints, service, budget).
func (p *pass) suspend(ctx context.Context, pods []corev1.Pod) error {
	job := p.job
	if err := p.deletePods(ctx, activePods(pods), false); err != nil {
		return err
	}
	if p.setCondition(trainingv1alpha1.ConditionSuspended, metav1.ConditionTrue, trainingv1alpha1.ReasonSuspended, "spec.suspend is true: no pods run; checkpoints are kept") {
		p.normal(trainingv1alpha1.ReasonSuspended, "Suspend", "suspended: deleted the worker pods, kept checkpoints")
		if job.Status.StartTime != nil {
			// Resuming starts a new attempt, so the pods being deleted now never pass for it.
			job.Status.Restarts++
		}
	}
	p.clearCondition(trainingv1alpha1.ConditionRestarting, trainingv1alpha1.ReasonSuspended, "the job is suspended")
	p.clearCondition(trainingv1alpha1.ConditionRunning, trainingv1alpha1.ReasonSuspended, "the job is suspended")
	p.clearCondition(trainingv1alpha1.ConditionWaitingForCapacity, trainingv1alpha1.ReasonSuspended, "the job is suspended")
	job.Status.ReadyNodes = 0
	job.Status.StartTime = nil
	return nil
}

// resume marks a suspended job as resumed; its pods are recreated by this pass.
func (p *pass) resume() {
	if p.clearCondition(trainingv1alpha1.ConditionSuspended, trainingv1alpha1.ReasonResumed, "spec.suspend is false") {
		p.normal(trainingv1alpha1.ReasonResumed, "Resume", "resumed: recreating the worker pods")
	}
}

// metadataOf is an empty core object of kind to Get into: the operator only needs to know that
// its Service and claim exist, so their informers hold metadata alone.
func metadataOf(kind string) *metav1.PartialObjectMetadata {
	m := &metav1.PartialObjectMetadata{}
	m.SetGroupVersionKind(corev1.SchemeGroupVersion.WithKind(kind))
	return m
}

func (p *pass) ensureService(ctx context.Context) error {
	svc := newService(p.job)
	if err := p.r.Get(ctx, client.ObjectKeyFromObject(svc), metadataOf("Service")); !apierrors.IsNotFound(err) {
		return err
	}
	if err := p.r.Create(ctx, svc); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("creating service: %w", err)
	}
	return nil
}

func (p *pass) ensureCheckpointClaim(ctx context.Context) error {
	pvc := newCheckpointClaim(p.job)
	if pvc == nil {
		return nil
	}
	if err := p.r.Get(ctx, client.ObjectKeyFromObject(pvc), metadataOf("PersistentVolumeClaim")); !apierrors.IsNotFound(err) {
		return err
	}
	if err := p.r.Create(ctx, pvc); err != nil {
		if apierrors.IsAlreadyExists(err) {
			return nil
		}
		return fmt.Errorf("creating checkpoint claim: %w", err)
	}
	p.normal(trainingv1alpha1.ReasonCheckpointClaimCreated, "Create", "created checkpoint claim %s (%s)", pvc.Name,
		pvc.Spec.Resources.Requests.Storage().String())
	return nil
}

// deadlineExceeded fails the job once activeDeadlineSeconds have passed since startTime.
func (p *pass) deadlineExceeded() bool {
	d := p.job.Spec.ActiveDeadlineSeconds
	if d == nil || p.now.Before(p.job.Status.StartTime.Add(time.Duration(*d)*time.Second)) {
		return false
	}
	p.fail(trainingv1alpha1.ReasonDeadlineExceeded, fmt.Sprintf("ran longer than activeDeadlineSeconds (%ds)", *d))
	return true
}

func (p *pass) requeueForDeadline() ctrl.Result {
	d := p.job.Spec.ActiveDeadlineSeconds
	if d == nil {
		return ctrl.Result{}
	}
	return ctrl.Result{RequeueAfter: p.job.Status.StartTime.Add(time.Duration(*d) * time.Second).Sub(p.now)}
}

// recordCheckpoint keeps the newest checkpoint step the workers reported.
func (p *pass) recordCheckpoint(g gang) {
	last := p.job.Status.LastCheckpoint
	if g.checkpointStep < 0 || (last != nil && last.Step >= g.checkpointStep) {
		return
	}
	p.job.Status.LastCheckpoint = &trainingv1alpha1.CheckpointStatus{Step: g.checkpointStep, Time: &metav1.Time{Time: p.now}}
}

// succeeded applies the success policy.
func (p *pass) succeeded(g gang) bool {
	job := p.job
	done := false
	switch job.Spec.SuccessPolicy {
	case trainingv1alpha1.SuccessAllRanks:
		done = g.succeeded == job.Spec.Nodes
	default:
		done = g.ranks[0] != nil && g.ranks[0].Status.Phase == corev1.PodSucceeded
	}
	if !done {
		return false
	}
	p.setCondition(trainingv1alpha1.ConditionSucceeded, metav1.ConditionTrue, trainingv1alpha1.ReasonCompleted,
		fmt.Sprintf("%s: training finished", job.Spec.SuccessPolicy))
	p.complete()
	p.normal(trainingv1alpha1.ReasonCompleted, "Complete", "succeeded (%s)", job.Spec.SuccessPolicy)
	return true
}

// fail marks the job Failed.
func (p *pass) fail(reason, message string) {
	p.setCondition(trainingv1alpha1.ConditionFailed, metav1.ConditionTrue, reason, message)
	p.complete()
	p.warning(reason, "Fail", "failed: %s", message)
}

// complete records the end of the job.
func (p *pass) complete() {
	p.job.Status.CompletionTime = &metav1.Time{Time: p.now}
	p.job.Status.ReadyNodes = 0
	p.clearCondition(trainingv1alpha1.ConditionRunning, trainingv1alpha1.ReasonFinished, "the job finished")
	p.clearCondition(trainingv1alpha1.ConditionWaitingForCapacity, trainingv1alpha1.ReasonFinished, "the job finished")
	p.clearCondition(trainingv1alpha1.ConditionRestarting, trainingv1alpha1.ReasonFinished, "the job finished")
}

// finish cleans up a finished job's running pods (finished pods stay for their logs) and
// deletes the job once ttlSecondsAfterFinished has passed.
func (p *pass) finish(ctx context.Context, pods []corev1.Pod) (ctrl.Result, error) {
	if err := p.deletePods(ctx, activePods(pods), true); err != nil {
		return ctrl.Result{}, err
	}
	ttl := p.job.Spec.TTLSecondsAfterFinished
	if ttl == nil || p.job.Status.CompletionTime == nil {
		return ctrl.Result{}, nil
	}
	expiry := p.job.Status.CompletionTime.Add(time.Duration(*ttl) * time.Second)
	if p.now.Before(expiry) {
		return ctrl.Result{RequeueAfter: expiry.Sub(p.now)}, nil
	}
	log.FromContext(ctx).Info("deleting finished job after its TTL", "ttlSecondsAfterFinished", *ttl)
	err := p.r.Delete(ctx, p.job, client.PropagationPolicy(metav1.DeletePropagationBackground))
	return ctrl.Result{}, client.IgnoreNotFound(err)
}

// updateProgress sets readyNodes, Running and WaitingForCapacity from the gang's pods, and
// asks to be called again when a pending capacity verdict becomes reportable.
func (p *pass) updateProgress(g gang) ctrl.Result {
	job := p.job
	n := job.Spec.Nodes
	job.Status.ReadyNodes = g.ready
	if g.ready == n {
		p.finishRecovery()
		if p.setCondition(trainingv1alpha1.ConditionRunning, metav1.ConditionTrue, trainingv1alpha1.ReasonAllRanksRunning,
			fmt.Sprintf("all %d ranks are running", n)) {
			p.normal(trainingv1alpha1.ReasonAllRanksRunning, "Run", "all %d ranks running (%d GPUs)", n, job.Spec.WorldSize())
		}
	} else {
		p.setCondition(trainingv1alpha1.ConditionRunning, metav1.ConditionFalse, trainingv1alpha1.ReasonStarting,
			fmt.Sprintf("%d/%d ranks running", g.ready, n))
	}

	if g.unschedulable == 0 {
		p.clearCondition(trainingv1alpha1.ConditionWaitingForCapacity, trainingv1alpha1.ReasonPlaced, fmt.Sprintf("%d/%d ranks placed", g.scheduled, n))
		return ctrl.Result{}
	}
	if wait := g.unschedulableSince.Add(capacityGrace).Sub(p.now); wait > 0 {
		return ctrl.Result{RequeueAfter: wait}
	}
	msg := fmt.Sprintf("%d/%d ranks placed, %d unschedulable: %s", g.scheduled, n, g.unschedulable, g.unschedulableMessage)
	if p.setCondition(trainingv1alpha1.ConditionWaitingForCapacity, metav1.ConditionTrue, trainingv1alpha1.ReasonUnschedulable, msg) {
		p.warning(trainingv1alpha1.ReasonUnschedulable, "Schedule", "%s", msg)
	}
	return ctrl.Result{}
}

// conditionOrder ranks condition types, most significant first: kubectl's STATUS column
// shows the first True one.
var conditionOrder = map[string]int{
	trainingv1alpha1.ConditionFailed:             0,
	trainingv1alpha1.ConditionSucceeded:          1,
	trainingv1alpha1.ConditionSuspended:          2,
	trainingv1alpha1.ConditionRestarting:         3,
	trainingv1alpha1.ConditionWaitingForCapacity: 4,
	trainingv1alpha1.ConditionRunning:            5,
	trainingv1alpha1.ConditionCreated:            6,
}

func sortConditions(conds []metav1.Condition) {
	slices.SortStableFunc(conds, func(a, b metav1.Condition) int {
		ra, oka := conditionOrder[a.Type]
		rb, okb := conditionOrder[b.Type]
		if !oka {
			ra = len(conditionOrder)
		}
		if !okb {
			rb = len(conditionOrder)
		}
		return ra - rb
	})
}

// truncate bounds a message to maxMessageLength bytes on a rune boundary.
func truncate(s string) string {
	if len(s) <= maxMessageLength {
		return s
	}
	cut := maxMessageLength - len("...")
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + "..."
}

// progressBatch is how long a job's pass waits after a pod event that only reports progress
// (created, scheduled, started, ready): during a launch of N ranks such events arrive by the
// thousand and each pass walks every pod, so one pass per batch keeps the cost linear.
const progressBatch = 200 * time.Millisecond

// podEvents enqueues a pod's job: at once when the pod failed, finished or is going away
// (recovery must not wait), after progressBatch otherwise (the queue merges the waits).
type podEvents struct{}

func (podEvents) Create(_ context.Context, e event.CreateEvent, q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
	enqueueOwner(e.Object, q, progressBatch)
}

func (podEvents) Update(_ context.Context, e event.UpdateEvent, q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
	delay := progressBatch
	if pod, ok := e.ObjectNew.(*corev1.Pod); ok && (!pod.DeletionTimestamp.IsZero() ||
		pod.Status.Phase == corev1.PodFailed || pod.Status.Phase == corev1.PodSucceeded || pod.Status.Reason != "") {
		delay = 0
	}
	enqueueOwner(e.ObjectNew, q, delay)
}

func (podEvents) Delete(_ context.Context, e event.DeleteEvent, q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
	enqueueOwner(e.Object, q, 0)
}

func (podEvents) Generic(_ context.Context, e event.GenericEvent, q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
	enqueueOwner(e.Object, q, 0)
}

func enqueueOwner(obj client.Object, q workqueue.TypedRateLimitingInterface[reconcile.Request], delay time.Duration) {
	owner := metav1.GetControllerOf(obj)
	if owner == nil || owner.Kind != "ZayaTrainingJob" || owner.APIVersion != trainingv1alpha1.GroupVersion.String() {
		return
	}
	req := reconcile.Request{NamespacedName: types.NamespacedName{Namespace: obj.GetNamespace(), Name: owner.Name}}
	if delay > 0 {
		q.AddAfter(req, delay)
		return
	}
	q.Add(req)
}

// SetupWithManager registers the reconciler, its pod index and metrics with mgr.
func (r *ZayaTrainingJobReconciler) SetupWithManager(mgr ctrl.Manager, concurrency int) error {
	if err := mgr.GetFieldIndexer().IndexField(context.Background(), &corev1.Pod{}, podOwnerKey, indexPodOwner); err != nil {
		return err
	}
	if err := mgr.GetFieldIndexer().IndexField(context.Background(), &corev1.Pod{}, podNodeKey, indexPodNode); err != nil {
		return err
	}
	registerMetrics(mgr.GetClient())
	return ctrl.NewControllerManagedBy(mgr).
		For(&trainingv1alpha1.ZayaTrainingJob{}).
		Watches(&corev1.Pod{}, podEvents{}).
		Owns(&corev1.Service{}, builder.OnlyMetadata).
		Watches(&corev1.Node{}, handler.EnqueueRequestsFromMapFunc(r.jobsOnNode), builder.WithPredicates(nodeHealthChanged)).
		WithOptions(controller.Options{MaxConcurrentReconciles: concurrency}).
		Named("zayatrainingjob").
		Complete(r)
}
