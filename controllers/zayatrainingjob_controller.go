// Package controllers reconciles ZayaTrainingJobs into gangs of AMD GPU worker pods and
// keeps them alive.
package controllers

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"golang.org/x/time/rate"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/klog/v2"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/metrics"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/source"

	trainingv1alpha1 "github.com/zaya-operator/zaya-operator/api/v1alpha1"
	"github.com/zaya-operator/zaya-operator/controllers/gang"
	"github.com/zaya-operator/zaya-operator/controllers/nodehealth"
	"github.com/zaya-operator/zaya-operator/controllers/recovery"
)

// Least privilege: reads come from the informers' caches (list, watch), but for a live get of
// the job's namespace before a restart (is it being deleted?); status is written with update only. test/integration's TestOperatorNeedsExactlyTheGeneratedRBAC
// runs a job's whole life under exactly these rules and fails on any unused one.
// +kubebuilder:rbac:groups=training.zaya.dev,resources=zayatrainingjobs,verbs=list;watch;delete
// +kubebuilder:rbac:groups=training.zaya.dev,resources=zayatrainingjobs/status,verbs=update
// +kubebuilder:rbac:groups="",resources=pods,verbs=list;watch;create;patch;delete
// +kubebuilder:rbac:groups="",resources=services,verbs=list;watch;create
// +kubebuilder:rbac:groups="",resources=persistentvolumeclaims,verbs=get;list;watch;create;patch
// +kubebuilder:rbac:groups="",resources=nodes,verbs=list;watch;patch
// +kubebuilder:rbac:groups="",resources=namespaces,verbs=get
// +kubebuilder:rbac:groups=events.k8s.io,resources=events,verbs=create;patch
// +kubebuilder:rbac:groups=coordination.k8s.io,resources=leases,verbs=get

// Reconcile brings one job one step closer to its spec and writes its status once.
func (r *ZayaTrainingJobReconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	stored := storedJob()
	if err := r.Get(ctx, req.NamespacedName, stored); err != nil {
		if apierrors.IsNotFound(err) {
			r.lastWrite.Delete(req.NamespacedName)
			r.conflicts.Delete(req.NamespacedName)
			r.tooLarge.Delete(req.NamespacedName)
			r.creations.Forget(req.NamespacedName)
			r.forgetProgress(req.NamespacedName)
			return r.releaseOrphaned(ctx, req.NamespacedName, false)
		}
		return ctrl.Result{}, err
	}
	if stored.GetDeletionTimestamp() != nil {
		// A Workload must not hold a foreground delete (or the quota) for a job that goes.
		return r.releaseOrphaned(ctx, req.NamespacedName, slices.Contains(stored.GetFinalizers(), metav1.FinalizerDeleteDependents))
	}
	if !managedByOperator(stored) {
		job, _, err := decodeJob(stored)
		if err != nil {
			return ctrl.Result{}, nil // another controller's to read
		}
		p := &pass{r: r, job: job, now: r.Clock.Now()}
		defer p.emit(true)
		return r.gate().Delegated(ctx, job, p)
	}
	logger := log.FromContext(ctx).WithValues("job", klog.KObj(stored))
	ctx = log.IntoContext(ctx, logger)
	job, dropped, err := decodeJob(stored)
	if err != nil {
		return ctrl.Result{}, r.undecodable(ctx, stored, err)
	}

	// The pass only reads pods, so it may share the cache's copies: at 1024 ranks a deep copy
	// per pass would dominate its cost.
	pods := &corev1.PodList{}
	if err := r.List(ctx, pods, client.InNamespace(job.Namespace), client.MatchingFields{podOwnerKey: job.Name},
		client.UnsafeDisableDeepCopy); err != nil {
		return ctrl.Result{}, fmt.Errorf("listing pods: %w", err)
	}
	marks, err := r.podMarkKey(ctx)
	if err != nil {
		return ctrl.Result{}, err
	}
	// Pods the operator did not make are no ranks, and never deleted: a rank whose name one
	// holds is reported as a name conflict when its pod is created.
	own, _ := marks.ownPods(job, pods.Items)
	own = recovery.SupervisorExits(own)

	oldStatus := job.Status.DeepCopy()
	p := &pass{r: r, job: job, now: r.Clock.Now(), marks: marks, pods: own}
	p.admission = r.gate().For(job, p)
	if len(dropped) > 0 {
		p.warning(trainingv1alpha1.ReasonInvalidSpec, "Validate", "reset %s: the stored value could not be read", strings.Join(dropped, ", "))
		oldStatus = &trainingv1alpha1.ZayaTrainingJobStatus{ObservedGeneration: -1} // write, replacing it
	}
	result, err := p.run(ctx, own)
	err = errors.Join(err, p.admission.Report(ctx, own, err != nil))
	// A job deleted and made again under its name: what the old one's admission holds goes
	// with its pods.
	orphans, oerr := r.gate().Orphans(ctx, req.NamespacedName, job.UID, false, r.podsHold(false))
	err = errors.Join(err, oerr)
	result = soonest(result, ctrl.Result{RequeueAfter: orphans})
	p.boundStatus()
	written, wait, werr := r.writeStatus(ctx, p, oldStatus)
	p.emit(written)
	switch {
	case apierrors.IsNotFound(werr):
		return ctrl.Result{}, err // deleted meanwhile (or by this pass, after its TTL)
	case apierrors.IsConflict(werr):
		// A newer version is on its way through the watch and triggers the next pass. Not
		// every 409 comes with one (a webhook's or a proxy's refusal, a watch that lost the
		// event): the pass's decision would then wait for an unrelated event, so look again.
		logger.V(1).Info("status update conflicted, waiting for the newer version")
		if err != nil {
			return ctrl.Result{}, err // retried anyway
		}
		return ctrl.Result{RequeueAfter: r.conflictRecheck(req.NamespacedName)}, nil
	case objectTooLarge(werr):
		r.statusTooLarge(ctx, job, werr)
		return ctrl.Result{}, nil
	case werr != nil:
		return ctrl.Result{}, fmt.Errorf("updating status: %w", werr)
	}
	if written {
		r.conflicts.Delete(req.NamespacedName)
	}
	return soonest(result, ctrl.Result{RequeueAfter: wait}), err
}

