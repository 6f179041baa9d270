package controllers

import (
	"context"
	"fmt"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	trainingv1alpha1 "github.com/zaya-operator/zaya-operator/api/v1alpha1"
	"github.com/zaya-operator/zaya-operator/controllers/bounded"
	"github.com/zaya-operator/zaya-operator/controllers/gang"
)

// AMD health signals (see docs/recovery.md): the device plugin lowers allocatable but never
// evicts running pods, so the operator has to act on them itself.
const (
	amdGPUUnhealthyTaint = "amd-gpu-unhealthy"
	amdConditionPrefix   = "AMDGPU"
	amdExporterGPUPrefix = "metricsexporter.amd.com.gpu."
	amdExporterNICPrefix = "metricsexporter.amd.com.nic."
	amdExporterSuffix    = ".state"
	resourceGPU          = corev1.ResourceName("amd.com/gpu")
	resourceNIC          = corev1.ResourceName("amd.com/nic")
)

// nodeProblem says why a node can no longer run a rank, or "" if it can. A missing node
// (nil) is lost.
func nodeProblem(name string, node *corev1.Node) (reason, message string) {
	if node == nil {
		return trainingv1alpha1.FailureReasonNodeLost, fmt.Sprintf("node %s is gone", name)
	}
	for _, c := range node.Status.Conditions {
		if c.Type == corev1.NodeReady && c.Status != corev1.ConditionTrue {
			return trainingv1alpha1.FailureReasonNodeLost, fmt.Sprintf("node %s is not Ready (%s: %s)", name, c.Status, c.Reason)
		}
	}
	for _, t := range node.Spec.Taints {
		switch t.Key {
		case corev1.TaintNodeUnreachable, corev1.TaintNodeNotReady:
			return trainingv1alpha1.FailureReasonNodeLost, fmt.Sprintf("node %s is tainted %s", name, t.Key)
		case amdGPUUnhealthyTaint:
			return trainingv1alpha1.FailureReasonDeviceUnhealthy, fmt.Sprintf("node %s is tainted %s", name, t.Key)
		}
	}
	for _, r := range []corev1.ResourceName{resourceGPU, resourceNIC} {
		capacity, ok := node.Status.Capacity[r]
		if !ok {
			continue
		}
		if alloc := node.Status.Allocatable[r]; alloc.Cmp(capacity) < 0 {
			return trainingv1alpha1.FailureReasonDeviceUnhealthy,
				fmt.Sprintf("node %s has %s %s allocatable of %s: a device went unhealthy", name, alloc.String(), r, capacity.String())
		}
	}
	// The lowest unhealthy device label, so the message does not change between passes. No
	// sorting: this runs for every rank of every pass and every node update, and copying and
	// sorting each node's labels was a fifth of the operator's CPU in a 2048-node launch.
	unhealthy := ""
	for k, v := range node.Labels {
		if v != "unhealthy" { // most labels stop here
			continue
		}
		device := strings.HasPrefix(k, amdExporterGPUPrefix) || strings.HasPrefix(k, amdExporterNICPrefix)
		if device && strings.HasSuffix(k, amdExporterSuffix) && (unhealthy == "" || k < unhealthy) {
			unhealthy = k
		}
	}
	if unhealthy != "" {
		return trainingv1alpha1.FailureReasonDeviceUnhealthy, fmt.Sprintf("node %s is labelled %s=unhealthy", name, unhealthy)
	}
	for _, c := range node.Status.Conditions {
		if strings.HasPrefix(string(c.Type), amdConditionPrefix) && c.Status == corev1.ConditionTrue {
			return trainingv1alpha1.FailureReasonDeviceUnhealthy, fmt.Sprintf("node %s has condition %s (%s)", name, c.Type, c.Reason)
		}
	}
	return "", ""
}

// maxAvoidedNodes bounds the unhealthy nodes a new pod names to keep off (64 requirements,
// about 5 KiB of the pod); past it the rest are found as today, once a rank lands there.
const maxAvoidedNodes = 64

// unhealthyNodes names the nodes a rank would be failed on at once (nodeProblem), sorted, at
// most maxAvoidedNodes: new pods are kept off them. A device plugin lowers allocatable by its
// broken devices only, so a rank that asks for fewer GPUs than a node has is still scheduled
// there, and was then failed as DeviceUnhealthy before it trained a step.
func (p *pass) unhealthyNodes(ctx context.Context) ([]string, error) {
	list := &corev1.NodeList{}
	if err := p.r.List(ctx, list, client.UnsafeDisableDeepCopy); err != nil {
		return nil, fmt.Errorf("listing nodes: %w", err)
	}
	var out []string
	for i := range list.Items {
		n := &list.Items[i]
		if reason, _ := nodeProblem(n.Name, n); reason != "" && !p.quarantined(n.Name) {
			out = append(out, n.Name)
		}
	}
	slices.Sort(out)
	return out[:min(len(out), maxAvoidedNodes)], nil
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
		reason, msg := nodeProblem(pod.Spec.NodeName, nodes[pod.Spec.NodeName])
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

// nodeHealthChanged passes node events that can change nodeProblem's answer; heartbeats that
// only move lastHeartbeatTime are dropped.
var nodeHealthChanged = predicate.Funcs{
	UpdateFunc: func(e event.UpdateEvent) bool {
		o, ok1 := e.ObjectOld.(*corev1.Node)
		n, ok2 := e.ObjectNew.(*corev1.Node)
		if !ok1 || !ok2 {
			return true
		}
		a, _ := nodeProblem(o.Name, o)
		b, _ := nodeProblem(n.Name, n)
		return a != b
	},
	CreateFunc:  func(event.CreateEvent) bool { return false },
	DeleteFunc:  func(event.DeleteEvent) bool { return true },
	GenericFunc: func(event.GenericEvent) bool { return false },
}
