package controllers

import (
	"context"
	"strings"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	trainingv1alpha1 "github.com/zaya-operator/zaya-operator/api/v1alpha1"
	"github.com/zaya-operator/zaya-operator/controllers/recovery"
)

const (
	watchdogLine = "[rank0]:[E1125 ProcessGroupNCCL.cpp:616] [Rank 0] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=77, OpType=ALLREDUCE, Timeout(ms)=600000) ran for 600012 milliseconds before timing out."
	gpuFaultLine = "Memory access fault by GPU node-2 (Agent handle: 0x55f4c3a1e2b0) on address 0x7f2b3c000000. Reason: Page not present or supervisor privilege."
)

func recreateGang(t *testing.T) (*harness, *trainingv1alpha1.ZayaTrainingJob) {
	return inPlaceGang(t, func(j *trainingv1alpha1.ZayaTrainingJob) {
		j.Spec.FaultTolerance.RestartMode = trainingv1alpha1.RestartModeRecreate
	})
}

// A peer's collective timeout shows first; the rank whose GPU faulted prints it a moment
// later: the fault is the root, the timeout its cascade.
func TestTheRankThatNamesAFaultIsTheRootNotTheFirstToFail(t *testing.T) {
	h, job := recreateGang(t)
	roots, cascades := scraped(t, "zaya_failures_total", "category", "GPUHardware", "role", "root"), scraped(t, "zaya_failures_total", "category", "GPUHardware", "role", "cascade")
	h.setPod(t, "llm-0-0", exitedSaying("n0", 1, now, "", watchdogLine))
	h.setPod(t, "llm-0-2", exitedSaying("n2", 134, now.Add(2*time.Second), "", gpuFaultLine))
	h.mustReconcile(t, job)
	f := h.get(t, job).Status.LastFailure
	if f == nil || *f.Rank != 2 || f.Category != "GPUHardware" || f.Cascaded != 1 {
		t.Fatalf("lastFailure %+v: want rank 2's GPU fault as the root, rank 0's timeout its cascade", f)
	}
	if r, c := scraped(t, "zaya_failures_total", "category", "GPUHardware", "role", "root")-roots, scraped(t, "zaya_failures_total", "category", "GPUHardware", "role", "cascade")-cascades; r != 1 || c != 1 {
		t.Errorf("zaya_failures_total rose by %v root, %v cascade; want 1 and 1", r, c)
	}
}

func TestWithoutEvidenceTheFirstFailureIsTheRoot(t *testing.T) {
	h, job := recreateGang(t)
	h.setPod(t, "llm-0-0", exitedSaying("n0", 1, now, "", watchdogLine))
	// Too late to be the cause of what failed a minute and more before it.
	h.setPod(t, "llm-0-2", exitedSaying("n2", 134, now.Add(2*time.Minute), "", gpuFaultLine))
	h.setPod(t, "llm-0-1", exitedSaying("n1", 1, now.Add(time.Second), "", "checkpoint-step=40"))
	h.mustReconcile(t, job)
	f := h.get(t, job).Status.LastFailure
	if f == nil || *f.Rank != 0 || f.Category != "CollectiveTimeout" || f.Cascaded != 2 {
		t.Fatalf("lastFailure %+v: want rank 0 (the first) as the root of 2 others", f)
	}
}

func TestAnInPlaceRestartsRootIsTheRankThatNamesAFault(t *testing.T) {
	h, job := inPlaceGang(t)
	fault := now.Add(-5 * time.Second)
	withMessage := func(msg string, f func(*corev1.Pod)) func(*corev1.Pod) {
		return func(p *corev1.Pod) {
			f(p)
			p.Status.ContainerStatuses[0].LastTerminationState.Terminated.Message = msg
		}
	}
	h.setPod(t, "llm-0-0", withMessage(watchdogLine, restartedInPlace("n0", 1, 1, fault, fault.Add(3*time.Second))))
	h.setPod(t, "llm-0-1", withMessage(gpuFaultLine, restartedInPlace("n1", 1, 134, fault.Add(time.Second), fault.Add(3*time.Second))))
	h.setPod(t, "llm-0-2", restartedInPlace("n2", 1, trainingv1alpha1.ExitStopped, fault, fault.Add(3*time.Second)))
	h.mustReconcile(t, job)
	f := h.get(t, job).Status.LastFailure
	if f == nil || *f.Rank != 1 || f.Category != "GPUHardware" || f.Cascaded != 2 {
		t.Fatalf("lastFailure %+v: want rank 1's GPU fault as the root of 2", f)
	}
}

