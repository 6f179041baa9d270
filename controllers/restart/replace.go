package restart

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"

	trainingv1alpha1 "github.com/zaya-operator/zaya-operator/api/v1alpha1"
	"github.com/zaya-operator/zaya-operator/controllers/bounded"
	"github.com/zaya-operator/zaya-operator/controllers/gang"
	"github.com/zaya-operator/zaya-operator/controllers/recovery"
)

// Replacing only what broke. With restartMode InPlace a rank whose pod cannot restart in place
// (its node failed, the pod was evicted or deleted, or it never rejoined its restarted peers)
// gets a new pod of the same name, so its hostname and DNS name stay, on another node; every
// other rank restarts in place and waits at the rendezvous for it. It is one in-place restart:
// the attempt stays, the ranks listed in status.replacing are the only pods written.

// replaceRanks opens an in-place restart (unless one is under way: then the failure joins it,
// not counted again) that gives v's rank, and every other rank on the same failed node, a new
// pod. It reports false when the ranks do not fit in status.replacing.
func (e *Executor) replaceRanks(ctx context.Context, g gang.Gang, v recovery.Verdict) bool {
	ranks := []int32{*v.Failure.Rank}
	if v.Pod == nil && v.Failure.Node != "" { // a node fault takes every rank there
		for r, pod := range g.Ranks {
			if pod != nil && pod.Spec.NodeName == v.Failure.Node && int32(r) != ranks[0] {
				ranks = append(ranks, int32(r))
			}
		}
	}
	if len(e.Job.Status.Replacing)+len(ranks) > recovery.MaxReplaced {
		return false
	}
	if _, ok := recovery.InPlaceUnderWay(&e.Job.Status); ok {
		e.reroot(v.Failure)
	} else {
		e.recover(ctx, v, trainingv1alpha1.RestartModeInPlace)
		if recovery.Finished(e.Job) {
			return true
		}
	}
	e.markReplaced(ctx, g, ranks, v.Failure.Reason, v.Failure.Message)
	return true
}

// markReplaced lists ranks in status.replacing: the next pass deletes their pods (a crash in
// between loses nothing) and creates new ones once the old are gone.
func (e *Executor) markReplaced(ctx context.Context, g gang.Gang, ranks []int32, reason, why string) {
	st := &e.Job.Status
	var names []string
	for _, r := range ranks {
		pod := g.Ranks[r]
		if pod == nil {
			pod = g.DisruptedPod(r) // deleted under the gang: its UID is what the replacement waits out
		}
		if pod == nil || slices.ContainsFunc(st.Replacing, func(x trainingv1alpha1.ReplacedPod) bool { return x.Rank == r }) {
			continue
		}
		spare := e.takeSpare(ctx, pod.Spec.NodeName)
		st.Replacing = append(st.Replacing, trainingv1alpha1.ReplacedPod{
			Rank: r, UID: string(pod.UID), Node: pod.Spec.NodeName, Reason: reason, Since: metav1.Time{Time: e.Now}, SpareNode: spare,
		})
		name := fmt.Sprintf("rank %d (pod %s on %s)", r, pod.Name, pod.Spec.NodeName)
		if spare != "" {
			name += " onto the warm spare's node " + spare
		}
		names = append(names, name)
	}
	if len(names) == 0 {
		return
	}
	e.Host.Loss().Broken()
	e.did(trainingv1alpha1.FailureActionReplacedPods)
	slices.SortFunc(st.Replacing, func(a, b trainingv1alpha1.ReplacedPod) int { return int(a.Rank) - int(b.Rank) })
	st.PodsReplaced = bounded.Count(st.PodsReplaced, len(names))
	e.Host.Warning(trainingv1alpha1.ReasonReplacingPods, "Restart", "replacing %s: %s; the other ranks restart in place",
		strings.Join(names, ", "), why)
	n := len(names)
	e.Host.WhenStored(func() { podsReplacedTotal.WithLabelValues(reason).Add(float64(n)) })
}

// replacedGrace is how long a replaced pod may take to stop: none when its node is lost (no
// kubelet will confirm, and the new pod needs the name), else briefly.
func replacedGrace(reason string) *int64 {
	if reason == trainingv1alpha1.FailureReasonNodeLost {
		return ptr.To[int64](0)
	}
	return recovery.Briefly()
}

