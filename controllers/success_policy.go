package controllers

import (
	"fmt"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	trainingv1alpha1 "github.com/zaya-operator/zaya-operator/api/v1alpha1"
)

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
