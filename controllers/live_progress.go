package controllers

import (
	"net"
	"strconv"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/zaya-operator/zaya-operator/api/contract"
	trainingv1alpha1 "github.com/zaya-operator/zaya-operator/api/v1alpha1"
	"github.com/zaya-operator/zaya-operator/controllers/gang"
	"github.com/zaya-operator/zaya-operator/controllers/liveprogress"
)

// Rank 0's live progress (liveprogress): the pass names rank 0's pod to the poller, since
// only the pass knows which pod is the job's own rank 0, and reads what the poller found.

// progressAddr is where rank's worker serves its progress: its pod's own address, while the
// pod runs. A pod on the host's network has none: its address is the node's, whatever
// listens there is not the worker's to answer for.
func progressAddr(g gang.Gang, rank int) string {
	if rank >= len(g.Ranks) {
		return ""
	}
	pod := g.Ranks[rank]
	if pod == nil || pod.DeletionTimestamp != nil || pod.Status.Phase != corev1.PodRunning || pod.Spec.HostNetwork ||
		net.ParseIP(pod.Status.PodIP) == nil || pod.Status.PodIP == pod.Status.HostIP {
		return ""
	}
	return net.JoinHostPort(pod.Status.PodIP, strconv.Itoa(contract.ProgressPort))
}

// watchProgress has the poller poll the job's rank 0, and takes its latest report.
func (p *pass) watchProgress(g gang.Gang) {
	p.progressAddrs = p.progressAddrs[:0]
	for rank := range min(2, len(g.Ranks)) { // rank 1 answers for a dead rank 0 (progressNow)
		if addr := progressAddr(g, rank); addr != "" {
			p.progressAddrs = append(p.progressAddrs, addr)
		}
	}
	poller := p.r.Progress
	if poller == nil {
		return
	}
	key := types.NamespacedName{Namespace: p.job.Namespace, Name: p.job.Name}
	addr := progressAddr(g, 0)
	if addr == "" {
		// No rank 0 of this attempt runs: its last target was a run that is over (a
		// recreated gang's old rank 0, a replaced rank 0), and what it said is no news of
		// training again. Such a run could still say it trained after the fault (restarted
		// in place before the operator decided to recreate) and end the loss too soon.
		poller.Forget(key)
		return
	}
	poller.Watch(key, liveprogress.Target{UID: p.job.UID, Addr: addr, Nodes: int(p.job.Spec.Nodes),
		MarginPercent: int(stragglerMargin(&p.job.Spec.FaultTolerance))})
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

// stragglerMargin is faultTolerance.stragglers.marginPercent, defaulted.
func stragglerMargin(ft *trainingv1alpha1.FaultToleranceSpec) int32 {
	if ft.Stragglers.MarginPercent <= 0 {
		return trainingv1alpha1.DefaultStragglerMarginPercent
	}
	return ft.Stragglers.MarginPercent
}
