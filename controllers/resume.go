package controllers

import (
	"cmp"
	"fmt"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/zaya-operator/zaya-operator/api/contract"
	trainingv1alpha1 "github.com/zaya-operator/zaya-operator/api/v1alpha1"
)

// What an attempt's workers restored, as their termination messages say: the step every rank
// resumed from, and the newer steps they found corrupt and moved aside.

// maxCorruptReported bounds the corrupt steps kept from one attempt (status and event).
const maxCorruptReported = 16

// corruptStep is one "zaya: checkpoint-corrupt: step=N ..." line.
type corruptStep struct {
	step   int64
	detail string // what follows the step: where it was moved and why
}

// resumeReport is what one pod's termination message says of its resume.
type resumeReport struct {
	step    int64 // -1: the pod did not say
	corrupt []corruptStep
}

// reportedResume reads the resume lines of a stopped worker.
func reportedResume(pod *corev1.Pod) resumeReport {
	msg, ok := terminationMessage(pod)
	if !ok {
		return resumeReport{step: -1}
	}
	return parseResume(msg)
}

// resumeOfRuns reads what a current rank's runs said of their resume: the run that followed
// the current restart (now), and the one that followed the restart before it (before). A run
// reports only as it ends, so after an in-place restart its words are those of the container's
// previous run (lastState), and which restart that run followed is told by its restart count
// against status.rankRestarts (base; nil if unknown or the last restart was a recreate): while
// the restart is under way base is the count before its fault, once it is over the count the
// restart left.
func resumeOfRuns(pod *corev1.Pod, base []int32, rank int, renewed, underWay bool) (now, before resumeReport) {
	now, before = resumeReport{step: -1}, resumeReport{step: -1}
	s := workerStatus(pod)
	if s == nil {
		return now, before
	}
	type run struct {
		t       *corev1.ContainerStateTerminated
		ordinal int32 // how many times the container had restarted before this run
	}
	runs := []run{{s.State.Terminated, s.RestartCount}}
	if s.RestartCount > 0 {
		runs = append(runs, run{s.LastTerminationState.Terminated, s.RestartCount - 1})
	}
	for _, r := range runs {
		if r.t == nil {
			continue
		}
		switch {
		case renewed || base == nil || rank >= len(base):
			// A pod made since the restart, or no counts to tell by: the run that ended now
			// is the restart's, as before rankRestarts was kept.
			if r.t == s.State.Terminated {
				now.merge(parseResume(r.t.Message))
			}
		default:
			first := base[rank] // the first run that followed the current restart
			if underWay {
				first++
			}
			if r.ordinal >= first {
				now.merge(parseResume(r.t.Message))
			} else if r.ordinal == first-1 {
				before.merge(parseResume(r.t.Message))
			}
		}
	}
	return now, before
}

// parseResume reads the resume lines of a termination message.
func parseResume(msg string) resumeReport {
	r := resumeReport{step: -1}
	for line := range strings.Lines(msg) {
		line = strings.TrimSpace(line)
		if v, ok := strings.CutPrefix(line, trainingv1alpha1.TerminationMessageRestoredPrefix); ok {
			if step, ok := contract.ParseStep(v); ok {
				r.step = step
			}
			continue
		}
		v, ok := strings.CutPrefix(line, trainingv1alpha1.TerminationMessageCorruptPrefix)
		if !ok || len(r.corrupt) == maxCorruptReported {
			continue
		}
		v, ok = strings.CutPrefix(strings.TrimSpace(v), "step=")
		num, detail, _ := strings.Cut(v, " ")
		if step, read := contract.ParseStep(num); ok && read {
			r.corrupt = append(r.corrupt, corruptStep{step: step, detail: strings.TrimSpace(detail)})
		}
	}
	return r
}

