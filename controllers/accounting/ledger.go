// Package accounting owns a job's goodput: how much of its started time went to training,
// what each root cause cost (down time, steps trained again) and when the job trains again;
// and its resume report: what each restart restored and the corrupt checkpoint steps the
// workers moved aside. It reads rank 0's live progress (liveprogress) and the ranks'
// termination messages, and edits status.goodput, status.lastResume and
// status.corruptCheckpoints on the job it is given; the core says when (a start, a failure,
// training again, a suspension, the end) through a Ledger, and tells the resume report's news
// in events.
package accounting

import (
	"context"
	"fmt"
	"slices"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	ctrl "sigs.k8s.io/controller-runtime"

	"github.com/zaya-operator/zaya-operator/api/contract"
	trainingv1alpha1 "github.com/zaya-operator/zaya-operator/api/v1alpha1"
	"github.com/zaya-operator/zaya-operator/controllers/attribution"
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

// Ledger is one pass's hand on a job's account: the job (its status edited in place), the
// pass's clock and what it knows of rank 0's progress.
type Ledger struct {
	Job *trainingv1alpha1.ZayaTrainingJob
	Now time.Time
	// Report is rank 0's latest live progress (nil: none); Watched whether its reports are
	// on their way, and Grace how long after every rank runs again a loss waits for one.
	Report  *liveprogress.Report
	Watched bool
	Grace   time.Duration
	// Poll reads rank 0's progress at once (nil: nothing to read).
	Poll func(ctx context.Context) (liveprogress.Report, bool)
	// Lost records seconds lost to category (kind "down" or "recompute") once the status
	// that counts them is stored.
	Lost func(category, kind string, seconds float64)
	// Attribute names a failure's category as the root cause will.
	Attribute func(f *trainingv1alpha1.JobFailure)
}

func (l *Ledger) lost(category, kind string, seconds float64) {
	if l.Lost != nil {
		l.Lost(category, kind, seconds)
	}
}

// progressNow reads rank 0's progress at once, for a failure about to stop the gang: the
// report the poller holds may be an interval old.
func (l *Ledger) progressNow(ctx context.Context) (liveprogress.Report, bool) {
	if l.Report != nil && fresh(*l.Report, l.Now) {
		return *l.Report, true
	}
	if l.Poll != nil {
		if rep, ok := l.Poll(ctx); ok {
			return rep, true
		}
	}
	if l.Report != nil {
		return *l.Report, true
	}
	return liveprogress.Report{}, false
}

// Stopped ends the open loss as of now, for a gang stopped (suspended, held): the stop is no
// wall time.
func (l *Ledger) Stopped() {
	if g := l.Account(); g != nil && g.Open != nil {
		l.closeLoss(g, l.Now, -1, nil, "suspension")
	}
	l.Refresh()
}

// addCount adds one to a status counter, at most the schema's bound.
func addCount(c int32) int32 { return int32(min(int64(max(c, 0))+1, trainingv1alpha1.MaxStatusCount)) }

// Account is the job's accounting, begun at its start with the startup open; nil before it
// started.
func (l *Ledger) Account() *trainingv1alpha1.GoodputStatus {
	st := &l.Job.Status
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

// Refresh adds the wall time since the last account (while started) and recomputes
// the totals.
func (l *Ledger) Refresh() {
	g := l.Account()
	if g == nil {
		return
	}
	end := l.Now
	if c := l.Job.Status.CompletionTime; c != nil && c.Time.Before(end) {
		end = c.Time
	}
	if l.Job.Status.StartTime != nil && end.After(g.AsOf.Time) {
		g.WallMilliseconds = addMillis(g.WallMilliseconds, end.Sub(g.AsOf.Time))
		g.AsOf = micro(end)
	}
	var lost int64
	for _, loss := range g.Lost {
		lost = addInt(lost, addInt(loss.DownMilliseconds, loss.RecomputeMilliseconds))
	}
	g.LostMilliseconds = lost
	// Each at least 0 (the schema's bound): the differences cannot wrap.
	g.TrainingMilliseconds = max(max(g.WallMilliseconds, 0)-max(min(g.StartupMilliseconds, g.WallMilliseconds), 0)-max(lost, 0), 0)
	g.EffectiveTrainingTime = ""
	if g.WallMilliseconds > 0 {
		g.EffectiveTrainingTime = fmt.Sprintf("%.1f%%", 100*float64(g.TrainingMilliseconds)/float64(g.WallMilliseconds))
	}
}

// Failed opens the loss of a root failure of category: since training last advanced
// (the stopped ranks' last steps, or rank 0's progress; else now), with where it stood. A
// loss still open (a failure before the job trained again) ends here.
func (l *Ledger) Failed(ctx context.Context, f trainingv1alpha1.JobFailure, messages []string) {
	g := l.Account()
	if g == nil {
		return
	}
	loss := lossOf(g, f.Category)
	loss.Failures = addCount(loss.Failures)
	if g.Open != nil {
		// A failure before the last loss was seen to end: the run between may have said when
		// it trained; else the loss runs until now.
		if l.Settle(messages); g.Open != nil {
			l.closeLoss(g, l.Now, -1, messages, "another failure")
		}
	}
	at := readRuns(messages, l.TrainingSince(), l.Now, true)
	since := clampTime(f.Time.Time, l.TrainingSince(), l.Now)
	var from string // for the log
	if !at.lastStep.IsZero() {
		since, from = at.lastStep, "exits" // the stopped ranks' own word
	} else if rep, ok := l.progressNow(ctx); !ok || !l.ofCurrentRun(rep) {
		from = fmt.Sprintf("failure (progress %v: run since %s, training since %s)", ok, stamp(rep.TrainingSince), stamp(l.TrainingSince()))
	} else {
		from = "progress"
		at.reached, at.committed, at.pace = max(at.reached, rep.Step), max(at.committed, rep.CheckpointStep), rep.StepSeconds
		if fresh(rep, l.Now) {
			since = clampTime(rep.LastStepAt, l.TrainingSince(), l.Now) // read just now: its last step is the gang's
		} else {
			// Up to a poll old: training went on at its pace until the failure (whose time
			// the kubelet keeps to the second).
			since = clampTime(rep.LastStepAt, since, l.Now)
			at.reached += stepsAfter(rep, since)
		}
	}
	goodputLog.V(1).Info("loss opened", "job", l.Job.Namespace+"/"+l.Job.Name, "category", f.Category, "since", stamp(since), "failure", f.Time.Time,
		"from", from, "messages", len(messages), "reached", at.reached)
	g.Open = &trainingv1alpha1.GoodputOpen{Category: f.Category, Since: micro(since), ReachedStep: at.reached,
		CheckpointStep: at.committed, StepMicroseconds: micros(at.pace)}
	l.timeline(func(r *trainingv1alpha1.RecoveryTimeline) { r.LastStep = trainingv1alpha1.Stamp(since) })
	l.Refresh()
}

// Broken opens a loss, counting no failure, when the operator breaks a gang that
// trained again within the restart under way (an escalation to a recreate, a laggard or a
// lost rank replaced): the gang trained until now, at the pace rank 0 last reported;
// Refine moves the start to the stopped ranks' last step once their exits show. No-op
// while a loss is open (the usual case: the gang had not trained again).
func (l *Ledger) Broken() {
	g := l.Account()
	if g == nil || g.Open != nil {
		return
	}
	category := string(attribution.Unknown)
	if f := l.Job.Status.LastFailure; f != nil && f.Category != "" {
		category = f.Category
	}
	o := &trainingv1alpha1.GoodputOpen{Category: category, Since: micro(l.Now)}
	if rep := l.Report; rep != nil && l.ofCurrentRun(*rep) {
		o.ReachedStep, o.CheckpointStep, o.StepMicroseconds = rep.Step+stepsAfter(*rep, l.Now), rep.CheckpointStep, micros(rep.StepSeconds)
	}
	goodputLog.V(1).Info("loss opened", "job", l.Job.Namespace+"/"+l.Job.Name, "category", category, "since", stamp(l.Now),
		"from", "the operator broke the gang again", "reached", o.ReachedStep)
	g.Open = o
	l.Refresh()
}

// ofCurrentRun says whether rep tells of a step of the run that trains now (or last did).
func (l *Ledger) ofCurrentRun(rep liveprogress.Report) bool {
	return !rep.LastStepAt.IsZero() && !rep.TrainingSince.Before(l.TrainingSince())
}

// TrainingSince is when the run that trains now (or last did) began: what workers report of
// older runs is no news.
func (l *Ledger) TrainingSince() time.Time {
	if g := l.Job.Status.Goodput; g != nil && g.TrainingSince != nil {
		return g.TrainingSince.Time
	}
	if l.Job.Status.StartTime != nil {
		return l.Job.Status.StartTime.Time
	}
	return time.Time{}
}

// Refine corrects the open loss from the stopped ranks' own word (their last-step-at
// lines), which may come passes after the failure was decided: the ranks that stopped over it
// exit moments later, and a recreate's stale pods still show their exits until they go.
func (l *Ledger) Refine(stopped func() []string) {
	g := l.Job.Status.Goodput
	if g == nil || g.Open == nil || g.Open.Category == "" {
		return
	}
	o := g.Open
	run := readRunsBegun(stopped(), l.TrainingSince(), l.Now, false, l.failedRunBegun(o))
	if since := micro(run.lastStep); run.lastStep.IsZero() || since.Equal(&o.Since) {
		return
	}
	goodputLog.V(1).Info("loss refined", "job", l.Job.Namespace+"/"+l.Job.Name, "from", stamp(o.Since.Time), "to", stamp(run.lastStep), "reached", run.reached)
	o.Since = micro(run.lastStep)
	l.timeline(func(r *trainingv1alpha1.RecoveryTimeline) { r.LastStep = trainingv1alpha1.Stamp(run.lastStep) })
	o.ReachedStep, o.CheckpointStep = max(o.ReachedStep, run.reached), max(o.CheckpointStep, run.committed)
	if o.StepMicroseconds == 0 {
		o.StepMicroseconds = micros(run.pace)
	}
}

// failedRunBegun bounds when the run that failed into the open loss began training: by the
// loss's start, or within a second of the run status knew (its ranks' first steps end a few
// milliseconds apart; the loss may start at the failure's second, before them). A run that
// began later trained after the failure: it ends the loss, it is not where it stopped.
func (l *Ledger) failedRunBegun(o *trainingv1alpha1.GoodputOpen) time.Time {
	return maxTime(o.Since.Time, l.TrainingSince().Add(time.Second))
}

// Settle ends the open loss once the job trains again: as of when rank 0 says its run
// began training, or a finished run's workers said so, or, where they say nothing, as of when
// every rank ran (once rank 0 had time to report). messages are the ranks' latest exits.
func (l *Ledger) Settle(messages []string) time.Duration {
	g := l.Account()
	if g == nil || g.Open == nil {
		return 0
	}
	o := g.Open
	if rep := l.Report; rep != nil && rep.TrainingSince.After(o.Since.Time) {
		l.closeLoss(g, rep.TrainingSince, rep.ResumedFrom, messages, "progress")
		l.ranBack(rep.Progress)
		return 0
	}
	if run := readRuns(messages, o.Since.Time, l.Now, false); !run.since.IsZero() {
		l.closeLoss(g, run.since, run.resumed, messages, "exits")
		return 0
	}
	if o.RanAt == nil {
		return 0
	}
	if wait := o.RanAt.Add(l.Grace).Sub(l.Now); wait > 0 && l.Watched {
		return wait
	}
	l.closeLoss(g, o.RanAt.Time, -1, messages, "ranks running")
	return 0
}

// Final brings the figures up to the completion: a loss still open ends as the last
// run's workers say it trained again, else when the job ended. The pass that completes the
// job calls it (its clock is the completion's, to the microsecond); later passes find
// nothing left to change.
func (l *Ledger) Final(messages []string) {
	g := l.Account()
	if g != nil && g.Open != nil {
		if c := l.Job.Status.CompletionTime; c != nil && c.Time.Before(l.Now) {
			defer func(now time.Time) { l.Now = now }(l.Now)
			l.Now = c.Time // nothing is lost after the end
		}
		l.Settle(messages)
		if g.Open != nil {
			end := l.Now
			if g.Open.RanAt != nil && meta.IsStatusConditionTrue(l.Job.Status.Conditions, trainingv1alpha1.ConditionSucceeded) {
				end = g.Open.RanAt.Time
			}
			l.closeLoss(g, end, -1, messages, "completion")
		}
	}
	l.Refresh()
}

// Ran notes that every rank runs: where the workers report nothing, the loss ends then.
func (l *Ledger) Ran() {
	if g := l.Account(); g != nil && g.Open != nil && g.Open.RanAt == nil {
		at := micro(l.Now)
		g.Open.RanAt = &at
	}
}

// closeLoss ends the open loss at end: its down time, and the steps the new run (resumed at
// step resumed; -1: unknown, the checkpoint committed before the failure) trains again.
// messages are the stopped ranks' exits: they may say where the failed run stood more
// exactly than the failure's pass knew. by says what ended it (for the log).
func (l *Ledger) closeLoss(g *trainingv1alpha1.GoodputStatus, end time.Time, resumed int64, messages []string, by string) {
	o := g.Open
	g.Open = nil
	since := o.Since.Time
	stopped := readRunsBegun(messages, l.TrainingSince(), end, false, l.failedRunBegun(o))
	if o.Category != "" && !stopped.lastStep.IsZero() && stopped.lastStep.Before(end) {
		since = stopped.lastStep // the ranks' own word, over the pass's guess
	}
	end = clampTime(end, since, l.Now)
	down := end.Sub(since)
	goodputLog.V(1).Info("loss closed", "job", l.Job.Namespace+"/"+l.Job.Name, "category", o.Category, "by", by, "opened", stamp(o.Since.Time), "since", stamp(since), "end", stamp(end),
		"down", down, "reached", max(o.ReachedStep, stopped.reached), "resumed", resumed, "checkpoint", o.CheckpointStep, "pace", o.StepMicroseconds)
	at := micro(end)
	g.TrainingSince = &at
	if o.Category != "" && (by == "progress" || by == "exits" || by == "ranks running") {
		l.timeline(func(r *trainingv1alpha1.RecoveryTimeline) {
			if r.Training == nil {
				r.LastStep, r.Training = trainingv1alpha1.Stamp(since), trainingv1alpha1.Stamp(end)
			}
		})
	}
	span := trainingv1alpha1.GoodputSpan{Category: o.Category, Since: micro(since), Until: at, Nodes: l.Job.Width()}
	defer func() { remember(g, span) }()
	if o.Category == "" {
		g.StartupMilliseconds = addMillis(g.StartupMilliseconds, down)
		l.lost("Startup", "down", max(down.Seconds(), 0))
		l.Refresh()
		return
	}
	loss := lossOf(g, o.Category)
	loss.DownMilliseconds = addMillis(loss.DownMilliseconds, down)
	category := o.Category
	l.lost(category, "down", max(down.Seconds(), 0))
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
		if st := l.Job.Status.StartTime; st != nil {
			trained = min(max(since.Sub(st.Time), 0), trained)
		}
		recompute := time.Duration(min(float64(reached-resumed)*pace, trained.Seconds()) * float64(time.Second))
		loss.RecomputeMilliseconds = addMillis(loss.RecomputeMilliseconds, recompute)
		span.RecomputeMilliseconds = addMillis(0, recompute)
		l.lost(category, "recompute", recompute.Seconds())
	}
	l.Refresh()
}

// timeline edits the timeline of the recovery under way, if the last failure keeps one.
func (l *Ledger) timeline(edit func(*trainingv1alpha1.RecoveryTimeline)) {
	l.Job.Status.StampRecovery(edit)
}

// ranBack takes into the recovery's timeline when rank 0's new run started and met its
// peers, as its report says: a time outside the recovery (from the gang's last step to
// training again) is not of this run, or not true, and is left out.
func (l *Ledger) ranBack(p contract.Progress) {
	l.timeline(func(r *trainingv1alpha1.RecoveryTimeline) {
		if r.LastStep == nil || r.Training == nil || r.WorkerStarted != nil || r.Rendezvous != nil {
			return
		}
		within := func(t time.Time) bool { return !t.Before(r.LastStep.Time) && !t.After(r.Training.Time) }
		if within(p.StartedAt) {
			r.WorkerStarted = trainingv1alpha1.Stamp(p.StartedAt)
		}
		if within(p.MetAt) && !p.MetAt.Before(p.StartedAt) {
			r.Rendezvous = trainingv1alpha1.Stamp(p.MetAt)
		}
	})
}

// remember adds a closed start or loss to the history, the oldest going past its bound.
func remember(g *trainingv1alpha1.GoodputStatus, span trainingv1alpha1.GoodputSpan) {
	g.History = append(g.History, span)
	if over := len(g.History) - trainingv1alpha1.MaxGoodputHistory; over > 0 {
		g.History = slices.Delete(g.History, 0, over)
	}
}

// Reroot moves the restart under way from the category of the root first taken for it
// (a rank that only stopped over a peer) to the one found since (a lost node's, a hung rank's),
// when the former was such a stop.
func (l *Ledger) Reroot(found trainingv1alpha1.JobFailure) {
	last := l.Job.Status.LastFailure
	if last == nil || last.ExitCode == nil || *last.ExitCode != trainingv1alpha1.ExitStopped {
		return
	}
	if found.Category == "" {
		l.Attribute(&found) // as recordFailure will name it (a Hang has no category of reason)
	}
	to := found.Category
	g := l.Account()
	if g == nil || to == "" || to == last.Category {
		return
	}
	if i := slices.IndexFunc(g.Lost, func(x trainingv1alpha1.GoodputLoss) bool { return x.Category == last.Category }); i >= 0 && g.Lost[i].Failures > 0 {
		g.Lost[i].Failures--
		if g.Lost[i].Failures == 0 && g.Lost[i].DownMilliseconds == 0 && g.Lost[i].RecomputeMilliseconds == 0 {
			g.Lost = slices.Delete(g.Lost, i, i+1)
		}
	}
	loss := lossOf(g, to)
	loss.Failures = addCount(loss.Failures)
	if g.Open != nil && g.Open.Category == last.Category {
		g.Open.Category = to
	}
	l.Refresh()
}
