// Package kueue holds the few fields of Kueue's v1beta2 API (kueue.x-k8s.io) that the
// operator reads and writes to run a job as a Kueue workload. Kueue's Go module is not on the
// module proxy; these types are written from its documented API (verified against v0.19.2).
// The operator writes them with patches only, so fields these types lack are never dropped.
// +kubebuilder:object:generate=true
package kueue

import (
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// GroupVersion is Kueue's storage version since v0.16.
var GroupVersion = schema.GroupVersion{Group: "kueue.x-k8s.io", Version: "v1beta2"}

// AddToScheme registers the types with a scheme.
func AddToScheme(s *runtime.Scheme) error {
	s.AddKnownTypes(GroupVersion, &Workload{}, &WorkloadList{}, &ResourceFlavor{}, &ResourceFlavorList{},
		&WorkloadPriorityClass{}, &WorkloadPriorityClassList{})
	metav1.AddToGroupVersion(s, GroupVersion)
	return nil
}

// Labels, annotations, finalizers and gates of Kueue's that the operator uses.
const (
	QueueNameLabel         = "kueue.x-k8s.io/queue-name"
	PriorityClassLabel     = "kueue.x-k8s.io/priority-class"
	MaxExecTimeLabel       = "kueue.x-k8s.io/max-exec-time-seconds"
	JobUIDLabel            = "kueue.x-k8s.io/job-uid"
	MultiKueueOriginLabel  = "kueue.x-k8s.io/multikueue-origin"
	PodSetLabel            = "kueue.x-k8s.io/podset"
	WorkloadAnnotation     = "kueue.x-k8s.io/workload"
	PrebuiltWorkloadLabel  = "kueue.x-k8s.io/prebuilt-workload-name"
	ResourceInUseFinalizer = "kueue.x-k8s.io/resource-in-use"
	TopologyGate           = "kueue.x-k8s.io/topology"
	MultiKueueController   = "kueue.x-k8s.io/multikueue"

	// TAS requests, on the job (they mean the same on a pod template).
	RequiredTopologyAnnotation      = "kueue.x-k8s.io/podset-required-topology"
	PreferredTopologyAnnotation     = "kueue.x-k8s.io/podset-preferred-topology"
	UnconstrainedTopologyAnnotation = "kueue.x-k8s.io/podset-unconstrained-topology"
	SliceRequiredTopologyAnnotation = "kueue.x-k8s.io/podset-slice-required-topology"
	SliceSizeAnnotation             = "kueue.x-k8s.io/podset-slice-size"

	// Pod-group integration.
	ManagedFinalizer      = "kueue.x-k8s.io/managed"
	PodGroupNameLabel     = "kueue.x-k8s.io/pod-group-name"
	PodGroupTotalCount    = "kueue.x-k8s.io/pod-group-total-count"
	PodGroupPodIndexLabel = "kueue.x-k8s.io/pod-group-pod-index-label"
	RetriableInGroup      = "kueue.x-k8s.io/retriable-in-group"
	PodGroupServing       = "kueue.x-k8s.io/pod-group-serving"
	AdmissionGate         = "kueue.x-k8s.io/admission"
)

// Workload condition types and reasons the operator reads or writes.
const (
	WorkloadQuotaReserved = "QuotaReserved"
	WorkloadAdmitted      = "Admitted"
	WorkloadEvicted       = "Evicted"
	WorkloadRequeued      = "Requeued"
	WorkloadPodsReady     = "PodsReady"
	WorkloadFinished      = "Finished"

	ReasonPending       = "Pending"
	ReasonNoReservation = "NoReservation"
	ReasonStarted       = "Started"
	ReasonRecovered     = "Recovered"
	ReasonWaitForStart  = "WaitForStart"
	ReasonWaitRecovery  = "WaitForRecovery"
	ReasonSucceeded     = "Succeeded"
	ReasonFailed        = "Failed"
	ReasonOwnerNotFound = "OwnerNotFound"
	ReasonPreempted     = "Preempted"
	ReasonNodeFailures  = "NodeFailures"
)

// +kubebuilder:object:root=true

// Workload is a unit of admission.
type Workload struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec   WorkloadSpec   `json:"spec,omitempty"`
	Status WorkloadStatus `json:"status,omitempty"`
}

// +kubebuilder:object:root=true

// WorkloadList is a list of Workloads.
type WorkloadList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []Workload `json:"items"`
}

// WorkloadSpec is what the workload asks for.
type WorkloadSpec struct {
	PodSets                     []PodSet          `json:"podSets"`
	QueueName                   string            `json:"queueName,omitempty"`
	PriorityClassRef            *PriorityClassRef `json:"priorityClassRef,omitempty"`
	Priority                    *int32            `json:"priority,omitempty"`
	Active                      *bool             `json:"active,omitempty"`
	MaximumExecutionTimeSeconds *int32            `json:"maximumExecutionTimeSeconds,omitempty"`
}

