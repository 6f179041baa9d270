package integration

import (
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/config"
)

// ctrlConfigSkipNameValidation lets each test start its own manager with the same controller
// name, and lets a panic in Reconcile crash the test binary instead of being logged as an
// error and retried: no input may crash the operator.
func ctrlConfigSkipNameValidation() config.Controller {
	return config.Controller{SkipNameValidation: ptr.To(true), RecoverPanic: ptr.To(false)}
}
