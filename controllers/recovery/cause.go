package recovery

import (
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	trainingv1alpha1 "github.com/zaya-operator/zaya-operator/api/v1alpha1"
	"github.com/zaya-operator/zaya-operator/controllers/attribution"
	"github.com/zaya-operator/zaya-operator/controllers/bounded"
	"github.com/zaya-operator/zaya-operator/controllers/gang"
)

// Root or cascade. When one rank faults, its peers fail moments later in broken or timed-out
// collectives; whichever failure the operator happens to see first is not necessarily the
// cause. Of the failures of one restart, the root is the one whose own evidence names a fault
// (a GPU or NIC fault, out of memory, storage, the program's own error, the platform taking
// the pod or node) within rootWindow of the first; failing that, the first. The others are its
// cascade: counted in lastFailure.cascaded, never quarantining a node.

// rootWindow is how much later than the first failure a rank with stronger evidence may fail
// and still be taken for the root: a collective timeout on its peers comes first when the
// faulty rank hangs before it dies.
const rootWindow = time.Minute

// CascadeGrace is how long after the first failure the operator waits for a cause when every
// failure so far is a rank that stopped over a peer.
const CascadeGrace = 2 * time.Second

// CascadeWait is how much longer to wait for a cause after a stop over a peer at at. The
// kubelet writes exit times in whole seconds, cut down: the grace runs from the end of that
// second. On kind under load, a killed rank's exit reached the API server 2 s after its peer's
// stop (stamped the same second), and the peer was blamed.
func CascadeWait(at, now time.Time) time.Duration {
	return at.Truncate(time.Second).Add(time.Second + CascadeGrace).Sub(now)
}

// EvidenceChecks bounds the ranks whose messages are read for one decision (the earliest
// failures): at 2,048 ranks every peer of a fault fails.
const EvidenceChecks = 64

// Evidence strength of a failed rank.
const (
	evidenceCascade = iota // it stopped because a peer failed (exit 75)
	evidenceSilent         // it stopped because a peer went silent: it names the frozen rank
	evidenceWeak           // nothing specific: an exit code, a timeout, a hang
	evidenceStrong         // a fault of its own named, or the platform took it
)

// failedRank is one failure of a restart: a failed pod, or a rank's ended run (in place).
type failedRank struct {
	pod  *corev1.Pod
	exit *corev1.ContainerStateTerminated // nil: the pod failed or went without an exit
	at   time.Time
	rank int32
}

// strength reads how much a failure's own evidence says.
func strength(table *attribution.Table, f failedRank) int {
	if f.exit == nil {
		if f.pod.Status.Reason != "" || !f.pod.DeletionTimestamp.IsZero() {
			return evidenceStrong // evicted, preempted, refused, deleted: the platform's word
		}
		return evidenceWeak
	}
	if f.exit.ExitCode == trainingv1alpha1.ExitStopped {
		if SilentPeer.MatchString(f.exit.Message) {
			return evidenceSilent
		}
		return evidenceCascade
	}
	if f.exit.Reason == "OOMKilled" {
		return evidenceStrong
	}
	if m, ok := table.Match(f.exit.Message); ok {
		switch m.Category {
		case attribution.PeerLost:
			return evidenceCascade
		case attribution.GPUHardware, attribution.NICFabric, attribution.OutOfMemory, attribution.Storage, attribution.Killed, attribution.UserCode:
			return evidenceStrong
		}
	}
	return evidenceWeak
}

// NamesACause reports whether pod's run that ended with exit says more than that it stopped
// over a peer: a root of its own.
func NamesACause(table *attribution.Table, pod *corev1.Pod, exit *corev1.ContainerStateTerminated) bool {
	return strength(table, failedRank{pod: pod, exit: exit}) >= evidenceWeak
}

// pickRoot sorts failures by time and returns the index of the root among them and how many of
// the others are its cascade.
func pickRoot(table *attribution.Table, failures []failedRank) (int, int32) {
	if len(failures) == 0 {
		return -1, 0
	}
	// By time, then rank: the order the failures happened in, whatever the listing order. The
	// caller reads the root from the sorted slice.
	slices.SortFunc(failures, func(a, b failedRank) int {
		if c := a.at.Compare(b.at); c != 0 {
			return c
		}
		return int(a.rank - b.rank)
	})
	first := failures[0].at
	best, bestStrength := -1, -1
	checked := 0
	for i, f := range failures {
		s := evidenceCascade
		switch {
		case checked >= EvidenceChecks || f.at.Sub(first) > rootWindow:
			// Too late, or too many, to be read.
			if f.exit == nil || f.exit.ExitCode != trainingv1alpha1.ExitStopped {
				s = evidenceWeak
			}
		default:
			checked++
			s = strength(table, f)
		}
		if s > bestStrength {
			best, bestStrength = i, s
		}
	}
	return best, int32(len(failures) - 1)
}

