package recovery

import (
	"fmt"
	"slices"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	trainingv1alpha1 "github.com/zaya-operator/zaya-operator/api/v1alpha1"
	"github.com/zaya-operator/zaya-operator/controllers/attribution"
	"github.com/zaya-operator/zaya-operator/controllers/bounded"
)

// Budget decides whether the failure v (already recorded in status.recentFailures) may restart
// job's gang at now. It returns the restart times to keep (those within restartWindow, now's
// added when the restart counts), or the reason and message to fail the job with: a fatal
// failure; the program's own error more often than userCodeRestarts (a restart will not fix
// it); the restart budget spent (maxRestarts within restartWindow); or a hand-written status
// whose restart count leaves no next attempt number the schema takes.
func Budget(job *trainingv1alpha1.ZayaTrainingJob, v Verdict, now time.Time) (recent []metav1.Time, reason, why string) {
	st := &job.Status
	f := v.Failure
	if v.Fatal {
		return nil, trainingv1alpha1.ReasonFatalFailure, f.Message
	}
	ft := &job.Spec.FaultTolerance
	since := now.Add(-ft.RestartWindow.Duration)
	if f.Category == string(attribution.UserCode) {
		// recentFailures (8) holds every one userCodeRestarts (at most 7) can allow.
		n := 0
		for _, r := range st.RecentFailures {
			if r.Category == f.Category && !r.Time.Time.Before(since) {
				n++
			}
		}
		if limit := ptr.Deref(ft.UserCodeRestarts, trainingv1alpha1.DefaultUserCodeRestarts); n > int(limit) {
			return nil, trainingv1alpha1.ReasonUserCodeError, bounded.Message(fmt.Sprintf(
				"%d failures of the program's own within %s (userCodeRestarts %d): a restart will not fix it; last: %s: %s",
				n, ft.RestartWindow.Duration, limit, f.Message, f.Evidence))
		}
	}
	recent = slices.DeleteFunc(slices.Clone(st.RestartTimes), func(t metav1.Time) bool { return t.Time.Before(since) })
	if v.Counted {
		if int32(len(recent)) >= *ft.MaxRestarts {
			return nil, trainingv1alpha1.ReasonRestartBudgetExceeded, fmt.Sprintf(
				"%d restarts within %s (maxRestarts %d); last failures: %s",
				len(recent), ft.RestartWindow.Duration, *ft.MaxRestarts, recentFailureSummary(st.RecentFailures))
		}
		recent = append(recent, metav1.Time{Time: now})
	}
	if st.Restarts >= trainingv1alpha1.MaxStatusCount { // a hand-written status: no next attempt number the schema takes
		return nil, trainingv1alpha1.ReasonRestartBudgetExceeded, fmt.Sprintf("status.restarts is %d, the most an attempt number can be", st.Restarts)
	}
	return recent, "", ""
}

func recentFailureSummary(fs []trainingv1alpha1.JobFailure) string {
	parts := make([]string, 0, 3)
	for i, f := range fs {
		if i == 3 {
			break
		}
		parts = append(parts, fmt.Sprintf("%s (%s)", f.Message, f.Reason))
	}
	return strings.Join(parts, "; ")
}

// RestartsLeft is how many more counted restarts the job's budget allows now: maxRestarts
// less the restarts within restartWindow (never below 0).
func RestartsLeft(job *trainingv1alpha1.ZayaTrainingJob, now time.Time) int32 {
	ft := &job.Spec.FaultTolerance
	if ft.MaxRestarts == nil || ft.RestartWindow == nil {
		return 0 // not defaulted: no budget to tell
	}
	since := now.Add(-ft.RestartWindow.Duration)
	n := int32(0)
	for _, t := range job.Status.RestartTimes {
		if !t.Time.Before(since) {
			n++
		}
	}
	return max(*ft.MaxRestarts-n, 0)
}
