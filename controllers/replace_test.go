package controllers

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/zaya-operator/zaya-operator/api/contract"
	trainingv1alpha1 "github.com/zaya-operator/zaya-operator/api/v1alpha1"
	"github.com/zaya-operator/zaya-operator/controllers/recovery"
	"github.com/zaya-operator/zaya-operator/controllers/restart"
	"github.com/zaya-operator/zaya-operator/controllers/workerpod"
)

// runningSince is a pod whose worker container runs a process started at started.
func runningSince(node string, started time.Time) func(*corev1.Pod) {
	return func(p *corev1.Pod) {
		running(node)(p)
		p.Status.ContainerStatuses = []corev1.ContainerStatus{{Name: "worker", Ready: true,
			State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: metav1.NewTime(started)}}}}
	}
}

// askSupervisors has the operator's asks answered by reach (by pod name) and returns the
// pods asked, in order.
func (h *harness) askSupervisors(reach func(pod string) recovery.Reach) *[]string {
	asked := new([]string)
	h.r.Supervisors = func(_ context.Context, pods ...*corev1.Pod) []recovery.Reach {
		out := make([]recovery.Reach, len(pods))
		for i, p := range pods {
			if p != nil {
				*asked = append(*asked, p.Name)
				out[i] = reach(p.Name)
			}
		}
		return out
	}
	return asked
}

// envOf is the value c's environment gives name ("" if none).
func envOf(c corev1.Container, name string) string {
	for _, e := range c.Env {
		if e.Name == name {
			return e.Value
		}
	}
	return ""
}

// uids are the live pods' UIDs by name.
func (h *harness) podUIDs(t testing.TB) map[string]types.UID {
	out := map[string]types.UID{}
	for name, p := range h.pods(t) {
		out[name] = p.UID
	}
	return out
}

func TestANodeFaultReplacesOnlyItsRanksPod(t *testing.T) {
	h, job := inPlaceGang(t)
	for r := range 3 {
		h.setPod(t, workerpod.PodName(job, 0, int32(r)), runningSince(fmt.Sprint("n", r), now.Add(-time.Minute)))
	}
	before := h.podUIDs(t)
	h.writes.Store(0)

	// The device plugin lowers n1's allocatable: rank 1 must move, its peers need not.
	h.setNode(t, "n1", func(n *corev1.Node) { n.Status.Allocatable["amd.com/gpu"] = resource.MustParse("7") })
	h.mustReconcile(t, job)
	st := h.get(t, job).Status
	if st.Restarts != 1 || st.InPlaceRestarts != 1 || st.Attempt() != 0 || st.LastFailure.Reason != trainingv1alpha1.FailureReasonDeviceUnhealthy {
		t.Fatalf("restarts %d, in place %d, attempt %d, lastFailure %+v; want one in-place restart of attempt 0 after DeviceUnhealthy",
			st.Restarts, st.InPlaceRestarts, st.Attempt(), st.LastFailure)
	}
	want := []trainingv1alpha1.ReplacedPod{{Rank: 1, UID: string(before["llm-0-1"]), Node: "n1", Reason: "DeviceUnhealthy", Since: metav1.NewTime(now)}}
	if diff := cmp.Diff(want, st.Replacing); diff != "" {
		t.Errorf("replacing (-want +got):\n%s", diff)
	}
	if st.PodsReplaced != 1 || len(st.QuarantinedNodes) != 1 || st.QuarantinedNodes[0].Name != "n1" {
		t.Errorf("podsReplaced %d, quarantined %+v; want 1 and n1", st.PodsReplaced, st.QuarantinedNodes)
	}
	if ev := h.drainEvents(); !containsPrefix(ev, "Warning ReplacingPods replacing rank 1 (pod llm-0-1 on n1): rank 1 (pod llm-0-1): node n1 has 7 amd.com/gpu allocatable of 8") {
		t.Errorf("events = %q", ev)
	}

	h.mustReconcile(t, job) // deletes rank 1's pod, which its live kubelet stops briefly
	h.mustReconcile(t, job) // creates its new pod
	after := h.podUIDs(t)
	if after["llm-0-0"] != before["llm-0-0"] || after["llm-0-2"] != before["llm-0-2"] || after["llm-0-1"] == "" || after["llm-0-1"] == before["llm-0-1"] {
		t.Fatalf("pods %v, before %v; want only llm-0-1 new", after, before)
	}
	pod := h.pods(t)["llm-0-1"]
	if pod.Labels[trainingv1alpha1.AttemptLabel] != "0" || pod.Spec.Hostname != "llm-1" {
		t.Errorf("new pod's attempt %q, hostname %q; want the rank's old ones", pod.Labels[trainingv1alpha1.AttemptLabel], pod.Spec.Hostname)
	}
	if a := pod.Spec.Affinity; a == nil || a.NodeAffinity == nil || !strings.Contains(a.NodeAffinity.String(), "n1") {
		t.Errorf("new pod's affinity %+v does not keep it off n1", a)
	}
	if w := h.writes.Load(); w != 4 {
		t.Errorf("%d writes, want 4: status, the delete, the create, status", w)
	}

	// The peers exit 75 and restart in place; the new rank starts on n3.
	back := now.Add(2 * time.Second)
	h.r.Clock = clockAt(back)
	h.setPod(t, "llm-0-0", restartedInPlace("n0", 1, trainingv1alpha1.ExitStopped, now.Add(time.Second), back))
	h.setPod(t, "llm-0-2", restartedInPlace("n2", 1, trainingv1alpha1.ExitStopped, now.Add(time.Second), back))
	h.setPod(t, "llm-0-1", runningSince("n3", back))
	h.mustReconcile(t, job)
	got := h.get(t, job)
	if c := condition(got, "Restarting"); c.Status != metav1.ConditionFalse || c.Reason != trainingv1alpha1.ReasonRecovered {
		t.Errorf("Restarting = %+v, want Recovered", c)
	}
	if got.Status.Replacing != nil || got.Status.Restarts != 1 || got.Status.PodsReplaced != 1 {
		t.Errorf("replacing %+v, restarts %d, podsReplaced %d; want none left, 1, 1", got.Status.Replacing, got.Status.Restarts, got.Status.PodsReplaced)
	}
}

