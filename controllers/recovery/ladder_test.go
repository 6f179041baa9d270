package recovery

import (
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	trainingv1alpha1 "github.com/zaya-operator/zaya-operator/api/v1alpha1"
)

var now = time.Date(2026, 11, 21, 8, 0, 0, 0, time.UTC)

// Each rung of the ladder gets its own inPlaceTimeout: a laggard's new pod restarts the clock.
func TestEachRungOfTheLadderGetsItsOwnTimeout(t *testing.T) {
	since := now.Add(-2 * time.Minute)
	st := &trainingv1alpha1.ZayaTrainingJobStatus{}
	if due := InPlaceDue(st, since, 3*time.Minute, now); due != time.Minute {
		t.Errorf("due %v, want 1m left of the first rung", due)
	}
	st.Replacing = []trainingv1alpha1.ReplacedPod{{Rank: 1, Since: metav1.NewTime(now.Add(-30 * time.Second))}}
	if due := InPlaceDue(st, since, 3*time.Minute, now); due != 150*time.Second {
		t.Errorf("due %v, want 2m30s left of the rung the replacement began", due)
	}
	if due := InPlaceDue(st, since, 10*time.Second, now); due > 0 {
		t.Errorf("due %v, want overdue", due)
	}
}

// Only a worker's own failures count against its node: not the program's bug, not a stop over
// a peer, not the platform's word (which quarantines by itself), and only within the window.
func TestWhichFailuresCountAgainstANode(t *testing.T) {
	exit := func(code int32, node string, ago time.Duration) trainingv1alpha1.JobFailure {
		return trainingv1alpha1.JobFailure{Reason: trainingv1alpha1.FailureReasonExitCode, ExitCode: ptr.To(code), Node: node, Time: metav1.NewTime(now.Add(-ago))}
	}
	recent := []trainingv1alpha1.JobFailure{
		exit(1, "n1", time.Minute),
		exit(trainingv1alpha1.ExitStopped, "n1", 2*time.Minute), // a bystander
		{Reason: trainingv1alpha1.FailureReasonExitCode, ExitCode: ptr.To[int32](1), Node: "n1", Category: "UserCode", Time: metav1.NewTime(now)},
		{Reason: trainingv1alpha1.FailureReasonNodeLost, Node: "n1", Time: metav1.NewTime(now)},
		exit(1, "n1", 48*time.Hour), // out of the window
		exit(1, "n2", time.Minute),  // another node
		{Reason: trainingv1alpha1.FailureReasonHang, Node: "n1", Time: metav1.NewTime(now.Add(-time.Minute))},
	}
	since := now.Add(-24 * time.Hour)
	if n := RepeatedOnNode(exit(139, "n1", 0), recent, since); n != RepeatedFailuresToQuarantine {
		t.Errorf("a crash on n1 makes %d failures there, want %d (itself, the exit 1, the hang)", n, RepeatedFailuresToQuarantine)
	}
	if n := RepeatedOnNode(exit(trainingv1alpha1.ExitStopped, "n1", 0), recent, since); n != 0 {
		t.Errorf("a stop over a peer counts %d against its node, want 0", n)
	}
	if n := RepeatedOnNode(exit(1, "", 0), recent, since); n != 0 {
		t.Errorf("a failure on no node counts %d, want 0", n)
	}
}
