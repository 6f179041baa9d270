package gang

import (
	"net"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/zaya-operator/zaya-operator/api/contract"
	trainingv1alpha1 "github.com/zaya-operator/zaya-operator/api/v1alpha1"
	"github.com/zaya-operator/zaya-operator/controllers/workerpod"
)

// FailedBefore orders failures by time, then by rank, so the answer does not depend on the
// order pods are listed in.
func FailedBefore(a, b *corev1.Pod) bool {
	// A worker that stopped because a peer failed (exit 75) is never the cause, even when its
	// node's clock or the whole-second times make it look first.
	if ca, cb := StoppedByPeer(a), StoppedByPeer(b); ca != cb {
		return cb
	}
	ta, tb := FailedAt(a), FailedAt(b)
	if !ta.Equal(tb) {
		return ta.Before(tb)
	}
	ra, _ := Rank(a)
	rb, _ := Rank(b)
	return ra < rb
}

// StoppedByPeer reports whether pod's worker exited 75: it stopped because a peer failed.
func StoppedByPeer(pod *corev1.Pod) bool {
	s := WorkerStatus(pod)
	return s != nil && s.State.Terminated != nil && s.State.Terminated.ExitCode == trainingv1alpha1.ExitStopped
}

// Rank is the rank a worker pod's label names.
func Rank(pod *corev1.Pod) (int32, bool) {
	r, err := strconv.ParseInt(pod.Labels[trainingv1alpha1.RankLabel], 10, 32)
	return int32(r), err == nil && r >= 0
}

// FailedAt is when a pod failed or was deleted.
func FailedAt(pod *corev1.Pod) time.Time {
	if !pod.DeletionTimestamp.IsZero() && pod.Status.Phase != corev1.PodFailed {
		return pod.DeletionTimestamp.Time
	}
	return FinishedAt(pod)
}

// FinishedAt is when a failed pod's worker stopped, for finding the rank that failed first
// (its peers fail later, in collective timeouts).
func FinishedAt(pod *corev1.Pod) time.Time {
	if s := WorkerStatus(pod); s != nil && s.State.Terminated != nil {
		return s.State.Terminated.FinishedAt.Time
	}
	return time.Time{}
}

// Finished reports whether a pod reached a terminal phase.
func Finished(pod *corev1.Pod) bool {
	return pod.Status.Phase == corev1.PodSucceeded || pod.Status.Phase == corev1.PodFailed
}

// Condition is the pod's condition of type t, or nil.
func Condition(pod *corev1.Pod, t corev1.PodConditionType) *corev1.PodCondition {
	for i := range pod.Status.Conditions {
		if pod.Status.Conditions[i].Type == t {
			return &pod.Status.Conditions[i]
		}
	}
	return nil
}

// Ready reports whether the pod's Ready condition is True.
func Ready(pod *corev1.Pod) bool {
	c := Condition(pod, corev1.PodReady)
	return c != nil && c.Status == corev1.ConditionTrue
}

// WorkerStatus is the status of a pod's worker container, if it has one yet.
func WorkerStatus(pod *corev1.Pod) *corev1.ContainerStatus {
	if len(pod.Spec.Containers) == 0 {
		return nil
	}
	name := pod.Spec.Containers[workerpod.WorkerContainer(&pod.Spec)].Name
	for i := range pod.Status.ContainerStatuses {
		if pod.Status.ContainerStatuses[i].Name == name {
			return &pod.Status.ContainerStatuses[i]
		}
	}
	return nil
}

// TerminationMessage is what the pod's worker container wrote when it stopped, if it did.
func TerminationMessage(pod *corev1.Pod) (string, bool) {
	s := WorkerStatus(pod)
	if s == nil || s.State.Terminated == nil {
		return "", false
	}
	return s.State.Terminated.Message, true
}

// ReportedCheckpoint reads the last committed checkpoint step a stopped worker wrote to its
// termination message ("checkpoint-step=N" on a line of its own): of its current run if it
// ended, else of the run before an in-place restart.
func ReportedCheckpoint(pod *corev1.Pod) (int64, bool) {
	msg, ok := TerminationMessage(pod)
	if s := WorkerStatus(pod); !ok && s != nil && s.LastTerminationState.Terminated != nil {
		msg, ok = s.LastTerminationState.Terminated.Message, true
	}
	if !ok {
		return 0, false
	}
	for line := range strings.Lines(msg) {
		v, found := strings.CutPrefix(strings.TrimSpace(line), trainingv1alpha1.TerminationMessageCheckpointPrefix)
		if !found {
			continue
		}
		if step, ok := contract.ParseStep(v); ok {
			return step, true
		}
	}
	return 0, false
}

// Holding are the pods that still exist and have not finished, deleted or not: what holds
// devices.
func Holding(pods []corev1.Pod) []*corev1.Pod {
	var out []*corev1.Pod
	for i := range pods {
		if !Finished(&pods[i]) {
			out = append(out, &pods[i])
		}
	}
	return out
}

// Active are the pods that still run or wait to run.
func Active(pods []corev1.Pod) []*corev1.Pod {
	var out []*corev1.Pod
	for i := range pods {
		p := &pods[i]
		if p.DeletionTimestamp.IsZero() && !Finished(p) {
			out = append(out, p)
		}
	}
	return out
}

// ExitMessages are the termination messages of pods' latest exits, at most limit of them.
func ExitMessages(pods []*corev1.Pod, limit int) []string {
	var out []string
	for _, pod := range pods {
		if msg := ExitMessage(pod); msg != "" {
			out = append(out, msg)
			if len(out) == limit {
				break
			}
		}
	}
	return out
}

// ExitMessage is the termination message of the worker container's latest run that ended,
// whatever its exit: goodput reads the progress lines of every run.
func ExitMessage(pod *corev1.Pod) string {
	if pod == nil {
		return ""
	}
	s := WorkerStatus(pod)
	switch {
	case s == nil:
		return ""
	case s.State.Terminated != nil:
		return s.State.Terminated.Message
	case s.LastTerminationState.Terminated != nil:
		return s.LastTerminationState.Terminated.Message
	}
	return ""
}

// PodNetworkIP is a running pod's own address on the pod network ("" otherwise): what the
// operator dials to reach the rank's processes. A pod on the host's network has none: its
// address is the node's, and whatever listens there is not the rank's to answer for.
func PodNetworkIP(pod *corev1.Pod) string {
	if pod == nil || pod.DeletionTimestamp != nil || pod.Status.Phase != corev1.PodRunning || pod.Spec.HostNetwork ||
		net.ParseIP(pod.Status.PodIP) == nil || pod.Status.PodIP == pod.Status.HostIP {
		return ""
	}
	return pod.Status.PodIP
}
