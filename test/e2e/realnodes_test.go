//go:build e2e

package e2e

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	trainingv1alpha1 "github.com/zaya-operator/zaya-operator/api/v1alpha1"
	"github.com/zaya-operator/zaya-operator/workers/train"
)

const (
	// realSteps is how long the recovery matrix's jobs train: a few minutes on kind.
	realSteps = 400
)

// realJob is the reference worker on kind's nodes (trainNodes ranks, one ring), with a
// checkpoint share; a test may change it before it is created.
func realJob(t *testing.T, ns, name string) (*trainingv1alpha1.ZayaTrainingJob, string) {
	t.Helper()
	procs := w.processes(t, int(trainNodes)+1)
	dir := procs.sharedClaim(t, ns, name)
	job := trainingJob(procs, ns, name, name, realSteps)
	job.Spec.FaultTolerance.MaxRestarts = ptr.To[int32](5)
	return job, dir
}

// kindOnly skips a test whose faults only a kind cluster can play.
func kindOnly(t *testing.T, why string) {
	t.Helper()
	if !w.kind() {
		t.Skip("kind only: " + why)
	}
}

// rankPod is the live pod of a rank: of the newest attempt that has one (a rank replaced in
// place keeps its attempt), not deleted, not finished.
func rankPod(g Gomega, job *trainingv1alpha1.ZayaTrainingJob, rank int) corev1.Pod {
	list := &corev1.PodList{}
	g.Expect(k8sClient.List(context.Background(), list, client.InNamespace(job.Namespace),
		client.MatchingLabels{trainingv1alpha1.JobNameLabel: job.Name, trainingv1alpha1.RankLabel: fmt.Sprint(rank)})).To(Succeed())
	var found *corev1.Pod
	for i, p := range list.Items {
		if _, spare := p.Labels[trainingv1alpha1.SpareLabel]; spare || !p.DeletionTimestamp.IsZero() ||
			p.Status.Phase == corev1.PodFailed || p.Status.Phase == corev1.PodSucceeded {
			continue
		}
		if found == nil || attemptOf(&p) > attemptOf(found) {
			found = &list.Items[i]
		}
	}
	g.Expect(found).NotTo(BeNil(), "no live pod of rank %d", rank)
	return *found
}

func attemptOf(p *corev1.Pod) int {
	a, _ := strconv.Atoi(p.Labels[trainingv1alpha1.AttemptLabel])
	return a
}

// workerRun is one run of a rank's worker: its pod and how often the kubelet had restarted the
// container before it.
type workerRun struct {
	pod      string
	uid      string
	restarts int32
}

func rank0Run(g Gomega, job *trainingv1alpha1.ZayaTrainingJob) workerRun {
	p := rankPod(g, job, 0)
	r := workerRun{pod: p.Name, uid: string(p.UID)}
	for _, s := range p.Status.ContainerStatuses {
		if s.Name == "worker" {
			r.restarts = s.RestartCount
		}
	}
	return r
}

// currentLog is the worker log of the pod's current container, as the kubelet keeps it.
func currentLog(ns, pod string) string {
	b, err := clients.CoreV1().Pods(ns).GetLogs(pod, &corev1.PodLogOptions{Container: "worker"}).Do(context.Background()).Raw()
	if err != nil {
		return ""
	}
	return string(b)
}

// podUIDs are the job's pods, spares and terminating ones included.
func podUIDs(g Gomega, job *trainingv1alpha1.ZayaTrainingJob) map[string]bool {
	list := &corev1.PodList{}
	g.Expect(k8sClient.List(context.Background(), list, client.InNamespace(job.Namespace),
		client.MatchingLabels{trainingv1alpha1.JobNameLabel: job.Name})).To(Succeed())
	out := map[string]bool{}
	for _, p := range list.Items {
		out[string(p.UID)] = true
	}
	return out
}

var (
	referenceOnce   sync.Once
	referenceParams []byte
	referenceErr    error
)

