package kueuegate

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	trainingv1alpha1 "github.com/zaya-operator/zaya-operator/api/v1alpha1"
	"github.com/zaya-operator/zaya-operator/controllers/admission"
	"github.com/zaya-operator/zaya-operator/controllers/workerpod"
	"github.com/zaya-operator/zaya-operator/internal/kueue"
)

// releaseOrphanedWorkloads lets the Workloads of jobs named key that are gone (or going; all
// but the job of UID keep) go once none of their pods holds a device: Finished with
// OwnerNotFound and unblocked, so neither the quota nor a foreground delete waits on them
// longer than the pods do. A pod past its deletion's due time by terminatingTimeout's default
// is on a lost node and holds nothing back.
func (g *Gate) releaseOrphanedWorkloads(ctx context.Context, key types.NamespacedName, keep types.UID, hold admission.PodsHold) (time.Duration, error) {
	if !g.workloads {
		return 0, nil
	}
	// Controlled by a job of that name, or orphaned from one (kubectl delete --cascade=orphan
	// takes the owner off every dependent: the Workload's label and job UID still say whose).
	list := &kueue.WorkloadList{}
	if err := g.List(ctx, list, client.InNamespace(key.Namespace), client.MatchingFields{workerpod.OwnerIndex: key.Name}); err != nil {
		return 0, fmt.Errorf("listing Workloads: %w", err)
	}
	var next time.Duration
	for _, wl := range list.Items {
		uid := types.UID("")
		if name, ok := workerpod.OwningJob(&wl); ok && name == key.Name {
			uid = metav1.GetControllerOf(&wl).UID
		} else if metav1.GetControllerOf(&wl) == nil && wl.Annotations[podSetsHashAnnotation] != "" {
			uid = types.UID(wl.Labels[kueue.JobUIDLabel])
		}
		if uid == "" || uid == keep || !slices.Contains(wl.Finalizers, kueue.ResourceInUseFinalizer) {
			continue // (one without the finalizer is let go already)
		}
		held, wait, err := hold(ctx, key, uid)
		if err != nil {
			return 0, err
		}
		if held {
			if wait > 0 && (next == 0 || wait < next) {
				next = wait
			}
			continue // their deletion (or the time it is due) brings the next look
		}
		if err := g.releaseWorkload(ctx, &wl, kueue.ReasonOwnerNotFound, "the ZayaTrainingJob is gone"); err != nil {
			return 0, err
		}
	}
	return next, nil
}

// Delegated serves a job that MultiKueue runs in a worker cluster (spec.managedBy): here the
// job only has a Workload for MultiKueue to dispatch. Its pods and status are the worker
// cluster's; the Workload goes once MultiKueue says it finished.
func (g *Gate) Delegated(ctx context.Context, job *trainingv1alpha1.ZayaTrainingJob, host admission.Host) (ctrl.Result, error) {
	if job.Spec.ManagedBy == nil || *job.Spec.ManagedBy != kueue.MultiKueueController || !g.kueueWorkload(job) {
		return ctrl.Result{}, nil
	}
	if errs := trainingv1alpha1.ValidateSpec(&job.Spec); len(errs) > 0 {
		return ctrl.Result{}, nil // refused at apply; one stored before that rule waits for a fix
	}
	t := &ticket{g: g, job: job, host: host}
	wl, err := t.workloadFor(ctx, nil)
	var input *inputError
	var conflict *admission.NameConflict
	switch {
	case errors.As(err, &input), errors.As(err, &conflict):
		// The job's status is the worker cluster's to write: an event says why, and the job
		// is looked at again slowly rather than retried as an API error.
		t.host.Acted(corev1.EventTypeWarning, trainingv1alpha1.ReasonWaitingForKueue, "Queue", "cannot queue the job in Kueue: %v", err)
		if input != nil && input.retry > 0 {
			return ctrl.Result{RequeueAfter: input.retry}, nil
		}
		return ctrl.Result{RequeueAfter: time.Minute}, nil
	case err != nil || wl == nil:
		return ctrl.Result{}, err
	}
	if meta.IsStatusConditionTrue(wl.Status.Conditions, kueue.WorkloadFinished) {
		return ctrl.Result{}, g.dropFinalizer(ctx, wl)
	}
	return ctrl.Result{}, nil
}