// An in-place restart counts its cascade once it ends: every other rank it restarted.
func TestAnInPlaceRestartCountsItsCascadeWhenItEnds(t *testing.T) {
	h, job := inPlaceGang(t)
	fault := now.Add(-3 * time.Second)
	h.setPod(t, "llm-0-1", restartedInPlace("n1", 1, 139, fault, fault.Add(time.Second)))
	h.mustReconcile(t, job)
	if f := h.get(t, job).Status.LastFailure; f == nil || f.Cascaded != 0 {
		t.Fatalf("lastFailure %+v: the peers have not failed yet", f)
	}
	back := now.Add(2 * time.Second)
	h.r.Clock = clockAt(back)
	h.setPod(t, "llm-0-0", restartedInPlace("n0", 1, trainingv1alpha1.ExitStopped, now, back))
	h.setPod(t, "llm-0-2", restartedInPlace("n2", 1, trainingv1alpha1.ExitStopped, now, back))
	h.mustReconcile(t, job)
	st := h.get(t, job).Status
	if c := condition(h.get(t, job), "Restarting"); c.Reason != trainingv1alpha1.ReasonRecovered {
		t.Fatalf("Restarting %+v, want Recovered", c)
	}
	if st.LastFailure.Cascaded != 2 || st.RecentFailures[0].Cascaded != 2 {
		t.Errorf("cascaded %d (recent %d), want the 2 peers the restart took down", st.LastFailure.Cascaded, st.RecentFailures[0].Cascaded)
	}
}

// A rank that froze never exits: its peers stop over it (exit 75, "peer silent"), and the
// failure is its hang, not theirs.
func TestAPeerFoundSilentIsTheRootOfItsPeersStops(t *testing.T) {
	h, job := recreateGang(t)
	// Global rank 8: node rank 1 of 8 GPUs each.
	silent := "checkpoint-step=40\nzaya: stopped: lost rank 8 during the all-reduce at step 120: peer silent: no heartbeat from rank 8 for 5s\n"
	h.setPod(t, "llm-0-0", exitedSaying("n0", trainingv1alpha1.ExitStopped, now, "", silent))
	h.setPod(t, "llm-0-2", exitedSaying("n2", trainingv1alpha1.ExitStopped, now.Add(time.Second), "", silent))
	h.mustReconcile(t, job)
	f := h.get(t, job).Status.LastFailure
	if f == nil || *f.Rank != 1 || f.Reason != "Hang" || f.Category != "Hang" || f.Node != "node-llm-0-1" || f.ExitCode != nil {
		t.Fatalf("lastFailure %+v: want rank 1's hang on its node", f)
	}
}

// Ranks that stopped over a peer whose node is gone: the node's loss is the root, though its
// rank's pod has not failed (its kubelet is the one gone).
func TestAGoneNodeBehindThePeersStopsIsTheRoot(t *testing.T) {
	h, job := recreateGang(t)
	eof := "zaya: stopped: lost rank 8 during the all-reduce at step 120: EOF\n"
	h.setPod(t, "llm-0-0", exitedSaying("n0", trainingv1alpha1.ExitStopped, now, "", eof))
	h.setPod(t, "llm-0-2", exitedSaying("n2", trainingv1alpha1.ExitStopped, now, "", eof))
	h.setNode(t, "node-llm-0-1", func(n *corev1.Node) { n.Status.Conditions[0].Status = corev1.ConditionUnknown })
	h.mustReconcile(t, job)
	f := h.get(t, job).Status.LastFailure
	if f == nil || *f.Rank != 1 || f.Category != "NodeLost" || f.Cascaded != 2 {
		t.Fatalf("lastFailure %+v: want rank 1's lost node, the root of 2 stops", f)
	}
}