func TestALostNodesPodIsRemovedAtOnce(t *testing.T) {
	h, job := inPlaceGang(t)
	var grace *int64
	h.r.Client = interceptDelete(h.r.Client, func(opts *client.DeleteOptions) { grace = opts.GracePeriodSeconds })
	h.setNode(t, "node-llm-0-2", func(n *corev1.Node) { n.Status.Conditions[0].Status = corev1.ConditionUnknown })
	h.mustReconcile(t, job)
	if st := h.get(t, job).Status; len(st.Replacing) != 1 || st.Replacing[0].Rank != 2 || st.Replacing[0].Reason != "NodeLost" {
		t.Fatalf("replacing %+v, want rank 2 for NodeLost", st.Replacing)
	}
	h.mustReconcile(t, job)
	if grace == nil || *grace != 0 {
		t.Errorf("deleted with grace %v, want 0: no kubelet will confirm", ptr.Deref(grace, -1))
	}
}

func TestARankLeftBehindOnANodeWithALapsedLeaseIsReplaced(t *testing.T) {
	h, job := inPlaceGang(t)
	fault := now.Add(-3 * time.Second) // past recovery.CascadeWait: the stops alone are recorded
	lease := &coordinationv1.Lease{
		ObjectMeta: metav1.ObjectMeta{Name: "n1", Namespace: corev1.NamespaceNodeLease},
		Spec:       coordinationv1.LeaseSpec{LeaseDurationSeconds: ptr.To[int32](20), RenewTime: ptr.To(metav1.NewMicroTime(fault))},
	}
	if err := h.r.Create(context.Background(), lease); err != nil {
		t.Fatal(err)
	}
	// Rank 1's node froze: its peers lost it and restarted in place, it did not.
	h.setPod(t, "llm-0-1", runningSince("n1", now.Add(-time.Minute)))
	h.setPod(t, "llm-0-0", restartedInPlace("n0", 1, trainingv1alpha1.ExitStopped, fault, fault.Add(time.Second)))
	h.setPod(t, "llm-0-2", restartedInPlace("n2", 1, trainingv1alpha1.ExitStopped, fault, fault.Add(time.Second)))
	h.mustReconcile(t, job) // the in-place restart opens
	res := h.mustReconcile(t, job)
	st := h.get(t, job).Status
	if len(st.Replacing) != 0 {
		t.Fatalf("replacing %+v while n1's Lease is 3s old of 20s", st.Replacing)
	}
	// Stale after half the Lease's duration: 10 s after its renewal, 7 s from now.
	if res.RequeueAfter != 7*time.Second {
		t.Errorf("requeue after %s, want 7s, when the Lease lapses", res.RequeueAfter)
	}

	h.r.Clock = clockAt(now.Add(7 * time.Second))
	h.drainEvents()
	h.mustReconcile(t, job)
	st = h.get(t, job).Status
	if len(st.Replacing) != 1 || st.Replacing[0].Rank != 1 || st.Replacing[0].Reason != trainingv1alpha1.FailureReasonNodeLost {
		t.Fatalf("replacing %+v, want rank 1 for NodeLost", st.Replacing)
	}
	if f := st.LastFailure; f.Reason != trainingv1alpha1.FailureReasonNodeLost || *f.Rank != 1 ||
		!strings.Contains(f.Message, "did not restart with its peers and node n1 stopped renewing its Lease (last renewed 10s ago)") {
		t.Errorf("lastFailure = %+v, want rank 1's node lost", f)
	}
	if st.Restarts != 1 || len(st.QuarantinedNodes) != 1 || st.QuarantinedNodes[0].Name != "n1" {
		t.Errorf("restarts %d, quarantined %+v; want the one restart, n1 quarantined", st.Restarts, st.QuarantinedNodes)
	}
}

