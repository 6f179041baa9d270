package recovery

import (
	"strings"
	"testing"

	trainingv1alpha1 "github.com/zaya-operator/zaya-operator/api/v1alpha1"
)

func TestPodFailureReasonIsAlwaysAValidConditionReason(t *testing.T) {
	for in, want := range map[string]string{
		"Evicted":                  "Evicted",
		"NodeShutdown":             "NodeShutdown",
		"OutOfamd.com/gpu":         trainingv1alpha1.FailureReasonNodeRejected,
		"OutOfcpu":                 trainingv1alpha1.FailureReasonNodeRejected,
		"UnexpectedAdmissionError": trainingv1alpha1.FailureReasonNodeRejected,
		"Weird reason!":            trainingv1alpha1.FailureReasonNodeRejected,
		strings.Repeat("A", 65):    trainingv1alpha1.FailureReasonNodeRejected,
	} {
		if got := podFailureReason(in); got != want {
			t.Errorf("podFailureReason(%q) = %q, want %q", in, got, want)
		}
		if !conditionReason.MatchString(podFailureReason(in)) {
			t.Errorf("podFailureReason(%q) is no valid condition reason", in)
		}
	}
}
