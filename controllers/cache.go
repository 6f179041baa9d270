package controllers

import (
	"context"
	"slices"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/selection"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/zaya-operator/zaya-operator/api/contract"
	trainingv1alpha1 "github.com/zaya-operator/zaya-operator/api/v1alpha1"
	"github.com/zaya-operator/zaya-operator/controllers/workerpod"
)

// Field indexes on the cached worker pods.
const (
	// podOwnerKey indexes pods by the name of the ZayaTrainingJob that controls them.
	podOwnerKey = workerpod.OwnerIndex
	// podNodeKey indexes pods by the node they are bound to.
	podNodeKey = "spec.nodeName"
)

func indexOwningJob(o client.Object) []string {
	if name, ok := workerpod.OwningJob(o); ok {
		return []string{name}
	}
	return nil
}

func indexPodNode(o client.Object) []string {
	if pod, ok := o.(*corev1.Pod); ok && pod.Spec.NodeName != "" {
		return []string{pod.Spec.NodeName}
	}
	return nil
}

// addIndexes registers the field indexes the reconciler lists by.
func addIndexes(ctx context.Context, indexer client.FieldIndexer) error {
	if err := indexer.IndexField(ctx, &corev1.Pod{}, podOwnerKey, indexOwningJob); err != nil {
		return err
	}
	return indexer.IndexField(ctx, &corev1.Pod{}, podNodeKey, indexPodNode)
}

// CacheOptions makes the manager cache only the pods, services and claims this operator
// labels, so its memory grows with its own jobs, not with the cluster.
func CacheOptions() cache.Options {
	req, err := labels.NewRequirement(trainingv1alpha1.JobNameLabel, selection.Exists, nil)
	if err != nil {
		panic(err) // a constant requirement cannot fail
	}
	ours := cache.ByObject{Label: labels.NewSelector().Add(*req)}
	return cache.Options{
		// Nothing here reads managedFields, a large share of every object; updates leave
		// them as they are when the request omits them.
		DefaultTransform: cache.TransformStripManagedFields(),
		ByObject: map[client.Object]cache.ByObject{
			&corev1.Pod{}:                   {Label: ours.Label, Transform: slimPod},
			&corev1.Service{}:               ours, // metadata only: see metadataOf
			&corev1.PersistentVolumeClaim{}: ours, // metadata only, likewise
			// Nodes are watched for health only: drop what is big and unused.
			&corev1.Node{}: {Transform: slimNode},
		},
	}
}

// slimPod keeps what the reconciler reads of its pods: metadata, status, the node, the grace
// period, the pod's restartPolicy, its scheduling gates (Kueue's admission gate: queued) and the
// containers' names and restart rules (whether an exit restarts in place). The rest of the spec
// (the RCCL environment, probes, volumes, affinity) is most of a worker pod and is never read
// back: the operator creates and deletes pods and patches only their metadata, so nothing
// dropped here can be written back.
func slimPod(o any) (any, error) {
	p, ok := o.(*corev1.Pod)
	if !ok {
		return o, nil
	}
	p.ManagedFields = nil
	containers := make([]corev1.Container, len(p.Spec.Containers))
	for i, c := range p.Spec.Containers {
		containers[i] = corev1.Container{Name: c.Name, RestartPolicy: c.RestartPolicy, RestartPolicyRules: c.RestartPolicyRules}
		// The supervisor's port says the operator may ask it (supervisorprobe.Addr).
		if j := slices.IndexFunc(c.Ports, func(p corev1.ContainerPort) bool { return p.Name == contract.SupervisorPortName }); j >= 0 {
			containers[i].Ports = []corev1.ContainerPort{c.Ports[j]}
		}
	}
	// HostNetwork: a rank on the node's network is never polled (liveprogress.Addr).
	p.Spec = corev1.PodSpec{NodeName: p.Spec.NodeName, TerminationGracePeriodSeconds: p.Spec.TerminationGracePeriodSeconds,
		RestartPolicy: p.Spec.RestartPolicy, Containers: containers, SchedulingGates: p.Spec.SchedulingGates, HostNetwork: p.Spec.HostNetwork}
	return p, nil
}

// slimNode keeps what nodehealth.Problem and tainting need.
func slimNode(o any) (any, error) {
	if n, ok := o.(*corev1.Node); ok {
		n.ManagedFields = nil
		n.Status.Images = nil
		n.Status.VolumesAttached = nil
		n.Status.VolumesInUse = nil
	}
	return o, nil
}

// metadataOf is an empty core object of kind to Get into: the operator only needs to know that
// its Service and claim exist, so their informers hold metadata alone.
func metadataOf(kind string) *metav1.PartialObjectMetadata {
	m := &metav1.PartialObjectMetadata{}
	m.SetGroupVersionKind(corev1.SchemeGroupVersion.WithKind(kind))
	return m
}