// Ranks that stopped over a peer whose node is gone but still Ready (the node lifecycle
// controller marks it after its grace period, 50 s by default): the node's Lease says it is
// gone. While the Lease may still lapse the judgment waits, so the new gang is not placed on a
// dead node that looks Ready; a Lease renewed since the stops means a live node.
func TestALapsedLeaseBehindThePeersStopsIsTheRoot(t *testing.T) {
	eof := "zaya: stopped: lost rank 8 during the all-reduce at step 120: EOF\n"
	lease := func(h *harness, renewed time.Time) {
		t.Helper()
		l := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: "node-llm-0-1", Namespace: corev1.NamespaceNodeLease},
			Spec: coordinationv1.LeaseSpec{LeaseDurationSeconds: ptr.To[int32](40), RenewTime: ptr.To(metav1.NewMicroTime(renewed))}}
		_ = h.r.Delete(context.Background(), l)
		if err := h.r.Create(context.Background(), l); err != nil {
			t.Fatal(err)
		}
	}
	stops := func(h *harness) {
		h.setPod(t, "llm-0-0", exitedSaying("n0", trainingv1alpha1.ExitStopped, now.Add(-3*time.Second), "", eof))
		h.setPod(t, "llm-0-2", exitedSaying("n2", trainingv1alpha1.ExitStopped, now.Add(-3*time.Second), "", eof))
	}

	t.Run("lapsed", func(t *testing.T) {
		h, job := recreateGang(t)
		lease(h, now.Add(-25*time.Second)) // stale after 20 s
		stops(h)
		h.mustReconcile(t, job)
		st := h.get(t, job).Status
		f := st.LastFailure
		if f == nil || *f.Rank != 1 || f.Reason != trainingv1alpha1.FailureReasonNodeLost || f.Category != "NodeLost" || f.Cascaded != 2 ||
			!strings.Contains(f.Message, "node node-llm-0-1 stopped renewing its Lease (last renewed 25s ago)") {
			t.Fatalf("lastFailure %+v: want rank 1's lost node, the root of 2 stops", f)
		}
		if len(st.QuarantinedNodes) != 1 || st.QuarantinedNodes[0].Name != "node-llm-0-1" {
			t.Errorf("quarantined %+v: the new gang must avoid the lost node", st.QuarantinedNodes)
		}
	})

	t.Run("lapsing", func(t *testing.T) {
		h, job := recreateGang(t)
		lease(h, now.Add(-8*time.Second)) // not renewed since the stops 3 s ago: may be lost
		stops(h)
		res := h.mustReconcile(t, job)
		if st := h.get(t, job).Status; st.Restarts != 0 || st.LastFailure != nil {
			t.Fatalf("restarts %d, lastFailure %+v: judged before the Lease could lapse", st.Restarts, st.LastFailure)
		}
		if res.RequeueAfter != 12*time.Second {
			t.Errorf("requeue after %s, want 12s, when the Lease lapses", res.RequeueAfter)
		}
		h.r.Clock = clockAt(now.Add(12 * time.Second))
		h.mustReconcile(t, job)
		if f := h.get(t, job).Status.LastFailure; f == nil || *f.Rank != 1 || f.Reason != trainingv1alpha1.FailureReasonNodeLost {
			t.Fatalf("lastFailure %+v: want rank 1's lost node once its Lease lapsed", f)
		}
	})

	// The node shut down (docker stop, a host powering off): its kubelet's last report has
	// rank 1 stopped by its own SIGTERM, and its peers over it.
	t.Run("shut down", func(t *testing.T) {
		h, job := recreateGang(t)
		lease(h, now.Add(-25*time.Second))
		h.setPod(t, "llm-0-1", exitedSaying("node-llm-0-1", trainingv1alpha1.ExitStopped, now.Add(-4*time.Second), "",
			"checkpoint-step=40\nzaya: stopped: rank 1 was signalled at step 48\n"))
		peer := "checkpoint-step=40\nzaya: stopped: peer rank 1 was stopped at step 48\n"
		h.setPod(t, "llm-0-0", exitedSaying("n0", trainingv1alpha1.ExitStopped, now.Add(-3*time.Second), "", peer))
		h.setPod(t, "llm-0-2", exitedSaying("n2", trainingv1alpha1.ExitStopped, now.Add(-3*time.Second), "", peer))
		h.mustReconcile(t, job)
		st := h.get(t, job).Status
		if f := st.LastFailure; f == nil || *f.Rank != 1 || f.Reason != trainingv1alpha1.FailureReasonNodeLost ||
			len(st.QuarantinedNodes) != 1 || st.QuarantinedNodes[0].Name != "node-llm-0-1" {
			t.Fatalf("lastFailure %+v, quarantined %+v: want rank 1's lost node, kept off", f, st.QuarantinedNodes)
		}
	})

	// Exit times are whole seconds, cut down: the stops stamped 3 s ago happened up to a second
	// later, and a renewal in that second may have come before the node was lost.
	t.Run("renewed in the stops' second", func(t *testing.T) {
		h, job := recreateGang(t)
		lease(h, now.Add(-2500*time.Millisecond))
		stops(h)
		res := h.mustReconcile(t, job)
		if st := h.get(t, job).Status; st.Restarts != 0 || st.LastFailure != nil || res.RequeueAfter <= 0 {
			t.Fatalf("restarts %d, lastFailure %+v, requeue %v: a renewal in the stops' second proves nothing", st.Restarts, st.LastFailure, res.RequeueAfter)
		}
	})

	t.Run("renewed", func(t *testing.T) {
		h, job := recreateGang(t)
		lease(h, now.Add(-time.Second)) // renewed after the stops: the node is alive
		stops(h)
		h.mustReconcile(t, job)
		st := h.get(t, job).Status
		if f := st.LastFailure; f == nil || f.Reason == trainingv1alpha1.FailureReasonNodeLost || len(st.QuarantinedNodes) != 0 {
			t.Fatalf("lastFailure %+v, quarantined %+v: a live node's rank is no lost node", f, st.QuarantinedNodes)
		}
	})
}

