package controllers

import (
	"fmt"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/zaya-operator/zaya-operator/api/contract"
	trainingv1alpha1 "github.com/zaya-operator/zaya-operator/api/v1alpha1"
	"github.com/zaya-operator/zaya-operator/controllers/workerpod"
	"github.com/zaya-operator/zaya-operator/internal/kueue"
)

// gang is the state of a job's pods for its current attempt. Every field is a function of
// the set of pods, never of the order the cache lists them in: status is built from it, and
// a status that changed with the listing order would be rewritten on every pass.
type gang struct {
	ranks     []*corev1.Pod // live pods of the current attempt, by rank; nil where missing
	disrupted []*corev1.Pod // current-attempt pods deleted under the running gang
	stale     []*corev1.Pod // live pods of other attempts or out-of-range ranks
	previous  []*corev1.Pod // the previous attempt's finished pods, kept for their logs
	draining  []*corev1.Pod // pods of other attempts, or replaced, still terminating
	replaced  []*corev1.Pod // live pods status.replacing names: to delete
	renewed   []bool        // by rank: its pod replaces one status.replacing names

	ready, scheduled, succeeded, unschedulable int32
	firstUnschedulable                         int32        // lowest unschedulable rank (valid when unschedulable > 0)
	unschedulableSince                         time.Time    // earliest verdict still standing
	notStarting                                *corev1.Pod  // the placed rank whose worker has waited to start longest
	notStartingSince                           time.Time    // when it was placed
	checkpointStep                             int64        // newest step in a termination message, -1 if none
	containerRestarts                          int64        // worker containers' restartCount, summed
	counts                                     []int32      // by rank: its worker container's restartCount (0 where missing)
	base                                       []int32      // by rank: status.rankRestarts, the counts before the restart's fault; nil if unknown
	resume                                     resumeReport // what the current restart's runs restored
	resumeBefore                               resumeReport // and the restart's before it, told late (recordResume)
	corrupt                                    resumeReport // the corrupt steps any run of any pod names (reportCorrupt)
	firstFailed                                *corev1.Pod
	failed                                     []*corev1.Pod // every failed pod, in listing order
}