// DeleteReplaced deletes the pods status.replacing names, each as its reason allows.
func (e *Executor) DeleteReplaced(ctx context.Context, g gang.Gang) error {
	for _, pod := range g.Replaced {
		i := slices.IndexFunc(e.Job.Status.Replacing, func(x trainingv1alpha1.ReplacedPod) bool { return x.UID == string(pod.UID) })
		if err := e.Host.DeletePods(ctx, []*corev1.Pod{pod}, replacedGrace(e.Job.Status.Replacing[i].Reason)); err != nil {
			return err
		}
	}
	return nil
}

// replaceLaggards is the ladder's middle rung: an in-place restart that did not bring every
// rank back within inPlaceTimeout replaces the pods of the ranks that are not back, once. It
// reports false when that was done already (or cannot be), so the gang must be recreated.
func (e *Executor) replaceLaggards(ctx context.Context, g gang.Gang, since time.Time, timeout time.Duration) bool {
	laggards := recovery.Laggards(g, since)
	st := &e.Job.Status
	if len(laggards) == 0 || len(st.Replacing)+len(laggards) > recovery.MaxReplaced || !recovery.ReplacesPods(&e.Job.Spec.FaultTolerance) {
		return false
	}
	e.markReplaced(ctx, g, laggards, trainingv1alpha1.ReasonInPlaceTimedOut,
		fmt.Sprintf("not back within inPlaceTimeout (%s) of the in-place restart", timeout))
	return true
}

// LostNodes acts on the fastest reliable signs of a lost node: during an in-place restart
// that most ranks stopped in, a rank that did not restart with its peers is lost
// with its node when its kubelet stopped renewing its Lease, or, sooner, when its peers named
// it silent, its kubelet renewed nothing since, and its supervisor answers the operator no
// more while a peer's does (recovery.LaggardFate). A rank its peers named silent on a node
// whose kubelet renewed since is hung, and is replaced alone.
// It returns when to look again while a laggard's fate is open.
func (e *Executor) LostNodes(ctx context.Context, g gang.Gang) (time.Duration, error) {
	since, ok := recovery.InPlaceUnderWay(&e.Job.Status)
	if !ok || !recovery.ReplacesPods(&e.Job.Spec.FaultTolerance) {
		return 0, nil
	}
	laggards := recovery.LostNodeSuspects(g, since)
	if len(laggards) == 0 {
		return 0, nil
	}
	var next time.Duration
	going := sync.OnceValue(func() bool { return e.Host.NamespaceGoing(ctx) }) // read once, and only to act
	// The restart is timed from an exit, stamped in whole seconds cut down: a renewal in that
	// second may have come before the fault (a node lost at .9 renewed at .3), so only a later
	// one proves the node alive, as for lapsedRank.
	alive := since.Truncate(time.Second).Add(time.Second)
	signs := make([]recovery.Laggard, len(laggards))
	var ask []*corev1.Pod
	for i, r := range laggards {
		pod := g.Ranks[r]
		age, stale, err := e.leaseAge(ctx, pod.Spec.NodeName)
		if err != nil {
			return 0, err
		}
		l := recovery.Laggard{LeaseAge: age, Stale: stale, SinceStop: e.Now.Sub(alive)}
		l.NamedSilent, l.NamedGone = recovery.NamedLaggard(g, r, since, e.Job.Spec.GPUsPerNode)
		signs[i] = l
		// Only where the answer can decide (recovery.LaggardFate): a rank its peers named, on a
		// node with a Lease neither lapsed nor renewed since the fault.
		if (l.NamedSilent || l.NamedGone) && e.Reach != nil && age >= 0 && age < stale && l.SinceStop <= age {
			ask = append(ask, pod)
		}
	}
	var asking time.Duration // the pass's clock stands still: a decision after the ask is this much later
	if len(ask) > 0 {
		control := backPeer(g, since, ask)
		start := time.Now()
		reach := e.Reach(ctx, append(ask, control)...)
		asking = time.Since(start)
		for i, r := range laggards {
			if j := slices.Index(ask, g.Ranks[r]); j >= 0 {
				signs[i].Reach, signs[i].Control = reach[j], reach[len(ask)]
				log.FromContext(ctx).V(1).Info("asked the supervisor of a rank its peers named", "rank", r, "pod", g.Ranks[r].Name,
					"silent", signs[i].NamedSilent, "gone", signs[i].NamedGone, "reach", reach[j], "control", reach[len(ask)],
					"leaseAge", signs[i].LeaseAge.String())
			}
		}
	}
	for i, r := range laggards {
		pod, l := g.Ranks[r], signs[i]
		fate, due := recovery.LaggardFate(l, HungRecheck)
		switch fate {
		case recovery.FateWait:
			if due > 0 && (next == 0 || due < next) {
				next = due
			}
			continue
		case recovery.FateHung:
			if going() {
				return 0, nil // the job goes with its namespace: nothing to replace
			}
			e.replaceHung(ctx, g, r)
			continue
		}
		why := fmt.Sprintf("node %s stopped renewing its Lease (last renewed %s ago)", pod.Spec.NodeName, l.LeaseAge.Round(time.Second))
		if l.LeaseAge < l.Stale {
			named := "found it silent"
			if !l.NamedSilent {
				named = "lost its supervisor"
			}
			why = fmt.Sprintf("its peers %s, its supervisor did not answer the operator while a peer's did, and node %s renewed no Lease since (last %s ago)",
				named, pod.Spec.NodeName, l.LeaseAge.Round(time.Second))
		}
		f := trainingv1alpha1.JobFailure{
			Time: metav1.Time{Time: e.Now}, Reason: trainingv1alpha1.FailureReasonNodeLost, Attempt: e.Job.Status.Restarts,
			Node: pod.Spec.NodeName, Rank: ptr.To(r),
			Message: bounded.Message(fmt.Sprintf("rank %d (pod %s) did not restart with its peers and %s", r, pod.Name, why)),
		}
		if going() {
			return 0, nil
		}
		if err := e.quarantine(ctx, &f); err != nil {
			return 0, err
		}
		e.reroot(f)
		e.markReplaced(ctx, g, []int32{r}, f.Reason, f.Message)
		if l.Reach == recovery.ReachSilent {
			e.Job.Status.StampRecovery(func(t *trainingv1alpha1.RecoveryTimeline) { t.Decided = trainingv1alpha1.Stamp(e.Now.Add(asking)) })
		}
	}
	return next, nil
}

