package controllers

import (
	"context"
	"time"

	trainingv1alpha1 "github.com/zaya-operator/zaya-operator/api/v1alpha1"
	"github.com/zaya-operator/zaya-operator/controllers/accounting"
	"github.com/zaya-operator/zaya-operator/controllers/liveprogress"
)

// The core's side of goodput (controllers/accounting): the pass lends its ledger the clock,
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