// classify sorts the job's pods into the gang of its current attempt.
func classify(job *trainingv1alpha1.ZayaTrainingJob, pods []corev1.Pod) gang {
	n := job.Spec.Nodes
	g := gang{ranks: make([]*corev1.Pod, n), renewed: make([]bool, n), counts: make([]int32, n), checkpointStep: -1, resume: resumeReport{step: -1}, resumeBefore: resumeReport{step: -1}, corrupt: resumeReport{step: -1}}
	g.base = restartBaseline(&job.Status, n)
	restarting := meta.FindStatusCondition(job.Status.Conditions, trainingv1alpha1.ConditionRestarting)
	underWay := restarting != nil && restarting.Status == metav1.ConditionTrue
	runBase := g.base // which restart a rank's runs followed: counts tell only in place
	if job.Status.LastRestartMode != trainingv1alpha1.RestartModeInPlace {
		runBase = nil
	}
	attempt := strconv.FormatInt(int64(job.Status.Attempt()), 10)
	previous := strconv.FormatInt(int64(job.Status.Attempt()-1), 10)
	var replacing map[string]bool
	var replacedRank map[int32]bool
	for _, r := range job.Status.Replacing {
		if r.UID == "" {
			continue // a hand-written status: no pod has no UID
		}
		if replacing == nil {
			replacing = make(map[string]bool, len(job.Status.Replacing))
			replacedRank = make(map[int32]bool, len(job.Status.Replacing))
		}
		replacing[r.UID] = true
		replacedRank[r.Rank] = true
	}
	for i := range pods {
		pod := &pods[i]
		g.corrupt.merge(corruptOfRuns(pod))
		if replacing[string(pod.UID)] {
			// Its rank gets a new pod of the same name once this one is gone.
			if pod.DeletionTimestamp.IsZero() {
				g.replaced = append(g.replaced, pod)
			} else {
				g.draining = append(g.draining, pod)
			}
			continue
		}
		rank, ok := podRank(pod)
		current := ok && rank < n && pod.Labels[trainingv1alpha1.AttemptLabel] == attempt
		if !current && pod.Labels[trainingv1alpha1.AttemptLabel] == previous && ok && rank < n {
			// The previous attempt's runs followed the restart before this one: what they
			// restored reaches the operator as they stop, often once the recreate stopping them
			// was decided (a device's health took the gang away: no rank had exited before).
			g.resumeBefore.merge(reportedResume(pod))
		}
		switch {
		case !current && podFinished(pod) && pod.DeletionTimestamp.IsZero() && pod.Labels[trainingv1alpha1.AttemptLabel] == previous:
			// The previous attempt's finished pods stay for `kubectl logs`; they hold no devices.
			g.previous = append(g.previous, pod)
			continue
		case !current && pod.DeletionTimestamp.IsZero():
			g.stale = append(g.stale, pod)
			continue
		case !current:
			g.draining = append(g.draining, pod)
			continue
		case !pod.DeletionTimestamp.IsZero() && !podFinished(pod):
			g.disrupted = append(g.disrupted, pod)
			continue
		}
		g.ranks[rank] = pod
		g.renewed[rank] = replacedRank[rank]
		g.containerRestarts += containerRestarts(pod)
		g.counts[rank] = int32(containerRestarts(pod))
		if step, ok := reportedCheckpoint(pod); ok && step > g.checkpointStep {
			g.checkpointStep = step
		}
		now, before := resumeOfRuns(pod, runBase, int(rank), g.renewed[rank], underWay)
		g.resume.merge(now)
		g.resumeBefore.merge(before)
		if pod.Spec.NodeName != "" {
			g.scheduled++
		}
		switch pod.Status.Phase {
		case corev1.PodSucceeded:
			g.succeeded++
		case corev1.PodFailed:
			if g.firstFailed == nil || failedBefore(pod, g.firstFailed) {
				g.firstFailed = pod
			}
			g.failed = append(g.failed, pod)
		case corev1.PodRunning:
			if podReady(pod) {
				g.ready++
			}
		case corev1.PodPending:
			if c := podCondition(pod, corev1.PodScheduled); c != nil && c.Status == corev1.ConditionFalse &&
				(c.Reason == corev1.PodReasonUnschedulable || (c.Reason == corev1.PodReasonSchedulingGated && len(foreignGates(pod)) > 0)) {
				if g.unschedulable == 0 || rank < g.firstUnschedulable {
					g.firstUnschedulable = rank
				}
				if g.unschedulable == 0 || c.LastTransitionTime.Time.Before(g.unschedulableSince) {
					g.unschedulableSince = c.LastTransitionTime.Time
				}
				g.unschedulable++
			} else if c != nil && c.Status == corev1.ConditionTrue && !c.LastTransitionTime.IsZero() {
				if s := workerStatus(pod); s != nil && s.State.Waiting != nil && s.State.Waiting.Reason != "" &&
					(g.notStarting == nil || c.LastTransitionTime.Time.Before(g.notStartingSince)) {
					g.notStarting, g.notStartingSince = pod, c.LastTransitionTime.Time
				}
			}
		}
	}
	return g
}

// vanishedAnnotation marks the stand-in for a rank's pod that went away unseen.
const vanishedAnnotation = "training.zaya.dev/vanished"

// disruptedRanks are the ranks whose pods were seen deleted under the running gang.
func (g *gang) disruptedRanks() map[int32]bool {
	going := make(map[int32]bool, len(g.disrupted))
	for _, pod := range g.disrupted {
		if r, ok := podRank(pod); ok {
			going[r] = true
		}
	}
	return going
}

