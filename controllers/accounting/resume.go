package accounting

import (
	"fmt"
	"slices"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	trainingv1alpha1 "github.com/zaya-operator/zaya-operator/api/v1alpha1"
	"github.com/zaya-operator/zaya-operator/controllers/bounded"
	"github.com/zaya-operator/zaya-operator/controllers/gang"
)

// The resume report: what each restart restored (status.lastResume) and the committed steps
// the workers found corrupt on the way (status.corruptCheckpoints), from the ranks'
// termination messages (gang), each kept once. The core tells it in events.

// maxCorruptReason bounds the reason status keeps for a corrupt step (the schema's MaxLength).
const maxCorruptReason = 512

// maxCorruptCheckpoints is the schema's bound on status.corruptCheckpoints.
const maxCorruptCheckpoints = 16

// corruptAccount splits what a corrupt line says after its step into where the step went and
// why. Both are the worker's words: the name is kept only in the form the worker makes
// (corrupt-step-<step>-<digits>), the reason is cut to the schema's bound.
func corruptAccount(c gang.CorruptStep) (movedTo, reason string) {
	rest, ok := strings.CutPrefix(c.Detail, "moved to ")
	if !ok {
		return "", "" // "moved aside by rank 0": a peer's word, rank 0 names the place
	}
	name, why, _ := strings.Cut(rest, ": ")
	if digits, ok := strings.CutPrefix(name, fmt.Sprintf("corrupt-step-%d-", c.Step)); ok &&
		digits != "" && len(name) <= 253 && strings.Trim(digits, "0123456789") == "" {
		movedTo = name
	}
	return movedTo, bounded.Cut(strings.ToValidUTF8(strings.TrimSpace(why), "?"), maxCorruptReason)
}

// NoteCorrupt records in st each corrupt step the gang's runs name (corrupt, newest first),
// once, and returns what the new ones say. It does not wait to know which restart's run said
// so: a run restarted in place speaks only as it ends, and a second restart (a device fault
// turned into a recreate) can come before the first one's report is attributed (the soak,
// seed 2585465317).
func NoteCorrupt(st *trainingv1alpha1.ZayaTrainingJobStatus, corrupt []gang.CorruptStep, now time.Time) []string {
	var fresh []trainingv1alpha1.CorruptCheckpoint
	var details []string
	for _, c := range slices.Backward(corrupt) { // oldest step first
		movedTo, reason := corruptAccount(c)
		i := slices.IndexFunc(st.CorruptCheckpoints, func(k trainingv1alpha1.CorruptCheckpoint) bool {
			return k.Step == c.Step && (k.MovedTo == movedTo || k.MovedTo == "" || movedTo == "")
		})
		if i >= 0 {
			if k := &st.CorruptCheckpoints[i]; k.MovedTo == "" && movedTo != "" {
				k.MovedTo, k.Reason = movedTo, reason // rank 0's account came after a peer's
			}
			continue
		}
		fresh = append(fresh, trainingv1alpha1.CorruptCheckpoint{Step: c.Step, MovedTo: movedTo, Reason: reason, Time: metav1.NewTime(now)})
		details = append(details, fmt.Sprintf("step %d %s", c.Step, c.Detail))
	}
	st.CorruptCheckpoints = append(st.CorruptCheckpoints, fresh...)
	if extra := len(st.CorruptCheckpoints) - maxCorruptCheckpoints; extra > 0 {
		st.CorruptCheckpoints = slices.Delete(st.CorruptCheckpoints, 0, extra)
	}
	return details
}

// Resumed stores in st what the current restart restored (now), once a pod of it has said, and
// returns it; nil when there is nothing new. A run reports only as it ends: one restarted in
// place says so when the next fault ends it, often once that fault is counted, so the restart
// before the current one (before) is recorded late rather than never.
func Resumed(st *trainingv1alpha1.ZayaTrainingJobStatus, now, before gang.ResumeReport) *trainingv1alpha1.ResumeStatus {
	last := st.LastResume
	switch restarts := st.Restarts; {
	case now.Step >= 0 && (last == nil || last.Attempt != restarts):
		st.LastResume = resumeOf(restarts, now)
	case before.Step >= 0 && restarts > 0 && (last == nil || last.Attempt < restarts-1):
		st.LastResume = resumeOf(restarts-1, before)
	default:
		return nil
	}
	return st.LastResume
}

// resumeOf is what restart attempt restored, as report says.
func resumeOf(attempt int32, report gang.ResumeReport) *trainingv1alpha1.ResumeStatus {
	rs := &trainingv1alpha1.ResumeStatus{Attempt: attempt, Step: report.Step}
	for _, c := range report.Corrupt {
		if c.Step > report.Step {
			rs.CorruptSteps = append(rs.CorruptSteps, c.Step)
		}
	}
	if len(rs.CorruptSteps) > 0 {
		rs.StepsLost = rs.CorruptSteps[0] - rs.Step
	}
	return rs
}
