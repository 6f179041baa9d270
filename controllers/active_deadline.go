package controllers

import (
	"fmt"
	"math"
	"time"

	ctrl "sigs.k8s.io/controller-runtime"

	trainingv1alpha1 "github.com/zaya-operator/zaya-operator/api/v1alpha1"
)

// deadline is when activeDeadlineSeconds runs out, or false for none. A deadline beyond
// what time.Duration holds (older CRDs did not bound it) means none, not an overflow into
// the past.
func (p *pass) deadline() (time.Time, bool) {
	d := p.job.Spec.ActiveDeadlineSeconds
	if d == nil || p.job.Status.StartTime == nil || *d > int64(math.MaxInt64/time.Second) {
		return time.Time{}, false
	}
	return p.job.Status.StartTime.Add(time.Duration(*d) * time.Second), true
}

// deadlineExceeded fails the job once activeDeadlineSeconds have passed since startTime.
func (p *pass) deadlineExceeded() bool {
	d := p.job.Spec.ActiveDeadlineSeconds
	if at, ok := p.deadline(); !ok || p.now.Before(at) {
		return false
	}
	p.fail(trainingv1alpha1.ReasonDeadlineExceeded, fmt.Sprintf("ran longer than activeDeadlineSeconds (%ds)", *d))
	return true
}

func (p *pass) requeueForDeadline() ctrl.Result {
	at, ok := p.deadline()
	if !ok {
		return ctrl.Result{}
	}
	return ctrl.Result{RequeueAfter: at.Sub(p.now)}
}