// PriorityClassRef names the class the priority came from.
type PriorityClassRef struct {
	Group string `json:"group"`
	Kind  string `json:"kind"`
	Name  string `json:"name"`
}

// PodSet is a group of pods with one template.
type PodSet struct {
	Name            string                 `json:"name"`
	Template        corev1.PodTemplateSpec `json:"template"`
	Count           int32                  `json:"count"`
	TopologyRequest *TopologyRequest       `json:"topologyRequest,omitempty"`
}

// TopologyRequest asks topology-aware scheduling to keep the pods together.
type TopologyRequest struct {
	Required                    *string `json:"required,omitempty"`
	Preferred                   *string `json:"preferred,omitempty"`
	Unconstrained               *bool   `json:"unconstrained,omitempty"`
	PodIndexLabel               *string `json:"podIndexLabel,omitempty"`
	PodSetSliceRequiredTopology *string `json:"podSetSliceRequiredTopology,omitempty"`
	PodSetSliceSize             *int32  `json:"podSetSliceSize,omitempty"`
}

// WorkloadStatus is what Kueue decided.
type WorkloadStatus struct {
	Conditions      []metav1.Condition    `json:"conditions,omitempty"`
	Admission       *Admission            `json:"admission,omitempty"`
	AdmissionChecks []AdmissionCheckState `json:"admissionChecks,omitempty"`
}

// Admission is where the workload was admitted.
type Admission struct {
	ClusterQueue      string             `json:"clusterQueue"`
	PodSetAssignments []PodSetAssignment `json:"podSetAssignments"`
}

// PodSetAssignment is one pod set's flavors and topology.
type PodSetAssignment struct {
	Name               string                         `json:"name"`
	Flavors            map[corev1.ResourceName]string `json:"flavors,omitempty"`
	ResourceUsage      corev1.ResourceList            `json:"resourceUsage,omitempty"`
	Count              *int32                         `json:"count,omitempty"`
	TopologyAssignment *runtime.RawExtension          `json:"topologyAssignment,omitempty"`
	DelayedTopology    *string                        `json:"delayedTopologyRequest,omitempty"`
}

// AdmissionCheckState is an admission check's verdict, with what it asks of the pods.
type AdmissionCheckState struct {
	Name          string         `json:"name"`
	State         string         `json:"state"`
	PodSetUpdates []PodSetUpdate `json:"podSetUpdates,omitempty"`
}

// PodSetUpdate is what an admission check adds to a pod set's pods.
type PodSetUpdate struct {
	Name         string              `json:"name"`
	Labels       map[string]string   `json:"labels,omitempty"`
	Annotations  map[string]string   `json:"annotations,omitempty"`
	NodeSelector map[string]string   `json:"nodeSelector,omitempty"`
	Tolerations  []corev1.Toleration `json:"tolerations,omitempty"`
}

// +kubebuilder:object:root=true

// ResourceFlavor is a kind of node: what its pods get to land there.
type ResourceFlavor struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`
	Spec              ResourceFlavorSpec `json:"spec,omitempty"`
}

// ResourceFlavorSpec holds the labels and tolerations a flavor's pods get.
type ResourceFlavorSpec struct {
	NodeLabels   map[string]string   `json:"nodeLabels,omitempty"`
	Tolerations  []corev1.Toleration `json:"tolerations,omitempty"`
	TopologyName *string             `json:"topologyName,omitempty"`
}

// +kubebuilder:object:root=true

// ResourceFlavorList is a list of ResourceFlavors.
type ResourceFlavorList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []ResourceFlavor `json:"items"`
}

// +kubebuilder:object:root=true

// WorkloadPriorityClass is a priority for workloads only.
type WorkloadPriorityClass struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`
	Value             int32 `json:"value"`
}

// +kubebuilder:object:root=true

// WorkloadPriorityClassList is a list of WorkloadPriorityClasses.
type WorkloadPriorityClassList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []WorkloadPriorityClass `json:"items"`
}

// SlimWorkload is a cache transform: the operator reads a cached Workload's metadata, status
// and pod set names and counts, never the pod templates, which are most of its size. (It
// reads a Workload's templates, a prebuilt one's, from the API server.)
func SlimWorkload(o any) (any, error) {
	if wl, ok := o.(*Workload); ok {
		wl.ManagedFields = nil
		for i := range wl.Spec.PodSets {
			wl.Spec.PodSets[i].Template = corev1.PodTemplateSpec{}
		}
	}
	return o, nil
}