// RootFailure is the root among the current attempt's failed and deleted pods, and how many
// others failed with it; nil when none did.
func RootFailure(g gang.Gang, table *attribution.Table) (*corev1.Pod, int32) {
	failures := make([]failedRank, 0, len(g.Failed)+len(g.Disrupted))
	for _, list := range [][]*corev1.Pod{g.Failed, g.Disrupted} {
		for _, pod := range list {
			f := failedRank{pod: pod, at: gang.FailedAt(pod)}
			f.rank, _ = gang.Rank(pod)
			if s := gang.WorkerStatus(pod); s != nil {
				f.exit = s.State.Terminated
			}
			failures = append(failures, f)
		}
	}
	i, cascaded := pickRoot(table, failures)
	if i < 0 {
		return nil, 0
	}
	return failures[i].pod, cascaded
}

// InPlaceRoot is the root among the ranks whose last run ended after `after`, with that run's
// end, and how many others ended with it: the fault that started an in-place restart. A stop
// over a peer the last restart replaced is that restart's, not a fault.
func InPlaceRoot(g gang.Gang, table *attribution.Table, after time.Time, counted []int32, gpusPerNode int32) (*corev1.Pod, *corev1.ContainerStateTerminated, int32) {
	var failures []failedRank
	for r, pod := range g.Ranks {
		if pod == nil {
			continue
		}
		t := LastExit(pod)
		if t == nil || !t.FinishedAt.After(after) {
			continue
		}
		if s := gang.WorkerStatus(pod); counted != nil && r < len(counted) && !g.Renewed[r] && s != nil && s.State.Terminated == nil &&
			g.Counts[r] <= counted[r] {
			continue // the run before this one ended in a restart already accounted for
		}
		if stopOverReplaced(g, t, gpusPerNode) {
			continue
		}
		failures = append(failures, failedRank{pod: pod, exit: t, at: t.FinishedAt.Time, rank: int32(r)})
	}
	i, cascaded := pickRoot(table, failures)
	if i < 0 {
		return nil, nil, 0
	}
	return failures[i].pod, failures[i].exit, cascaded
}

// CascadeSince counts the ranks other than root that went down in the in-place restart that
// began at since: their last run ended then or later, or their pod was replaced.
func CascadeSince(g gang.Gang, since time.Time, root int32) int32 {
	var n int32
	for r, pod := range g.Ranks {
		if pod == nil || int32(r) == root {
			continue
		}
		if g.Renewed[r] || (g.Base != nil && g.Counts[r] != g.Base[r]) {
			n++
			continue
		}
		if t := LastExit(pod); g.Base == nil && t != nil && !t.FinishedAt.Time.Before(since) {
			n++
		}
	}
	return n
}

// stopOverReplaced reports whether exit is a stop over a silent peer whose pod is newer than
// the run that stopped: the peer it lost was the pod that was replaced, and the restart that
// replaced it accounts for that (a run that rejoined a frozen rank's hub before the rank's new
// pod came up finds it silent a few seconds later). Times are whole seconds: a run that began
// in the new pod's second may have met it. A replaced rank that hangs again before its peers'
// runs end is seen at their next stop, from runs that began after its pod.
func stopOverReplaced(g gang.Gang, exit *corev1.ContainerStateTerminated, gpusPerNode int32) bool {
	if exit.ExitCode != trainingv1alpha1.ExitStopped || exit.StartedAt.IsZero() {
		return false
	}
	rank, _, ok := SilentRank(exit.Message, g, gpusPerNode)
	return ok && exit.StartedAt.Before(&g.Ranks[rank].CreationTimestamp)
}

// watchSilent is the gang watch's word for a rank whose supervisor said nothing for the peer
// timeout, as the hub says it of a member and a member of the hub (workers/gangwatch).
var watchSilent = regexp.MustCompile(`gang watch: lost rank (\d+) \(node rank \d+[^\n]*: peer silent`)

// watchFoundSilent reports whether a stopped rank's message is the gang watch's silence of a
// live pod of the gang: its cause is named already. Its supervisor stopped for the peer
// timeout (a frozen, cut-off or lost node): no exit of its own is moments behind, so the
// restart is not held for one (CascadeWait); a supervisor that ended on a live node reads
// "went away", and its exit is waited for.
func watchFoundSilent(msg string, g gang.Gang, gpusPerNode int32) bool {
	m := watchSilent.FindStringSubmatch(msg)
	if m == nil {
		return false
	}
	_, _, ok := SilentRank(m[0], g, gpusPerNode)
	return ok
}