// backPeer is a rank that stopped in the in-place restart that began at since (back from it or
// between runs: its pod's address lives either way), on a node none of the asked pods is on
// (nil if none): what it answers tells whether the operator reaches the job's pods at all.
func backPeer(g gang.Gang, since time.Time, asked []*corev1.Pod) *corev1.Pod {
	for r, pod := range g.Ranks {
		if pod != nil && (g.Back(r, since) || g.RestartExit(r, since) != nil) &&
			!slices.ContainsFunc(asked, func(a *corev1.Pod) bool { return a.Spec.NodeName == pod.Spec.NodeName }) {
			return pod
		}
	}
	return nil
}

// lapsedRank finds, among the ranks still on their nodes while their peers stopped over a
// peer (the first of them at since), and the ranks stopped by a signal nobody in the job sent
// (a node shutting down stops its containers: `docker stop` of a kind node, a host powering
// off), one whose kubelet stopped renewing its Lease: that node is lost, whatever its Node
// says until the node lifecycle controller's grace period ends. While a Lease not renewed
// since the stop may still lapse, it returns how long to wait; a rank whose kubelet renewed
// since is on a live node. Too many such ranks is not one lost node: nothing.
func (e *Executor) lapsedRank(ctx context.Context, g gang.Gang, since time.Time) (*trainingv1alpha1.JobFailure, time.Duration, error) {
	var left []int32
	for r, pod := range g.Ranks {
		if pod == nil || pod.Spec.NodeName == "" || !pod.DeletionTimestamp.IsZero() {
			continue
		}
		if pod.Status.Phase == corev1.PodSucceeded || pod.Status.Phase == corev1.PodFailed {
			s := gang.WorkerStatus(pod)
			if s == nil || s.State.Terminated == nil || !recovery.Signalled.MatchString(s.State.Terminated.Message) {
				continue
			}
		}
		left = append(left, int32(r))
	}
	if len(left) == 0 || len(left) > recovery.LeaseChecksPerPass {
		return nil, 0, nil
	}
	// Exit times are whole seconds, cut down: a renewal in the stop's own second may have come
	// before the stop (a node lost at .7 renewed at .5), so only a later one proves the node alive.
	since = since.Truncate(time.Second).Add(time.Second)
	var wait time.Duration
	for _, r := range left {
		pod := g.Ranks[r]
		age, stale, err := e.leaseAge(ctx, pod.Spec.NodeName)
		if err != nil {
			return nil, 0, err
		}
		switch {
		case age < 0 || e.Now.Sub(since) > age:
			continue // no Lease to judge by, or renewed since the peers stopped
		case age >= stale:
			return &trainingv1alpha1.JobFailure{
				Time: metav1.Time{Time: e.Now}, Reason: trainingv1alpha1.FailureReasonNodeLost, Attempt: e.Job.Status.Restarts,
				Node: pod.Spec.NodeName, Rank: ptr.To(r),
				Message: bounded.Message(fmt.Sprintf("rank %d (pod %s): its peers lost it and node %s stopped renewing its Lease (last renewed %s ago)",
					r, pod.Name, pod.Spec.NodeName, age.Round(time.Second))),
			}, 0, nil
		}
		if due := stale - age; wait == 0 || due < wait {
			wait = due
		}
	}
	return nil, wait, nil
}

