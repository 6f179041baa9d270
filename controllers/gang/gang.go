package gang

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	trainingv1alpha1 "github.com/zaya-operator/zaya-operator/api/v1alpha1"
	"github.com/zaya-operator/zaya-operator/controllers/workerpod"
)

// Gang is the state of a job's pods for its current attempt. Every field is a function of
// the set of pods, never of the order the cache lists them in: status is built from it, and
// a status that changed with the listing order would be rewritten on every pass.
type Gang struct {
	Ranks     []*corev1.Pod // live pods of the current attempt, by rank; nil where missing
	Disrupted []*corev1.Pod // current-attempt pods deleted under the running gang
	Stale     []*corev1.Pod // live pods of other attempts or out-of-range ranks
	Previous  []*corev1.Pod // the previous attempt's finished pods, kept for their logs
	Draining  []*corev1.Pod // pods of other attempts, or replaced, still terminating
	Replaced  []*corev1.Pod // live pods status.replacing names: to delete
	Renewed   []bool        // by rank: its pod replaces one status.replacing names

	Ready, Scheduled, Succeeded, Unschedulable int32
	FirstUnschedulable                         int32        // lowest unschedulable rank (valid when unschedulable > 0)
	UnschedulableSince                         time.Time    // earliest verdict still standing
	NotStarting                                *corev1.Pod  // the placed rank whose worker has waited to start longest
	NotStartingSince                           time.Time    // when it was placed
	CheckpointStep                             int64        // newest step in a termination message, -1 if none
	ContainerRestarts                          int64        // worker containers' restartCount, summed
	Counts                                     []int32      // by rank: its worker container's restartCount (0 where missing)
	Base                                       []int32      // by rank: status.rankRestarts, the counts before the restart's fault; nil if unknown
	Resume                                     ResumeReport // what the current restart's runs restored
	ResumeBefore                               ResumeReport // and the restart's before it, told late (recordResume)
	Corrupt                                    ResumeReport // the corrupt steps any run of any pod names (reportCorrupt)
	FirstFailed                                *corev1.Pod
	Failed                                     []*corev1.Pod // every failed pod, in listing order

	lifted []string // scheduling gates the job's admission lifts
}

// Of sorts the job's pods into the gang of its current attempt.
func Of(job *trainingv1alpha1.ZayaTrainingJob, pods []corev1.Pod, lifted ...string) Gang {
	n := job.Width()
	g := Gang{Ranks: make([]*corev1.Pod, n), Renewed: make([]bool, n), Counts: make([]int32, n), CheckpointStep: -1, Resume: ResumeReport{Step: -1}, ResumeBefore: ResumeReport{Step: -1}, Corrupt: ResumeReport{Step: -1}, lifted: lifted}
	g.Base = RestartBaseline(&job.Status, n)
	restarting := meta.FindStatusCondition(job.Status.Conditions, trainingv1alpha1.ConditionRestarting)
	underWay := restarting != nil && restarting.Status == metav1.ConditionTrue
	runBase := g.Base // which restart a rank's runs followed: counts tell only in place
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
		g.Corrupt.Merge(CorruptOfRuns(pod))
		if replacing[string(pod.UID)] {
			// Its rank gets a new pod of the same name once this one is gone.
			if pod.DeletionTimestamp.IsZero() {
				g.Replaced = append(g.Replaced, pod)
			} else {
				g.Draining = append(g.Draining, pod)
			}
			continue
		}
		rank, ok := Rank(pod)
		current := ok && rank < n && pod.Labels[trainingv1alpha1.AttemptLabel] == attempt
		if !current && pod.Labels[trainingv1alpha1.AttemptLabel] == previous && ok && rank < n {
			// The previous attempt's runs followed the restart before this one: what they
			// restored reaches the operator as they stop, often once the recreate stopping them
			// was decided (a device's health took the gang away: no rank had exited before).
			g.ResumeBefore.Merge(ReportedResume(pod))
		}
		switch {
		case !current && Finished(pod) && pod.DeletionTimestamp.IsZero() && pod.Labels[trainingv1alpha1.AttemptLabel] == previous:
			// The previous attempt's finished pods stay for `kubectl logs`; they hold no devices.
			g.Previous = append(g.Previous, pod)
			continue
		case !current && pod.DeletionTimestamp.IsZero():
			g.Stale = append(g.Stale, pod)
			continue
		case !current:
			g.Draining = append(g.Draining, pod)
			continue
		case !pod.DeletionTimestamp.IsZero() && !Finished(pod):
			g.Disrupted = append(g.Disrupted, pod)
			continue
		}
		g.Ranks[rank] = pod
		g.Renewed[rank] = replacedRank[rank]
		g.ContainerRestarts += ContainerRestarts(pod)
		g.Counts[rank] = int32(ContainerRestarts(pod))
		if step, ok := ReportedCheckpoint(pod); ok && step > g.CheckpointStep {
			g.CheckpointStep = step
		}
		now, before := ResumeOfRuns(pod, runBase, int(rank), g.Renewed[rank], underWay)
		g.Resume.Merge(now)
		g.ResumeBefore.Merge(before)
		if pod.Spec.NodeName != "" {
			g.Scheduled++
		}
		switch pod.Status.Phase {
		case corev1.PodSucceeded:
			g.Succeeded++
		case corev1.PodFailed:
			if g.FirstFailed == nil || FailedBefore(pod, g.FirstFailed) {
				g.FirstFailed = pod
			}
			g.Failed = append(g.Failed, pod)
		case corev1.PodRunning:
			if Ready(pod) {
				g.Ready++
			}
		case corev1.PodPending:
			if c := Condition(pod, corev1.PodScheduled); c != nil && c.Status == corev1.ConditionFalse &&
				(c.Reason == corev1.PodReasonUnschedulable || (c.Reason == corev1.PodReasonSchedulingGated && len(ForeignGates(pod, lifted)) > 0)) {
				if g.Unschedulable == 0 || rank < g.FirstUnschedulable {
					g.FirstUnschedulable = rank
				}
				if g.Unschedulable == 0 || c.LastTransitionTime.Time.Before(g.UnschedulableSince) {
					g.UnschedulableSince = c.LastTransitionTime.Time
				}
				g.Unschedulable++
			} else if c != nil && c.Status == corev1.ConditionTrue && !c.LastTransitionTime.IsZero() {
				if s := WorkerStatus(pod); s != nil && s.State.Waiting != nil && s.State.Waiting.Reason != "" &&
					(g.NotStarting == nil || c.LastTransitionTime.Time.Before(g.NotStartingSince)) {
					g.NotStarting, g.NotStartingSince = pod, c.LastTransitionTime.Time
				}
			}
		}
	}
	return g
}

