package controllers

import (
	"context"
	"fmt"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"sigs.k8s.io/controller-runtime/pkg/log"

	trainingv1alpha1 "github.com/zaya-operator/zaya-operator/api/v1alpha1"
	"github.com/zaya-operator/zaya-operator/controllers/workerpod"
)

// accept validates what the CRD cannot and sets Created.
func (p *pass) accept(ctx context.Context) bool {
	job := p.job
	errs := trainingv1alpha1.ValidateSpec(&job.Spec)
	var claimWarning string
	if len(errs) == 0 && p.needsSizeCheck() {
		errs = append(podSizeErrors(job), jobSizeErrors(job)...)
		var claimErrs field.ErrorList
		claimErrs, claimWarning = p.claimErrors(ctx)
		errs = append(errs, claimErrs...)
	}
	if len(errs) > 0 && p.acceptedThisGeneration() {
		// Same spec, new rules: an upgrade must not stop jobs that were running under the old
		// ones (their pods were valid then); the user hears once what the next edit must fix.
		msg := "accepted by an earlier version of the operator; this version refuses it, so the next edit must fix: " + errs.ToAggregate().Error()
		if p.setCondition(trainingv1alpha1.ConditionCreated, metav1.ConditionTrue, trainingv1alpha1.ReasonAcceptedBeforeUpgrade, msg) {
			p.warning(trainingv1alpha1.ReasonAcceptedBeforeUpgrade, "Validate", "%s", msg)
		}
		return true
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
		p.normal(trainingv1alpha1.ReasonNetworkConfigured, "Create", "%s", workerpod.FormatEnv(workerpod.NetworkEnv(&job.Spec)))
		if claimWarning != "" {
			p.warning(trainingv1alpha1.ReasonCheckpointClaimAccessMode, "Validate", "%s", claimWarning)
		}
	}
	return true
}

// needsSizeCheck reports whether the worker pod's size is still to be checked for this
// generation of the spec: it builds and encodes a pod, too much for every pass, but every
// change of the template (allowed while suspended) can grow it.
func (p *pass) needsSizeCheck() bool {
	return !p.acceptedThisGeneration()
}

// acceptedThisGeneration reports whether this generation of the spec was accepted before (by
// this operator or an earlier one). The condition alone is anyone's word who may write status:
// the operator's own marked pods of the job, which a refused spec never gets, must back it.
func (p *pass) acceptedThisGeneration() bool {
	c := meta.FindStatusCondition(p.job.Status.Conditions, trainingv1alpha1.ConditionCreated)
	return c != nil && c.Status == metav1.ConditionTrue && c.ObservedGeneration == p.job.Generation && len(p.pods) > 0
}