func TestALapsedLeaseAloneOrALaggardAloneIsNoNodeLoss(t *testing.T) {
	h, job := inPlaceGang(t)
	old := ptr.To(metav1.NewMicroTime(now.Add(-time.Hour)))
	for _, n := range []string{"n0", "n1", "n2"} {
		if err := h.r.Create(context.Background(), &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: n, Namespace: corev1.NamespaceNodeLease},
			Spec: coordinationv1.LeaseSpec{LeaseDurationSeconds: ptr.To[int32](40), RenewTime: old}}); err != nil {
			t.Fatal(err)
		}
	}
	// Every Lease lapsed (the kubelets' API access broke) but no rank is behind: nothing.
	for r := range 3 {
		h.setPod(t, workerpod.PodName(job, 0, int32(r)), runningSince(fmt.Sprint("n", r), now.Add(-time.Minute)))
	}
	h.mustReconcile(t, job)
	if st := h.get(t, job).Status; st.Restarts != 0 || len(st.Replacing) != 0 {
		t.Fatalf("restarts %d, replacing %+v with every rank running", st.Restarts, st.Replacing)
	}
	// A rank behind on a node whose Lease is fresh: it is slow, not lost.
	if err := h.r.Delete(context.Background(), &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: "n1", Namespace: corev1.NamespaceNodeLease}}); err != nil {
		t.Fatal(err)
	}
	if err := h.r.Create(context.Background(), &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: "n1", Namespace: corev1.NamespaceNodeLease},
		Spec: coordinationv1.LeaseSpec{LeaseDurationSeconds: ptr.To[int32](40), RenewTime: ptr.To(metav1.NewMicroTime(now))}}); err != nil {
		t.Fatal(err)
	}
	fault := now.Add(-recovery.CascadeGrace - time.Second)
	h.setPod(t, "llm-0-0", restartedInPlace("n0", 1, trainingv1alpha1.ExitStopped, fault, now))
	h.setPod(t, "llm-0-2", restartedInPlace("n2", 1, trainingv1alpha1.ExitStopped, fault, now))
	h.mustReconcile(t, job)
	h.mustReconcile(t, job)
	if st := h.get(t, job).Status; st.Restarts != 1 || len(st.Replacing) != 0 {
		t.Errorf("restarts %d, replacing %+v; want the in-place restart and no pod replaced", st.Restarts, st.Replacing)
	}
}

func TestAFaultOfAReplacingRestartJoinsIt(t *testing.T) {
	h, job := inPlaceGang(t)
	h.setNode(t, "node-llm-0-1", func(n *corev1.Node) { n.Status.Conditions[0].Status = corev1.ConditionUnknown })
	h.mustReconcile(t, job)
	// Meanwhile the kubelet of rank 2's node evicts it (node pressure).
	h.setPod(t, "llm-0-2", func(p *corev1.Pod) {
		p.Status.Phase, p.Status.Reason, p.Status.Message = corev1.PodFailed, "Evicted", "The node was low on resource: memory."
	})
	h.mustReconcile(t, job)
	st := h.get(t, job).Status
	if st.Restarts != 1 || st.Attempt() != 0 || len(st.Replacing) != 2 || st.Replacing[1].Rank != 2 || st.Replacing[1].Reason != "Evicted" {
		t.Errorf("restarts %d, attempt %d, replacing %+v; want one restart replacing ranks 1 and 2", st.Restarts, st.Attempt(), st.Replacing)
	}
}

