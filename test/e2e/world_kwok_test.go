//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	trainingv1alpha1 "github.com/zaya-operator/zaya-operator/api/v1alpha1"
	"github.com/zaya-operator/zaya-operator/internal/testjob"
	"github.com/zaya-operator/zaya-operator/test/nodeagent"
)

// agentLabel marks (and taints) the node agent's process-backed nodes.
const agentLabel = "zaya.dev/process-node"

// kwokWorld is hack/e2e.sh's cluster: kwok plays the kubelet of fake nodes, and what a test
// does to them is written to the API server as their kubelet would write it.
type kwokWorld struct{}

func (kwokWorld) kind() bool { return false }

// idle: a kwok pod runs nothing and stays Running until its status says otherwise.
func (kwokWorld) idle(*trainingv1alpha1.ZayaTrainingJob) {}

func (kwokWorld) idleContainer(*corev1.Container) {}

// exitWorker writes the exit as the pod's kubelet would report it.
func (kwokWorld) exitWorker(g Gomega, pod corev1.Pod, code int32) {
	patch := client.MergeFrom(pod.DeepCopy())
	pod.Status.Phase = corev1.PodFailed
	pod.Status.ContainerStatuses = []corev1.ContainerStatus{{
		Name: "worker", Image: pod.Spec.Containers[0].Image,
		State: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{
			ExitCode: code, Reason: "Error", FinishedAt: metav1.Now(), Message: "checkpoint-step=300",
		}},
	}}
	g.Expect(k8sClient.Status().Patch(context.Background(), &pod, patch)).To(Succeed())
}

// loseNode: kwok stops minding the node and its Ready turns Unknown.
func (kwokWorld) loseNode(t *testing.T, g Gomega, node string) {
	patchNode(t, g, node,
		func(n *corev1.Node) {
			n.Labels["zaya.dev/fault"] = "down"
			for i := range n.Status.Conditions {
				if n.Status.Conditions[i].Type == corev1.NodeReady {
					n.Status.Conditions[i].Status = corev1.ConditionUnknown
					n.Status.Conditions[i].Reason = "NodeStatusUnknown"
				}
			}
		},
		func(n *corev1.Node) { delete(n.Labels, "zaya.dev/fault") })
}

// unhealthyGPU writes what AMD's device plugin makes the kubelet report.
func (kwokWorld) unhealthyGPU(t *testing.T, g Gomega, node string) {
	patchNode(t, g, node,
		func(n *corev1.Node) { n.Status.Allocatable["amd.com/gpu"] = resource.MustParse("7") },
		func(n *corev1.Node) { n.Status.Allocatable["amd.com/gpu"] = resource.MustParse("8") })
}

// claimVolumes: hack/cluster.sh made shared volumes for any claim.
func (kwokWorld) claimVolumes(*testing.T, string, ...string) {}

// patchNode changes a node and restores it when the test ends (the cluster is shared).
func patchNode(t *testing.T, g Gomega, name string, mutate func(*corev1.Node), restore func(*corev1.Node)) {
	t.Helper()
	ctx := context.Background()
	// Metadata and status are separate writes, each from its own copy: a patch's response
	// overwrites the object it was given.
	change := func(f func(*corev1.Node)) error {
		n := &corev1.Node{}
		if err := k8sClient.Get(ctx, client.ObjectKey{Name: name}, n); err != nil {
			return err
		}
		meta, status := n.DeepCopy(), n.DeepCopy()
		f(meta)
		f(status)
		if err := k8sClient.Patch(ctx, meta, client.MergeFrom(n)); err != nil {
			return err
		}
		return k8sClient.Status().Patch(ctx, status, client.MergeFrom(n))
	}
	g.Expect(change(mutate)).To(Succeed())
	t.Cleanup(func() { _ = change(restore) })
}

// processes starts a node agent with n process-backed MI300X nodes for this test.
func (kwokWorld) processes(t *testing.T, n int) processNodes {
	return kwokProcesses{processCluster(t, n)}
}

func (kwokWorld) kubeletProcesses(t *testing.T, n int) processNodes {
	return kwokProcesses{processCluster(t, n, 40*time.Second)}
}

