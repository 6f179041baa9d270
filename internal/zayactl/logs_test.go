package zayactl

import (
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func TestTheFailedRunIsThePreviousContainerOnceTheKubeletRestartedIt(t *testing.T) {
	failed := time.Date(2026, 11, 29, 12, 0, 10, 0, time.UTC)
	at := func(s int) metav1.Time { return metav1.NewTime(failed.Add(time.Duration(s) * time.Second)) }
	running := func(started int) corev1.ContainerState {
		return corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: at(started)}}
	}
	ended := func(finished int) corev1.ContainerState {
		return corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: 137, FinishedAt: at(finished)}}
	}
	for _, c := range []struct {
		name string
		w    *corev1.ContainerStatus
		want bool
	}{
		{"no worker status", nil, false},
		{"never restarted", &corev1.ContainerStatus{State: running(-60)}, false},
		{"restarted after the failure was recorded", &corev1.ContainerStatus{RestartCount: 1, State: running(2), LastTerminationState: ended(0)}, true},
		// The real kubelet's restart rules restart the worker as soon as it exits, before the
		// operator's pass that records the failure.
		{"restarted before the failure was recorded", &corev1.ContainerStatus{RestartCount: 1, State: running(-1), LastTerminationState: ended(-2)}, true},
		{"recorded in the second the run ended", &corev1.ContainerStatus{RestartCount: 1, State: running(0), LastTerminationState: ended(1)}, true},
		{"waiting to start again", &corev1.ContainerStatus{RestartCount: 2, State: corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: "CrashLoopBackOff"}}, LastTerminationState: ended(0)}, true},
		{"the current run ended and is not restarted", &corev1.ContainerStatus{RestartCount: 1, State: ended(0), LastTerminationState: ended(-300)}, false},
		// The previous run ended long before the failure: the current run was running when a
		// hang or a lost GPU was recorded against it.
		{"restarted long before the failure", &corev1.ContainerStatus{RestartCount: 1, State: running(-600), LastTerminationState: ended(-601)}, false},
	} {
		if got := failedRunIsPrevious(c.w, failed); got != c.want {
			t.Errorf("%s: %v, want %v", c.name, got, c.want)
		}
	}
}