// Of ranks that stopped over peers, the one that says which peer went silent names the root,
// though another stopped first (over the rank that gave up).
func TestTheStopThatNamesASilentPeerPointsAtTheRoot(t *testing.T) {
	h, job := recreateGang(t)
	h.setPod(t, "llm-0-0", exitedSaying("n0", trainingv1alpha1.ExitStopped, now, "", "zaya: stopped: lost rank 16 during the all-reduce at step 120: EOF\n"))
	h.setPod(t, "llm-0-2", exitedSaying("n2", trainingv1alpha1.ExitStopped, now.Add(time.Second), "",
		"zaya: stopped: lost rank 8 during the all-reduce at step 120: peer silent: no heartbeat from rank 8 for 5s\n"))
	h.mustReconcile(t, job)
	f := h.get(t, job).Status.LastFailure
	if f == nil || *f.Rank != 1 || f.Category != "Hang" {
		t.Fatalf("lastFailure %+v: want rank 1's hang", f)
	}
}

// Only stops over a peer so far: the operator waits a moment for the cause rather than blame a
// bystander, then decides.
func TestOnlyStopsOverAPeerWaitAMomentForTheirCause(t *testing.T) {
	h, job := recreateGang(t)
	h.setPod(t, "llm-0-0", exitedSaying("n0", trainingv1alpha1.ExitStopped, now, "", "zaya: stopped: lost rank 16 during the all-reduce at step 120: EOF\n"))
	res := h.mustReconcile(t, job)
	// Exit times are whole seconds: the grace runs from the end of the one stamped.
	if got := h.get(t, job); got.Status.Restarts != 0 || res.RequeueAfter <= 0 || res.RequeueAfter > recovery.CascadeGrace+time.Second {
		t.Fatalf("restarts %d, requeue %v: want a wait of at most %v", got.Status.Restarts, res.RequeueAfter, recovery.CascadeGrace+time.Second)
	}
	// The cause shows: rank 2 crashed.
	h.setPod(t, "llm-0-2", exitedSaying("n2", 139, now.Add(time.Second), "", "Segmentation fault"))
	h.mustReconcile(t, job)
	if f := h.get(t, job).Status.LastFailure; f == nil || *f.Rank != 2 {
		t.Fatalf("lastFailure %+v: want rank 2, the cause", f)
	}
	// Or nothing more shows: after the grace the stop is all there is.
	h2, job2 := recreateGang(t)
	h2.setPod(t, "llm-0-0", exitedSaying("n0", trainingv1alpha1.ExitStopped, now.Add(-recovery.CascadeGrace-time.Second), "", "zaya: stopped: lost rank 16: EOF\n"))
	h2.mustReconcile(t, job2)
	if got := h2.get(t, job2); got.Status.Restarts != 1 {
		t.Errorf("restarts %d after the grace, want 1", got.Status.Restarts)
	}
}