// processCluster starts an agent playing n nodes; lease, if given, is their Lease's duration.
func processCluster(t *testing.T, n int, lease ...time.Duration) *nodeagent.Agent {
	t.Helper()
	worker := os.Getenv("ZAYA_E2E_WORKER")
	if worker == "" {
		t.Fatal("ZAYA_E2E_WORKER (the zaya-worker binary) is not set: run through make test-e2e")
	}
	cs := clientset(t)
	nodes := make([]string, n)
	stamp := time.Now().UnixNano() % 100000
	for i := range nodes {
		nodes[i] = fmt.Sprintf("proc-%d-%d", stamp, i)
	}
	ctx, cancel := context.WithCancel(context.Background())
	opts := nodeagent.Options{
		Client: cs, Nodes: nodes, WorkDir: t.TempDir(),
		Labels: map[string]string{agentLabel: "true"},
		Taints: []corev1.Taint{{Key: agentLabel, Value: "true", Effect: corev1.TaintEffectNoSchedule}},
		Commands: map[string]string{"zaya-worker": worker, "zaya-supervisor": os.Getenv("ZAYA_E2E_SUPERVISOR"), "sh": "/bin/sh",
			"torchrun": debianTorchrun},
		// A kubelet configured with crashLoopBackOff.maxContainerRestartPeriod: 1s (KEP-4603):
		// a default one waits 10 s before a container's second in-place restart within 10 min.
		MaxContainerRestartPeriod: time.Second,
		// A lost node turns NotReady 5 s after its kubelet died, before its Lease lapses (10 s):
		// a Recreate judged between the peers' stops and the lapse has been seen, under CI's
		// load, to place the new gang on the dead node and restart twice (known, open). The real
		// grace (50 s, the Lease first) is played on kind.
		NodeMonitorGracePeriod: 5 * time.Second,
		// Pod DNS names resolved as a cluster's DNS does, when they are dialled, where this
		// machine lets the test write /etc/hosts (CI does): a restarted peer reaches a
		// replaced rank 0 at its new address.
		HostsFile: hostsFile(t),
		Logf:      t.Logf,
	}
	if len(lease) > 0 {
		opts.LeaseDuration = lease[0]
	}
	a, err := nodeagent.Start(ctx, opts)
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cancel()
		if err := a.RemoveHosts(); err != nil {
			t.Errorf("taking the pods' names out of /etc/hosts: %v", err)
		}
		for _, n := range nodes {
			_ = cs.CoreV1().Nodes().Delete(context.Background(), n, metav1.DeleteOptions{})
		}
	})
	return a
}

// hostsFile is /etc/hosts where the test may write it, else "" (names resolved as processes
// start: a peer that retries a replaced pod keeps its old address).
func hostsFile(t *testing.T) string {
	f, err := os.OpenFile("/etc/hosts", os.O_WRONLY, 0)
	if err != nil {
		t.Logf("pod DNS names go into processes' environment as addresses (/etc/hosts: %v)", err)
		return ""
	}
	_ = f.Close()
	return "/etc/hosts"
}

// kwokProcesses are a node agent's nodes: pods run host binaries, their files are the
// agent's folders.
type kwokProcesses struct{ a *nodeagent.Agent }

func (kwokProcesses) place(ps *corev1.PodSpec) {
	ps.NodeSelector = map[string]string{agentLabel: "true"}
	ps.Tolerations = []corev1.Toleration{{Key: agentLabel, Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoSchedule}}
}

// placeTorch: the host's torchrun (the agent runs host commands), gloo over loopback (the
// nodes share a host).
func (p kwokProcesses) placeTorch(t testing.TB, job *trainingv1alpha1.ZayaTrainingJob) {
	t.Helper()
	if out, err := exec.Command("/usr/bin/python3", "-c", "import torch").CombinedOutput(); err != nil {
		t.Fatalf("Debian's PyTorch is needed (apt-get install python3-torch; .ci/run installs it): %v\n%s", err, out)
	}
	job.Spec.Network.SocketIfname = "lo"
	p.place(&job.Spec.Template.Spec)
}

// supervise runs the command under zaya-supervisor, as an image whose entrypoint wraps its
// worker would (the process-backed node runs host binaries: the worker is named by its path).
func (kwokProcesses) supervise(t testing.TB, c *corev1.Container) {
	t.Helper()
	if os.Getenv("ZAYA_E2E_SUPERVISOR") == "" {
		t.Fatal("ZAYA_E2E_SUPERVISOR (the zaya-supervisor binary) is not set: run through make test-e2e")
	}
	cmd := slices.Clone(c.Command)
	if len(cmd) > 0 && cmd[0] == "zaya-worker" {
		cmd[0] = os.Getenv("ZAYA_E2E_WORKER")
	}
	c.Command = append([]string{"zaya-supervisor", "--"}, cmd...)
}

// inject names the worker by its path, for the supervisor the operator puts in front of it
// (the node agent runs ZAYA_E2E_SUPERVISOR for the copy its init container would make).
func (kwokProcesses) inject(t testing.TB, c *corev1.Container) {
	t.Helper()
	if os.Getenv("ZAYA_E2E_SUPERVISOR") == "" {
		t.Fatal("ZAYA_E2E_SUPERVISOR (the zaya-supervisor binary) is not set: run through make test-e2e")
	}
	if len(c.Command) > 0 && c.Command[0] == "zaya-worker" {
		c.Command = append([]string{os.Getenv("ZAYA_E2E_WORKER")}, c.Command[1:]...)
	}
}

