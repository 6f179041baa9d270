package gang

import (
	"time"

	corev1 "k8s.io/api/core/v1"

	trainingv1alpha1 "github.com/zaya-operator/zaya-operator/api/v1alpha1"
)

// ContainerRestarts is how often pod's worker container was restarted in place.
func ContainerRestarts(pod *corev1.Pod) int64 {
	if s := WorkerStatus(pod); s != nil {
		return int64(max(s.RestartCount, 0))
	}
	return 0
}

// RestartBaseline is status.rankRestarts for a gang of n ranks: nil when it cannot be known (a
// status written before it was kept, or by someone else, of another size), then the ranks'
// start times decide instead.
func RestartBaseline(st *trainingv1alpha1.ZayaTrainingJobStatus, n int32) []int32 {
	switch {
	case len(st.RankRestarts) == int(n):
		return st.RankRestarts
	case len(st.RankRestarts) == 0 && st.ContainerRestarts == 0:
		return make([]int32, n) // omitted: every count is 0
	}
	return nil
}

// RestartedSince reports whether every rank has come back from an in-place restart that
// began at t (back): the restart is over only once the cascade reached every rank, or a rank
// not yet torn down would be counted as recovered.
func (g Gang) RestartedSince(t time.Time) bool {
	for r, pod := range g.Ranks {
		if pod == nil || !g.Back(r, t) {
			return false
		}
	}
	return true
}

// RestartExit is the run rank r ended in the in-place restart that began at since, whether
// its kubelet has restarted it yet (back) or not (between runs, or in its back-off): a rank
// with such an exit stopped with the others; nil when it ended none since. Exit times are
// whole seconds, cut down, so an exit in since's own second counts.
func (g Gang) RestartExit(r int, since time.Time) *corev1.ContainerStateTerminated {
	pod := g.Ranks[r]
	if pod == nil {
		return nil
	}
	s := WorkerStatus(pod)
	if s == nil {
		return nil
	}
	t := since.Truncate(time.Second)
	if g.Back(r, since) {
		exit := s.LastTerminationState.Terminated
		if exit == nil || (g.Base == nil && exit.FinishedAt.Time.Before(t)) {
			return nil // with counts known, a rank that is back ended its last run in this restart
		}
		return exit
	}
	exit := s.State.Terminated
	if exit == nil {
		exit = s.LastTerminationState.Terminated // restarted, not yet ready; or waiting to restart
	}
	if exit == nil || exit.FinishedAt.Time.Before(t) {
		return nil
	}
	return exit
}

// BackAt is when the last rank came back: the latest start of a worker process or Ready
// transition, as the kubelet recorded them (zero when unknown).
func (g Gang) BackAt() time.Time {
	var at time.Time
	for _, pod := range g.Ranks {
		if pod == nil {
			continue
		}
		if s := WorkerStatus(pod); s != nil && s.State.Running != nil && s.State.Running.StartedAt.After(at) {
			at = s.State.Running.StartedAt.Time
		}
		if c := Condition(pod, corev1.PodReady); c != nil && c.LastTransitionTime.After(at) {
			at = c.LastTransitionTime.Time
		}
	}
	return at
}

// Back reports whether rank r has come back from the in-place restart that began at since:
// ready, and running a process started after the fault. Its restart count tells, where the
// count before the fault is known (g.Base): a rank whose count rose has restarted, one whose
// pod was replaced runs a new pod's first process. Otherwise its start time decides, which is
// whole seconds: a process started in the fault's own second counts only if its container ran
// before and that run ended since, or a rank the cascade has not reached yet, started in that
// second, would be taken for restarted.
func (g Gang) Back(r int, since time.Time) bool {
	pod := g.Ranks[r]
	if !Ready(pod) {
		return false
	}
	s := WorkerStatus(pod)
	if s == nil || s.State.Running == nil {
		return false
	}
	if g.Renewed[r] {
		return true
	}
	if g.Base != nil {
		return g.Counts[r] != g.Base[r] // fewer: a pod created since, with its own count
	}
	t, started := since.Truncate(time.Second), s.State.Running.StartedAt.Time
	switch {
	case started.After(t):
		return true
	case started.Before(t):
		return false
	}
	last := s.LastTerminationState.Terminated
	return last != nil && !last.FinishedAt.Time.Before(t)
}
