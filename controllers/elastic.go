package controllers

import (
	"context"
	"fmt"
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
	switch {
	case r != (recovery.Resize{}):
	case job.Width() >= job.Spec.Nodes:
		r.Unmark = job.Status.GrowAtStep != nil // whole: nothing to grow
	case !p.restarting() && g.Ready == job.Width():
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

// refused takes a verdict on a worker of a shrunk gang that exited ExitNoResize as its
// trainer's word that it cannot train at that width: the gang restarts at spec.nodes, waits
// for capacity there, and is not shrunk again (recovery.Shrink). It reports whether it did.
func (p *pass) refused(ctx context.Context, v recovery.Verdict) bool {
	job := p.job
	f := v.Failure
	if job.Spec.Elastic == nil || job.Width() >= job.Spec.Nodes || f.ExitCode == nil || *f.ExitCode != trainingv1alpha1.ExitNoResize {
		return false
	}
	rank := "a rank"
	if f.Rank != nil {
		rank = fmt.Sprintf("rank %d", *f.Rank)
	}
	return p.restarts.Elastic(ctx, recovery.Resize{Nodes: job.Spec.Nodes, Reason: trainingv1alpha1.ReasonElasticRefused, Message: fmt.Sprintf(
		"%s's worker exited %d: its trainer cannot train on %d of %d nodes; back to %d nodes, waiting for capacity, and not shrunk again until the job is suspended and resumed",
		rank, trainingv1alpha1.ExitNoResize, job.Width(), job.Spec.Nodes, job.Spec.Nodes)})
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