// deleteSpy reports each Delete's options.
type deleteSpy struct {
	client.Client
	seen func(*client.DeleteOptions)
}

func (d deleteSpy) Delete(ctx context.Context, obj client.Object, opts ...client.DeleteOption) error {
	o := &client.DeleteOptions{}
	o.ApplyOptions(opts)
	d.seen(o)
	return d.Client.Delete(ctx, obj, opts...)
}

func interceptDelete(c client.Client, seen func(*client.DeleteOptions)) client.Client {
	return deleteSpy{Client: c, seen: seen}
}

// rank1LeftBehind opens an in-place restart of inPlaceGang's job at fault: ranks 0 and 2
// stopped with message and are back, rank 1 still runs its old process on n1, whose kubelet
// last renewed its 40 s Lease at renewed.
func rank1LeftBehind(t *testing.T, h *harness, job *trainingv1alpha1.ZayaTrainingJob, fault, renewed time.Time, message string) {
	t.Helper()
	if err := h.r.Create(context.Background(), &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: "n1", Namespace: corev1.NamespaceNodeLease},
		Spec: coordinationv1.LeaseSpec{LeaseDurationSeconds: ptr.To[int32](40), RenewTime: ptr.To(metav1.NewMicroTime(renewed))}}); err != nil {
		t.Fatal(err)
	}
	stopped := func(node string) func(*corev1.Pod) {
		return func(p *corev1.Pod) {
			restartedInPlace(node, 1, trainingv1alpha1.ExitStopped, fault, fault.Add(time.Second))(p)
			p.Status.ContainerStatuses[0].LastTerminationState.Terminated.Message = message
		}
	}
	h.setPod(t, "llm-0-1", runningSince("n1", now.Add(-time.Minute)))
	h.setPod(t, "llm-0-0", stopped("n0"))
	h.setPod(t, "llm-0-2", stopped("n2"))
	h.mustReconcile(t, job) // the in-place restart opens
}

// A rank that keeps running the process its peers stopped over, on a node whose kubelet is
// alive (it renewed its Lease since the restart began), and that a peer found silent, is hung:
// its pod alone is replaced at once, the node is not quarantined. Without the peer's word, or
// before the kubelet has shown it is alive, nothing is replaced yet.
func TestAHungRankOnALiveNodeIsReplacedAlone(t *testing.T) {
	fault := now.Add(-3 * time.Second)
	silent := "checkpoint-step=40\nzaya: stopped: lost rank 9 during the all-reduce at step 52: peer silent: no heartbeat from rank 9 for 5s\n"
	eof := "checkpoint-step=40\nzaya: stopped: lost rank 0 during the all-reduce at step 52: EOF\n"
	for _, tc := range []struct {
		name     string
		message  string        // rank 0's and rank 2's stopped lines
		renewed  time.Time     // n1's Lease
		replaced bool          // rank 1's pod
		requeue  time.Duration // when nothing is replaced yet
	}{
		{"named silent, kubelet alive", silent, now.Add(-time.Second), true, 0},
		{"lost no one in particular", eof, now.Add(-time.Second), false, 19 * time.Second},
		{"named silent, kubelet not heard from since", silent, fault.Add(-time.Second), false, restart.HungRecheck},
		// Exit times are whole seconds, cut down: a renewal in the stops' own second may have
		// come before the node died (chaos, a lost node taken for a hung rank, replaced
		// unquarantined and restarted again once its node turned NotReady).
		{"named silent, renewed only in the stops' own second", silent, fault.Add(300 * time.Millisecond), false, restart.HungRecheck},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h, job := inPlaceGang(t)
			rank1LeftBehind(t, h, job, fault, tc.renewed, tc.message)
			res := h.mustReconcile(t, job)
			st := h.get(t, job).Status
			if !tc.replaced {
				if len(st.Replacing) != 0 {
					t.Fatalf("replacing %+v", st.Replacing)
				}
				if res.RequeueAfter != tc.requeue {
					t.Errorf("requeue after %s, want %s", res.RequeueAfter, tc.requeue)
				}
				return
			}
			if len(st.Replacing) != 1 || st.Replacing[0].Rank != 1 || st.Replacing[0].Reason != trainingv1alpha1.FailureReasonHang {
				t.Fatalf("replacing %+v, want rank 1 for Hang", st.Replacing)
			}
			if st.Restarts != 1 || len(st.QuarantinedNodes) != 0 || st.PodsReplaced != 1 {
				t.Errorf("restarts %d, quarantined %+v, podsReplaced %d; want 1 restart, no quarantine, 1 pod", st.Restarts, st.QuarantinedNodes, st.PodsReplaced)
			}
			if f := st.LastFailure; f.Reason != trainingv1alpha1.FailureReasonHang || *f.Rank != 1 {
				t.Errorf("lastFailure %+v, want rank 1 hung", f)
			}
		})
	}
}