// reference trains the job once with no fault and returns its final parameters: every
// faulted run must end with the same bytes.
func reference(t *testing.T) []byte {
	t.Helper()
	referenceOnce.Do(func() {
		ns := newNamespace(t)
		job, dir := realJob(t, ns, "reference")
		if err := k8sClient.Create(context.Background(), job); err != nil {
			referenceErr = err
			return
		}
		started := time.Now()
		waitSucceeded(t, job, 5*time.Minute)
		t.Logf("uninterrupted run: %d steps in %v", realSteps, time.Since(started).Round(time.Second))
		referenceParams, referenceErr = os.ReadFile(filepath.Join(dir, "final-params"))
	})
	if referenceErr != nil {
		t.Fatalf("the uninterrupted run: %v", referenceErr)
	}
	return referenceParams
}

// nodeFault is a fault played on the node of the victim rank, and what the operator must make
// of it.
type nodeFault struct {
	name string
	mode trainingv1alpha1.RestartMode
	// supervise runs the worker under zaya-supervisor (inPlaceMechanism: Supervisor).
	supervise bool
	// injected leaves the worker's command plain for the operator to put the supervisor in
	// front of it (faultTolerance.supervisor Inject: the chart is installed with the worker
	// image as its supervisor image).
	injected bool
	inject   func(t *testing.T, g Gomega, node string)
	// replaced is how many pods an in-place restart replaces; a recreate replaces them all.
	replaced int
	category string
	// decided, if set, is in the failure's message: how the operator knew.
	decided string
	// blip first drops the victim's node's packets, its pods' included, for less than the
	// peer timeout: nothing may restart for it.
	blip bool
	// rank0 plays the fault on rank 0's node (the gang watch's hub's) rather than rank 1's.
	rank0 bool
	// heal, if set, ends the fault as soon as the gang trains again (a partition that
	// heals): the old rank's processes must then go, and write no checkpoint meanwhile.
	heal func(t *testing.T, g Gomega, node string)
}

func killWorker(sig string) func(t *testing.T, g Gomega, node string) {
	return func(t *testing.T, g Gomega, node string) {
		// The worker is the process named zaya-worker inside the node (one rank per node);
		// the kubelet and containerd see it die (or stop) as on a real host.
		out, err := docker("exec", node, "pkill", "-"+sig, "-x", "zaya-worker")
		g.Expect(err).NotTo(HaveOccurred(), out)
	}
}

// cutNode takes the node off the cluster's network: its kubelet and its rank lose every peer.
// Its kubelet runs on alone: it restarts the containers that end, as their restart rules say,
// and learns nothing of the pods deleted meanwhile until the node is back (the test's end, or
// reconnectNode).
func cutNode(t *testing.T, g Gomega, node string) {
	ip, err := docker("inspect", "-f", "{{.NetworkSettings.Networks.kind.IPAddress}}", node)
	g.Expect(err).NotTo(HaveOccurred(), ip)
	out, err := docker("network", "disconnect", "kind", node)
	g.Expect(err).NotTo(HaveOccurred(), out)
	cutFrom.Store(node, strings.TrimSpace(ip))
	t.Cleanup(func() { reconnectNode(t, node) })
}

// cutFrom is each node's address on kind's network before cutNode took it off.
var cutFrom sync.Map

// reconnectNode puts a node cutNode took off back on the network (once) and waits for it to
// be Ready.
func reconnectNode(t *testing.T, node string) {
	v, cut := cutFrom.LoadAndDelete(node)
	if !cut {
		return
	}
	ip := v.(string)
	back := time.Now()
	if out, err := docker("network", "connect", "kind", node); err != nil {
		t.Errorf("reconnecting %s: %v\n%s", node, err, out)
		return
	}
	// Docker may hand out another address (the network's subnet is not the user's): kind's
	// entrypoint moves a node's own configuration to its new address at boot. Either way
	// the node's routes to the other nodes' pods went with its interface: the cluster
	// script routes every node again.
	if now, _ := docker("inspect", "-f", "{{.NetworkSettings.Networks.kind.IPAddress}}", node); strings.TrimSpace(now) != ip {
		t.Logf("%s came back as %s (was %s): restarting it", node, strings.TrimSpace(now), ip)
		if out, err := docker("restart", node); err != nil {
			t.Errorf("restarting %s: %v\n%s", node, err, out)
		}
	}
	k := w.(*kindWorld)
	if out, err := command(k.clusterScript, "up", fmt.Sprint(k.workers)); err != nil {
		t.Errorf("routing the pod network again: %v\n%s", err, out)
	}
	waitNodeBack(t, node, back)
}

