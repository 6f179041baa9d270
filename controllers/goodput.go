package controllers

import (
	"context"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ctrl "sigs.k8s.io/controller-runtime"

	"github.com/zaya-operator/zaya-operator/api/contract"
	trainingv1alpha1 "github.com/zaya-operator/zaya-operator/api/v1alpha1"
	"github.com/zaya-operator/zaya-operator/controllers/attribution"
	"github.com/zaya-operator/zaya-operator/controllers/gang"
	"github.com/zaya-operator/zaya-operator/controllers/liveprogress"
)

// Goodput: how much of a job's started time went to training. Time is lost from the start
// until the job first trains, and from each failure (when training last advanced) until it
// trains again, plus the steps trained again past the checkpoint it resumed from, at the pace
// the workers reported. Both ends come from the workers: rank 0's live progress
// (liveprogress) says when a run began training, termination messages (training-since=,
// last-step-at=, training-step=, checkpoint-step=, step-seconds=) say where a run that ended
// stood. Where the workers say nothing the pods do: a loss then ends when every rank runs.
// status.goodput.open holds the loss under way; the figures are brought up to date at each
// event (start, failure, training again, suspension, completion), never for time passing
// alone (the zaya_job_effective_training_ratio gauge carries them on to the scrape).

var goodputLog = ctrl.Log.WithName("goodput")

// progressGrace is how long after every rank runs again a loss waits for rank 0 to report
// that it trains, before it is closed as of the ranks running (its workers report nothing).
func (r *ZayaTrainingJobReconciler) progressGrace() time.Duration {
	return 3*r.ProgressPollInterval + 5*time.Second
}

// goodput is the job's accounting, begun at its start with the startup open; nil before it
// started.
func (p *pass) goodput() *trainingv1alpha1.GoodputStatus {
	st := &p.job.Status
	if st.StartTime == nil {
		return st.Goodput
	}
	start := micro(st.StartTime.Time)
	if st.Goodput == nil {
		st.Goodput = &trainingv1alpha1.GoodputStatus{AsOf: start, Open: &trainingv1alpha1.GoodputOpen{Since: start}}
	}
	if st.Goodput.AsOf.Before(&start) {
		// Resumed: the suspension is no wall time, and the job starts again.
		st.Goodput.AsOf = start
		st.Goodput.Open = &trainingv1alpha1.GoodputOpen{Since: start}
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
		g.AsOf = micro(end)
	}
	var lost int64
	for _, l := range g.Lost {
		lost = addInt(lost, addInt(l.DownMilliseconds, l.RecomputeMilliseconds))
	}
	g.LostMilliseconds = lost
	// Each at least 0 (the schema's bound): the differences cannot wrap.
	g.TrainingMilliseconds = max(max(g.WallMilliseconds, 0)-max(min(g.StartupMilliseconds, g.WallMilliseconds), 0)-max(lost, 0), 0)
	g.EffectiveTrainingTime = ""
	if g.WallMilliseconds > 0 {
		g.EffectiveTrainingTime = fmt.Sprintf("%.1f%%", 100*float64(g.TrainingMilliseconds)/float64(g.WallMilliseconds))
	}
}