// SilentRank is the rank of the gang whose pod a stopped rank's message names silent (the
// reference worker's "lost rank N …: peer silent"; N is a global rank, node rank × gpusPerNode
// + local), with the words that named it; false when it names none of the gang's live pods.
func SilentRank(msg string, g gang.Gang, gpusPerNode int32) (int32, string, bool) {
	m := SilentPeer.FindStringSubmatch(msg)
	if m == nil {
		return 0, "", false
	}
	n, err := strconv.ParseInt(m[1], 10, 32)
	if err != nil || n < 0 {
		return 0, "", false
	}
	rank := int32(n) / max(gpusPerNode, 1)
	if rank >= int32(len(g.Ranks)) || g.Ranks[rank] == nil {
		return 0, "", false
	}
	return rank, m[0], true
}

// BlameSilentPeer turns a root that only stopped because a peer went silent (exit 75, the
// reference worker's "lost rank N …: peer silent") into that peer's hang: the rank that froze
// never exits by itself, so it is never among the failures. msg is the stopped rank's
// termination message.
func BlameSilentPeer(f *trainingv1alpha1.JobFailure, msg string, g gang.Gang, gpusPerNode int32) {
	if f.ExitCode == nil || *f.ExitCode != trainingv1alpha1.ExitStopped {
		return
	}
	rank, words, ok := SilentRank(msg, g, gpusPerNode)
	if !ok || (f.Rank != nil && *f.Rank == rank) {
		return
	}
	pod := g.Ranks[rank]
	by := ptr.Deref(f.Rank, -1)
	f.Rank, f.Node, f.ExitCode = ptr.To(rank), pod.Spec.NodeName, nil
	f.Reason, f.Category, f.Rule, f.Evidence = trainingv1alpha1.FailureReasonHang, string(attribution.Hang), "", bounded.Cut(words, MaxEvidence)
	f.Message = bounded.Message(fmt.Sprintf("rank %d (pod %s on %s) went silent: rank %d lost it (%s)", rank, pod.Name, pod.Spec.NodeName, by, words))
}

// HungLaggard reports whether rank, left behind by an in-place restart that began at since, still
// runs the process its peers stopped over, and a peer that stopped in it named it silent (the
// reference worker's "lost rank N …: peer silent"): a live process would have lost its peers
// too and exited. Global ranks in the peers' messages are node ranks × gpusPerNode + local.
func HungLaggard(g gang.Gang, rank int32, since time.Time, gpusPerNode int32) bool {
	silent, _ := NamedLaggard(g, rank, since, gpusPerNode)
	return silent
}

// NamedLaggard reports how the peers that stopped in the in-place restart that began at since
// (back from it or not yet: their last run's end holds their words) named rank, which still
// runs (as its status says) the process they stopped over: silent (HungLaggard), or gone (the gang watch's "node rank N's supervisor went away": its
// connection ended, as it does when its node shuts down; its status would have said so by now
// were its kubelet alive).
func NamedLaggard(g gang.Gang, rank int32, since time.Time, gpusPerNode int32) (silent, gone bool) {
	s := gang.WorkerStatus(g.Ranks[rank])
	if s == nil || s.State.Running == nil || g.Renewed[rank] {
		return false, false
	}
	if g.Base != nil && g.Counts[rank] != g.Base[rank] {
		return false, false // restarted since the fault
	}
	if g.Base == nil && !s.State.Running.StartedAt.Time.Before(since.Truncate(time.Second)) {
		return false, false
	}
	for r := range g.Ranks {
		if int32(r) == rank {
			continue
		}
		exit := g.RestartExit(r, since) // back or not: its words are in its last run's end
		if exit == nil {
			continue
		}
		for _, m := range SilentPeer.FindAllStringSubmatch(exit.Message, -1) {
			if n, err := strconv.ParseInt(m[1], 10, 32); err == nil && int32(n)/max(gpusPerNode, 1) == rank {
				silent = true
			}
		}
		for _, m := range SupervisorGone.FindAllStringSubmatch(exit.Message, -1) {
			if n, err := strconv.ParseInt(m[1]+m[2], 10, 32); err == nil && n == int64(rank) {
				gone = true
			}
		}
	}
	return silent, gone
}

// SupervisorGone is the gang watch's report of a node rank whose supervisor's connection to
// the hub ended, as the hub says it of a member and a member of the hub (workers/gangwatch).
var SupervisorGone = regexp.MustCompile(`node rank (\d+)'s supervisor went away|lost the hub \(node rank (\d+)\b`)

// Signalled is how the reference worker says it stopped on its own SIGTERM (its peers say
// "peer rank N was stopped").
var Signalled = regexp.MustCompile(`(?m)^zaya: stopped: rank \d+ was signalled at step \d+`)

// SilentPeer is the reference worker's report of a peer it found silent (docs/worker-contract.md).
var SilentPeer = regexp.MustCompile(`lost rank (\d+)\b[^\n]*: peer silent`)

