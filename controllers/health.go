package controllers

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

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

// unhealthyRank finds the lowest rank of the current attempt whose node can no longer run it
// and returns it as a failure. Nodes come from one cached list, without copies.
func (p *pass) unhealthyRank(ctx context.Context, g gang) (*trainingv1alpha1.JobFailure, error) {
	var nodes map[string]*corev1.Node
	for rank, pod := range g.ranks {
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
			Message: truncate(fmt.Sprintf("rank %d (pod %s): %s", rank, pod.Name, msg)),
		}, nil
	}
	return nil, nil
}

// podNodeKey indexes the operator's pods by the node they are bound to.
const podNodeKey = "spec.nodeName"

func indexPodNode(o client.Object) []string {
	if pod, ok := o.(*corev1.Pod); ok && pod.Spec.NodeName != "" {
		return []string{pod.Spec.NodeName}
	}
	return nil
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

// quarantines reports whether a failure reason keeps the job off the node from now on.
func quarantines(reason string) bool {
	return reason == trainingv1alpha1.FailureReasonNodeLost || reason == trainingv1alpha1.FailureReasonDeviceUnhealthy
}

// quarantine adds a node to the job's exclusion list (oldest entries go when it is full) and,
// if asked, taints it. The taint is checked even when the node is listed already: a pass whose
// taint request failed still writes the list, and the retry must not stop at it.
func (p *pass) quarantine(ctx context.Context, f *trainingv1alpha1.JobFailure) error {
	st := &p.job.Status
	if f.Node == "" {
		return nil
	}
	if !slices.ContainsFunc(st.QuarantinedNodes, func(q trainingv1alpha1.QuarantinedNode) bool { return q.Name == f.Node }) {
		st.QuarantinedNodes = append(st.QuarantinedNodes, trainingv1alpha1.QuarantinedNode{Name: f.Node, Reason: f.Reason, Since: metav1.Time{Time: p.now}})
		if over := len(st.QuarantinedNodes) - int(p.job.Spec.FaultTolerance.Quarantine.MaxNodes); over > 0 {
			st.QuarantinedNodes = st.QuarantinedNodes[over:]
		}
		p.warning(trainingv1alpha1.ReasonNodeQuarantined, "Quarantine", "quarantined node %s for this job: %s", f.Node, f.Message)
	}
	if p.job.Spec.FaultTolerance.Quarantine.NodeTaint != trainingv1alpha1.QuarantineTaintNoSchedule {
		return nil
	}
	return p.taintNode(ctx, f.Node)
}

// taintNode adds training.zaya.dev/quarantined:NoSchedule to a node, once.
func (p *pass) taintNode(ctx context.Context, name string) error {
	node := &corev1.Node{}
	if err := p.r.Get(ctx, client.ObjectKey{Name: name}, node); err != nil {
		return client.IgnoreNotFound(err)
	}
	if slices.ContainsFunc(node.Spec.Taints, func(t corev1.Taint) bool { return t.Key == trainingv1alpha1.QuarantineTaintKey }) {
		return nil
	}
	base := node.DeepCopy()
	node.Spec.Taints = append(node.Spec.Taints, corev1.Taint{
		Key: trainingv1alpha1.QuarantineTaintKey, Value: p.job.Namespace + "." + p.job.Name, Effect: corev1.TaintEffectNoSchedule,
	})
	if err := p.r.Patch(ctx, node, client.MergeFromWithOptions(base, client.MergeFromWithOptimisticLock{})); err != nil {
		if apierrors.IsNotFound(err) {
			return nil
		}
		return fmt.Errorf("tainting node %s: %w", name, err)
	}
	p.warning(trainingv1alpha1.ReasonNodeQuarantined, "Taint", "tainted node %s %s:NoSchedule", name, trainingv1alpha1.QuarantineTaintKey)
	return nil
}

// expireQuarantine releases nodes quarantined longer than quarantine.expireAfter, so a repaired
// node can come back, and returns when the next one is due (0 for none).
func (p *pass) expireQuarantine() time.Duration {
	after := p.job.Spec.FaultTolerance.Quarantine.ExpireAfter.Duration
	var next time.Duration
	kept := p.job.Status.QuarantinedNodes[:0:0]
	for _, q := range p.job.Status.QuarantinedNodes {
		due := q.Since.Add(after).Sub(p.now)
		if due <= 0 {
			p.normal(trainingv1alpha1.ReasonNodeReleased, "Quarantine", "released node %s from quarantine after %s", q.Name, after)
			continue
		}
		if next == 0 || due < next {
			next = due
		}
		kept = append(kept, q)
	}
	if len(kept) != len(p.job.Status.QuarantinedNodes) {
		p.job.Status.QuarantinedNodes = kept
	}
	return next
}

// avoidQuarantined keeps a pod off the job's quarantined nodes: a NotIn on each node's name
// (the apiserver allows one value per node-name field requirement) is added to every required
// node-affinity term of the template (terms are ORed, so each needs them).
func avoidQuarantined(ps *corev1.PodSpec, quarantined []trainingv1alpha1.QuarantinedNode) {
	if len(quarantined) == 0 {
		return
	}
	reqs := make([]corev1.NodeSelectorRequirement, 0, len(quarantined))
	for _, q := range quarantined {
		reqs = append(reqs, corev1.NodeSelectorRequirement{Key: metav1.ObjectNameField, Operator: corev1.NodeSelectorOpNotIn, Values: []string{q.Name}})
	}
	if ps.Affinity == nil {
		ps.Affinity = &corev1.Affinity{}
	}
	if ps.Affinity.NodeAffinity == nil {
		ps.Affinity.NodeAffinity = &corev1.NodeAffinity{}
	}
	na := ps.Affinity.NodeAffinity
	if na.RequiredDuringSchedulingIgnoredDuringExecution == nil {
		na.RequiredDuringSchedulingIgnoredDuringExecution = &corev1.NodeSelector{}
	}
	terms := na.RequiredDuringSchedulingIgnoredDuringExecution.NodeSelectorTerms
	if len(terms) == 0 {
		terms = []corev1.NodeSelectorTerm{{}}
	}
	for i := range terms {
		terms[i].MatchFields = append(terms[i].MatchFields, reqs...)
	}
	na.RequiredDuringSchedulingIgnoredDuringExecution.NodeSelectorTerms = terms
}
