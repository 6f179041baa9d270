package controllers

import (
	"fmt"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ctrl "sigs.k8s.io/controller-runtime"

	trainingv1alpha1 "github.com/zaya-operator/zaya-operator/api/v1alpha1"
	"github.com/zaya-operator/zaya-operator/controllers/bounded"
	"github.com/zaya-operator/zaya-operator/controllers/gang"
	"github.com/zaya-operator/zaya-operator/controllers/recovery"
)

// capacityGrace is how long the scheduler must have found no room for a rank before the job
// reports WaitingForCapacity: a claim still binding or a node still registering is not news.
const capacityGrace = 10 * time.Second

// recordCheckpoint keeps the newest checkpoint step the workers reported.
func (p *pass) recordCheckpoint(g gang.Gang) {
	last := p.job.Status.LastCheckpoint
	if g.CheckpointStep < 0 || (last != nil && last.Step >= g.CheckpointStep) {
		return
	}
	p.job.Status.LastCheckpoint = &trainingv1alpha1.CheckpointStatus{Step: g.CheckpointStep, Time: &metav1.Time{Time: p.now}}
}

// updateProgress sets readyNodes, Running and WaitingForCapacity from the gang's pods, and
// asks to be called again when a pending capacity verdict becomes reportable.
func (p *pass) updateProgress(g gang.Gang) ctrl.Result {
	var recheck time.Duration
	job := p.job
	n := job.Width()
	job.Status.ReadyNodes = g.Ready
	running := g.Ready == n
	if since, ok := recovery.InPlaceUnderWay(&job.Status); ok && !g.RestartedSince(since) {
		running = false // a rank the cascade has not reached yet still runs the old process
	}
	if running {
		p.restarts.Finish(g)
		p.ledger().Ran()
		if p.becameTrue(trainingv1alpha1.ConditionRunning, trainingv1alpha1.ReasonAllRanksRunning, fmt.Sprintf("all %d ranks are running", n)) {
			p.normal(trainingv1alpha1.ReasonAllRanksRunning, "Run", "all %d ranks running (%d GPUs)", n, n*job.Spec.GPUsPerNode)
			if job.Status.Restarts == 0 {
				took := p.now.Sub(job.CreationTimestamp.Time)
				p.whenStored(func() { timeToRunning.Observe(took.Seconds()) })
			}
		}
	} else if msg, wait := notStarting(g, p.now); msg != "" {
		if p.setCondition(trainingv1alpha1.ConditionRunning, metav1.ConditionFalse, trainingv1alpha1.ReasonRankNotStarting,
			fmt.Sprintf("%d/%d ranks running; %s", g.Ready, n, msg)) {
			p.warning(trainingv1alpha1.ReasonRankNotStarting, "Run", "%s", msg)
		}
	} else {
		p.setCondition(trainingv1alpha1.ConditionRunning, metav1.ConditionFalse, trainingv1alpha1.ReasonStarting,
			fmt.Sprintf("%d/%d ranks running", g.Ready, n))
		recheck = wait
	}

	if g.Unschedulable == 0 {
		p.clearCondition(trainingv1alpha1.ConditionWaitingForCapacity, trainingv1alpha1.ReasonPlaced, fmt.Sprintf("%d/%d ranks placed", g.Scheduled, n))
		return ctrl.Result{RequeueAfter: recheck}
	}
	if wait := g.UnschedulableSince.Add(capacityGrace).Sub(p.now); wait > 0 {
		return soonest(ctrl.Result{RequeueAfter: wait}, ctrl.Result{RequeueAfter: recheck})
	}
	msg := fmt.Sprintf("%d/%d ranks placed, %d unschedulable: %s", g.Scheduled, n, g.Unschedulable, g.UnschedulableMessage())
	if p.becameTrue(trainingv1alpha1.ConditionWaitingForCapacity, trainingv1alpha1.ReasonUnschedulable, msg) {
		p.warning(trainingv1alpha1.ReasonUnschedulable, "Schedule", "%s", msg)
	}
	return ctrl.Result{RequeueAfter: recheck}
}

// A placed rank whose worker container keeps waiting to start is news once the kubelet's
// reason has stood for a while: an error (an image it cannot pull, a missing Secret) after
// startErrorGrace; ContainerCreating, which is also an image being pulled (a ROCm image is
// many GB), after createGrace, when a volume that does not attach or mount is likelier.
const (
	startErrorGrace = 30 * time.Second
	createGrace     = 5 * time.Minute
)

// notStarting says which placed rank has waited too long to start and why, or how long until
// the longest wait so far is news.
func notStarting(g gang.Gang, now time.Time) (string, time.Duration) {
	if g.NotStarting == nil {
		return "", 0
	}
	w := gang.WorkerStatus(g.NotStarting).State.Waiting
	grace, hint := startErrorGrace, ""
	if w.Reason == "ContainerCreating" {
		grace, hint = createGrace, " (pulling a large image, or a volume that does not attach or mount: the pod's events say which)"
	}
	if wait := g.NotStartingSince.Add(grace).Sub(now); wait > 0 {
		return "", wait
	}
	rank, _ := gang.Rank(g.NotStarting)
	msg := fmt.Sprintf("rank %d on node %s has not started since it was placed at %s: %s", rank, g.NotStarting.Spec.NodeName,
		g.NotStartingSince.UTC().Format(time.RFC3339), w.Reason)
	if w.Message != "" {
		msg += ": " + w.Message
	}
	return bounded.Message(msg + hint), 0
}
