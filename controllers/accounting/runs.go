package accounting

import (
	"math"
	"slices"
	"strconv"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/zaya-operator/zaya-operator/api/contract"
	trainingv1alpha1 "github.com/zaya-operator/zaya-operator/api/v1alpha1"
	"github.com/zaya-operator/zaya-operator/controllers/liveprogress"
)

// stepsAfter is how many steps rep's run took after its last report until t, going on at
// its pace.
func stepsAfter(rep liveprogress.Report, t time.Time) int64 {
	if rep.StepSeconds <= 0 || !t.After(rep.LastStepAt) {
		return 0
	}
	return int64(min(t.Sub(rep.LastStepAt).Seconds()/rep.StepSeconds, contract.MaxStep))
}

// micros is a step time in seconds as status keeps it (at most a day).
func micros(seconds float64) int64 { return int64(min(seconds, 86400) * 1e6) }

// stamp is t for the log, to the microsecond.
func stamp(t time.Time) string { return t.UTC().Format("15:04:05.000000") }

// freshReport is how old a report may be and still tell the gang's last step: a few of a
// fast run's steps (a report a poll old is read again).
const freshReport = 100 * time.Millisecond

// fresh says whether rep was read within freshReport.
func fresh(rep liveprogress.Report, now time.Time) bool { return rep.At.After(now.Add(-freshReport)) }

// micro is t as status keeps it: to the microsecond, so that a time set again compares equal.
func micro(t time.Time) metav1.MicroTime { return metav1.NewMicroTime(t.Truncate(time.Microsecond)) }

// clampTime is t, or lo if t is before it, or hi if after.
func clampTime(t, lo, hi time.Time) time.Time {
	if t.Before(lo) {
		t = lo
	}
	if t.After(hi) {
		t = hi
	}
	return t
}

// maxTime is the later of a and b.
func maxTime(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}

// lossOf is category's row, added if missing (a hand-written status past the bound shares the
// last row).
func lossOf(g *trainingv1alpha1.GoodputStatus, category string) *trainingv1alpha1.GoodputLoss {
	if i := slices.IndexFunc(g.Lost, func(l trainingv1alpha1.GoodputLoss) bool { return l.Category == category }); i >= 0 {
		return &g.Lost[i]
	}
	if len(g.Lost) >= 16 {
		return &g.Lost[len(g.Lost)-1]
	}
	g.Lost = append(g.Lost, trainingv1alpha1.GoodputLoss{Category: category})
	return &g.Lost[len(g.Lost)-1]
}

// runsReport is what stopped workers said of the run they ran: the furthest step reached and
// the newest checkpoint, the pace, when it last advanced; and, of a run that began training
// after some time, when it did and from which step.
type runsReport struct {
	reached, committed, resumed int64
	pace                        float64
	lastStep, since             time.Time
}

// readRuns reads the progress lines of termination messages whose run last trained in
// (after, before] (older runs are no news, newer ones another run's); with untimed, also of
// messages that say nothing of times (a worker older than those lines).
func readRuns(messages []string, after, before time.Time, untimed bool) runsReport {
	return readRunsBegun(messages, after, before, untimed, time.Time{})
}

// readRunsBegun is readRuns of the runs that began training by begun (zero: any): where a
// failed run stopped, never a run that trained after it.
func readRunsBegun(messages []string, after, before time.Time, untimed bool, begun time.Time) runsReport {
	r := runsReport{resumed: -1}
	for _, msg := range messages {
		m := readProgress(msg)
		if !begun.IsZero() && m.since.After(begun) {
			continue
		}
		if m.lastStep.IsZero() {
			if untimed {
				r.committed = max(r.committed, m.checkpoint)
				if m.step > r.reached {
					r.reached, r.pace = m.step, m.stepSeconds
				}
			}
			continue
		}
		if !m.lastStep.After(after) || m.lastStep.After(before) {
			continue
		}
		r.committed = max(r.committed, m.checkpoint)
		if m.step > r.reached {
			r.reached, r.pace = m.step, m.stepSeconds
		}
		if m.lastStep.After(r.lastStep) {
			r.lastStep = m.lastStep
		}
		if m.since.After(after) && (r.since.IsZero() || m.since.Before(r.since)) {
			r.since, r.resumed = m.since, m.restored
		}
	}
	return r
}

type progressReport struct {
	step, checkpoint, restored int64
	stepSeconds                float64
	since, lastStep            time.Time
}

// readProgress reads a termination message's progress lines; a line it cannot read is none.
func readProgress(msg string) progressReport {
	r := progressReport{restored: -1}
	for line := range strings.Lines(msg) {
		line = strings.TrimSpace(line)
		if v, ok := strings.CutPrefix(line, trainingv1alpha1.TerminationMessageTrainingStepPrefix); ok {
			if n, ok := contract.ParseStep(v); ok {
				r.step = n
			}
		} else if v, ok := strings.CutPrefix(line, trainingv1alpha1.TerminationMessageStepSecondsPrefix); ok {
			if f, err := strconv.ParseFloat(v, 64); err == nil && f > 0 && f < 86400 {
				r.stepSeconds = f
			}
		} else if v, ok := strings.CutPrefix(line, trainingv1alpha1.TerminationMessageCheckpointPrefix); ok {
			if n, ok := contract.ParseStep(v); ok {
				r.checkpoint = n
			}
		} else if v, ok := strings.CutPrefix(line, trainingv1alpha1.TerminationMessageRestoredPrefix); ok {
			if n, ok := contract.ParseStep(v); ok {
				r.restored = n
			}
		} else if v, ok := strings.CutPrefix(line, trainingv1alpha1.TerminationMessageTrainingSincePrefix); ok {
			if t, err := time.Parse(time.RFC3339Nano, v); err == nil {
				r.since = t
			}
		} else if v, ok := strings.CutPrefix(line, trainingv1alpha1.TerminationMessageLastStepAtPrefix); ok {
			if t, err := time.Parse(time.RFC3339Nano, v); err == nil {
				r.lastStep = t
			}
		}
	}
	return r
}

// addMillis adds d's whole milliseconds to ms, saturating.
func addMillis(ms int64, d time.Duration) int64 { return addInt(ms, max(int64(d/time.Millisecond), 0)) }

func addInt(a, b int64) int64 {
	if b > 0 && a > math.MaxInt64-b {
		return math.MaxInt64
	}
	return a + b
}
