package controllers

import (
	"context"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	trainingv1alpha1 "github.com/zaya-operator/zaya-operator/api/v1alpha1"
	"github.com/zaya-operator/zaya-operator/controllers/admission"
	"github.com/zaya-operator/zaya-operator/controllers/bounded"
	"github.com/zaya-operator/zaya-operator/controllers/gang"
	"github.com/zaya-operator/zaya-operator/controllers/recovery"
	"github.com/zaya-operator/zaya-operator/controllers/workerpod"
)

// The core's side of the admission gate (controllers/admission): the pass asks its ticket
// whether the gang may run, stops a held one, and lends the ticket what it may use (Host).

// gate is the reconciler's admission; none when it has no queueing system.
func (r *ZayaTrainingJobReconciler) gate() admission.Gate {
	if r.Admission == nil {
		return admission.None{}
	}
	return r.Admission
}

// admitted runs the admission's side of a pass and reports whether the gang may run. One
// that may not is stopped, and once none of its pods holds a device, the admission hands
// back what it holds.
func (p *pass) admitted(ctx context.Context, pods []corev1.Pod) (bool, ctrl.Result, error) {
	wasHeld := meta.IsStatusConditionTrue(p.job.Status.Conditions, trainingv1alpha1.ConditionQueued)
	ran := p.job.Status.StartTime != nil || len(gang.Active(pods)) > 0
	v, err := p.admission.Admit(ctx, pods)
	switch {
	case err != nil:
		return false, ctrl.Result{}, err
	case v.Decision == admission.Run:
		return true, ctrl.Result{}, nil
	case v.Decision == admission.Refused:
		return false, ctrl.Result{}, nil
	}
	if !wasHeld && ran {
		p.job.Status.Restarts = bounded.Count(p.job.Status.Restarts, 1) // the next admission starts a new attempt, as a resume does
	}
	if err := p.stopGang(ctx, pods); err != nil {
		return false, ctrl.Result{}, err
	}
	if !v.Holding {
		return false, ctrl.Result{RequeueAfter: v.Retry}, nil
	}
	// What the admission holds goes back only once no pod holds a device; a pod on a lost
	// node is force-deleted after terminatingTimeout rather than holding it forever.
	next, err := p.clearStuck(ctx, terminatingPods(pods))
	if err != nil || len(gang.Holding(pods)) > 0 {
		return false, ctrl.Result{RequeueAfter: next}, err
	}
	wait, err := p.admission.Release(ctx)
	return false, ctrl.Result{RequeueAfter: wait}, err
}

// noteQueue reports whether the gang's ranks wait in the admission's queue. The first
// admission of a job that never ran moves its start to now.
func (p *pass) noteQueue(pods []corev1.Pod) bool {
	queued, admittedNow := p.admission.Queued(pods)
	st := &p.job.Status
	if admittedNow && st.Restarts == 0 && (st.Goodput == nil || st.Goodput.TrainingSince == nil) {
		// Never ran: the queue was no part of it.
		st.StartTime = &metav1.Time{Time: p.now}
		st.Goodput = nil
	}
	return queued
}

// terminatingPods are the job's pods being deleted that have not stopped.
func terminatingPods(pods []corev1.Pod) []*corev1.Pod {
	var out []*corev1.Pod
	for i := range pods {
		if !pods[i].DeletionTimestamp.IsZero() && !gang.Finished(&pods[i]) {
			out = append(out, &pods[i])
		}
	}
	return out
}

// The pass is its ticket's Host.
var _ admission.Host = (*pass)(nil)

func (p *pass) Now() time.Time { return p.now }

func (p *pass) SetCondition(condType string, status metav1.ConditionStatus, reason, message string) bool {
	return p.setCondition(condType, status, reason, message)
}

func (p *pass) ClearCondition(condType, reason, message string) bool {
	return p.clearCondition(condType, reason, message)
}

func (p *pass) Fail(reason, message string) { p.fail(reason, message) }

func (p *pass) Normal(reason, action, format string, args ...any) {
	p.normal(reason, action, format, args...)
}