// VanishedAnnotation marks the stand-in for a rank's pod that went away unseen.
const VanishedAnnotation = "training.zaya.dev/vanished"

// DisruptedRanks are the ranks whose pods were seen deleted under the running gang.
func (g *Gang) DisruptedRanks() map[int32]bool {
	going := make(map[int32]bool, len(g.Disrupted))
	for _, pod := range g.Disrupted {
		if r, ok := Rank(pod); ok {
			going[r] = true
		}
	}
	return going
}

// NoticeVanished counts as deleted under the running gang each rank whose pod is gone without
// the operator having seen it go: a force delete, or its Node object removed (the pod garbage
// collector deletes such pods at once). The stored status had every rank ready and no
// replacement under way, so no rank can be missing: making one again alone, in the same
// attempt, would leave its peers waiting on a collective with a stranger.
func (g *Gang) NoticeVanished(job *trainingv1alpha1.ZayaTrainingJob, now time.Time) {
	if job.Status.ReadyNodes < job.Width() || len(job.Status.Replacing) > 0 {
		return
	}
	going := g.DisruptedRanks()
	attempt := job.Status.Attempt()
	// The loss is as old as the first worker exit since the last failure: peers that stopped
	// over the missing rank restarted after it, and an in-place restart timed from now would
	// never count them back.
	at, since := now, job.Status.StartTime
	if f := job.Status.LastFailure; f != nil {
		since = &f.Time
	}
	for _, pod := range g.Ranks {
		if pod == nil {
			continue
		}
		if s := WorkerStatus(pod); s != nil {
			for _, t := range []*corev1.ContainerStateTerminated{s.State.Terminated, s.LastTerminationState.Terminated} {
				if t != nil && t.FinishedAt.Time.Before(at) && (since == nil || t.FinishedAt.After(since.Time)) {
					at = t.FinishedAt.Time
				}
			}
		}
	}
	for r, pod := range g.Ranks {
		if pod != nil || going[int32(r)] {
			continue
		}
		name := workerpod.PodName(job, attempt, int32(r))
		g.Disrupted = append(g.Disrupted, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{
			Name: name, Namespace: job.Namespace, UID: types.UID("vanished-" + name),
			Labels: map[string]string{
				trainingv1alpha1.JobNameLabel: job.Name,
				trainingv1alpha1.RankLabel:    strconv.Itoa(r),
				trainingv1alpha1.AttemptLabel: strconv.FormatInt(int64(attempt), 10),
			},
			Annotations:       map[string]string{VanishedAnnotation: "true"},
			DeletionTimestamp: &metav1.Time{Time: at},
		}})
	}
}

// DisruptedPod is rank's pod deleted under the gang (still terminating, or NoticeVanished's
// stand-in), if there is one.
func (g Gang) DisruptedPod(rank int32) *corev1.Pod {
	for _, pod := range g.Disrupted {
		if r, ok := Rank(pod); ok && r == rank {
			return pod
		}
	}
	return nil
}

// UnschedulableMessage names the lowest unschedulable rank and why the scheduler left it.
func (g Gang) UnschedulableMessage() string {
	pod := g.Ranks[g.FirstUnschedulable]
	if gates := ForeignGates(pod, g.lifted); len(gates) > 0 {
		return fmt.Sprintf("rank %d: held by scheduling gates the operator did not set (%s): whatever added them (the template, a webhook) must remove them",
			g.FirstUnschedulable, strings.Join(gates, ", "))
	}
	return fmt.Sprintf("rank %d: %s", g.FirstUnschedulable, Condition(pod, corev1.PodScheduled).Message)
}

// ForeignGates are a pod's scheduling gates that are not the operator's own, nor lifted by
// whatever admits the job (Kueue's admission and topology gates): nothing will lift them.
func ForeignGates(pod *corev1.Pod, lifted []string) []string {
	var out []string
	for _, g := range pod.Spec.SchedulingGates {
		if !slices.Contains(lifted, g.Name) {
			out = append(out, g.Name)
		}
	}
	return out
}

// Missing are the ranks that need a pod.
func (g Gang) Missing() []int32 {
	var out []int32
	for r, p := range g.Ranks {
		if p == nil {
			out = append(out, int32(r))
		}
	}
	return out
}

// FirstFailure is the pod of the current attempt that failed first: the root cause, as its
// peers fail later in collective timeouts. Nil when nothing failed.
func (g Gang) FirstFailure() *corev1.Pod {
	first := g.FirstFailed
	for _, p := range g.Disrupted {
		if first == nil || FailedBefore(p, first) {
			first = p
		}
	}
	return first
}
