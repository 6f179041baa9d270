package controllers

import (
	"context"
	"errors"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"

	trainingv1alpha1 "github.com/zaya-operator/zaya-operator/api/v1alpha1"
	"github.com/zaya-operator/zaya-operator/controllers/bounded"
)

// What the job's neighbours can do to it: take a name it needs, or delete its namespace.

// conflictRecheck is how often a job blocked by a name conflict looks again: the foreign
// object is not in the operator's cache, so its deletion brings no event.
const conflictRecheck = 10 * time.Second

// blocked handles an error that stops the job from starting its pods: a name conflict is the
// user's to fix (Running=False, NameConflict, one warning, a recheck later); a namespace being
// deleted ends the job quietly; anything else is retried, and a refusal by the API server
// (Pod Security, a quota, a webhook) is said in Running=False, FailedCreate, until a pod of
// the attempt is made.
func (p *pass) blocked(_ context.Context, err error) (ctrl.Result, error) {
	var conflict *nameConflict
	var refusal apierrors.APIStatus
	switch {
	case errors.As(err, &conflict):
		if p.setCondition(trainingv1alpha1.ConditionRunning, metav1.ConditionFalse, trainingv1alpha1.ReasonNameConflict, conflict.Error()) {
			p.warning(trainingv1alpha1.ReasonNameConflict, "Create", "%s", conflict.Error())
		}
		return ctrl.Result{RequeueAfter: conflictRecheck}, nil
	case namespaceTerminating(err):
		return ctrl.Result{}, nil
	case errors.As(err, &refusal) && refusal.Status().Code >= 400 && refusal.Status().Code < 500:
		p.setCondition(trainingv1alpha1.ConditionRunning, metav1.ConditionFalse, trainingv1alpha1.ReasonFailedCreate,
			bounded.Message(fmt.Sprintf("the API server refused a worker pod (retrying): %v", err)))
	}
	return ctrl.Result{}, err
}

// namespaceTerminating reports whether err refused a create because the namespace is being
// deleted: the job goes with it, and nothing needs saying.
func namespaceTerminating(err error) bool {
	return apierrors.HasStatusCause(err, corev1.NamespaceTerminatingCause)
}

// namespaceGoing reports whether the job's namespace is being deleted. The namespace
// controller deletes pods before it reaches the job, so their loss looks like a failure: a
// restart decided then would count against the budget, log a restart and try to create pods
// in a dying namespace. Asked live, and only when a failure is about to be acted on.
func (p *pass) namespaceGoing(ctx context.Context) bool {
	ns := &metav1.PartialObjectMetadata{}
	ns.SetGroupVersionKind(corev1.SchemeGroupVersion.WithKind("Namespace"))
	err := p.r.apiReader().Get(ctx, client.ObjectKey{Name: p.job.Namespace}, ns)
	if err != nil {
		// Without the answer (or with the namespace already gone, and the job with it) the
		// failure is handled as one: a restart is the safe side.
		if !apierrors.IsNotFound(err) {
			log.FromContext(ctx).Error(err, "reading the job's namespace before a restart")
		}
		return false
	}
	return ns.DeletionTimestamp != nil
}
