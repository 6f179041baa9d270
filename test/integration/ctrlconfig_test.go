package integration

import (
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/config"
)

// ctrlConfigSkipNameValidation lets each test start its own manager with the same controller name.
func ctrlConfigSkipNameValidation() config.Controller {
	return config.Controller{SkipNameValidation: ptr.To(true)}
}
