package controllers

import (
	"context"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	trainingv1alpha1 "github.com/zaya-operator/zaya-operator/api/v1alpha1"
	"github.com/zaya-operator/zaya-operator/controllers/gang"
	"github.com/zaya-operator/zaya-operator/controllers/liveprogress"
	"github.com/zaya-operator/zaya-operator/controllers/recovery"
)

// resize acts on an elastic job's verdicts (recovery.Shrink, recovery.Grow; restart carries
// them out): it reports when to look again and whether the gang restarts at another width.
func (p *pass) resize(ctx context.Context, g gang.Gang, spares []*corev1.Pod) (time.Duration, bool) {
	job := p.job
	if job.Spec.Elastic == nil {
		return 0, false
	}
	r := recovery.Shrink(job, g, p.now)
	if r == (recovery.Resize{}) && !p.restarting() && g.Ready == job.Width() {
		rep, wait := p.growReport()
		if wait > 0 {
			return wait, false
		}
		r = recovery.Grow(job, recovery.HoldersOf(job, spares), rep, p.now)
		if r.Mark != nil || (r.Nodes == 0 && !r.Unmark && job.Status.GrowAtStep != nil) {
			// Waiting for the checkpoint: rank 0's reports say when, and wake no pass.
			r.Wait = max(p.r.ProgressPollInterval, time.Second)
		}
	}
	return r.Wait, p.restarts.Elastic(ctx, r)
}

// growReport is rank 0's latest report of the current run, for a grow to wait for its next
// checkpoint. nil with no wait means the workers report no progress (none came within the
// progress grace of the gang running): the gang then grows without waiting for one.
func (p *pass) growReport() (*liveprogress.Report, time.Duration) {
	if rep := p.report; rep != nil && !rep.TrainingSince.Before(p.ledger().TrainingSince()) {
		return rep, 0
	}
	if !p.progressWatched() {
		return nil, 0
	}
	running := meta.FindStatusCondition(p.job.Status.Conditions, trainingv1alpha1.ConditionRunning)
	if running == nil || running.Status != metav1.ConditionTrue {
		return nil, p.r.progressGrace()
	}
	if wait := running.LastTransitionTime.Add(p.r.progressGrace()).Sub(p.now); wait > 0 {
		return nil, wait
	}
	return nil, 0
}