// A PyTorch rank killed (137, no words) and its peers' gloo collectives broken in the same
// second: each peer's traceback ends in "Connection reset by peer", which is a symptom, not
// the program's own error, so the killed rank is the root even though it is not the first
// rank in the listing and a peer's traceback would otherwise read as UserCode.
func TestAPeersConnectionResetIsNotTheRoot(t *testing.T) {
	h, job := recreateGang(t)
	reset := "Traceback (most recent call last):\n  File \"/app/train.py\", line 86, in main\n    loss.backward()\n" +
		"RuntimeError: [./gloo/transport/tcp/pair.cc:589] Read error [127.0.0.1]:26031: Connection reset by peer\n"
	h.setPod(t, "llm-0-0", exitedSaying("n0", 1, now, "", reset))
	h.setPod(t, "llm-0-1", exitedSaying("n1", 137, now, "", ""))
	h.setPod(t, "llm-0-2", exitedSaying("n2", 1, now, "", reset))
	h.mustReconcile(t, job)
	f := h.get(t, job).Status.LastFailure
	if f == nil || *f.Rank != 1 || *f.ExitCode != 137 || f.Cascaded != 2 {
		t.Fatalf("lastFailure %+v: want rank 1's exit 137, the root of 2 broken collectives", f)
	}
}

// A trainer torchrun's child was killed from outside: torchrun exits 1 with its own
// ChildFailedError traceback, which is not the user's code (PyTorch 1.13, as printed).
func TestATorchrunChildKilledIsKilledNotUserCode(t *testing.T) {
	h, job := recreateGang(t)
	reset := "RuntimeError: [./gloo/transport/tcp/pair.cc:589] Read error [127.0.0.1]:26031: Connection reset by peer\n"
	killed := "ERROR:torch.distributed.elastic.multiprocessing.api:failed (exitcode: -9) local_rank: 0 (pid: 7697) of binary: /usr/bin/python3.11\n" +
		"Traceback (most recent call last):\n  File \"/usr/bin/torchrun\", line 33, in <module>\n" +
		"torch.distributed.elastic.multiprocessing.errors.ChildFailedError: \n" +
		"Root Cause (first observed failure):\n[0]:\n  exitcode  : -9 (pid: 7697)\n  traceback : Signal 9 (SIGKILL) received by PID 7697\n"
	h.setPod(t, "llm-0-0", exitedSaying("n0", 1, now, "", reset))
	h.setPod(t, "llm-0-1", exitedSaying("n1", 1, now, "", killed))
	h.setPod(t, "llm-0-2", exitedSaying("n2", 1, now, "", reset))
	h.mustReconcile(t, job)
	f := h.get(t, job).Status.LastFailure
	if f == nil || *f.Rank != 1 || f.Category != "Killed" || f.Rule != "torchrun-child-signalled" || f.Cascaded != 2 {
		t.Fatalf("lastFailure %+v: want rank 1, Killed by rule torchrun-child-signalled, the root of 2 broken collectives", f)
	}
}
