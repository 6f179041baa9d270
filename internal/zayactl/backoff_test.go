package zayactl

import (
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// restartedPod is a job pod whose worker restarted restarts times, the last run having run
// for ran before it exited, and the next one starting gap after that exit.
func restartedPod(name string, restarts int32, ran, gap time.Duration) corev1.Pod {
	exit := time.Date(2026, 12, 7, 4, 0, 0, 0, time.UTC)
	return corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec:       corev1.PodSpec{NodeName: "n-" + name, Containers: []corev1.Container{{Name: "worker"}}},
		Status: corev1.PodStatus{ContainerStatuses: []corev1.ContainerStatus{{
			Name: "worker", RestartCount: restarts,
			State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: metav1.NewTime(exit.Add(gap))}},
			LastTerminationState: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{
				ExitCode: 75, StartedAt: metav1.NewTime(exit.Add(-ran)), FinishedAt: metav1.NewTime(exit)}},
		}}},
	}
}

// The gap before a worker's second or later in-place restart within 10 minutes is its
// kubelet's back-off: 10 s or more is a default kubelet's, a second or two a cap set low. A
// first restart, or one after a run of 10 minutes, says nothing (no back-off applies).
func TestPreflightReadsTheKubeletsBackOffFromTheJobsRestarts(t *testing.T) {
	for _, tc := range []struct {
		name   string
		pods   []corev1.Pod
		err    error
		result string
		detail string
	}{
		{"no restart yet", nil, nil, ok, "cannot tell yet"},
		{"a first restart only", []corev1.Pod{restartedPod("a", 1, time.Minute, 0)}, nil, ok, "cannot tell yet"},
		{"after a long run", []corev1.Pod{restartedPod("a", 2, 11*time.Minute, 0)}, nil, ok, "cannot tell yet"},
		{"default kubelets", []corev1.Pod{restartedPod("a", 2, time.Minute, time.Second), restartedPod("b", 2, time.Minute, 10*time.Second)}, nil, warn,
			"b on n-b came back 10s after its exit (restart 2)"},
		{"a low cap", []corev1.Pod{restartedPod("a", 3, time.Minute, time.Second), restartedPod("b", 2, 30*time.Second, 2*time.Second)}, nil, ok,
			"capped low: the slowest of 2 repeated in-place restarts, b on n-b came back 2s"},
		{"a middling cap", []corev1.Pod{restartedPod("a", 2, time.Minute, 5*time.Second)}, nil, ok, "wait a few seconds"},
		{"clocks apart", []corev1.Pod{restartedPod("a", 2, time.Minute, -3*time.Second)}, nil, ok, "cannot tell yet"},
		{"pods unreadable", nil, apierrors.NewForbidden(schema.GroupResource{Resource: "pods"}, "", nil), warn, "forbidden"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := readyCluster()
			f.Pods, f.PodsErr = tc.pods, tc.err
			p := preflightOf(f)
			var c *Check
			for i := range p.Checks {
				if p.Checks[i].Name == "Restart back-off" {
					c = &p.Checks[i]
				}
			}
			if c == nil {
				t.Fatalf("no back-off check in %+v", p.Checks)
			}
			if c.Result != tc.result || !strings.Contains(c.Detail, tc.detail) {
				t.Errorf("%s: %s, want %s with %q", c.Result, c.Detail, tc.result, tc.detail)
			}
			if !p.Ready {
				t.Errorf("the back-off made the cluster not ready: %+v", c)
			}
		})
	}
}