// noticeVanished counts as deleted under the running gang each rank whose pod is gone without
// the operator having seen it go: a force delete, or its Node object removed (the pod garbage
// collector deletes such pods at once). The stored status had every rank ready and no
// replacement under way, so no rank can be missing: making one again alone, in the same
// attempt, would leave its peers waiting on a collective with a stranger.
func (g *gang) noticeVanished(job *trainingv1alpha1.ZayaTrainingJob, now time.Time) {
	if job.Status.ReadyNodes < job.Spec.Nodes || len(job.Status.Replacing) > 0 {
		return
	}
	going := g.disruptedRanks()
	attempt := job.Status.Attempt()
	// The loss is as old as the first worker exit since the last failure: peers that stopped
	// over the missing rank restarted after it, and an in-place restart timed from now would
	// never count them back.
	at, since := now, job.Status.StartTime
	if f := job.Status.LastFailure; f != nil {
		since = &f.Time
	}
	for _, pod := range g.ranks {
		if pod == nil {
			continue
		}
		if s := workerStatus(pod); s != nil {
			for _, t := range []*corev1.ContainerStateTerminated{s.State.Terminated, s.LastTerminationState.Terminated} {
				if t != nil && t.FinishedAt.Time.Before(at) && (since == nil || t.FinishedAt.After(since.Time)) {
					at = t.FinishedAt.Time
				}
			}
		}
	}
	for r, pod := range g.ranks {
		if pod != nil || going[int32(r)] {
			continue
		}
		name := workerpod.PodName(job, attempt, int32(r))
		g.disrupted = append(g.disrupted, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{
			Name: name, Namespace: job.Namespace, UID: types.UID("vanished-" + name),
			Labels: map[string]string{
				trainingv1alpha1.JobNameLabel: job.Name,
				trainingv1alpha1.RankLabel:    strconv.Itoa(r),
				trainingv1alpha1.AttemptLabel: strconv.FormatInt(int64(attempt), 10),
			},
			Annotations:       map[string]string{vanishedAnnotation: "true"},
			DeletionTimestamp: &metav1.Time{Time: at},
		}})
	}
}

// disruptedPod is rank's pod deleted under the gang (still terminating, or noticeVanished's
// stand-in), if there is one.
func (g gang) disruptedPod(rank int32) *corev1.Pod {
	for _, pod := range g.disrupted {
		if r, ok := podRank(pod); ok && r == rank {
			return pod
		}
	}
	return nil
}

// unschedulableMessage names the lowest unschedulable rank and why the scheduler left it.
func (g gang) unschedulableMessage() string {
	pod := g.ranks[g.firstUnschedulable]
	if gates := foreignGates(pod); len(gates) > 0 {
		return fmt.Sprintf("rank %d: held by scheduling gates the operator did not set (%s): whatever added them (the template, a webhook) must remove them",
			g.firstUnschedulable, strings.Join(gates, ", "))
	}
	return fmt.Sprintf("rank %d: %s", g.firstUnschedulable, podCondition(pod, corev1.PodScheduled).Message)
}

// foreignGates are a pod's scheduling gates that are not the operator's own (Kueue's
// admission and topology gates, which Kueue lifts): nothing the operator runs will lift them.
func foreignGates(pod *corev1.Pod) []string {
	var out []string
	for _, g := range pod.Spec.SchedulingGates {
		if g.Name != kueueAdmissionGate && g.Name != kueue.TopologyGate {
			out = append(out, g.Name)
		}
	}
	return out
}

// missing are the ranks that need a pod.
func (g gang) missing() []int32 {
	var out []int32
	for r, p := range g.ranks {
		if p == nil {
			out = append(out, int32(r))
		}
	}
	return out
}

// firstFailure is the pod of the current attempt that failed first: the root cause, as its
// peers fail later in collective timeouts. Nil when nothing failed.
func (g gang) firstFailure() *corev1.Pod {
	first := g.firstFailed
	for _, p := range g.disrupted {
		if first == nil || failedBefore(p, first) {
			first = p
		}
	}
	return first
}

// failedBefore orders failures by time, then by rank, so the answer does not depend on the
// order pods are listed in.
func failedBefore(a, b *corev1.Pod) bool {
	// A worker that stopped because a peer failed (exit 75) is never the cause, even when its
	// node's clock or the whole-second times make it look first.
	if ca, cb := stoppedByPeer(a), stoppedByPeer(b); ca != cb {
		return cb
	}
	ta, tb := failedAt(a), failedAt(b)
	if !ta.Equal(tb) {
		return ta.Before(tb)
	}
	ra, _ := podRank(a)
	rb, _ := podRank(b)
	return ra < rb
}