const (
	// defaultPeerTimeout is the reference worker's and the gang watch's (5 s).
	defaultPeerTimeout = 5 * time.Second
	// blipFor is a network blip, shorter than the peer timeout.
	blipFor = 2 * time.Second
)

// blipNode drops every packet in, out of and through the node (its pods' traffic passes
// FORWARD) for d, as a flapping link or a switch's failover would, then lets them pass again:
// TCP retransmits and every connection lives on.
func blipNode(t *testing.T, g Gomega, node string, d time.Duration) {
	const chains = "INPUT OUTPUT FORWARD"
	script := fmt.Sprintf(`for c in %[1]s; do iptables -w -I $c 1 -j DROP; done; sleep %[2]g; for c in %[1]s; do iptables -w -D $c -j DROP; done`, chains, d.Seconds())
	t.Cleanup(func() { // the rules gone whatever became of the script
		_, _ = docker("exec", node, "sh", "-c", fmt.Sprintf(`for c in %s; do while iptables -w -D $c -j DROP 2>/dev/null; do :; done; done`, chains))
	})
	out, err := docker("exec", node, "sh", "-c", script)
	g.Expect(err).NotTo(HaveOccurred(), out)
}

// TestRecoveryOnRealKubelets trains the reference worker on kind and plays one fault per
// subtest on rank 1's node (rank 0's, the hub's, for the cut that heals) mid-training: the job restarts (in place by the real kubelet's
// container restart rules, or under zaya-supervisor, or recreated), blames rank 1 with the
// fault's category, replaces only the pods it must, trains again from the last checkpoint and
// ends with parameters bit-identical to an uninterrupted run's. Each subtest logs the time
// from the fault to every rank running and to rank 0 training steps again.
func TestRecoveryOnRealKubelets(t *testing.T) {
	kindOnly(t, "the faults are Docker's (a node's container stopped, paused, cut off) and the kubelet's (restart rules, probes); kwok's process nodes play them in TestTrainingJobSurvivesChaos")
	want := reference(t)
	ranks := int(trainNodes)
	frozen := func(t *testing.T, g Gomega, node string) { kindProcesses{w.(*kindWorld)}.freeze(t, g, node) }
	inPlace, recreate := trainingv1alpha1.RestartModeInPlace, trainingv1alpha1.RestartModeRecreate
	for _, f := range []nodeFault{
		{name: "worker-killed/in-place", mode: inPlace, inject: killWorker("KILL"), replaced: 0, category: "Unknown"},
		{name: "worker-killed/supervisor", mode: inPlace, supervise: true, inject: killWorker("KILL"), replaced: 0, category: "Unknown"},
		{name: "worker-killed/injected", mode: inPlace, injected: true, inject: killWorker("KILL"), replaced: 0, category: "Unknown"},
		{name: "worker-killed/recreate", mode: recreate, inject: killWorker("KILL"), replaced: ranks, category: "Unknown"},
		{name: "worker-hung/in-place", mode: inPlace, inject: killWorker("STOP"), replaced: 1, category: "Hang"},
		{name: "node-stopped/in-place", mode: inPlace, inject: w.loseNode, replaced: 1, category: "NodeLost"},
		{name: "node-stopped/recreate", mode: recreate, inject: w.loseNode, replaced: ranks, category: "NodeLost"},
		// Under the injected supervisor (the chart's default) the operator asks the rank its
		// peers found silent, and does not wait for the kubelet's Lease
		// (docs/design/fast-node-loss.md); the Lease alone decides node-stopped/in-place here
		// and the frozen node without the supervisor on the process nodes.
		{name: "node-frozen/injected", mode: inPlace, injected: true, inject: frozen, replaced: 1, category: "NodeLost", decided: asked, blip: true},
		// Rank 0's node, the hub's, is cut off and comes back while the new gang trains.
		{name: "network-cut/injected", mode: inPlace, injected: true, inject: cutNode, replaced: 1, category: "NodeLost", decided: asked,
			rank0: true, heal: func(t *testing.T, _ Gomega, node string) { reconnectNode(t, node) }},
		{name: "gpu-unhealthy/in-place", mode: inPlace, inject: w.unhealthyGPU, replaced: 1, category: "GPUHardware"},
	} {
		t.Run(f.name, func(t *testing.T) { faultRun(t, f, want) })
	}
}

