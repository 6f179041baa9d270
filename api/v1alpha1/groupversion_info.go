// Package v1alpha1 holds the ZayaTrainingJob API of group training.zaya.dev: its types,
// defaults, validation helpers and the well-known labels, conditions and reasons.
// +kubebuilder:object:generate=true
// +groupName=training.zaya.dev
package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

var (
	// GroupVersion is the group and version of this API.
	GroupVersion = schema.GroupVersion{Group: "training.zaya.dev", Version: "v1alpha1"}

	// SchemeBuilder registers this API's types with a runtime.Scheme.
	SchemeBuilder = runtime.NewSchemeBuilder(addKnownTypes)

	// AddToScheme adds this API's types to a runtime.Scheme.
	AddToScheme = SchemeBuilder.AddToScheme
)

func addKnownTypes(s *runtime.Scheme) error {
	s.AddKnownTypes(GroupVersion, &ZayaTrainingJob{}, &ZayaTrainingJobList{})
	metav1.AddToGroupVersion(s, GroupVersion)
	return nil
}
