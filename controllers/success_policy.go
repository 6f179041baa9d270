package controllers

import (
	"fmt"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	trainingv1alpha1 "github.com/zaya-operator/zaya-operator/api/v1alpha1"
	"github.com/zaya-operator/zaya-operator/controllers/gang"
	"github.com/zaya-operator/zaya-operator/controllers/recovery"
)

// succeeded completes the job when the success policy says the gang is done
// (recovery.Succeeded); wait > 0 asks for another look after it.
func (p *pass) succeeded(g gang.Gang) (done bool, wait time.Duration) {
	job := p.job
	if done, wait = recovery.Succeeded(&job.Spec, g, p.now); !done {
		return false, wait
	}
	p.setCondition(trainingv1alpha1.ConditionSucceeded, metav1.ConditionTrue, trainingv1alpha1.ReasonCompleted,
		fmt.Sprintf("%s: training finished", job.Spec.SuccessPolicy))
	p.complete()
	p.normal(trainingv1alpha1.ReasonCompleted, "Complete", "succeeded (%s)", job.Spec.SuccessPolicy)
	return true, 0
}
