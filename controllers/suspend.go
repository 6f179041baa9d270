package controllers

import (
	"context"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	trainingv1alpha1 "github.com/zaya-operator/zaya-operator/api/v1alpha1"
	"github.com/zaya-operator/zaya-operator/controllers/bounded"
	"github.com/zaya-operator/zaya-operator/controllers/gang"
)

// suspend deletes every pod and keeps everything else (checkpoints, service, budget).
func (p *pass) suspend(ctx context.Context, pods []corev1.Pod) error {
	ran := p.job.Status.StartTime != nil || len(gang.Active(pods)) > 0
	if err := p.stopGang(ctx, pods); err != nil {
		return err
	}
	if p.setCondition(trainingv1alpha1.ConditionSuspended, metav1.ConditionTrue, trainingv1alpha1.ReasonSuspended, "spec.suspend is true: no pods run; checkpoints are kept") {
		p.normal(trainingv1alpha1.ReasonSuspended, "Suspend", "suspended: deleted the worker pods, kept checkpoints")
		// Pods ran (a start time, or pods whose start was never stored: that pass's status
		// write lost a conflict with the edit that suspended the job).
		if ran {
			// Resuming starts a new attempt, so the pods being deleted now never pass for it.
			p.job.Status.Restarts = bounded.Count(p.job.Status.Restarts, 1)
		}
	}
	p.clearCondition(trainingv1alpha1.ConditionQueued, trainingv1alpha1.ReasonSuspended, "the job is suspended")
	for _, c := range []string{trainingv1alpha1.ConditionRestarting, trainingv1alpha1.ConditionRunning, trainingv1alpha1.ConditionWaitingForCapacity, trainingv1alpha1.ConditionShrunk} {
		p.clearCondition(c, trainingv1alpha1.ReasonSuspended, "the job is suspended")
	}
	// A resumed elastic job starts whole; its spec may change width meanwhile.
	p.job.Status.CurrentNodes, p.job.Status.GrowAtStep = 0, nil
	return p.admission.Suspended(ctx, pods)
}

// stopGang deletes every running pod of the job (each may save on SIGTERM) and closes the
// run: no ranks ready, no start time, the loss until now counted as the stop's.
func (p *pass) stopGang(ctx context.Context, pods []corev1.Pod) error {
	job := p.job
	p.r.forgetProgress(types.NamespacedName{Namespace: job.Namespace, Name: job.Name})
	p.ledger().Stopped() // lost until now: the stop is no wall time
	if err := p.deletePods(ctx, gang.Active(pods), nil); err != nil {
		return err
	}
	// Pods created but not yet seen by the cache are deleted or never will be: expecting
	// them would hold the next gang's pods back until the expectations expire.
	p.r.creations.Forget(types.NamespacedName{Namespace: job.Namespace, Name: job.Name})
	job.Status.ReadyNodes = 0
	job.Status.StartTime = nil
	return nil
}

// resume marks a suspended job as resumed; its pods are recreated by this pass.
func (p *pass) resume() {
	if p.clearCondition(trainingv1alpha1.ConditionSuspended, trainingv1alpha1.ReasonResumed, "spec.suspend is false") {
		p.normal(trainingv1alpha1.ReasonResumed, "Resume", "resumed: recreating the worker pods")
	}
}
