package controllers

import (
	corev1 "k8s.io/api/core/v1"

	trainingv1alpha1 "github.com/zaya-operator/zaya-operator/api/v1alpha1"
	"github.com/zaya-operator/zaya-operator/controllers/attribution"
	"github.com/zaya-operator/zaya-operator/controllers/recovery"
)

// The failure patterns the pass reads failures with (recovery.Attribute).

// attribute names what f was. pod, when known, is the failed rank's pod as it failed.
func (p *pass) attribute(f *trainingv1alpha1.JobFailure, pod *corev1.Pod) {
	recovery.Attribute(p.r.failurePatterns(), f, pod)
}

// failurePatterns is the table failures are read with.
func (r *ZayaTrainingJobReconciler) failurePatterns() *attribution.Table {
	if t := r.patterns.Load(); t != nil {
		return t
	}
	return defaultPatterns
}

// defaultPatterns is the shipped table, compiled once.
var defaultPatterns = attribution.Default()

// SetFailurePatterns makes the operator read failures with the shipped patterns plus user's
// (whose rules replace shipped ones of the same name); nil goes back to the shipped ones.
func (r *ZayaTrainingJobReconciler) SetFailurePatterns(user *attribution.Table) {
	if user == nil {
		r.patterns.Store(nil)
		return
	}
	r.patterns.Store(defaultPatterns.Merge(user))
}
