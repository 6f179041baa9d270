package controllers

import (
	"fmt"
	"slices"
	"strings"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	trainingv1alpha1 "github.com/zaya-operator/zaya-operator/api/v1alpha1"
	"github.com/zaya-operator/zaya-operator/controllers/gang"
)

// maxCorruptReason bounds the reason status keeps for a corrupt step (the schema's MaxLength).
const maxCorruptReason = 512

// account splits what a corrupt line says after its step into where the step went and why.
// Both are the worker's words: the name is kept only in the form the worker makes
// (corrupt-step-<step>-<digits>), the reason is cut to the schema's bound.
func account(c gang.CorruptStep) (movedTo, reason string) {
	rest, ok := strings.CutPrefix(c.Detail, "moved to ")
	if !ok {
		return "", "" // "moved aside by rank 0": a peer's word, rank 0 names the place
	}
	name, why, _ := strings.Cut(rest, ": ")
	if digits, ok := strings.CutPrefix(name, fmt.Sprintf("corrupt-step-%d-", c.Step)); ok &&
		digits != "" && len(name) <= 253 && strings.Trim(digits, "0123456789") == "" {
		movedTo = name
	}
	return movedTo, truncateTo(strings.ToValidUTF8(strings.TrimSpace(why), "?"), maxCorruptReason)
}

// maxCorruptCheckpoints is the schema's bound on status.corruptCheckpoints.
const maxCorruptCheckpoints = 16

// reportCorrupt records each corrupt step the gang's runs name, once, with a warning. It does
// not wait to know which restart's run said so: a run restarted in place speaks only as it
// ends, and a second restart (a device fault turned into a recreate) can come before the
// operator has attributed the first one's report (the soak, seed 2585465317).
func (p *pass) reportCorrupt(g gang.Gang) {
	st := &p.job.Status
	var fresh []trainingv1alpha1.CorruptCheckpoint
	var details []string
	for _, c := range slices.Backward(g.Corrupt.Corrupt) { // oldest step first
		movedTo, reason := account(c)
		i := slices.IndexFunc(st.CorruptCheckpoints, func(k trainingv1alpha1.CorruptCheckpoint) bool {
			return k.Step == c.Step && (k.MovedTo == movedTo || k.MovedTo == "" || movedTo == "")
		})
		if i >= 0 {
			if k := &st.CorruptCheckpoints[i]; k.MovedTo == "" && movedTo != "" {
				k.MovedTo, k.Reason = movedTo, reason // rank 0's account came after a peer's
			}
			continue
		}
		fresh = append(fresh, trainingv1alpha1.CorruptCheckpoint{Step: c.Step, MovedTo: movedTo, Reason: reason, Time: metav1.NewTime(p.now)})
		details = append(details, fmt.Sprintf("step %d %s", c.Step, c.Detail))
	}
	if len(fresh) == 0 {
		return
	}
	st.CorruptCheckpoints = append(st.CorruptCheckpoints, fresh...)
	if extra := len(st.CorruptCheckpoints) - maxCorruptCheckpoints; extra > 0 {
		st.CorruptCheckpoints = slices.Delete(st.CorruptCheckpoints, 0, extra)
	}
	p.warning(trainingv1alpha1.ReasonCheckpointCorrupt, "Resume", "%s", truncate(fmt.Sprintf(
		"%d committed checkpoint step(s) failed verification when the workers resumed and were moved aside, the gang resuming from an older step: %s",
		len(fresh), strings.Join(details, "; "))))
}

// recordResume stores what the current restart restored, once a pod of it has said, with an
// event: a warning when committed steps were found corrupt. A run reports only as it ends: one
// restarted in place says so when the next fault ends it, often once the operator has counted
// that fault, so the restart before the current one is recorded late rather than never.
func (p *pass) recordResume(g gang.Gang) {
	job := p.job
	last := job.Status.LastResume
	switch restarts := job.Status.Restarts; {
	case g.Resume.Step >= 0 && (last == nil || last.Attempt != restarts):
		p.recordResumeOf(restarts, g.Resume)
	case g.ResumeBefore.Step >= 0 && restarts > 0 && (last == nil || last.Attempt < restarts-1):
		p.recordResumeOf(restarts-1, g.ResumeBefore)
	}
}

// recordResumeOf stores what restart attempt restored, as report says.
func (p *pass) recordResumeOf(attempt int32, report gang.ResumeReport) {
	job := p.job
	rs := &trainingv1alpha1.ResumeStatus{Attempt: attempt, Step: report.Step}
	for _, c := range report.Corrupt {
		if c.Step > report.Step {
			rs.CorruptSteps = append(rs.CorruptSteps, c.Step)
		}
	}
	if len(rs.CorruptSteps) > 0 {
		rs.StepsLost = rs.CorruptSteps[0] - rs.Step
	}
	job.Status.LastResume = rs
	if len(rs.CorruptSteps) == 0 {
		p.normal(trainingv1alpha1.ReasonCheckpointRestored, "Resume", "the gang resumed from checkpoint step %d (after %d restarts)", rs.Step, attempt)
		return
	}
	// The corrupt steps' warning is reportCorrupt's, whichever run told them.
	p.normal(trainingv1alpha1.ReasonCheckpointRestored, "Resume",
		"the gang resumed from checkpoint step %d (after %d restarts), losing %d steps: %d newer step(s) failed verification and were moved aside (status.corruptCheckpoints)",
		rs.Step, attempt, rs.StepsLost, len(rs.CorruptSteps))
}
