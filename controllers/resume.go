package controllers

import (
	"cmp"
	"fmt"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"

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
	r := resumeReport{step: -1}
	msg, ok := terminationMessage(pod)
	if !ok {
		return r
	}
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

// recordResume stores what the current attempt restored, once a pod of it has said, with an
// event: a warning when committed steps were found corrupt.
func (p *pass) recordResume(g gang) {
	job := p.job
	attempt := job.Status.Restarts
	if g.resume.step < 0 || (job.Status.LastResume != nil && job.Status.LastResume.Attempt == attempt) {
		return
	}
	rs := &trainingv1alpha1.ResumeStatus{Attempt: attempt, Step: g.resume.step}
	for _, c := range g.resume.corrupt {
		if c.step > g.resume.step {
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
	var details []string
	for _, c := range g.resume.corrupt {
		details = append(details, fmt.Sprintf("step %d %s", c.step, c.detail))
	}
	p.warning(trainingv1alpha1.ReasonCheckpointCorrupt, "Resume",
		"the gang resumed from checkpoint step %d (after %d restarts), losing %d steps: %d newer step(s) failed verification and were moved aside: %s",
		rs.Step, attempt, rs.StepsLost, len(rs.CorruptSteps), strings.Join(details, "; "))
}
