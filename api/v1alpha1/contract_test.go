package v1alpha1

import (
	"testing"

	"github.com/zaya-operator/zaya-operator/api/contract"
)

// ExitCodeConfigError (constants.go) is the operator's copy of the contract's exit code; the
// worker exits with contract.ExitConfig, so the two must not drift apart.
func TestExitCodeConfigErrorIsTheContracts(t *testing.T) {
	if ExitCodeConfigError != contract.ExitConfig {
		t.Fatalf("ExitCodeConfigError = %d, the worker contract says %d", ExitCodeConfigError, contract.ExitConfig)
	}
}