// sharedClaim is a claim bound to a volume of its own (the agent backs it with a folder).
func (p kwokProcesses) sharedClaim(t testing.TB, ns, name string) string {
	t.Helper()
	g := NewWithT(t)
	ctx := context.Background()
	pv, pvc := testjob.SharedClaim(ns, name, "/tmp/zaya-"+ns+"-"+name, corev1.PersistentVolumeReclaimDelete)
	g.Expect(k8sClient.Create(ctx, pv)).To(Succeed())
	t.Cleanup(func() { _ = k8sClient.Delete(context.Background(), pv) })
	g.Eventually(func() error { return k8sClient.Create(ctx, pvc) }, timeout, interval).Should(Succeed())
	return p.a.VolumeDir(ns, name)
}

func (p kwokProcesses) nodeOf(ns, pod string) string { return p.a.NodeOf(ns, pod) }

func (p kwokProcesses) runLog(ns, pod string, restarts int32) string {
	dir := p.a.PodDir(ns, pod)
	if dir == "" {
		return ""
	}
	b, _ := os.ReadFile(nodeagent.RunLogPath(filepath.Join(dir, "worker.log"), restarts))
	return string(b)
}

func (p kwokProcesses) fault(g Gomega, ns, pod, fault string) {
	g.Expect(writeFault(p.a.PodDir(ns, pod), fault)).To(Succeed())
}

func (p kwokProcesses) down(_ *testing.T, g Gomega, node string) {
	g.Expect(p.a.NodeDown(context.Background(), node)).To(Succeed())
}

// kill SIGKILLs the pod's process, whatever it started (a session of its own).
func (p kwokProcesses) kill(g Gomega, ns, pod string) {
	g.Expect(p.a.Signal(ns, pod, syscall.SIGKILL)).To(Succeed())
}

func (p kwokProcesses) freeze(_ *testing.T, g Gomega, node string) {
	g.Expect(p.a.Freeze(node)).To(Succeed())
}

func (p kwokProcesses) thaw(_ *testing.T, g Gomega, node string) {
	g.Expect(p.a.Thaw(node)).To(Succeed())
}

func (p kwokProcesses) running(_ Gomega, node string) []string {
	var out []string
	for _, uid := range p.a.Processes(node) {
		out = append(out, string(uid))
	}
	return out
}

func (kwokWorld) restartOperator(t *testing.T, g Gomega) (int, func() error) {
	pauseSuiteOperator(t)
	op, err := startOperator()
	g.Expect(err).NotTo(HaveOccurred(), "a fresh operator must start")
	t.Cleanup(op.stop)
	return op.cmd.Process.Pid, func() error {
		select {
		case <-op.exited:
			return fmt.Errorf("the operator exited: %w\n%s", op.waitErr, op.log())
		default:
			return nil
		}
	}
}

// replicas pauses the suite's operator and runs two processes electing a leader in a Lease
// of the test's own, in ns.
func (kwokWorld) replicas(t *testing.T, g Gomega, ns string) operatorReplicas {
	pauseSuiteOperator(t)
	id := fmt.Sprintf("failover-%d", time.Now().UnixNano()%100000)
	r := &kwokReplicas{t: t, flags: []string{"--leader-elect", "--leader-election-namespace=" + ns, "--leader-election-id=" + id}}
	r.join(g)
	r.join(g)
	return r
}

type kwokReplicas struct {
	t     *testing.T
	flags []string
	procs []*operatorProcess
}

func (r *kwokReplicas) join(g Gomega) {
	o, err := startOperator(r.flags...)
	g.Expect(err).NotTo(HaveOccurred())
	r.procs = append(r.procs, o)
	r.t.Cleanup(o.stop)
}

// leader is the live process that logged its election; its log file names it.
func (r *kwokReplicas) leader(g Gomega) string {
	var id string
	g.Eventually(func() string {
		for _, o := range r.procs {
			select {
			case <-o.exited:
				continue
			default:
			}
			if strings.Contains(strings.ToLower(o.log()), "successfully acquired lease") {
				id = o.logPath
				return id
			}
		}
		return ""
	}, failoverTimeout, interval).ShouldNot(BeEmpty(), "no replica became leader")
	return id
}

func (r *kwokReplicas) kill(_ Gomega, id string) {
	for _, o := range r.procs {
		if o.logPath == id {
			o.kill()
		}
	}
}