// goodputFailed opens the loss of a root failure of category: since training last advanced
// (the stopped ranks' last steps, or rank 0's progress; else now), with where it stood. A
// loss still open (a failure before the job trained again) ends here.
func (p *pass) goodputFailed(ctx context.Context, f trainingv1alpha1.JobFailure, messages []string) {
	g := p.goodput()
	if g == nil {
		return
	}
	l := lossOf(g, f.Category)
	l.Failures = addCount(l.Failures, 1)
	if g.Open != nil {
		// A failure before the last loss was seen to end: the run between may have said when
		// it trained; else the loss runs until now.
		if p.settleGoodput(messages); g.Open != nil {
			p.closeLoss(g, p.now, -1, messages, "another failure")
		}
	}
	at := readRuns(messages, p.trainingSince(), p.now, true)
	since := clampTime(f.Time.Time, p.trainingSince(), p.now)
	var from string // for the log
	if !at.lastStep.IsZero() {
		since, from = at.lastStep, "exits" // the stopped ranks' own word
	} else if rep, ok := p.progressNow(ctx); !ok || !p.ofCurrentRun(rep) {
		from = fmt.Sprintf("failure (progress %v: run since %s, training since %s)", ok, stamp(rep.TrainingSince), stamp(p.trainingSince()))
	} else {
		from = "progress"
		at.reached, at.committed, at.pace = max(at.reached, rep.Step), max(at.committed, rep.CheckpointStep), rep.StepSeconds
		if fresh(rep, p.now) {
			since = clampTime(rep.LastStepAt, p.trainingSince(), p.now) // read just now: its last step is the gang's
		} else {
			// Up to a poll old: training went on at its pace until the failure (whose time
			// the kubelet keeps to the second).
			since = clampTime(rep.LastStepAt, since, p.now)
			at.reached += stepsAfter(rep, since)
		}
	}
	goodputLog.V(1).Info("loss opened", "job", p.job.Namespace+"/"+p.job.Name, "category", f.Category, "since", stamp(since), "failure", f.Time.Time,
		"from", from, "messages", len(messages), "reached", at.reached)
	g.Open = &trainingv1alpha1.GoodputOpen{Category: f.Category, Since: micro(since), ReachedStep: at.reached,
		CheckpointStep: at.committed, StepMicroseconds: micros(at.pace)}
	p.refreshGoodput()
}

// goodputBroken opens a loss, counting no failure, when the operator breaks a gang that
// trained again within the restart under way (an escalation to a recreate, a laggard or a
// lost rank replaced): the gang trained until now, at the pace rank 0 last reported;
// refineLoss moves the start to the stopped ranks' last step once their exits show. No-op
// while a loss is open (the usual case: the gang had not trained again).
func (p *pass) goodputBroken() {
	g := p.goodput()
	if g == nil || g.Open != nil {
		return
	}
	category := string(attribution.Unknown)
	if f := p.job.Status.LastFailure; f != nil && f.Category != "" {
		category = f.Category
	}
	o := &trainingv1alpha1.GoodputOpen{Category: category, Since: micro(p.now)}
	if rep := p.report; rep != nil && p.ofCurrentRun(*rep) {
		o.ReachedStep, o.CheckpointStep, o.StepMicroseconds = rep.Step+stepsAfter(*rep, p.now), rep.CheckpointStep, micros(rep.StepSeconds)
	}
	goodputLog.V(1).Info("loss opened", "job", p.job.Namespace+"/"+p.job.Name, "category", category, "since", stamp(p.now),
		"from", "the operator broke the gang again", "reached", o.ReachedStep)
	g.Open = o
	p.refreshGoodput()
}

// ofCurrentRun says whether rep tells of a step of the run that trains now (or last did).
func (p *pass) ofCurrentRun(rep liveprogress.Report) bool {
	return !rep.LastStepAt.IsZero() && !rep.TrainingSince.Before(p.trainingSince())
}

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

// trainingSince is when the run that trains now (or last did) began: what workers report of
// older runs is no news.
func (p *pass) trainingSince() time.Time {
	if g := p.job.Status.Goodput; g != nil && g.TrainingSince != nil {
		return g.TrainingSince.Time
	}
	if p.job.Status.StartTime != nil {
		return p.job.Status.StartTime.Time
	}
	return time.Time{}
}

// progressNow reads rank 0's progress at once, for a failure about to stop the gang: the
// report the poller holds may be an interval old. Bounded by the poll's own deadlines.
func (p *pass) progressNow(ctx context.Context) (liveprogress.Report, bool) {
	if p.report != nil && fresh(*p.report, p.now) {
		return *p.report, true
	}
	ctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	if p.r.Progress != nil {
		for _, addr := range p.progressAddrs {
			if prog, err := liveprogress.Fetch(ctx, p.r.Progress.Client(), addr, p.now); err == nil && !prog.TrainingSince.IsZero() {
				return liveprogress.Report{Progress: prog, At: p.now}, true
			}
		}
	}
	if p.report != nil {
		return *p.report, true
	}
	return liveprogress.Report{}, false
}

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