// A rank its peers named silent, on a node whose kubelet renewed nothing since, is judged
// by asking its supervisor before the Lease lapses: silent while a peer on another node
// answers, its node is lost or cut off (replaced elsewhere, the node quarantined, at once).
// Answering, refusing, the operator reaching nobody, or a peer's word missing, leave it to
// the Lease, as without asking.
func TestALaggardsSupervisorTellsALostNodeBeforeItsLeaseLapses(t *testing.T) {
	fault := now.Add(-6 * time.Second)
	silent := "zaya: stopped: lost rank 9 during the all-reduce at step 52: peer silent: no heartbeat from rank 9 for 5s\n"
	eof := "zaya: stopped: lost rank 0 during the all-reduce at step 52: EOF\n"
	gone := "zaya-supervisor: gang watch: node rank 1's supervisor went away: EOF\n"
	for _, tc := range []struct {
		name       string
		message    string                    // rank 0's and rank 2's stopped lines
		reach      map[string]recovery.Reach // by pod name; missing: unknown
		reason     string                    // rank 1's replacement's ("": none yet)
		quarantine bool
		asked      []string // the pods asked, in order
		requeue    time.Duration
	}{
		{"silent, a peer answers: lost", silent, map[string]recovery.Reach{"llm-0-1": recovery.ReachSilent, "llm-0-0": recovery.ReachAnswered},
			trainingv1alpha1.FailureReasonNodeLost, true, []string{"llm-0-1", "llm-0-0"}, 0},
		{"answers: its node lives; its kubelet's renewal judges it, as without asking", silent, map[string]recovery.Reach{"llm-0-1": recovery.ReachAnswered, "llm-0-0": recovery.ReachAnswered},
			"", false, []string{"llm-0-1", "llm-0-0"}, restart.HungRecheck},
		{"silent, the peer silent too: the Lease decides", silent, map[string]recovery.Reach{"llm-0-1": recovery.ReachSilent, "llm-0-0": recovery.ReachSilent},
			"", false, []string{"llm-0-1", "llm-0-0"}, restart.HungRecheck},
		{"refused: its container between runs", silent, map[string]recovery.Reach{"llm-0-1": recovery.ReachAlive, "llm-0-0": recovery.ReachAnswered},
			"", false, []string{"llm-0-1", "llm-0-0"}, restart.HungRecheck},
		{"gone, silent, a peer answers: its node shut down", gone, map[string]recovery.Reach{"llm-0-1": recovery.ReachSilent, "llm-0-0": recovery.ReachAnswered},
			trainingv1alpha1.FailureReasonNodeLost, true, []string{"llm-0-1", "llm-0-0"}, 0},
		{"gone, answers: not a hang, its kubelet will say", gone, map[string]recovery.Reach{"llm-0-1": recovery.ReachAnswered, "llm-0-0": recovery.ReachAnswered},
			"", false, []string{"llm-0-1", "llm-0-0"}, restart.HungRecheck},
		{"not named: not asked", eof, map[string]recovery.Reach{"llm-0-1": recovery.ReachSilent, "llm-0-0": recovery.ReachAnswered},
			"", false, nil, 15 * time.Second},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h, job := inPlaceGang(t)
			asked := h.askSupervisors(func(pod string) recovery.Reach { return tc.reach[pod] })
			// Renewed 5 s ago, before the fault's second ended: nothing heard since. 15 s to stale.
			rank1LeftBehind(t, h, job, fault, now.Add(-5*time.Second), tc.message)
			*asked = nil
			res := h.mustReconcile(t, job)
			if !cmp.Equal(*asked, tc.asked) {
				t.Errorf("asked %v, want %v", *asked, tc.asked)
			}
			st := h.get(t, job).Status
			if tc.reason == "" {
				if len(st.Replacing) != 0 {
					t.Fatalf("replacing %+v", st.Replacing)
				}
				if res.RequeueAfter != tc.requeue {
					t.Errorf("requeue after %s, want %s", res.RequeueAfter, tc.requeue)
				}
				return
			}
			if len(st.Replacing) != 1 || st.Replacing[0].Rank != 1 || st.Replacing[0].Reason != tc.reason {
				t.Fatalf("replacing %+v, want rank 1 for %s", st.Replacing, tc.reason)
			}
			if got := len(st.QuarantinedNodes) == 1 && st.QuarantinedNodes[0].Name == "n1"; got != tc.quarantine {
				t.Errorf("quarantined %+v, want n1 quarantined: %t", st.QuarantinedNodes, tc.quarantine)
			}
			f := st.LastFailure
			if f.Reason != tc.reason || ptr.Deref(f.Rank, -1) != 1 || f.Node != "n1" {
				t.Errorf("lastFailure %+v, want rank 1 on n1 %s", f, tc.reason)
			}
			named := "found it silent"
			if tc.message == gone {
				named = "lost its supervisor"
			}
			if tc.reason == trainingv1alpha1.FailureReasonNodeLost && !strings.Contains(f.Message,
				"its peers "+named+", its supervisor did not answer the operator while a peer's did, and node n1 renewed no Lease since (last 5s ago)") {
				t.Errorf("message %q names neither look", f.Message)
			}
		})
	}
}

