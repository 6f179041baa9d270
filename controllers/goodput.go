package controllers

import (
	"context"
	"fmt"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/types"

	trainingv1alpha1 "github.com/zaya-operator/zaya-operator/api/v1alpha1"
	"github.com/zaya-operator/zaya-operator/controllers/accounting"
	"github.com/zaya-operator/zaya-operator/controllers/bounded"
	"github.com/zaya-operator/zaya-operator/controllers/gang"
	"github.com/zaya-operator/zaya-operator/controllers/liveprogress"
	"github.com/zaya-operator/zaya-operator/controllers/recovery"
)

// The core's side of accounting (controllers/accounting): the pass lends its ledger the clock,
// rank 0's progress and the metrics of what was lost; the ledger keeps status.goodput.

// ledger is the job's account as this pass knows it.
func (p *pass) ledger() *accounting.Ledger {
	return &accounting.Ledger{
		Job: p.job, Now: p.now, Report: p.report, Watched: p.progressWatched(), Grace: p.r.progressGrace(),
		Poll: p.pollProgress,
		Lost: func(category, kind string, seconds float64) {
			p.whenStored(func() { lostSecondsTotal.WithLabelValues(category, kind).Add(seconds) })
		},
		Attribute: func(f *trainingv1alpha1.JobFailure) { p.attribute(f, nil) },
	}
}

// progressGrace is how long after every rank runs again a loss waits for rank 0 to report
// that it trains, before it is closed as of the ranks running (its workers report nothing).
func (r *ZayaTrainingJobReconciler) progressGrace() time.Duration {
	return 3*r.ProgressPollInterval + 5*time.Second
}

// pollProgress reads rank 0's progress (or rank 1's, for a dead rank 0) at once, bounded by
// the poll's own deadlines.
func (p *pass) pollProgress(ctx context.Context) (liveprogress.Report, bool) {
	if p.r.Progress == nil {
		return liveprogress.Report{}, false
	}
	ctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	for _, addr := range p.progressAddrs {
		if prog, err := liveprogress.Fetch(ctx, p.r.Progress.Client(), addr, p.now); err == nil && !prog.TrainingSince.IsZero() {
			return liveprogress.Report{Progress: prog, At: p.now}, true
		}
	}
	return liveprogress.Report{}, false
}

// Rank 0's live progress (liveprogress): the pass names rank 0's pod to the poller, since
// only the pass knows which pod is the job's own rank 0, and reads what the poller found.

// rankAddr is where rank's worker serves its progress, if it does.
func rankAddr(g gang.Gang, rank int) string {
	if rank >= len(g.Ranks) {
		return ""
	}
	return liveprogress.Addr(g.Ranks[rank])
}

// watchProgress has the poller poll the job's rank 0, and takes its latest report.
func (p *pass) watchProgress(g gang.Gang) {
	p.progressAddrs = p.progressAddrs[:0]
	for rank := range min(2, len(g.Ranks)) { // rank 1 answers for a dead rank 0 (progressNow)
		if addr := rankAddr(g, rank); addr != "" {
			p.progressAddrs = append(p.progressAddrs, addr)
		}
	}
	poller := p.r.Progress
	if poller == nil {
		return
	}
	key := types.NamespacedName{Namespace: p.job.Namespace, Name: p.job.Name}
	addr := rankAddr(g, 0)
	if addr == "" {
		// No rank 0 of this attempt runs: its last target was a run that is over (a
		// recreated gang's old rank 0, a replaced rank 0), and what it said is no news of
		// training again. Such a run could still say it trained after the fault (restarted
		// in place before the operator decided to recreate) and end the loss too soon.
		poller.Forget(key)
		return
	}
	poller.Watch(key, liveprogress.Target{UID: p.job.UID, Addr: addr, Nodes: int(p.job.Width()),
		MarginPercent: int(recovery.StragglerMargin(&p.job.Spec.FaultTolerance))})
	if rep, ok := poller.Latest(key, p.job.UID); ok {
		p.report = &rep
	}
}

// forgetProgress stops polling the job: it finished, is suspended or is gone.
func (r *ZayaTrainingJobReconciler) forgetProgress(key types.NamespacedName) {
	if r.Progress != nil {
		r.Progress.Forget(key)
	}
}

// progressWatched says whether rank 0's reports are on their way for this job.
func (p *pass) progressWatched() bool {
	return p.r.Progress != nil && p.r.Progress.Watching(types.NamespacedName{Namespace: p.job.Namespace, Name: p.job.Name}, p.job.UID)
}

// The core tells the resume report (controllers/accounting) in events.

// reportCorrupt records each corrupt step the gang's runs name, once, with a warning.
func (p *pass) reportCorrupt(g gang.Gang) {
	details := accounting.NoteCorrupt(&p.job.Status, g.Corrupt.Corrupt, p.now)
	if len(details) == 0 {
		return
	}
	p.warning(trainingv1alpha1.ReasonCheckpointCorrupt, "Resume", "%s", bounded.Message(fmt.Sprintf(
		"%d committed checkpoint step(s) failed verification when the workers resumed and were moved aside, the gang resuming from an older step: %s",
		len(details), strings.Join(details, "; "))))
}

// recordResume stores what the current restart restored, once a pod of it has said, with an
// event.
func (p *pass) recordResume(g gang.Gang) {
	rs := accounting.Resumed(&p.job.Status, g.Resume, g.ResumeBefore)
	switch {
	case rs == nil:
	case len(rs.CorruptSteps) == 0:
		p.normal(trainingv1alpha1.ReasonCheckpointRestored, "Resume", "the gang resumed from checkpoint step %d (after %d restarts)", rs.Step, rs.Attempt)
	default:
		// The corrupt steps' warning is reportCorrupt's, whichever run told them.
		p.normal(trainingv1alpha1.ReasonCheckpointRestored, "Resume",
			"the gang resumed from checkpoint step %d (after %d restarts), losing %d steps: %d newer step(s) failed verification and were moved aside (status.corruptCheckpoints)",
			rs.Step, rs.Attempt, rs.StepsLost, len(rs.CorruptSteps))
	}
}