// asked is how a node fault's failure reads when the operator asked the rank's supervisor.
const asked = "its supervisor did not answer the operator while a peer's did"

func faultRun(t *testing.T, f nodeFault, want []byte) {
	g := NewWithT(t)
	ctx := context.Background()
	ns := newNamespace(t)
	job, dir := realJob(t, ns, "faulted")
	job.Spec.FaultTolerance.RestartMode = f.mode
	if f.supervise {
		job.Spec.FaultTolerance.InPlaceMechanism = trainingv1alpha1.InPlaceMechanismSupervisor
		kindProcesses{}.supervise(t, &job.Spec.Template.Spec.Containers[0])
	}
	if f.injected {
		job.Spec.FaultTolerance.Supervisor = trainingv1alpha1.SupervisorInject
	}
	if f.blip {
		// Slower steps (the same sums: a step's pace is only a wait), so that the blip and
		// the quiet after it leave the fault most of the job's steps on any machine.
		c := &job.Spec.Template.Spec.Containers[0]
		c.Args = append(c.Args, "-pace=75ms")
	}
	g.Expect(k8sClient.Create(ctx, job)).To(Succeed())
	waitRunningWithin(g, job, 0, 3*time.Minute)
	if f.injected {
		// The real kubelet ran the init container and the copied binary.
		p := rankPod(g, job, 0)
		g.Expect(p.Spec.Containers[0].Command).To(Equal([]string{"/zaya/bin/zaya-supervisor", "--", "zaya-worker"}))
		g.Expect(p.Status.InitContainerStatuses).To(ContainElement(HaveField("State.Terminated.ExitCode", BeZero())))
	}

	before := rank0Run(g, job)
	g.Eventually(func() int64 { return train.ParseLog(currentLog(ns, before.pod)).Last }, 3*time.Minute, 100*time.Millisecond).
		Should(BeNumerically(">=", 2*ckptEvery+5), "no progress")
	victimRank := 1
	if f.rank0 {
		victimRank = 0
	}
	victim := rankPod(g, job, victimRank)
	node := victim.Spec.NodeName
	pods := podUIDs(g, job)
	atStep := train.ParseLog(currentLog(ns, before.pod)).Last
	oldAttempt := newestAttempt(g, dir)
	if f.blip {
		// A blip shorter than the peer timeout: the gang stalls and trains on, no restart,
		// no pod replaced, no ask (docs/design/fast-node-loss.md: the peers name no one).
		blipNode(t, g, node, blipFor)
		g.Consistently(func(g Gomega) {
			j := getJob(g, job)
			g.Expect(j.Status.Restarts).To(BeZero(), "a blip restarted the gang: %+v", j.Status.LastFailure)
			g.Expect(rank0Run(g, job)).To(Equal(before))
		}, defaultPeerTimeout+3*time.Second, time.Second).Should(Succeed())
		g.Expect(podUIDs(g, job)).To(Equal(pods), "a blip replaced pods")
		now := train.ParseLog(currentLog(ns, before.pod)).Last
		g.Expect(now).To(BeNumerically(">", atStep), "no step trained since the blip")
		atStep = now
		t.Logf("%s: a %v blip on %s: no restart; rank 0 at step %d", f.name, blipFor, node, atStep)
	}
	t.Logf("%s on %s (rank %d, pod %s) at rank 0's step %d, checkpoint attempt %d", f.name, node, victimRank, victim.Name, atStep, oldAttempt)
	if f.heal != nil {
		g.Expect(kindProcesses{}.running(g, node)).To(ContainElement(string(victim.UID)), "the victim's processes are not seen where they run")
	}
	injected := time.Now()
	f.inject(t, g, node)
	// Docker's own time to play the fault (a pause freezes every task of the node, a kill
	// tears the node down): the gang stops somewhere within it, and the recovery timeline
	// counts from the gang's last step instead.
	t.Logf("%s: the fault took %v to play", f.name, time.Since(injected).Round(10*time.Millisecond))

	got := waitRunningWithin(g, job, 1, 4*time.Minute)
	recovery := time.Since(injected)
	var after workerRun
	var resumed int64
	g.Eventually(func(g Gomega) {
		after = rank0Run(g, job)
		g.Expect(after).NotTo(Equal(before), "rank 0 still runs the process the fault found")
		p := train.ParseLog(currentLog(ns, after.pod))
		g.Expect(p.Resumed).To(BeNumerically(">", 0), "rank 0's new run did not resume from a checkpoint")
		g.Expect(p.Last).To(BeNumerically(">", p.Resumed))
		resumed = p.Resumed
	}, 3*time.Minute, 100*time.Millisecond).Should(Succeed())
	advancing := time.Since(injected)
	var written []string
	if f.heal != nil {
		// The old rank's processes ran on alone (its kubelet restarts what ends); once its
		// node is back, its kubelet learns the pod was replaced and stops them.
		written = attemptFiles(g, dir, oldAttempt)
		f.heal(t, g, node)
		g.Eventually(func(g Gomega) []string { return kindProcesses{}.running(g, node) }, 2*time.Minute, time.Second).
			ShouldNot(ContainElement(string(victim.UID)), "the replaced rank's containers outlived its node's return")
		t.Logf("%s: the node back and the replaced rank's containers gone %v after the fault", f.name, time.Since(injected).Round(10*time.Millisecond))
	}

	replaced := 0
	for uid := range podUIDs(g, job) {
		if !pods[uid] {
			replaced++
		}
	}
	lf := got.Status.LastFailure
	g.Expect(lf).NotTo(BeNil())
	t.Logf("%s: running again after %v, training again after %v, resumed at step %d (fault at %d), %d pods replaced, blamed rank %v on %s: %s/%s (%s); %s",
		f.name, recovery.Round(10*time.Millisecond), advancing.Round(10*time.Millisecond), resumed, atStep, replaced,
		ptr.Deref(lf.Rank, -1), lf.Node, lf.Reason, lf.Category, lf.Message, recoveryTimeline(g, job))
	// Under a supervisor too (its own mechanism or injected): the killed worker's supervisor
	// keeps the worker's exit, which came before the gang's stop reached it (it used to take
	// the stop, exit 75 like its peer, and the peer was blamed: 1 run in 3).
	g.Expect(lf.Rank).To(HaveValue(Equal(int32(victimRank))), "the root rank")
	g.Expect(lf.Category).To(Equal(f.category))
	if f.decided != "" {
		g.Expect(lf.Message).To(ContainSubstring(f.decided))
	}
	g.Expect(got.Status.LastRestartMode).To(Equal(f.mode))
	wantReplaced := f.replaced
	if f.mode == trainingv1alpha1.RestartModeRecreate {
		wantReplaced = int(job.Spec.Nodes)
	}
	g.Expect(replaced).To(Equal(wantReplaced), "pods replaced")
	g.Expect(atStep-resumed).To(BeNumerically("<=", ckptEvery+1), "steps lost")

	if f.mode == trainingv1alpha1.RestartModeInPlace && f.replaced == 0 && !f.supervise && !f.injected {
		// The kubelet restarted the killed worker in its pod: kubectl zaya logs --root
		// reads the run that failed.
		rootLogs(t, g, got)
	}

	final := waitSucceeded(t, job, 5*time.Minute)
	g.Expect(final.Status.Restarts).To(Equal(int32(1)))
	params, err := os.ReadFile(filepath.Join(dir, "final-params"))
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(bytes.Equal(params, want)).To(BeTrue(), "final parameters differ from the uninterrupted run's")
	if f.heal != nil {
		g.Expect(written).To(ContainElements(attemptFiles(g, dir, oldAttempt)), "the replaced rank's old run wrote checkpoint files after the fault healed")
	}
	fmt.Printf("kind-recovery %-26s running-again %8v training-again %8v pods-replaced %d lost-steps %d\n",
		f.name, recovery.Round(10*time.Millisecond), advancing.Round(10*time.Millisecond), replaced, atStep-resumed)
}

