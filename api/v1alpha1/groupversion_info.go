// Package v1alpha1 holds the ZayaTrainingJob API of group training.zaya.dev: its types,
// defaults, validation helpers and the well-known labels, conditions and reasons.
// +kubebuilder:object:generate=true
// +groupName=training.zaya.dev
package v1alpha1

import (
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/scheme"
)

var (
	// GroupVersion is the group and version of this API.
	GroupVersion = schema.GroupVersion{Group: "training.zaya.dev", Version: "v1alpha1"}

	// SchemeBuilder registers this API's types with a runtime.Scheme.
	SchemeBuilder = &scheme.Builder{GroupVersion: GroupVersion}

	// AddToScheme adds this API's types to a runtime.Scheme.
	AddToScheme = SchemeBuilder.AddToScheme
)

func init() {
	SchemeBuilder.Register(&ZayaTrainingJob{}, &ZayaTrainingJobList{})
}
