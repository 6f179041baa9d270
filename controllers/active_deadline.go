package controllers

import (
	"fmt"
	"time"

	ctrl "sigs.k8s.io/controller-runtime"

	trainingv1alpha1 "github.com/zaya-operator/zaya-operator/api/v1alpha1"
)

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