// The gang watch's silence names its cause: the in-place restart opens on the first stop the
// operator sees, and the silent rank's fate is asked while its peers are still between runs
// (exited, not yet restarted: a kubelet's back-off), a peer's refusing address the control.
// A worker's own word for a silent peer waits for the cascade's grace as before (its rank's
// exit, a GPU fault's, may be moments behind).
func TestALostNodeIsDecidedWhileItsPeersAreBetweenRuns(t *testing.T) {
	fault := now.Add(-1500 * time.Millisecond) // within recovery.CascadeWait
	for _, tc := range []struct {
		name, message string
		replaced      bool
	}{
		{"the gang watch's silence", "zaya: stopped: gang watch: lost rank 8 (node rank 1): peer silent for 5s\n", true},
		{"a worker's own silence", "zaya: stopped: lost rank 9 during the all-reduce at step 52: peer silent: no heartbeat from rank 9 for 5s\n", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h, job := inPlaceGang(t)
			asked := h.askSupervisors(func(pod string) recovery.Reach {
				if pod == "llm-0-1" {
					return recovery.ReachSilent
				}
				return recovery.ReachAlive // a container between runs
			})
			if err := h.r.Create(context.Background(), &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: "n1", Namespace: corev1.NamespaceNodeLease},
				Spec: coordinationv1.LeaseSpec{LeaseDurationSeconds: ptr.To[int32](40), RenewTime: ptr.To(metav1.NewMicroTime(now.Add(-5 * time.Second)))}}); err != nil {
				t.Fatal(err)
			}
			exited := func(node string) func(*corev1.Pod) {
				return func(p *corev1.Pod) {
					running(node)(p)
					p.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionFalse}}
					p.Status.ContainerStatuses = []corev1.ContainerStatus{{Name: "worker", State: corev1.ContainerState{
						Terminated: &corev1.ContainerStateTerminated{ExitCode: trainingv1alpha1.ExitStopped, Reason: "Error",
							StartedAt: metav1.NewTime(now.Add(-time.Minute)), FinishedAt: metav1.NewTime(fault), Message: tc.message}}}}
				}
			}
			h.setPod(t, "llm-0-1", runningSince("n1", now.Add(-time.Minute)))
			h.setPod(t, "llm-0-0", exited("n0"))
			h.setPod(t, "llm-0-2", exited("n2"))
			h.mustReconcile(t, job)
			h.mustReconcile(t, job)
			st := h.get(t, job).Status
			if !tc.replaced {
				if st.Restarts != 0 || len(*asked) != 0 {
					t.Fatalf("restarts %d, asked %v: want the cascade's grace awaited", st.Restarts, *asked)
				}
				return
			}
			if !cmp.Equal(*asked, []string{"llm-0-1", "llm-0-0"}) {
				t.Errorf("asked %v, want rank 1's supervisor and rank 0's pod", *asked)
			}
			if st.Restarts != 1 || len(st.Replacing) != 1 || st.Replacing[0].Rank != 1 || st.Replacing[0].Reason != trainingv1alpha1.FailureReasonNodeLost {
				t.Fatalf("restarts %d, replacing %+v; want one restart, rank 1 replaced for NodeLost", st.Restarts, st.Replacing)
			}
			if len(st.QuarantinedNodes) != 1 || st.QuarantinedNodes[0].Name != "n1" {
				t.Errorf("quarantined %+v, want n1", st.QuarantinedNodes)
			}
			// One fault, one failure: the hang the stop blamed on rank 1 is its node's loss.
			if len(st.RecentFailures) != 1 || st.RecentFailures[0].Reason != trainingv1alpha1.FailureReasonNodeLost {
				t.Errorf("recent failures %+v, want rank 1's node loss alone", st.RecentFailures)
			}
			// Its replacement's worker waits for the old one's bound, from the decision.
			h.mustReconcile(t, job) // the old pod goes
			h.mustReconcile(t, job) // its replacement comes
			pod := h.pods(t)["llm-0-1"]
			if pod == nil || pod.Spec.NodeName == "n1" {
				t.Fatalf("rank 1's pod %+v, want its replacement", pod)
			}
			want := st.LastFailure.Recovery.Decided.UTC().Format(time.RFC3339Nano)
			if got := envOf(pod.Spec.Containers[0], contract.EnvNodeLostAt); got != want {
				t.Errorf("%s=%q, want the decision %q", contract.EnvNodeLostAt, got, want)
			}
		})
	}
}

