package zayactl

import (
	"cmp"
	"fmt"
	"slices"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/zaya-operator/zaya-operator/controllers/gang"
)

// What the kubelets' crash-loop back-off costs an in-place restart, read from the jobs' own
// restarts: a kubelet's configuration is not readable without nodes/proxy, which also grants
// exec on every pod of a node, so preflight never asks for it. A default kubelet restarts a
// container at once the first time, then waits 10 s, doubling to 5 min, before each further
// restart of it until it has run 10 minutes; crashLoopBackOff.maxContainerRestartPeriod
// (KubeletCrashLoopBackOffMax) caps that wait. So the gap between a worker's exit and its next
// start, once it has restarted twice within 10 minutes, is the back-off its node applies.

// backOffResets is how long a container must run before its kubelet forgets its back-off.
const backOffResets = 10 * time.Minute

// backOffHeld and backOffTuned bound what a gap says: at least the default's first wait
// (10 s, less the whole-second stamps' error) is a back-off in force; at most a couple of
// seconds is a cap set low.
const (
	backOffHeld  = 8 * time.Second
	backOffTuned = 3 * time.Second
)

// restartGap is one worker container's newest in-place restart that its kubelet's back-off
// applied to.
type restartGap struct {
	Pod      string
	Node     string
	Restarts int32
	Gap      time.Duration
}

// restartGaps are the gaps of pods' worker containers that restarted at least twice, their last
// run shorter than backOffResets, largest first. Times are the kubelet's whole seconds.
func restartGaps(pods []corev1.Pod) []restartGap {
	var out []restartGap
	for i := range pods {
		s := gang.WorkerStatus(&pods[i])
		if s == nil || s.RestartCount < 2 || s.State.Running == nil || s.LastTerminationState.Terminated == nil {
			continue
		}
		last := s.LastTerminationState.Terminated
		if last.StartedAt.IsZero() || last.FinishedAt.IsZero() || last.FinishedAt.Sub(last.StartedAt.Time) >= backOffResets {
			continue
		}
		gap := s.State.Running.StartedAt.Sub(last.FinishedAt.Time)
		if gap < 0 || gap > time.Hour {
			continue // a clock apart, not a back-off
		}
		out = append(out, restartGap{Pod: pods[i].Name, Node: pods[i].Spec.NodeName, Restarts: s.RestartCount, Gap: gap})
	}
	slices.SortStableFunc(out, func(a, b restartGap) int { return cmp.Compare(b.Gap, a.Gap) })
	return out
}

// backOffCheck says what the kubelets' back-off costs a rank that fails twice within 10 minutes.
func backOffCheck(f facts) Check {
	const name = "Restart back-off"
	if f.PodsErr != nil {
		return unreadable(name, "the namespace's pods", f.PodsErr)
	}
	gaps := restartGaps(f.Pods)
	if len(gaps) == 0 {
		return Check{Name: name, Result: ok,
			Detail: "cannot tell yet: no worker here has restarted in place twice within 10 minutes (a default kubelet waits 10 s before a container's second restart, doubling to 5 min)"}
	}
	worst := gaps[0]
	seen := fmt.Sprintf("%s on %s came back %s after its exit (restart %d)", worst.Pod, orDash(worst.Node, "?"), worst.Gap, worst.Restarts)
	switch {
	case worst.Gap >= backOffHeld:
		return Check{Name: name, Result: warn,
			Detail: fmt.Sprintf("the kubelets' crash-loop back-off holds in-place restarts: %s; a rank that fails again within 10 minutes waits 10 s, then 20 s, 40 s … up to 5 min, and its gang with it", seen),
			Fix:    "set the kubelets' crashLoopBackOff.maxContainerRestartPeriod to 1s (KubeletConfiguration, feature gate KubeletCrashLoopBackOffMax), or give jobs restartMode: Recreate (new pods wait for no back-off; docs/recovery.md)"}
	case worst.Gap <= backOffTuned:
		return Check{Name: name, Result: ok,
			Detail: fmt.Sprintf("the kubelets' back-off is capped low: the slowest of %d repeated in-place restarts, %s", len(gaps), seen)}
	}
	return Check{Name: name, Result: ok, Detail: fmt.Sprintf("repeated in-place restarts wait a few seconds: %s", seen)}
}
