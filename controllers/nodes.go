package controllers

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	trainingv1alpha1 "github.com/zaya-operator/zaya-operator/api/v1alpha1"
	"github.com/zaya-operator/zaya-operator/controllers/bounded"
	"github.com/zaya-operator/zaya-operator/controllers/gang"
	"github.com/zaya-operator/zaya-operator/controllers/nodehealth"
)

// The pass's reads of node health (nodehealth): the nodes new pods keep off, and the ranks on
// nodes that can no longer run them.

// unhealthyNodes names the nodes a rank would be failed on at once (nodehealth.Unhealthy): new
// pods are kept off them. A device plugin lowers allocatable by its broken devices only, so a
// rank that asks for fewer GPUs than a node has is still scheduled there, and was then failed
// as DeviceUnhealthy before it trained a step.
func (p *pass) unhealthyNodes(ctx context.Context) ([]string, error) {
	list := &corev1.NodeList{}
	if err := p.r.List(ctx, list, client.UnsafeDisableDeepCopy); err != nil {
		return nil, fmt.Errorf("listing nodes: %w", err)
	}
	return nodehealth.Unhealthy(list.Items, p.quarantined), nil
}

// unhealthyRank finds the lowest rank of the current attempt whose node can no longer run it
// and returns it as a failure. Nodes come from one cached list, without copies.
func (p *pass) unhealthyRank(ctx context.Context, g gang.Gang) (*trainingv1alpha1.JobFailure, error) {
	var nodes map[string]*corev1.Node
	for rank, pod := range g.Ranks {
		if pod == nil || pod.Spec.NodeName == "" || pod.Status.Phase == corev1.PodSucceeded || pod.Status.Phase == corev1.PodFailed {
			continue
		}
		if nodes == nil {
			list := &corev1.NodeList{}
			if err := p.r.List(ctx, list, client.UnsafeDisableDeepCopy); err != nil {
				return nil, fmt.Errorf("listing nodes: %w", err)
			}
			nodes = make(map[string]*corev1.Node, len(list.Items))
			for i := range list.Items {
				nodes[list.Items[i].Name] = &list.Items[i]
			}
		}
		reason, msg := nodehealth.Problem(pod.Spec.NodeName, nodes[pod.Spec.NodeName])
		if reason == "" {
			continue
		}
		return &trainingv1alpha1.JobFailure{
			Time: metav1.Time{Time: p.now}, Reason: reason, Attempt: p.job.Status.Restarts,
			Node: pod.Spec.NodeName, Rank: ptr.To(int32(rank)),
			Message: bounded.Message(fmt.Sprintf("rank %d (pod %s): %s", rank, pod.Name, msg)),
		}, nil
	}
	return nil, nil
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