// conflictRecheck is how soon to look at a job whose status write was refused with 409 again
// (should no newer version bring a pass first): statusConflictRecheck, doubling while the
// refusals go on (a webhook that always refuses costs a pass per maxConflictRecheck).
func (r *ZayaTrainingJobReconciler) conflictRecheck(key types.NamespacedName) time.Duration {
	n := 0
	if v, ok := r.conflicts.Load(key); ok {
		n = v.(int)
	}
	r.conflicts.Store(key, n+1)
	return min(statusConflictRecheck<<min(n, 8), maxConflictRecheck)
}

// run is the list of steps of one pass.
func (p *pass) run(ctx context.Context, pods []corev1.Pod) (ctrl.Result, error) {
	job := p.job
	job.Status.ObservedGeneration = job.Generation
	// A status written by hand or restored under an older schema may hold a negative
	// counter; as an attempt it would be an invalid pod label.
	job.Status.Restarts = max(job.Status.Restarts, 0)
	job.Status.InPlaceRestarts = min(max(job.Status.InPlaceRestarts, 0), job.Status.Restarts)

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
	job.Status.CurrentNodes = job.Width()
	if run, res, err := p.admitted(ctx, pods); err != nil {
		return p.blocked(ctx, err)
	} else if !run {
		return soonest(res, p.requeueForDeadline()), nil
	}
	if err := p.ensureChildren(ctx); err != nil {
		return p.blocked(ctx, err)
	}
	p.decideMechanism(ctx)
	if job.Status.StartTime == nil {
		job.Status.StartTime = &metav1.Time{Time: p.now}
	}
	if queued := p.noteQueue(pods); !queued && p.deadlineExceeded() {
		return p.finish(ctx, pods)
	}

	ranks, spares := recovery.SplitSpares(job, pods)
	p.restarts = p.restarter(spares)
	releaseIn := p.restarts.ExpireQuarantine()
	if _, ok := recovery.InPlaceUnderWay(&job.Status); !ok {
		job.Status.Replacing = nil // left by a restart that ended another way (suspended, say)
	}
	g := gang.Of(job, ranks, p.r.gate().Lifted()...)
	if n, err := p.reclaimRanks(ctx, g); err != nil || n > 0 {
		return ctrl.Result{}, err // relabelled: the pods' return to the cache brings the next pass
	}
	g.NoticeVanished(job, p.now)
	p.stopped = sync.OnceValue(func() []string {
		// The current ranks' exits, and a recreate's old ranks' until they go.
		return append(gang.ExitMessages(g.Ranks, recovery.EvidenceChecks), gang.ExitMessages(slices.Concat(g.Stale, g.Draining, g.Previous), recovery.EvidenceChecks)...)
	})
	p.watchProgress(g)
	p.ledger().Refine(p.stopped) // read only while a loss is open: the exits of a big gang are many strings
	p.recordCheckpoint(g)
	p.recordResume(g)
	p.reportCorrupt(g)
	done, settling := p.succeeded(g)
	if done {
		// Decided now, acted on once stored (the status write brings the next pass): had
		// this pass deleted the other ranks and its write failed, the next one would see
		// ranks stopped under rank 0 and take the attempt for a failure.
		return ctrl.Result{}, nil
	}
	if settling > 0 {
		// Rank 0 is done; the others have recovery.SuccessGrace to finish or fail.
		return soonest(ctrl.Result{RequeueAfter: settling}, p.requeueForDeadline()), nil
	}
	v, wait, err := p.restarts.FirstFailure(ctx, g)
	if err != nil {
		return ctrl.Result{}, err
	}
	if wait > 0 {
		return ctrl.Result{RequeueAfter: wait}, nil // the cause may still show: see recovery.CascadeGrace
	}
	if v == nil && !p.restarting() {
		v = p.judgeStragglers(g)
	}
	if v != nil {
		if p.namespaceGoing(ctx) {
			return ctrl.Result{}, nil // the job goes with it: nothing to restart or report
		}
		if p.refused(ctx, *v) {
			return ctrl.Result{}, nil // the status write brings the next pass, which recreates at full width
		}
		if err := p.restarts.Act(ctx, *v, g); err != nil {
			return ctrl.Result{}, err
		}
		if finished(job) {
			return p.finish(ctx, pods)
		}
		return ctrl.Result{}, nil // the status write brings the next pass
	}
	started, causeDue, err := p.restarts.NoticeInPlace(ctx, g)
	if err != nil {
		return ctrl.Result{}, err
	}
	if started {
		if finished(job) {
			return p.finish(ctx, pods)
		}
		return ctrl.Result{}, nil
	}
	leaseDue, err := p.restarts.LostNodes(ctx, g)
	if err != nil {
		return ctrl.Result{}, err
	}
	inPlaceDue, escalated := p.restarts.InPlaceOverdue(ctx, g)
	if escalated {
		return ctrl.Result{}, nil // the status write brings the next pass, which recreates
	}
	resizeDue, resized := p.resize(ctx, g, spares)
	if resized {
		return ctrl.Result{}, nil // the status write brings the next pass, which recreates at the new width
	}
	if err := p.restarts.DeleteReplaced(ctx, g); err != nil {
		return ctrl.Result{}, err
	}
	spareDue, err := p.restarts.EnsureSpares(ctx, g)
	if err != nil {
		return ctrl.Result{}, err
	}

	// A new attempt starts only once the old one is gone: its pods hold the GPUs and answer
	// to the same hostnames.
	var grace *int64
	if p.restarting() {
		grace = recovery.Briefly()
	}
	if err := p.deletePods(ctx, g.Stale, grace); err != nil {
		return ctrl.Result{}, err
	}
	if len(g.Stale) > 0 || len(g.Draining) > 0 || len(g.Replaced) > 0 {
		next, err := p.clearStuck(ctx, g.Draining)
		return soonest(ctrl.Result{RequeueAfter: next}, p.requeueForDeadline(), ctrl.Result{RequeueAfter: inPlaceDue}, ctrl.Result{RequeueAfter: causeDue}), err
	}
	if wait := recovery.BackoffLeft(job, p.now); wait > 0 {
		return soonest(ctrl.Result{RequeueAfter: wait}, p.requeueForDeadline(), ctrl.Result{RequeueAfter: causeDue}), nil
	}
	recheck, err := p.createMissing(ctx, g)
	if err != nil {
		return p.blocked(ctx, err)
	}
	progress := p.updateProgress(g)
	return soonest(progress, ctrl.Result{RequeueAfter: p.ledger().Settle(p.stopped())}, p.requeueForDeadline(), ctrl.Result{RequeueAfter: releaseIn},
		ctrl.Result{RequeueAfter: recheck}, ctrl.Result{RequeueAfter: inPlaceDue}, ctrl.Result{RequeueAfter: leaseDue}, ctrl.Result{RequeueAfter: spareDue},
		ctrl.Result{RequeueAfter: causeDue}, ctrl.Result{RequeueAfter: resizeDue}), nil
}