// stoppedByPeer reports whether pod's worker exited 75: it stopped because a peer failed.
func stoppedByPeer(pod *corev1.Pod) bool {
	s := workerStatus(pod)
	return s != nil && s.State.Terminated != nil && s.State.Terminated.ExitCode == trainingv1alpha1.ExitStopped
}

// podRank is the rank a worker pod's label names.
func podRank(pod *corev1.Pod) (int32, bool) {
	r, err := strconv.ParseInt(pod.Labels[trainingv1alpha1.RankLabel], 10, 32)
	return int32(r), err == nil && r >= 0
}

// failedAt is when a pod failed or was deleted.
func failedAt(pod *corev1.Pod) time.Time {
	if !pod.DeletionTimestamp.IsZero() && pod.Status.Phase != corev1.PodFailed {
		return pod.DeletionTimestamp.Time
	}
	return finishedAt(pod)
}

// finishedAt is when a failed pod's worker stopped, for finding the rank that failed first
// (its peers fail later, in collective timeouts).
func finishedAt(pod *corev1.Pod) time.Time {
	if s := workerStatus(pod); s != nil && s.State.Terminated != nil {
		return s.State.Terminated.FinishedAt.Time
	}
	return time.Time{}
}

// podFinished reports whether a pod reached a terminal phase.
func podFinished(pod *corev1.Pod) bool {
	return pod.Status.Phase == corev1.PodSucceeded || pod.Status.Phase == corev1.PodFailed
}

// podCondition is the pod's condition of type t, or nil.
func podCondition(pod *corev1.Pod, t corev1.PodConditionType) *corev1.PodCondition {
	for i := range pod.Status.Conditions {
		if pod.Status.Conditions[i].Type == t {
			return &pod.Status.Conditions[i]
		}
	}
	return nil
}

// podReady reports whether the pod's Ready condition is True.
func podReady(pod *corev1.Pod) bool {
	c := podCondition(pod, corev1.PodReady)
	return c != nil && c.Status == corev1.ConditionTrue
}

// workerStatus is the status of a pod's worker container, if it has one yet.
func workerStatus(pod *corev1.Pod) *corev1.ContainerStatus {
	if len(pod.Spec.Containers) == 0 {
		return nil
	}
	name := pod.Spec.Containers[workerpod.WorkerContainer(&pod.Spec)].Name
	for i := range pod.Status.ContainerStatuses {
		if pod.Status.ContainerStatuses[i].Name == name {
			return &pod.Status.ContainerStatuses[i]
		}
	}
	return nil
}

// terminationMessage is what the pod's worker container wrote when it stopped, if it did.
func terminationMessage(pod *corev1.Pod) (string, bool) {
	s := workerStatus(pod)
	if s == nil || s.State.Terminated == nil {
		return "", false
	}
	return s.State.Terminated.Message, true
}

// reportedCheckpoint reads the last committed checkpoint step a stopped worker wrote to its
// termination message ("checkpoint-step=N" on a line of its own): of its current run if it
// ended, else of the run before an in-place restart.
func reportedCheckpoint(pod *corev1.Pod) (int64, bool) {
	msg, ok := terminationMessage(pod)
	if s := workerStatus(pod); !ok && s != nil && s.LastTerminationState.Terminated != nil {
		msg, ok = s.LastTerminationState.Terminated.Message, true
	}
	if !ok {
		return 0, false
	}
	for line := range strings.Lines(msg) {
		v, found := strings.CutPrefix(strings.TrimSpace(line), trainingv1alpha1.TerminationMessageCheckpointPrefix)
		if !found {
			continue
		}
		if step, ok := contract.ParseStep(v); ok {
			return step, true
		}
	}
	return 0, false
}

// activePods are the pods that still run or wait to run.
func activePods(pods []corev1.Pod) []*corev1.Pod {
	var out []*corev1.Pod
	for i := range pods {
		p := &pods[i]
		if p.DeletionTimestamp.IsZero() && !podFinished(p) {
			out = append(out, p)
		}
	}
	return out
}
