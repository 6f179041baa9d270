// Package nodehealth reads whether a node can still run a rank, from the platform's own
// signals (Ready, the node lifecycle's taints, AMD's device plugin, metrics exporter and
// node problem detector), and keeps the operator's taints on nodes: the cluster-wide hardware
// suspicion a node earns by rooting hardware failures in several namespaces' jobs, and the
// expiry of every taint the operator adds. What a tenant's workers print never taints a node
// for others alone: namespaces are counted, not jobs.
package nodehealth

import (
	"fmt"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/predicate"

	trainingv1alpha1 "github.com/zaya-operator/zaya-operator/api/v1alpha1"
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

// Problem says why a node can no longer run a rank, or "" if it can. A missing node
// (nil) is lost.
func Problem(name string, node *corev1.Node) (reason, message string) {
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

// MaxAvoided bounds the unhealthy nodes a new pod names to keep off (64 requirements,
// about 5 KiB of the pod); past it the rest are found as today, once a rank lands there.
const MaxAvoided = 64

// Unhealthy names the nodes a rank would be failed on at once (Problem), sorted, at most
// MaxAvoided, skipping those skip names (the job keeps off them already).
func Unhealthy(nodes []corev1.Node, skip func(name string) bool) []string {
	var out []string
	for i := range nodes {
		n := &nodes[i]
		if reason, _ := Problem(n.Name, n); reason != "" && !skip(n.Name) {
			out = append(out, n.Name)
		}
	}
	slices.Sort(out)
	return out[:min(len(out), MaxAvoided)]
}

// Changed passes node events that can change Problem's answer; heartbeats that
// only move lastHeartbeatTime are dropped.
var Changed = predicate.Funcs{
	UpdateFunc: func(e event.UpdateEvent) bool {
		o, ok1 := e.ObjectOld.(*corev1.Node)
		n, ok2 := e.ObjectNew.(*corev1.Node)
		if !ok1 || !ok2 {
			return true
		}
		a, _ := Problem(o.Name, o)
		b, _ := Problem(n.Name, n)
		return a != b
	},
	CreateFunc:  func(event.CreateEvent) bool { return false },
	DeleteFunc:  func(event.DeleteEvent) bool { return true },
	GenericFunc: func(event.GenericEvent) bool { return false },
}
