package recovery

import (
	"strings"

	corev1 "k8s.io/api/core/v1"

	trainingv1alpha1 "github.com/zaya-operator/zaya-operator/api/v1alpha1"
	"github.com/zaya-operator/zaya-operator/controllers/attribution"
	"github.com/zaya-operator/zaya-operator/controllers/bounded"
	"github.com/zaya-operator/zaya-operator/controllers/gang"
)

// Why it failed: a failure's category, read from what the platform says of the rank (its node
// lost, its pod evicted, its device unhealthy: facts, not guesses) and else from what the rank
// itself printed (its termination message, or its log's tail), through the failure patterns
// (attribution.Default, plus a user's table).

// Attribute names what f was, through table. pod, when known, is the failed rank's pod as it failed.
func Attribute(table *attribution.Table, f *trainingv1alpha1.JobFailure, pod *corev1.Pod) {
	if c, ok := CategoryOfReason(f); ok {
		f.Category = string(c)
		return
	}
	if pod != nil {
		if s := gang.WorkerStatus(pod); s != nil && s.State.Terminated != nil {
			t := s.State.Terminated
			if t.Reason == "OOMKilled" {
				f.Category, f.Rule, f.Evidence = string(attribution.OutOfMemory), "", "the kernel killed the container: OOMKilled"
				return
			}
			if m, ok := table.Match(t.Message); ok {
				f.Category, f.Rule, f.Evidence = string(m.Category), m.Pattern, bounded.Cut(m.Line, MaxEvidence)
				return
			}
		}
	}
	if f.Reason == trainingv1alpha1.FailureReasonHang {
		f.Category = string(attribution.Hang)
		return
	}
	if f.Category == "" {
		f.Category = string(attribution.Unknown)
	}
}

// MaxEvidence bounds the matched line kept in status.
const MaxEvidence = 512

// CategoryOfReason is the category a platform signal names by itself.
func CategoryOfReason(f *trainingv1alpha1.JobFailure) (attribution.Category, bool) {
	switch f.Reason {
	case trainingv1alpha1.FailureReasonNodeLost:
		return attribution.NodeLost, true
	case trainingv1alpha1.FailureReasonDeviceUnhealthy:
		if strings.Contains(f.Message, "amd.com/nic") || strings.Contains(f.Message, ".nic.") {
			return attribution.NICFabric, true
		}
		return attribution.GPUHardware, true
	case trainingv1alpha1.FailureReasonEvicted, trainingv1alpha1.FailureReasonPreempted, trainingv1alpha1.FailureReasonPodDeleted:
		return attribution.Eviction, true
	case trainingv1alpha1.FailureReasonNodeRejected:
		return attribution.Infrastructure, true
	case trainingv1alpha1.FailureReasonStraggler:
		return attribution.Straggler, true
	}
	return "", false
}

// HardwareRoot reports whether a root failure's own evidence blames its node's GPU or NIC
// (a fault the runtime or RCCL printed, where no health signal did): the node is quarantined
// for the job and the rank moved, as for an unhealthy device.
func HardwareRoot(f trainingv1alpha1.JobFailure) bool {
	return f.Node != "" && attribution.Hardware(attribution.Category(f.Category)) && !Quarantines(f.Reason)
}

// QuarantinedFor is f as the quarantine records it: the category is why.
func QuarantinedFor(f trainingv1alpha1.JobFailure) *trainingv1alpha1.JobFailure {
	f.Reason = f.Category
	return &f
}

// CategoryWords ends a restart's message with what the failure was.
func CategoryWords(f trainingv1alpha1.JobFailure) string {
	if f.Category == "" || f.Category == string(attribution.Unknown) {
		return ""
	}
	if f.Rule != "" {
		return " [" + f.Category + ", rule " + f.Rule + "]"
	}
	return " [" + f.Category + "]"
}

// Quarantines reports whether a failure reason keeps the job off the node from now on.
func Quarantines(reason string) bool {
	return reason == trainingv1alpha1.FailureReasonNodeLost || reason == trainingv1alpha1.FailureReasonDeviceUnhealthy ||
		reason == trainingv1alpha1.FailureReasonStraggler
}

// PlatformSignal reports whether a quarantine rests on the platform's own word about the node
// (its kubelet lost, a device its health signals took away), the only grounds on which a job
// may taint a node for everyone. What a tenant's workers print, how often they crash and what
// they report are the tenant's word: they keep the node from that job alone.
func PlatformSignal(reason string) bool {
	return reason == trainingv1alpha1.FailureReasonNodeLost || reason == trainingv1alpha1.FailureReasonDeviceUnhealthy
}