// merge folds another rank's report in. Ranks agree on the step through their collective,
// so they differ only if a worker breaks the contract: the lowest step is the safe claim.
func (r *resumeReport) merge(o resumeReport) {
	if o.step >= 0 && (r.step < 0 || o.step < r.step) {
		r.step = o.step
	}
	for _, c := range o.corrupt {
		// Rank 0 names where the step went and why; the other ranks only that it was moved:
		// keep the longest account of each step.
		i := slices.IndexFunc(r.corrupt, func(x corruptStep) bool { return x.step == c.step })
		switch {
		case i < 0:
			r.corrupt = append(r.corrupt, c)
		case len(c.detail) > len(r.corrupt[i].detail) || (len(c.detail) == len(r.corrupt[i].detail) && c.detail < r.corrupt[i].detail):
			r.corrupt[i] = c
		}
	}
	// Newest first, ties by detail: the result must not depend on the pods' listing order.
	slices.SortFunc(r.corrupt, func(a, b corruptStep) int {
		return cmp.Or(cmp.Compare(b.step, a.step), strings.Compare(a.detail, b.detail))
	})
	if len(r.corrupt) > maxCorruptReported {
		r.corrupt = r.corrupt[:maxCorruptReported]
	}
}

// corruptOfRuns reads the corrupt steps a pod's worker runs named: the one that ended last and
// the one before it, whichever restart they followed.
func corruptOfRuns(pod *corev1.Pod) resumeReport {
	r := resumeReport{step: -1}
	if s := workerStatus(pod); s != nil {
		for _, t := range []*corev1.ContainerStateTerminated{s.State.Terminated, s.LastTerminationState.Terminated} {
			if t != nil {
				r.merge(resumeReport{step: -1, corrupt: parseResume(t.Message).corrupt})
			}
		}
	}
	return r
}

// maxCorruptReason bounds the reason status keeps for a corrupt step (the schema's MaxLength).
const maxCorruptReason = 512

// account splits what a corrupt line says after its step into where the step went and why.
// Both are the worker's words: the name is kept only in the form the worker makes
// (corrupt-step-<step>-<digits>), the reason is cut to the schema's bound.
func (c corruptStep) account() (movedTo, reason string) {
	rest, ok := strings.CutPrefix(c.detail, "moved to ")
	if !ok {
		return "", "" // "moved aside by rank 0": a peer's word, rank 0 names the place
	}
	name, why, _ := strings.Cut(rest, ": ")
	if digits, ok := strings.CutPrefix(name, fmt.Sprintf("corrupt-step-%d-", c.step)); ok &&
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
func (p *pass) reportCorrupt(g gang) {
	st := &p.job.Status
	var fresh []trainingv1alpha1.CorruptCheckpoint
	var details []string
	for _, c := range slices.Backward(g.corrupt.corrupt) { // oldest step first
		movedTo, reason := c.account()
		i := slices.IndexFunc(st.CorruptCheckpoints, func(k trainingv1alpha1.CorruptCheckpoint) bool {
			return k.Step == c.step && (k.MovedTo == movedTo || k.MovedTo == "" || movedTo == "")
		})
		if i >= 0 {
			if k := &st.CorruptCheckpoints[i]; k.MovedTo == "" && movedTo != "" {
				k.MovedTo, k.Reason = movedTo, reason // rank 0's account came after a peer's
			}
			continue
		}
		fresh = append(fresh, trainingv1alpha1.CorruptCheckpoint{Step: c.step, MovedTo: movedTo, Reason: reason, Time: metav1.NewTime(p.now)})
		details = append(details, fmt.Sprintf("step %d %s", c.step, c.detail))
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
func (p *pass) recordResume(g gang) {
	job := p.job
	last := job.Status.LastResume
	switch restarts := job.Status.Restarts; {
	case g.resume.step >= 0 && (last == nil || last.Attempt != restarts):
		p.recordResumeOf(restarts, g.resume)
	case g.resumeBefore.step >= 0 && restarts > 0 && (last == nil || last.Attempt < restarts-1):
		p.recordResumeOf(restarts-1, g.resumeBefore)
	}
}

// recordResumeOf stores what restart attempt restored, as report says.
func (p *pass) recordResumeOf(attempt int32, report resumeReport) {
	job := p.job
	rs := &trainingv1alpha1.ResumeStatus{Attempt: attempt, Step: report.step}
	for _, c := range report.corrupt {
		if c.step > report.step {
			rs.CorruptSteps = append(rs.CorruptSteps, c.step)
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
