package controllers

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	trainingv1alpha1 "github.com/zaya-operator/zaya-operator/api/v1alpha1"
	"github.com/zaya-operator/zaya-operator/controllers/nodehealth"
	"github.com/zaya-operator/zaya-operator/controllers/recovery"
)

// The pass's read of node health (nodehealth): the nodes new pods keep off.

// unhealthyNodes names the nodes a rank would be failed on at once (nodehealth.Unhealthy): new
// pods are kept off them. A device plugin lowers allocatable by its broken devices only, so a
// rank that asks for fewer GPUs than a node has is still scheduled there, and was then failed
// as DeviceUnhealthy before it trained a step.
func (p *pass) unhealthyNodes(ctx context.Context) ([]string, error) {
	list := &corev1.NodeList{}
	if err := p.r.List(ctx, list, client.UnsafeDisableDeepCopy); err != nil {
		return nil, fmt.Errorf("listing nodes: %w", err)
	}
	return nodehealth.Unhealthy(list.Items, func(node string) bool { return recovery.Quarantined(&p.job.Status, node) }), nil
}

// jobsOnNode maps a node event to the jobs with a rank on that node.
func (r *ZayaTrainingJobReconciler) jobsOnNode(ctx context.Context, o client.Object) []reconcile.Request {
	pods := &corev1.PodList{}
	if err := r.List(ctx, pods, client.MatchingFields{podNodeKey: o.GetName()}, client.UnsafeDisableDeepCopy); err != nil {
		log.FromContext(ctx).Error(err, "listing pods on node", "node", o.GetName())
		return nil
	}
	seen := map[types.NamespacedName]bool{}
	var out []reconcile.Request
	for i := range pods.Items {
		job := pods.Items[i].Labels[trainingv1alpha1.JobNameLabel]
		key := types.NamespacedName{Namespace: pods.Items[i].Namespace, Name: job}
		if job != "" && !seen[key] {
			seen[key] = true
			out = append(out, reconcile.Request{NamespacedName: key})
		}
	}
	return out
}
