package controllers

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	trainingv1alpha1 "github.com/zaya-operator/zaya-operator/api/v1alpha1"
	"github.com/zaya-operator/zaya-operator/controllers/recovery"
)

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
	p.clearCondition(trainingv1alpha1.ConditionQueued, trainingv1alpha1.ReasonFinished, "the job finished")
	p.clearCondition(trainingv1alpha1.ConditionRestarting, trainingv1alpha1.ReasonFinished, "the job finished")
	p.clearCondition(trainingv1alpha1.ConditionStraggling, trainingv1alpha1.ReasonFinished, "the job finished")
	var stopped []string
	if p.stopped != nil {
		stopped = p.stopped()
	}
	p.ledger().Final(stopped)
}

// finished reports whether the job reached Succeeded or Failed.
func finished(job *trainingv1alpha1.ZayaTrainingJob) bool {
	return recovery.Finished(job)
}