// A hung rank's peers restart in place and may rejoin its frozen process (the supervisor's hub
// lives on rank 0) before its new pod comes up; they then find it silent again. That stop is
// the restart that replaced it, not a new fault: counted again, one hang would be three
// failures on its node and quarantine it (chaos seed 3573677252). A stop from runs that began
// after the new pod is a new fault.
func TestAStopOverAReplacedHungRankIsItsRestart(t *testing.T) {
	fault := now.Add(-3 * time.Second)
	silent := "zaya: stopped: lost rank 9 during the all-reduce at step 52: peer silent: no heartbeat from rank 9 for 5s\n"
	h, job := inPlaceGang(t)
	if err := h.r.Create(context.Background(), &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: "n1", Namespace: corev1.NamespaceNodeLease},
		Spec: coordinationv1.LeaseSpec{LeaseDurationSeconds: ptr.To[int32](40), RenewTime: ptr.To(metav1.NewMicroTime(now.Add(-time.Second)))}}); err != nil {
		t.Fatal(err)
	}
	// stopped: the peer's run that began at started ended over rank 9 (node rank 1) at end.
	stopped := func(node string, count int32, started, end time.Time) func(*corev1.Pod) {
		return func(p *corev1.Pod) {
			restartedInPlace(node, count, trainingv1alpha1.ExitStopped, end, end.Add(time.Second))(p)
			last := p.Status.ContainerStatuses[0].LastTerminationState.Terminated
			last.Message, last.StartedAt = silent, metav1.NewTime(started)
		}
	}
	h.setPod(t, "llm-0-1", runningSince("n1", now.Add(-time.Minute)))
	h.setPod(t, "llm-0-0", stopped("n0", 1, now.Add(-time.Minute), fault))
	h.setPod(t, "llm-0-2", stopped("n2", 1, now.Add(-time.Minute), fault))
	h.mustReconcile(t, job) // the in-place restart opens
	h.mustReconcile(t, job) // rank 1 is hung on a live node: replaced
	if st := h.get(t, job).Status; len(st.Replacing) != 1 || len(st.RecentFailures) != 1 {
		t.Fatalf("replacing %+v, recent failures %+v; want rank 1 replaced for its one failure", st.Replacing, st.RecentFailures)
	}
	h.mustReconcile(t, job) // deletes its pod
	h.mustReconcile(t, job) // creates the new one

	// The new rank 1 comes up; the peers' runs since the fault (begun at fault+1s) are back.
	created, back := now.Add(time.Second), now.Add(3*time.Second)
	h.r.Clock = clockAt(back)
	h.setPod(t, "llm-0-1", func(p *corev1.Pod) { p.CreationTimestamp = metav1.NewTime(created); runningSince("n3", back)(p) })
	h.mustReconcile(t, job)
	if c := condition(h.get(t, job), "Restarting"); c.Status != metav1.ConditionFalse {
		t.Fatalf("Restarting = %+v, want the restart over", c)
	}

	// Those runs had met rank 1's frozen process: they find it silent and stop again.
	h.r.Clock = clockAt(back.Add(10 * time.Second))
	h.setPod(t, "llm-0-0", stopped("n0", 2, fault.Add(time.Second), back.Add(4*time.Second)))
	h.setPod(t, "llm-0-2", stopped("n2", 2, fault.Add(time.Second), back.Add(4*time.Second)))
	h.mustReconcile(t, job)
	h.mustReconcile(t, job)
	st := h.get(t, job).Status
	if st.Restarts != 1 || len(st.RecentFailures) != 1 || len(st.QuarantinedNodes) != 0 {
		t.Fatalf("restarts %d, recent failures %+v, quarantined %+v; want the one restart and failure, no quarantine",
			st.Restarts, st.RecentFailures, st.QuarantinedNodes)
	}
	if c := condition(h.get(t, job), "Restarting"); c.Status != metav1.ConditionFalse {
		t.Errorf("Restarting = %+v, want no new restart", c)
	}

	// Runs that began after the new pod find it silent: it hung again, a new fault.
	h.r.Clock = clockAt(back.Add(20 * time.Second))
	h.setPod(t, "llm-0-0", stopped("n0", 3, back.Add(5*time.Second), back.Add(12*time.Second)))
	h.setPod(t, "llm-0-2", stopped("n2", 3, back.Add(5*time.Second), back.Add(12*time.Second)))
	h.mustReconcile(t, job)
	h.mustReconcile(t, job)
	st = h.get(t, job).Status
	if st.Restarts != 2 || st.LastFailure.Reason != trainingv1alpha1.FailureReasonHang || ptr.Deref(st.LastFailure.Rank, -1) != 1 || st.LastFailure.Node != "n3" {
		t.Errorf("restarts %d, lastFailure %+v; want a second restart for rank 1 hung on n3", st.Restarts, st.LastFailure)
	}
}