func (p *pass) Acted(eventType, reason, action, format string, args ...any) {
	p.acted(eventType, reason, action, format, args...)
}

// LivePods counts the job's pods that have not stopped, as the API server has them.
func (p *pass) LivePods(ctx context.Context) (int, error) {
	pods := &corev1.PodList{}
	if err := p.r.apiReader().List(ctx, pods, client.InNamespace(p.job.Namespace),
		client.MatchingLabels{trainingv1alpha1.JobNameLabel: p.job.Name}); err != nil {
		return 0, fmt.Errorf("listing the job's pods: %w", err)
	}
	n := 0
	for i := range pods.Items {
		// The operator's own pods only: one forged with the job's owner is never deleted, so
		// it must not hold the quota either.
		if p.marks.made(p.job.UID, &pods.Items[i]) && !gang.Finished(&pods.Items[i]) {
			n++
		}
	}
	return n, nil
}

// Shape is rank 0's and spare 0's pods from the spec alone: attempt 0, nothing quarantined,
// the supervisor's init container where the ranks get it.
func (p *pass) Shape() (rank, spare *corev1.Pod, spares int32) {
	base := &trainingv1alpha1.ZayaTrainingJob{ObjectMeta: p.job.ObjectMeta, Spec: p.job.Spec}
	rank = newWorkerPod(base, nil, 0) // the environment is left out anyway
	workerpod.InjectSupervisor(base, rank, p.r.SupervisorImage)
	if spares = recovery.WantedSpares(p.job); spares > 0 {
		spare = newSparePod(base, 0, recovery.DefaultSpareImage, "")
	}
	return rank, spare, spares
}

// releaseOrphaned lets the admission's hold on a job that is gone (or going) go.
func (r *ZayaTrainingJobReconciler) releaseOrphaned(ctx context.Context, key types.NamespacedName, deletePods bool) (ctrl.Result, error) {
	wait, err := r.gate().Orphans(ctx, key, "", true, r.podsHold(deletePods))
	if err != nil {
		return ctrl.Result{}, err
	}
	return ctrl.Result{RequeueAfter: wait}, nil
}

// podsHold reports whether pods the operator made for the job of uid still hold devices, and
// when to look again if only the clock can change that: those it controls, and those
// orphaned from it (kubectl delete --cascade=orphan: they run on, and keep what their
// admission holds). Under a foreground delete (deletePods) the operator deletes them itself,
// as the garbage collector would.
func (r *ZayaTrainingJobReconciler) podsHold(deletePods bool) admission.PodsHold {
	return func(ctx context.Context, key types.NamespacedName, uid types.UID) (bool, time.Duration, error) {
		pods := &corev1.PodList{}
		if err := r.List(ctx, pods, client.InNamespace(key.Namespace), client.MatchingLabels{trainingv1alpha1.JobNameLabel: key.Name},
			client.UnsafeDisableDeepCopy); err != nil {
			return false, 0, fmt.Errorf("listing pods: %w", err)
		}
		if len(pods.Items) == 0 {
			return false, 0, nil
		}
		marks, err := r.podMarkKey(ctx)
		if err != nil {
			return false, 0, err
		}
		now := r.Clock.Now()
		held, next := false, time.Duration(0)
		for i := range pods.Items {
			pod := &pods.Items[i]
			if ours := marks.made(uid, pod) || marks.orphaned(uid, pod); !ours || gang.Finished(pod) {
				continue
			}
			if pod.DeletionTimestamp.IsZero() {
				held = true
				if deletePods && metav1.IsControlledBy(pod, &metav1.ObjectMeta{UID: uid}) {
					if err := r.Delete(ctx, pod, client.Preconditions{UID: &pod.UID}); err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
						return false, 0, fmt.Errorf("deleting pod %s: %w", pod.Name, err)
					}
				}
				continue
			}
			if wait := pod.DeletionTimestamp.Add(trainingv1alpha1.DefaultTerminatingTimeout).Sub(now); wait > 0 {
				held = true
				if next == 0 || wait < next {
					next = wait
				}
			}
		}
		return held, next, nil
	}
}