// refineLoss corrects the open loss from the stopped ranks' own word (their last-step-at
// lines), which may come passes after the failure was decided: the ranks that stopped over it
// exit moments later, and a recreate's stale pods still show their exits until they go.
func (p *pass) refineLoss() {
	g := p.job.Status.Goodput
	if g == nil || g.Open == nil || g.Open.Category == "" {
		return
	}
	o := g.Open
	run := readRunsBegun(p.stopped(), p.trainingSince(), p.now, false, p.failedRunBegun(o))
	if since := micro(run.lastStep); run.lastStep.IsZero() || since.Equal(&o.Since) {
		return
	}
	goodputLog.V(1).Info("loss refined", "job", p.job.Namespace+"/"+p.job.Name, "from", stamp(o.Since.Time), "to", stamp(run.lastStep), "reached", run.reached)
	o.Since = micro(run.lastStep)
	o.ReachedStep, o.CheckpointStep = max(o.ReachedStep, run.reached), max(o.CheckpointStep, run.committed)
	if o.StepMicroseconds == 0 {
		o.StepMicroseconds = micros(run.pace)
	}
}

// failedRunBegun bounds when the run that failed into the open loss began training: by the
// loss's start, or within a second of the run status knew (its ranks' first steps end a few
// milliseconds apart; the loss may start at the failure's second, before them). A run that
// began later trained after the failure: it ends the loss, it is not where it stopped.
func (p *pass) failedRunBegun(o *trainingv1alpha1.GoodputOpen) time.Time {
	return maxTime(o.Since.Time, p.trainingSince().Add(time.Second))
}

// maxTime is the later of a and b.
func maxTime(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}

// settleGoodput ends the open loss once the job trains again: as of when rank 0 says its run
// began training, or a finished run's workers said so, or, where they say nothing, as of when
// every rank ran (once rank 0 had time to report). messages are the ranks' latest exits.
func (p *pass) settleGoodput(messages []string) time.Duration {
	g := p.goodput()
	if g == nil || g.Open == nil {
		return 0
	}
	o := g.Open
	if rep := p.report; rep != nil && rep.TrainingSince.After(o.Since.Time) {
		p.closeLoss(g, rep.TrainingSince, rep.ResumedFrom, messages, "progress")
		return 0
	}
	if run := readRuns(messages, o.Since.Time, p.now, false); !run.since.IsZero() {
		p.closeLoss(g, run.since, run.resumed, messages, "exits")
		return 0
	}
	if o.RanAt == nil {
		return 0
	}
	if wait := o.RanAt.Add(p.r.progressGrace()).Sub(p.now); wait > 0 && p.progressWatched() {
		return wait
	}
	p.closeLoss(g, o.RanAt.Time, -1, messages, "ranks running")
	return 0
}

// finalGoodput brings the figures up to the completion: a loss still open ends as the last
// run's workers say it trained again, else when the job ended. The pass that completes the
// job calls it (its clock is the completion's, to the microsecond); later passes find
// nothing left to change.
func (p *pass) finalGoodput(messages []string) {
	g := p.goodput()
	if g != nil && g.Open != nil {
		if c := p.job.Status.CompletionTime; c != nil && c.Time.Before(p.now) {
			defer func(now time.Time) { p.now = now }(p.now)
			p.now = c.Time // nothing is lost after the end
		}
		p.settleGoodput(messages)
		if g.Open != nil {
			end := p.now
			if g.Open.RanAt != nil && meta.IsStatusConditionTrue(p.job.Status.Conditions, trainingv1alpha1.ConditionSucceeded) {
				end = g.Open.RanAt.Time
			}
			p.closeLoss(g, end, -1, messages, "completion")
		}
	}
	p.refreshGoodput()
}

// goodputRan notes that every rank runs: where the workers report nothing, the loss ends then.
func (p *pass) goodputRan() {
	if g := p.goodput(); g != nil && g.Open != nil && g.Open.RanAt == nil {
		at := micro(p.now)
		g.Open.RanAt = &at
	}
}