// A replacement's worker waits from its rank's node-loss decision: the decision's own
// microsecond where the last failure is that loss, else its record's second rounded up; a
// rank replaced for anything else does not wait.
func TestAReplacementKnowsWhenItsRanksNodeWasLost(t *testing.T) {
	since := metav1.NewTime(now.Truncate(time.Second))
	decided := trainingv1alpha1.Stamp(now.Add(750 * time.Millisecond))
	lost := func(rank int32) *trainingv1alpha1.JobFailure {
		return &trainingv1alpha1.JobFailure{Reason: trainingv1alpha1.FailureReasonNodeLost, Rank: ptr.To(rank),
			Recovery: &trainingv1alpha1.RecoveryTimeline{Decided: decided}}
	}
	for _, tc := range []struct {
		name   string
		reason string
		last   *trainingv1alpha1.JobFailure
		want   time.Time
	}{
		{"the last failure's decision", trainingv1alpha1.FailureReasonNodeLost, lost(1), decided.Time},
		{"another rank's loss since", trainingv1alpha1.FailureReasonNodeLost, lost(2), since.Add(time.Second)},
		{"no timeline", trainingv1alpha1.FailureReasonNodeLost, nil, since.Add(time.Second)},
		{"a hung rank's replacement", trainingv1alpha1.FailureReasonHang, lost(1), time.Time{}},
	} {
		st := &trainingv1alpha1.ZayaTrainingJobStatus{LastFailure: tc.last,
			Replacing: []trainingv1alpha1.ReplacedPod{{Rank: 1, Reason: tc.reason, Since: since}}}
		if got := nodeLostAt(st, 1); !got.Equal(tc.want) {
			t.Errorf("%s: %v, want %v", tc.name, got, tc.want)
		}
		if got := nodeLostAt(st, 0); !got.IsZero() {
			t.Errorf("%s: rank 0, not replaced: %v", tc.name, got)
		}
	}
}