// TestHangCaughtByTheKubeletsProbe freezes the only rank of a one-node job: no peer is left to
// notice, so only the heartbeat probe the operator adds can. The real kubelet runs it (sh,
// date and stat in the worker image), the probe writes its "zaya: hang:" line to the
// termination log and fails, the kubelet kills the worker, and the operator must read the
// line as a Hang of rank 0 and bring the job back to finish.
func TestHangCaughtByTheKubeletsProbe(t *testing.T) {
	kindOnly(t, "the probe is run by the real kubelet from the worker image; the node agent runs it in TestTrainingJobSurvivesChaos's hangs")
	g := NewWithT(t)
	ctx := context.Background()
	ns := newNamespace(t)
	job, _ := realJob(t, ns, "alone")
	job.Spec.Nodes, job.Spec.Parallelism.ContextParallel = 1, 1
	job.Spec.FaultTolerance.RestartMode = trainingv1alpha1.RestartModeInPlace
	g.Expect(k8sClient.Create(ctx, job)).To(Succeed())
	waitRunningWithin(g, job, 0, 3*time.Minute)

	before := rankPod(g, job, 0)
	g.Eventually(func() int64 { return train.ParseLog(currentLog(ns, before.Name)).Last }, 3*time.Minute, 100*time.Millisecond).
		Should(BeNumerically(">=", ckptEvery+5), "no progress")
	t.Logf("freezing the worker on %s (pod %s)", before.Spec.NodeName, before.Name)
	injected := time.Now()
	killWorker("STOP")(t, g, before.Spec.NodeName)
	defer func() {
		if t.Failed() {
			out, _ := kubectl("get", "pods", "-n", ns, "-o", "yaml")
			t.Logf("the job's pods:\n%s", out)
		}
	}()

	got := waitRunningWithin(g, job, 1, 3*time.Minute)
	lf := got.Status.LastFailure
	g.Expect(lf).NotTo(BeNil())
	t.Logf("probe: running again after %v, blamed rank %v: %s/%s (%s)", time.Since(injected).Round(10*time.Millisecond),
		ptr.Deref(lf.Rank, -1), lf.Reason, lf.Category, lf.Message)
	g.Expect(lf.Rank).To(HaveValue(Equal(int32(0))))
	g.Expect(lf.Category).To(Equal("Hang"))
	// The hang was the probe's verdict, read from the line it left in the termination log the
	// kubelet kept, not a crash the operator guessed at.
	g.Expect(lf.Reason).To(Equal(trainingv1alpha1.FailureReasonHang))
	g.Expect(lf.Message).To(ContainSubstring("zaya: hang:"))
	final := waitSucceeded(t, job, 5*time.Minute)
	g.Expect(final.Status.Restarts).To(Equal(int32(1)))
}
