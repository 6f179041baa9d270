package controllers

import (
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	trainingv1alpha1 "github.com/zaya-operator/zaya-operator/api/v1alpha1"
)

// Goodput: how much of a job's started time went to training. The operator accounts it from
// what it sees: the start (to every rank running), each failure (to every rank running again),
// and the steps a restart trains again, priced at the pace the workers report when they stop
// (training-step=, step-seconds= and checkpoint-step= in their termination messages).
// status.goodput is brought up to date at each such event, and at suspension and completion:
// a running job's status is never written for it alone (the zaya_job_effective_training_ratio
// gauge carries it on to the scrape).

// goodput is the job's accounting, begun at its start; nil before it started.
func (p *pass) goodput() *trainingv1alpha1.GoodputStatus {
	st := &p.job.Status
	if st.StartTime == nil {
		return st.Goodput
	}
	if st.Goodput == nil {
		st.Goodput = &trainingv1alpha1.GoodputStatus{AsOf: *st.StartTime}
	}
	if st.Goodput.AsOf.Before(st.StartTime) {
		st.Goodput.AsOf = *st.StartTime // resumed: the suspension is no wall time
	}
	return st.Goodput
}

// refreshGoodput adds the wall time since the last account (while started) and recomputes
// the totals.
func (p *pass) refreshGoodput() {
	g := p.goodput()
	if g == nil {
		return
	}
	end := p.now
	if c := p.job.Status.CompletionTime; c != nil && c.Time.Before(end) {
		end = c.Time
	}
	if p.job.Status.StartTime != nil && end.After(g.AsOf.Time) {
		g.WallMilliseconds = addMillis(g.WallMilliseconds, end.Sub(g.AsOf.Time))
		g.AsOf = metav1.Time{Time: end}
	}
	var lost int64
	for _, l := range g.Lost {
		lost = addInt(lost, addInt(l.DownMilliseconds, l.RecomputeMilliseconds))
	}
	g.LostMilliseconds = lost
	g.TrainingMilliseconds = max(g.WallMilliseconds-g.StartupMilliseconds-lost, 0)
	g.EffectiveTrainingTime = ""
	if g.WallMilliseconds > 0 {
		g.EffectiveTrainingTime = fmt.Sprintf("%.1f%%", 100*float64(g.TrainingMilliseconds)/float64(g.WallMilliseconds))
	}
}

// goodputStarted accounts a start: from the job's start (or resume) until every rank ran.
func (p *pass) goodputStarted() {
	g := p.goodput()
	if g == nil {
		return
	}
	g.StartupMilliseconds = addMillis(g.StartupMilliseconds, p.now.Sub(p.job.Status.StartTime.Time))
	p.refreshGoodput()
}

// goodputFailed accounts a root failure of category.
func (p *pass) goodputFailed(category string) {
	g := p.goodput()
	if g == nil {
		return
	}
	l := lossOf(g, category)
	l.Failures = min(l.Failures+1, math.MaxInt32)
	p.refreshGoodput()
}

// rerootGoodput moves the restart under way from the category of the root first taken for it
// (a rank that only stopped over a peer) to the one found since (a lost node's, a hung rank's),
// when the former was such a stop.
func (p *pass) rerootGoodput(found trainingv1alpha1.JobFailure) {
	last := p.job.Status.LastFailure
	if last == nil || last.ExitCode == nil || *last.ExitCode != trainingv1alpha1.ExitStopped {
		return
	}
	to := found.Category
	if to == "" {
		c, _ := categoryOfReason(&found)
		to = string(c)
	}
	g := p.goodput()
	if g == nil || to == "" || to == last.Category {
		return
	}
	if i := slices.IndexFunc(g.Lost, func(l trainingv1alpha1.GoodputLoss) bool { return l.Category == last.Category }); i >= 0 && g.Lost[i].Failures > 0 {
		g.Lost[i].Failures--
		if g.Lost[i].Failures == 0 && g.Lost[i].DownMilliseconds == 0 && g.Lost[i].RecomputeMilliseconds == 0 {
			g.Lost = slices.Delete(g.Lost, i, i+1)
		}
	}
	l := lossOf(g, to)
	l.Failures = min(l.Failures+1, math.MaxInt32)
	p.refreshGoodput()
}

// goodputRecompute accounts the work a failure of category has the gang train again.
func (p *pass) goodputRecompute(category string, recompute time.Duration) {
	g := p.goodput()
	if g == nil || recompute <= 0 {
		return
	}
	l := lossOf(g, category)
	l.RecomputeMilliseconds = addMillis(l.RecomputeMilliseconds, recompute)
	p.refreshGoodput()
}

// failedMessages are the termination messages of the gang's failed pods, at most
// evidenceChecks of them (the ranks of a gang stop within a step of each other).
func failedMessages(g gang) []string {
	var out []string
	for _, pod := range g.failed {
		if s := workerStatus(pod); s != nil && s.State.Terminated != nil {
			out = append(out, s.State.Terminated.Message)
		}
		if len(out) == evidenceChecks {
			break
		}
	}
	return out
}

// exitMessagesSince are the termination messages of the ranks' runs that ended at or after
// since: an in-place restart's root and cascade.
func (g gang) exitMessagesSince(since time.Time) []string {
	var out []string
	for _, pod := range g.ranks {
		if pod == nil {
			continue
		}
		if t := lastExit(pod); t != nil && !t.FinishedAt.Time.Before(since) {
			out = append(out, t.Message)
			if len(out) == evidenceChecks {
				break
			}
		}
	}
	return out
}

// goodputRecovered accounts a restart's downtime, from the failure to every rank running again.
func (p *pass) goodputRecovered(category string, down time.Duration) {
	g := p.goodput()
	if g == nil {
		return
	}
	l := lossOf(g, category)
	l.DownMilliseconds = addMillis(l.DownMilliseconds, down)
	p.refreshGoodput()
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

// workLost prices the steps a restart trains again from what stopped ranks reported: the
// furthest step reached past the newest committed checkpoint, at the pace reported with it.
func workLost(messages []string) time.Duration {
	var reached, committed int64
	var pace float64
	for _, msg := range messages {
		r := readProgress(msg)
		if r.step > reached {
			reached, pace = r.step, r.stepSeconds
		}
		committed = max(committed, r.checkpoint)
	}
	if reached <= committed || pace <= 0 {
		return 0
	}
	return time.Duration(min(float64(reached-committed)*pace, float64(366*24*time.Hour/time.Second)) * float64(time.Second))
}

type progressReport struct {
	step, checkpoint int64
	stepSeconds      float64
}

// readProgress reads a termination message's progress lines; a line it cannot read is none.
func readProgress(msg string) progressReport {
	var r progressReport
	for line := range strings.Lines(msg) {
		line = strings.TrimSpace(line)
		if v, ok := strings.CutPrefix(line, trainingv1alpha1.TerminationMessageTrainingStepPrefix); ok {
			if n, err := strconv.ParseInt(v, 10, 64); err == nil && n >= 0 {
				r.step = n
			}
		} else if v, ok := strings.CutPrefix(line, trainingv1alpha1.TerminationMessageStepSecondsPrefix); ok {
			if f, err := strconv.ParseFloat(v, 64); err == nil && f > 0 && f < 86400 {
				r.stepSeconds = f
			}
		} else if v, ok := strings.CutPrefix(line, trainingv1alpha1.TerminationMessageCheckpointPrefix); ok {
			if n, err := strconv.ParseInt(v, 10, 64); err == nil && n >= 0 {
				r.checkpoint = n
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