// statusConflictRecheck is how soon a job whose status write conflicted is looked at again if no
// newer version has brought a pass before.
const statusConflictRecheck = time.Second

// maxConflictRecheck caps conflictRecheck.
const maxConflictRecheck = time.Minute

// maxRetryBackoff caps the wait before a job whose passes keep failing (API errors) is tried
// again: client-go's default grows to 1,000 s, so a flaky API server could hold a broken
// gang's restart for a quarter of an hour after it healed.
const maxRetryBackoff = 10 * time.Second

// retryRateLimiter is controller-runtime's default rate limiter (per job: 5 ms doubling on
// each failure; overall: 10 per second, bursts of 100) with the per-job wait capped.
func retryRateLimiter() workqueue.TypedRateLimiter[reconcile.Request] {
	return workqueue.NewTypedMaxOfRateLimiter(
		workqueue.NewTypedItemExponentialFailureRateLimiter[reconcile.Request](5*time.Millisecond, maxRetryBackoff),
		&workqueue.TypedBucketRateLimiter[reconcile.Request]{Limiter: rate.NewLimiter(rate.Limit(10), 100)},
	)
}

// SetupWithManager registers the reconciler, its pod index and metrics with mgr.
func (r *ZayaTrainingJobReconciler) SetupWithManager(mgr ctrl.Manager, concurrency int) error {
	if err := addIndexes(context.Background(), mgr.GetFieldIndexer()); err != nil {
		return err
	}
	if err := registerJobsCollector(metrics.Registry, mgr.GetClient()); err != nil {
		return err
	}
	b := ctrl.NewControllerManagedBy(mgr).
		For(storedJob()).
		Watches(&corev1.Pod{}, podEvents{}).
		Owns(&corev1.Service{}, builder.OnlyMetadata).
		Watches(&corev1.Node{}, handler.EnqueueRequestsFromMapFunc(r.jobsOnNode), builder.WithPredicates(nodehealth.Changed)).
		WithOptions(controller.Options{MaxConcurrentReconciles: concurrency, RateLimiter: retryRateLimiter()}).
		Named("zayatrainingjob")
	b, err := r.gate().Setup(mgr, b)
	if err != nil {
		return err
	}
	if r.Progress != nil {
		// The poller wakes a job when its progress says something the job acts on.
		woken := make(chan event.TypedGenericEvent[reconcile.Request], 1024)
		r.Progress.Notify = func(key types.NamespacedName) {
			select { // never block the poller: a wake-up dropped while 1024 wait comes with the job's next pass (an open loss requeues itself)
			case woken <- event.TypedGenericEvent[reconcile.Request]{Object: reconcile.Request{NamespacedName: key}}:
			default:
			}
		}
		b = b.WatchesRawSource(source.Channel(woken, handler.TypedFuncs[reconcile.Request, reconcile.Request]{
			GenericFunc: func(_ context.Context, e event.TypedGenericEvent[reconcile.Request], q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
				q.Add(e.Object)
			},
		}))
		if err := mgr.Add(r.Progress); err != nil {
			return err
		}
	}
	return b.Complete(r)
}