// HungRecheck is how often a rank that looks hung is looked at again until its node's Lease
// says whether the node is alive.
const HungRecheck = 2 * time.Second

// replaceHung gives a hung rank a new pod: its node is alive (its kubelet renewed its Lease
// since the restart began), so it is not quarantined; the kubelet kills the frozen process
// when the old pod is deleted. Waiting for its liveness probe (hangTimeout) would hold every
// other rank at the rendezvous that long.
func (e *Executor) replaceHung(ctx context.Context, g gang.Gang, rank int32) {
	pod := g.Ranks[rank]
	f := trainingv1alpha1.JobFailure{
		Time: metav1.Time{Time: e.Now}, Reason: trainingv1alpha1.FailureReasonHang, Attempt: e.Job.Status.Restarts,
		Node: pod.Spec.NodeName, Rank: ptr.To(rank),
		Message: bounded.Message(fmt.Sprintf("rank %d (pod %s on %s) kept running after its peers stopped and restarted: they found it silent (hung)",
			rank, pod.Name, pod.Spec.NodeName)),
	}
	// Its peers named it silent, so the restart is already this hang's: one fault, one failure
	// (each would count against the node, and three quarantine it).
	if last := e.Job.Status.LastFailure; last == nil || last.Reason != f.Reason || ptr.Deref(last.Rank, -1) != rank || last.Node != f.Node {
		e.reroot(f)
	}
	e.markReplaced(ctx, g, []int32{rank}, f.Reason, f.Message)
}

// leaseAge is how long ago node's kubelet last renewed its Lease, and after how long that
// means it stopped: two renewals missed (a kubelet renews every quarter of the Lease's
// duration). A negative age means there is no Lease to judge by. Read live, for the few nodes
// of ranks left behind, rather than watching every node's Lease.
func (e *Executor) leaseAge(ctx context.Context, node string) (age, stale time.Duration, err error) {
	l := &coordinationv1.Lease{}
	if err := e.Live.Get(ctx, client.ObjectKey{Namespace: corev1.NamespaceNodeLease, Name: node}, l); err != nil {
		if apierrors.IsNotFound(err) || apierrors.IsForbidden(err) {
			log.FromContext(ctx).V(1).Info("no node Lease to judge by", "node", node, "error", err.Error())
			return -1, 0, nil
		}
		return 0, 0, fmt.Errorf("reading node %s's Lease: %w", node, err)
	}
	if l.Spec.RenewTime == nil {
		return -1, 0, nil
	}
	duration := 40 * time.Second // a kubelet's default
	if d := ptr.Deref(l.Spec.LeaseDurationSeconds, 0); d > 0 {
		duration = time.Duration(d) * time.Second
	}
	return max(e.Now.Sub(l.Spec.RenewTime.Time), 0), duration / 2, nil
}