// InPlaceFault is the fault that starts an in-place restart, read from the gang of job: the
// root among the ranks' exits since the last failure or the end of the restart that followed
// it, or, where whole-second times cannot tell (a restart in the last failure's second), among
// the ranks whose restart counts rose past seen and baseline (status.containerRestarts and
// rankRestarts as the last restart left them). It is judged and named with table and the
// admission's word (stopped), and timed from the fault as the kubelet saw it. It returns the
// verdict and the root rank's live pod; no verdict and how long to wait while every exit so
// far is a stop over a peer (the ranks restart themselves either way: waiting costs the gang
// nothing, and the peer's own exit, which its kubelet may report seconds later, names the
// cause); nothing when no rank restarted.
func InPlaceFault(job *trainingv1alpha1.ZayaTrainingJob, g gang.Gang, seen int64, baseline []int32, table *attribution.Table, stopped Stopped, now time.Time) (*Verdict, *corev1.Pod, time.Duration) {
	st := &job.Status
	var after time.Time
	if st.LastFailure != nil {
		after = st.LastFailure.Time.Time
	}
	if c := meta.FindStatusCondition(st.Conditions, trainingv1alpha1.ConditionRestarting); c != nil && c.LastTransitionTime.After(after) {
		after = c.LastTransitionTime.Time
	}
	if after.After(now) {
		after = time.Time{} // not the operator's: it never writes a time ahead of its clock
	}
	pod, exit, cascaded := InPlaceRoot(g, table, after, nil, job.Spec.GPUsPerNode)
	if pod == nil && g.ContainerRestarts > seen {
		// A restart whose exit is no newer than the last failure (times are whole seconds):
		// the ranks whose counts rose since the last restart's are the news, where the counts
		// are known; an older exit of another rank, in the same second, is not.
		pod, exit, cascaded = InPlaceRoot(g, table, time.Time{}, gang.RestartBaseline(&trainingv1alpha1.ZayaTrainingJobStatus{RankRestarts: baseline, ContainerRestarts: seen}, int32(len(g.Ranks))), job.Spec.GPUsPerNode)
	}
	if pod == nil {
		return nil, nil, 0
	}
	if exit.ExitCode == trainingv1alpha1.ExitStopped && !watchFoundSilent(exit.Message, g, job.Spec.GPUsPerNode) {
		if wait := CascadeWait(exit.FinishedAt.Time, now); wait > 0 {
			return nil, nil, wait
		}
	}
	v := Judge(&job.Spec, Ended(pod, exit), now, st.Restarts, stopped)
	Attribute(table, &v.Failure, Ended(pod, exit))
	BlameSilentPeer(&v.Failure, exit.Message, g, job.Spec.GPUsPerNode)
	v.Failure.Cascaded = cascaded
	// The restart is timed from the fault itself, as the kubelet saw it, not from this pass.
	at := exit.FinishedAt.Time
	if at.IsZero() || at.After(now) {
		at = now
	}
	v.Failure.Time = metav1.Time{Time: at}
	return &v, pod, 0
}

// LateCause is the cause of an in-place restart of job that began at since on a stop over a
// peer (status.lastFailure), once the peer's own exit shows: an exit of the restart (stamped
// in the stop's second or later, or the second before where the restart counts tell which runs
// ended in it) that names a cause of its own, from another rank, judged and named with table
// and the admission's word (stopped). Nil while there is none, when the last failure is no
// such stop, while ranks are being replaced, or when the cause is fatal (its pod fails: the
// failure path ends the job).
func LateCause(job *trainingv1alpha1.ZayaTrainingJob, g gang.Gang, since time.Time, table *attribution.Table, stopped Stopped, now time.Time) *Verdict {
	st := &job.Status
	last := st.LastFailure
	if last == nil || last.ExitCode == nil || *last.ExitCode != trainingv1alpha1.ExitStopped || len(st.Replacing) > 0 {
		return nil
	}
	after := since.Truncate(time.Second).Add(-time.Nanosecond)
	if g.Base != nil {
		after = after.Add(-time.Second)
	}
	pod, exit, _ := InPlaceRoot(g, table, after, g.Base, job.Spec.GPUsPerNode)
	if pod == nil || !NamesACause(table, pod, exit) {
		return nil // still no cause of its own
	}
	if r, _ := gang.Rank(pod); last.Rank != nil && *last.Rank == r {
		return nil
	}
	v := Judge(&job.Spec, Ended(pod, exit), now, last.Attempt, stopped)
	if v.Fatal {
		return nil
	}
	Attribute(table, &v.Failure, Ended(pod, exit))
	v.Failure.Cascaded = last.Cascaded
	if at := exit.FinishedAt.Time; !at.IsZero() && !at.After(now) {
		v.Failure.Time = metav1.Time{Time: at}
	}
	return &v
}
