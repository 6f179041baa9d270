package recovery

import (
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	trainingv1alpha1 "github.com/zaya-operator/zaya-operator/api/v1alpha1"
	"github.com/zaya-operator/zaya-operator/internal/testjob"
)

func TestTheRestartBudget(t *testing.T) {
	job := func() *trainingv1alpha1.ZayaTrainingJob {
		j := &trainingv1alpha1.ZayaTrainingJob{}
		j.Spec.FaultTolerance.MaxRestarts = ptr.To[int32](2)
		j.Spec.FaultTolerance.RestartWindow = &metav1.Duration{Duration: time.Hour}
		j.Spec.FaultTolerance.UserCodeRestarts = ptr.To[int32](1)
		return j
	}
	crash := Verdict{Failure: trainingv1alpha1.JobFailure{Reason: trainingv1alpha1.FailureReasonExitCode, Message: "rank 1 exited 1"}, Counted: true}

	j := job()
	j.Status.RestartTimes = []metav1.Time{metav1.NewTime(now.Add(-2 * time.Hour)), metav1.NewTime(now.Add(-time.Minute))}
	if recent, reason, _ := Budget(j, crash, now); reason != "" || len(recent) != 2 || !recent[1].Time.Equal(now) {
		t.Errorf("recent %v, refused %q: want the old restart dropped, this one counted", recent, reason)
	}
	j.Status.RestartTimes = append(j.Status.RestartTimes, metav1.NewTime(now.Add(-time.Second)))
	if _, reason, why := Budget(j, crash, now); reason != trainingv1alpha1.ReasonRestartBudgetExceeded || !strings.Contains(why, "maxRestarts 2") {
		t.Errorf("refused %q (%s): want the budget spent", reason, why)
	}
	free := crash
	free.Counted = false
	if recent, reason, _ := Budget(j, free, now); reason != "" || len(recent) != 2 {
		t.Errorf("an uncounted restart: recent %v, refused %q", recent, reason)
	}

	j = job()
	bug := crash
	bug.Failure.Category = "UserCode"
	j.Status.RecentFailures = []trainingv1alpha1.JobFailure{bug.Failure, bug.Failure} // this one and one before
	for i := range j.Status.RecentFailures {
		j.Status.RecentFailures[i].Time = metav1.NewTime(now)
	}
	if _, reason, _ := Budget(j, bug, now); reason != trainingv1alpha1.ReasonUserCodeError {
		t.Errorf("refused %q: the program's own error twice with userCodeRestarts 1 fails the job", reason)
	}

	fatal := crash
	fatal.Fatal = true
	if _, reason, _ := Budget(job(), fatal, now); reason != trainingv1alpha1.ReasonFatalFailure {
		t.Errorf("refused %q, want FatalFailure", reason)
	}
	j = job()
	j.Status.Restarts = trainingv1alpha1.MaxStatusCount
	if _, reason, _ := Budget(j, free, now); reason != trainingv1alpha1.ReasonRestartBudgetExceeded {
		t.Errorf("refused %q: no next attempt number", reason)
	}
}

// The budget left counts only the restarts within the window.
func TestRestartsLeftCountsTheWindowOnly(t *testing.T) {
	job := testjob.MakeZayaTrainingJob("llm", "ns").Defaulted().Obj()
	job.Spec.FaultTolerance.MaxRestarts = ptr.To[int32](3)
	job.Spec.FaultTolerance.RestartWindow = &metav1.Duration{Duration: time.Hour}
	now := time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)
	job.Status.RestartTimes = []metav1.Time{{Time: now.Add(-2 * time.Hour)}, {Time: now.Add(-30 * time.Minute)}, {Time: now.Add(-time.Minute)}}
	if got := RestartsLeft(job, now); got != 1 {
		t.Errorf("restarts left %d: want 1 (two of three within the hour)", got)
	}
	job.Status.RestartTimes = append(job.Status.RestartTimes, metav1.Time{Time: now}, metav1.Time{Time: now})
	if got := RestartsLeft(job, now); got != 0 {
		t.Errorf("restarts left %d past the budget: want 0", got)
	}
}