// closeLoss ends the open loss at end: its down time, and the steps the new run (resumed at
// step resumed; -1: unknown, the checkpoint committed before the failure) trains again.
// messages are the stopped ranks' exits: they may say where the failed run stood more
// exactly than the failure's pass knew. by says what ended it (for the log).
func (p *pass) closeLoss(g *trainingv1alpha1.GoodputStatus, end time.Time, resumed int64, messages []string, by string) {
	o := g.Open
	g.Open = nil
	since := o.Since.Time
	stopped := readRunsBegun(messages, p.trainingSince(), end, false, p.failedRunBegun(o))
	if o.Category != "" && !stopped.lastStep.IsZero() && stopped.lastStep.Before(end) {
		since = stopped.lastStep // the ranks' own word, over the pass's guess
	}
	end = clampTime(end, since, p.now)
	down := end.Sub(since)
	goodputLog.V(1).Info("loss closed", "job", p.job.Namespace+"/"+p.job.Name, "category", o.Category, "by", by, "opened", stamp(o.Since.Time), "since", stamp(since), "end", stamp(end),
		"down", down, "reached", max(o.ReachedStep, stopped.reached), "resumed", resumed, "checkpoint", o.CheckpointStep, "pace", o.StepMicroseconds)
	at := micro(end)
	g.TrainingSince = &at
	if o.Category == "" {
		g.StartupMilliseconds = addMillis(g.StartupMilliseconds, down)
		p.whenStored(func() { lostSecondsTotal.WithLabelValues("Startup", "down").Add(max(down.Seconds(), 0)) })
		p.refreshGoodput()
		return
	}
	l := lossOf(g, o.Category)
	l.DownMilliseconds = addMillis(l.DownMilliseconds, down)
	category := o.Category
	p.whenStored(func() { lostSecondsTotal.WithLabelValues(category, "down").Add(max(down.Seconds(), 0)) })
	reached, pace := max(o.ReachedStep, stopped.reached), float64(o.StepMicroseconds)/1e6
	if pace <= 0 {
		pace = stopped.pace
	}
	if resumed < 0 {
		resumed = max(o.CheckpointStep, stopped.committed)
	}
	if reached > resumed && pace > 0 {
		// Steps trained again took at most the time the job has run (a resume from an older,
		// verified checkpoint may reach back before the failed run): what the workers say of
		// steps and pace is their word, and no bigger.
		trained := 366 * 24 * time.Hour
		if st := p.job.Status.StartTime; st != nil {
			trained = min(max(since.Sub(st.Time), 0), trained)
		}
		recompute := time.Duration(min(float64(reached-resumed)*pace, trained.Seconds()) * float64(time.Second))
		l.RecomputeMilliseconds = addMillis(l.RecomputeMilliseconds, recompute)
		p.whenStored(func() { lostSecondsTotal.WithLabelValues(category, "recompute").Add(recompute.Seconds()) })
	}
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
	if found.Category == "" {
		p.attribute(&found, nil) // as recordFailure will name it (a Hang has no category of reason)
	}
	to := found.Category
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
	l.Failures = addCount(l.Failures, 1)
	if g.Open != nil && g.Open.Category == last.Category {
		g.Open.Category = to
	}
	p.refreshGoodput()
}

// podMessages are the termination messages of pods' latest exits, at most limit of them.
func podMessages(pods []*corev1.Pod, limit int) []string {
	var out []string
	for _, pod := range pods {
		if msg := exitMessage(pod); msg != "" {
			out = append(out, msg)
			if len(out) == limit {
				break
			}
		}
	}
	return out
}

// exitMessage is the termination message of the worker container's latest run that ended,
// whatever its exit: goodput reads the progress lines of every run.
func exitMessage(pod *corev1.Pod) string {
	if pod == nil {
		return ""
	}
	s := gang.WorkerStatus(pod)
	switch {
	case s == nil:
		return ""
	case s.State.Terminated != nil:
		return s.State.Terminated.Message
	case s.LastTerminationState.Terminated != nil:
		return s.LastTerminationState.Terminated.Message
	}
	return ""
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
