package workerpod

import (
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"
)

// AvoidNodes keeps a pod off the named nodes: a NotIn on each node's name is added to every
// required node-affinity term of the pod (terms are ORed, so each needs them).
func AvoidNodes(ps *corev1.PodSpec, names []string) {
	requireNodeFields(ps, notOnNodes(names))
}

// notOnNodes are requirements that a node be none of names, one per node (the API takes a
// single value for a field's NotIn); names no node can have are left out (a hand-written
// status: the API server would refuse the pod).
func notOnNodes(names []string) []corev1.NodeSelectorRequirement {
	reqs := make([]corev1.NodeSelectorRequirement, 0, len(names))
	for _, name := range names {
		if len(validation.IsDNS1123Subdomain(name)) == 0 {
			reqs = append(reqs, corev1.NodeSelectorRequirement{Key: metav1.ObjectNameField, Operator: corev1.NodeSelectorOpNotIn, Values: []string{name}})
		}
	}
	return reqs
}

// nodeAffinity is the pod's node affinity, made if it has none.
func nodeAffinity(ps *corev1.PodSpec) *corev1.NodeAffinity {
	if ps.Affinity == nil {
		ps.Affinity = &corev1.Affinity{}
	}
	if ps.Affinity.NodeAffinity == nil {
		ps.Affinity.NodeAffinity = &corev1.NodeAffinity{}
	}
	return ps.Affinity.NodeAffinity
}

// PreferOtherNodes asks the scheduler to place a pod on any node but the named ones when it
// can, and lets it use them when nothing else fits. A node that looks unhealthy now may be so
// for seconds (joining, a device plugin restarting): a pod's affinity cannot change, and a
// required rule would keep it Pending for good where that node was the one left (the e2e
// suite: a job on two new nodes, one not yet Ready when its pods were made).
func PreferOtherNodes(ps *corev1.PodSpec, names []string) {
	reqs := notOnNodes(names)
	if len(reqs) == 0 {
		return
	}
	na := nodeAffinity(ps)
	na.PreferredDuringSchedulingIgnoredDuringExecution = append(na.PreferredDuringSchedulingIgnoredDuringExecution, corev1.PreferredSchedulingTerm{
		Weight: 100, Preference: corev1.NodeSelectorTerm{MatchFields: reqs},
	})
}

// requireNodeFields adds field requirements on the node to every required node-affinity term
// of the pod (the terms are ORed: each must carry them).
func requireNodeFields(ps *corev1.PodSpec, reqs []corev1.NodeSelectorRequirement) {
	if len(reqs) == 0 {
		return
	}
	required := requiredTerms(ps)
	for i := range required.NodeSelectorTerms {
		required.NodeSelectorTerms[i].MatchFields = append(required.NodeSelectorTerms[i].MatchFields, reqs...)
	}
}

// requiredTerms is the pod's required node affinity, made with one empty term (any node) if
// it has no term.
func requiredTerms(ps *corev1.PodSpec) *corev1.NodeSelector {
	na := nodeAffinity(ps)
	if na.RequiredDuringSchedulingIgnoredDuringExecution == nil {
		na.RequiredDuringSchedulingIgnoredDuringExecution = &corev1.NodeSelector{}
	}
	required := na.RequiredDuringSchedulingIgnoredDuringExecution
	if len(required.NodeSelectorTerms) == 0 {
		required.NodeSelectorTerms = []corev1.NodeSelectorTerm{{}}
	}
	return required
}

// RequireNode keeps a pod to the named node (a spare's, held for the rank).
func RequireNode(ps *corev1.PodSpec, node string) {
	requireNodeFields(ps, []corev1.NodeSelectorRequirement{{Key: metav1.ObjectNameField, Operator: corev1.NodeSelectorOpIn, Values: []string{node}}})
}

// NFD's labels of an AMD GPU node: a physical function, or a virtual function passed to a
// virtual machine (AMD's NFD rules; a cloud's GPU virtual servers, IBM's among them, show
// VFs).
const (
	LabelAMDGPU  = "feature.node.kubernetes.io/amd-gpu"
	LabelAMDVGPU = "feature.node.kubernetes.io/amd-vgpu"
)

// The AMD device plugin's resources a worker requests: GPUs, and a Pollara NIC per GPU.
const (
	ResourceAMDGPU corev1.ResourceName = "amd.com/gpu"
	ResourceAMDNIC corev1.ResourceName = "amd.com/nic"
)

// RequireAMDGPU keeps a pod to nodes that NFD labels as AMD GPU nodes, with either label:
// each required node-affinity term of the pod becomes two, one per label (terms are ORed).
func RequireAMDGPU(ps *corev1.PodSpec) {
	required := requiredTerms(ps)
	terms := required.NodeSelectorTerms
	out := make([]corev1.NodeSelectorTerm, 0, 2*len(terms))
	for _, label := range []string{LabelAMDGPU, LabelAMDVGPU} {
		for _, t := range terms {
			t = *t.DeepCopy()
			t.MatchExpressions = append(t.MatchExpressions, corev1.NodeSelectorRequirement{Key: label, Operator: corev1.NodeSelectorOpIn, Values: []string{"true"}})
			out = append(out, t)
		}
	}
	required.NodeSelectorTerms = out
}
