package gang

import (
	"cmp"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"

	"github.com/zaya-operator/zaya-operator/api/contract"
	trainingv1alpha1 "github.com/zaya-operator/zaya-operator/api/v1alpha1"
)

// What an attempt's workers restored, as their termination messages say: the step every rank
// resumed from, and the newer steps they found corrupt and moved aside.

// MaxCorruptReported bounds the corrupt steps kept from one attempt (status and event).
const MaxCorruptReported = 16

// CorruptStep is one "zaya: checkpoint-corrupt: step=N ..." line.
type CorruptStep struct {
	Step   int64
	Detail string // what follows the step: where it was moved and why
}

// ResumeReport is what one pod's termination message says of its resume.
type ResumeReport struct {
	Step    int64 // -1: the pod did not say
	Corrupt []CorruptStep
}

// ReportedResume reads the resume lines of a stopped worker.
func ReportedResume(pod *corev1.Pod) ResumeReport {
	msg, ok := TerminationMessage(pod)
	if !ok {
		return ResumeReport{Step: -1}
	}
	return ParseResume(msg)
}

// ResumeOfRuns reads what a current rank's runs said of their resume: the run that followed
// the current restart (now), and the one that followed the restart before it (before). A run
// reports only as it ends, so after an in-place restart its words are those of the container's
// previous run (lastState), and which restart that run followed is told by its restart count
// against status.rankRestarts (base; nil if unknown or the last restart was a recreate): while
// the restart is under way base is the count before its fault, once it is over the count the
// restart left.
func ResumeOfRuns(pod *corev1.Pod, base []int32, rank int, renewed, underWay bool) (now, before ResumeReport) {
	now, before = ResumeReport{Step: -1}, ResumeReport{Step: -1}
	s := WorkerStatus(pod)
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
				now.Merge(ParseResume(r.t.Message))
			}
		default:
			first := base[rank] // the first run that followed the current restart
			if underWay {
				first++
			}
			if r.ordinal >= first {
				now.Merge(ParseResume(r.t.Message))
			} else if r.ordinal == first-1 {
				before.Merge(ParseResume(r.t.Message))
			}
		}
	}
	return now, before
}

// ParseResume reads the resume lines of a termination message.
func ParseResume(msg string) ResumeReport {
	r := ResumeReport{Step: -1}
	for line := range strings.Lines(msg) {
		line = strings.TrimSpace(line)
		if v, ok := strings.CutPrefix(line, trainingv1alpha1.TerminationMessageRestoredPrefix); ok {
			if step, ok := contract.ParseStep(v); ok {
				r.Step = step
			}
			continue
		}
		v, ok := strings.CutPrefix(line, trainingv1alpha1.TerminationMessageCorruptPrefix)
		if !ok || len(r.Corrupt) == MaxCorruptReported {
			continue
		}
		v, ok = strings.CutPrefix(strings.TrimSpace(v), "step=")
		num, detail, _ := strings.Cut(v, " ")
		if step, read := contract.ParseStep(num); ok && read {
			r.Corrupt = append(r.Corrupt, CorruptStep{Step: step, Detail: strings.TrimSpace(detail)})
		}
	}
	return r
}

// Merge folds another rank's report in. Ranks agree on the step through their collective,
// so they differ only if a worker breaks the contract: the lowest step is the safe claim.
func (r *ResumeReport) Merge(o ResumeReport) {
	if o.Step >= 0 && (r.Step < 0 || o.Step < r.Step) {
		r.Step = o.Step
	}
	for _, c := range o.Corrupt {
		// Rank 0 names where the step went and why; the other ranks only that it was moved:
		// keep the longest account of each step.
		i := slices.IndexFunc(r.Corrupt, func(x CorruptStep) bool { return x.Step == c.Step })
		switch {
		case i < 0:
			r.Corrupt = append(r.Corrupt, c)
		case len(c.Detail) > len(r.Corrupt[i].Detail) || (len(c.Detail) == len(r.Corrupt[i].Detail) && c.Detail < r.Corrupt[i].Detail):
			r.Corrupt[i] = c
		}
	}
	// Newest first, ties by detail: the result must not depend on the pods' listing order.
	slices.SortFunc(r.Corrupt, func(a, b CorruptStep) int {
		return cmp.Or(cmp.Compare(b.Step, a.Step), strings.Compare(a.Detail, b.Detail))
	})
	if len(r.Corrupt) > MaxCorruptReported {
		r.Corrupt = r.Corrupt[:MaxCorruptReported]
	}
}

// CorruptOfRuns reads the corrupt steps a pod's worker runs named: the one that ended last and
// the one before it, whichever restart they followed.
func CorruptOfRuns(pod *corev1.Pod) ResumeReport {
	r := ResumeReport{Step: -1}
	if s := WorkerStatus(pod); s != nil {
		for _, t := range []*corev1.ContainerStateTerminated{s.State.Terminated, s.LastTerminationState.Terminated} {
			if t != nil {
				r.Merge(ResumeReport{Step: -1, Corrupt: ParseResume(t.Message).Corrupt})
			}
		}
	}
	return r
}
