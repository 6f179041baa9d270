package controllers

import (
	"context"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/zaya-operator/zaya-operator/controllers/gang"
	"github.com/zaya-operator/zaya-operator/controllers/recovery"
)

// finish cleans up a finished job's running pods (finished pods stay for their logs) and
// deletes the job once ttlSecondsAfterFinished has passed.
func (p *pass) finish(ctx context.Context, pods []corev1.Pod) (ctrl.Result, error) {
	p.r.forgetProgress(types.NamespacedName{Namespace: p.job.Namespace, Name: p.job.Name})
	own := make([]*corev1.Pod, len(pods))
	for i := range pods {
		own[i] = &pods[i]
	}
	p.ledger().Final(gang.ExitMessages(own, recovery.EvidenceChecks))
	if err := p.deletePods(ctx, gang.Active(pods), recovery.Briefly()); err != nil {
		return ctrl.Result{}, err
	}
	ttl := p.job.Spec.TTLSecondsAfterFinished
	if ttl == nil || p.job.Status.CompletionTime == nil {
		return ctrl.Result{}, nil
	}
	expiry := p.job.Status.CompletionTime.Add(time.Duration(*ttl) * time.Second)
	if p.now.Before(expiry) {
		return ctrl.Result{RequeueAfter: expiry.Sub(p.now)}, nil
	}
	log.FromContext(ctx).Info("deleting finished job after its TTL", "ttlSecondsAfterFinished", *ttl)
	err := p.r.Delete(ctx, p.job, client.PropagationPolicy(metav1.DeletePropagationBackground))
	return ctrl.Result{}, client.IgnoreNotFound(err)
}
