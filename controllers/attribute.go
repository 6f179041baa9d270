package controllers

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

// maxEvidence bounds the matched line kept in status.
const maxEvidence = 512

// attribute names what f was. pod, when known, is the failed rank's pod as it failed.
func (p *pass) attribute(f *trainingv1alpha1.JobFailure, pod *corev1.Pod) {
	if c, ok := categoryOfReason(f); ok {
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
			if m, ok := p.r.failurePatterns().Match(t.Message); ok {
				f.Category, f.Rule, f.Evidence = string(m.Category), m.Pattern, bounded.Cut(m.Line, maxEvidence)
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

// categoryOfReason is the category a platform signal names by itself.
func categoryOfReason(f *trainingv1alpha1.JobFailure) (attribution.Category, bool) {
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

// hardwareRoot reports whether a root failure's own evidence blames its node's GPU or NIC
// (a fault the runtime or RCCL printed, where no health signal did): the node is quarantined
// for the job and the rank moved, as for an unhealthy device.
func hardwareRoot(f trainingv1alpha1.JobFailure) bool {
	return f.Node != "" && attribution.Hardware(attribution.Category(f.Category)) && !quarantines(f.Reason)
}

// quarantinedFor is f as the quarantine records it: the category is why.
func quarantinedFor(f trainingv1alpha1.JobFailure) *trainingv1alpha1.JobFailure {
	f.Reason = f.Category
	return &f
}

// categoryWords ends a restart's message with what the failure was.
func categoryWords(f trainingv1alpha1.JobFailure) string {
	if f.Category == "" || f.Category == string(attribution.Unknown) {
		return ""
	}
	if f.Rule != "" {
		return " [" + f.Category + ", rule " + f.Rule + "]"
	}
	return " [" + f.Category + "]"
}

// failurePatterns is the table failures are read with.
func (r *ZayaTrainingJobReconciler) failurePatterns() *attribution.Table {
	if t := r.patterns.Load(); t != nil {
		return t
	}
	return defaultPatterns
}

// defaultPatterns is the shipped table, compiled once.
var defaultPatterns = attribution.Default()

// SetFailurePatterns makes the operator read failures with the shipped patterns plus user's
// (whose rules replace shipped ones of the same name); nil goes back to the shipped ones.
func (r *ZayaTrainingJobReconciler) SetFailurePatterns(user *attribution.Table) {
	if user == nil {
		r.patterns.Store(nil)
		return
	}
	r.patterns.Store(defaultPatterns.Merge(user))
}
