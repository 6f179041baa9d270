//go:build e2e

package e2e

import (
	"bytes"
	"context"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	trainingv1alpha1 "github.com/zaya-operator/zaya-operator/api/v1alpha1"
	"github.com/zaya-operator/zaya-operator/internal/testjob"
)

// kindWorld is hack/kind/e2e.sh's cluster: what a test does to a node it does to the node's
// container (docker kill, pause, exec), to a worker inside its container (kubectl exec).
type kindWorld struct {
	workers int32
	// sharedDir is a host folder every node mounts at the same path: checkpoints written by
	// a rank on one node are read by its replacement on another, and by the test.
	sharedDir string
	// workerImage is the worker image loaded into the nodes; clusterScript routes the pod
	// network again after a node changed its address.
	workerImage, clusterScript string
	// pytorchImage is Debian's CPU PyTorch (examples/pytorch/Dockerfile.cpu), loaded into
	// the workers.
	pytorchImage string
}

// controlDir is the fake device plugin's health control folder on every node.
const controlDir = "/var/lib/kubelet/device-plugins/amd-fake-control"

func newKindWorld() (*kindWorld, error) {
	k := &kindWorld{sharedDir: os.Getenv("ZAYA_KIND_SHARED_DIR"), workerImage: os.Getenv("ZAYA_KIND_WORKER_IMAGE"),
		clusterScript: os.Getenv("ZAYA_KIND_CLUSTER_SCRIPT"), pytorchImage: os.Getenv("ZAYA_KIND_PYTORCH_IMAGE")}
	n, err := strconv.Atoi(os.Getenv("ZAYA_KIND_WORKERS"))
	if k.sharedDir == "" || k.workerImage == "" || k.clusterScript == "" || err != nil || n < 4 {
		return nil, fmt.Errorf("the kind world needs ZAYA_KIND_SHARED_DIR, ZAYA_KIND_WORKER_IMAGE, ZAYA_KIND_CLUSTER_SCRIPT and ZAYA_KIND_WORKERS (4 or more): run it through make test-kind")
	}
	k.workers = int32(n)
	return k, nil
}

func (*kindWorld) kind() bool { return true }

// idleScript waits to be told to exit (exitWorker writes the code and the termination
// message to the pod's /dev/shm, which outlives a container restart), touching the heartbeat
// the operator's probe reads. It leaves on SIGTERM, as a worker that saves nothing.
const idleScript = `trap 'exit 0' TERM
while [ ! -e /dev/shm/zaya-exit ]; do [ -z "$ZAYA_HEARTBEAT_FILE" ] || touch "$ZAYA_HEARTBEAT_FILE"; sleep 1; done
cat /dev/shm/zaya-exit.msg >>"$ZAYA_TERMINATION_LOG"
code=$(cat /dev/shm/zaya-exit); rm -f /dev/shm/zaya-exit; exit "$code"`

// idle runs the worker image's shell. It does not cooperate as the reference worker does
// (no peer notices another's exit and stops), so only a recreate restarts its peers: a
// restart in place would wait for inPlaceTimeout, as for any trainer that sits in a
// collective (issue 37). kwok's fake pods fail whole, which recreates too.
func (k *kindWorld) idle(job *trainingv1alpha1.ZayaTrainingJob) {
	job.Spec.FaultTolerance.RestartMode = trainingv1alpha1.RestartModeRecreate
	job.Spec.FaultTolerance.Supervisor = trainingv1alpha1.SupervisorOff // the shell is the test's puppet
	ps := &job.Spec.Template.Spec
	ps.TerminationGracePeriodSeconds = ptr.To[int64](5)
	k.idleContainer(&ps.Containers[0])
}

func (k *kindWorld) idleContainer(c *corev1.Container) {
	c.Image, c.ImagePullPolicy = k.workerImage, corev1.PullNever
	c.Command, c.Args = []string{"sh", "-c", idleScript}, nil
}

func (*kindWorld) exitWorker(g Gomega, pod corev1.Pod, code int32) {
	out, err := kubectl("exec", "-n", pod.Namespace, pod.Name, "-c", "worker", "--", "sh", "-c",
		`echo checkpoint-step=300 >/dev/shm/zaya-exit.msg && echo "$1" >/dev/shm/zaya-exit`, "sh", strconv.Itoa(int(code)))
	g.Expect(err).NotTo(HaveOccurred(), out)
}

// loseNode kills the node's container, everything in it at once (SIGKILL, as power goes:
// docker stop would give its init the stop signal first); it starts again when the test ends.
func (*kindWorld) loseNode(t *testing.T, g Gomega, node string) {
	out, err := docker("kill", node)
	g.Expect(err).NotTo(HaveOccurred(), out)
	t.Cleanup(func() {
		back := time.Now()
		if out, err := docker("start", node); err != nil {
			t.Errorf("starting %s again: %v\n%s", node, err, out)
			return
		}
		// The node image routes its pod network again at boot (hack/kind/node).
		waitNodeBack(t, node, back)
	})
}

// unhealthyGPU has the fake device plugin report the node's GPU 0 unhealthy: the kubelet
// lowers amd.com/gpu's allocatable, as AMD's plugin makes it do.
func (*kindWorld) unhealthyGPU(t *testing.T, g Gomega, node string) {
	out, err := docker("exec", node, "touch", controlDir+"/unhealthy-gpu-0")
	g.Expect(err).NotTo(HaveOccurred(), out)
	t.Cleanup(func() {
		if out, err := docker("exec", node, "rm", "-f", controlDir+"/unhealthy-gpu-0"); err != nil {
			t.Errorf("healing %s: %v\n%s", node, err, out)
		}
	})
}

// claimVolumes binds each claim, before the operator makes it, to a folder of the shared
// directory: kind's only storage class (local-path) cannot give ReadWriteMany.
func (k *kindWorld) claimVolumes(t *testing.T, ns string, claims ...string) {
	t.Helper()
	g := NewWithT(t)
	ctx := context.Background()
	classes := &storagev1.StorageClassList{}
	g.Expect(k8sClient.List(ctx, classes)).To(Succeed())
	class := ""
	for _, c := range classes.Items {
		if c.Annotations["storageclass.kubernetes.io/is-default-class"] == "true" {
			class = c.Name
		}
	}
	for _, claim := range claims {
		dir := k.folder(t, ns, claim)
		pv := &corev1.PersistentVolume{
			ObjectMeta: metav1.ObjectMeta{Name: ns + "-" + claim},
			Spec: corev1.PersistentVolumeSpec{
				Capacity:                      corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Pi")},
				AccessModes:                   []corev1.PersistentVolumeAccessMode{corev1.ReadWriteMany},
				PersistentVolumeReclaimPolicy: corev1.PersistentVolumeReclaimRetain,
				StorageClassName:              class,
				ClaimRef:                      &corev1.ObjectReference{Kind: "PersistentVolumeClaim", Namespace: ns, Name: claim},
				PersistentVolumeSource:        corev1.PersistentVolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: dir}},
			},
		}
		g.Expect(k8sClient.Create(ctx, pv)).To(Succeed())
		t.Cleanup(func() { _ = k8sClient.Delete(context.Background(), pv) })
	}
}

// folder is a folder of the shared directory that the worker (uid 65532) may write, removed
// when the test ends.
func (k *kindWorld) folder(t testing.TB, ns, name string) string {
	t.Helper()
	dir := filepath.Join(k.sharedDir, ns+"-"+name)
	if err := os.MkdirAll(dir, 0o777); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(dir, 0o777); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	return dir
}

// processes: every worker node of kind runs real processes; a test may use up to all of them.
func (k *kindWorld) processes(t *testing.T, n int) processNodes {
	t.Helper()
	if n > int(k.workers) {
		t.Fatalf("the test needs %d nodes; the kind cluster has %d workers (ZAYA_KIND_WORKERS)", n, k.workers)
	}
	return kindProcesses{k}
}

// kubeletProcesses: kind's kubelets hold their default Lease.
func (k *kindWorld) kubeletProcesses(t *testing.T, n int) processNodes { return k.processes(t, n) }

type kindProcesses struct{ k *kindWorld }

func (p kindProcesses) place(ps *corev1.PodSpec) {
	c := &ps.Containers[0]
	c.Image, c.ImagePullPolicy = p.k.workerImage, corev1.PullNever
}

// placeTorch: the PyTorch image, gloo over the pod network (the default interface, eth0).
func (p kindProcesses) placeTorch(t testing.TB, job *trainingv1alpha1.ZayaTrainingJob) {
	t.Helper()
	if p.k.pytorchImage == "" {
		t.Fatal("ZAYA_KIND_PYTORCH_IMAGE (Debian's PyTorch, loaded into the nodes) is not set: run through make test-kind")
	}
	c := &job.Spec.Template.Spec.Containers[0]
	c.Image, c.ImagePullPolicy = p.k.pytorchImage, corev1.PullNever
}

// supervise: the image holds zaya-supervisor next to zaya-worker.
func (kindProcesses) supervise(_ testing.TB, c *corev1.Container) {
	c.Command = append([]string{"zaya-supervisor", "--"}, c.Command...)
}

// inject: the image's PATH finds zaya-worker; the operator copies zaya-supervisor in.
func (kindProcesses) inject(testing.TB, *corev1.Container) {}

// sharedClaim binds a claim to a hostPath volume in the shared folder, which every node
// mounts at the same path: a ReadWriteMany share, as the worker contract asks.
func (p kindProcesses) sharedClaim(t testing.TB, ns, name string) string {
	t.Helper()
	g := NewWithT(t)
	ctx := context.Background()
	dir := p.k.folder(t, ns, name)
	pv, pvc := testjob.SharedClaim(ns, name, dir, corev1.PersistentVolumeReclaimRetain)
	g.Expect(k8sClient.Create(ctx, pv)).To(Succeed())
	t.Cleanup(func() { _ = k8sClient.Delete(context.Background(), pv) })
	g.Eventually(func() error { return k8sClient.Create(ctx, pvc) }, time.Minute, time.Second).Should(Succeed())
	return dir
}

func (kindProcesses) nodeOf(ns, pod string) string {
	p := &corev1.Pod{}
	if err := k8sClient.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: pod}, p); err != nil {
		return ""
	}
	return p.Spec.NodeName
}

// runLog asks the kubelet, which keeps a container's current run and the one before.
func (kindProcesses) runLog(ns, name string, restarts int32) string {
	pod := &corev1.Pod{}
	if err := k8sClient.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: name}, pod); err != nil {
		return ""
	}
	current := int32(-1)
	for _, s := range pod.Status.ContainerStatuses {
		if s.Name == "worker" {
			current = s.RestartCount
		}
	}
	if restarts != current && restarts != current-1 {
		return ""
	}
	b, err := clients.CoreV1().Pods(ns).GetLogs(name, &corev1.PodLogOptions{Container: "worker", Previous: restarts != current}).
		Do(context.Background()).Raw()
	if err != nil {
		return ""
	}
	return string(b)
}

func (kindProcesses) fault(g Gomega, ns, pod, fault string) {
	out, err := kubectl("exec", "-n", ns, pod, "-c", "worker", "--", "sh", "-c", `echo "$1" >/dev/shm/zaya-fault`, "sh", fault)
	g.Expect(err).NotTo(HaveOccurred(), out)
}

// freeze pauses the node's container: every process of the node, its kubelet included,
// frozen with its sockets open.
func (kindProcesses) freeze(t *testing.T, g Gomega, node string) {
	out, err := docker("pause", node)
	g.Expect(err).NotTo(HaveOccurred(), out)
	t.Cleanup(func() {
		if paused, _ := docker("inspect", "-f", "{{.State.Paused}}", node); strings.TrimSpace(paused) != "true" {
			return // thawed by the test
		}
		back := time.Now()
		if out, err := docker("unpause", node); err != nil {
			t.Errorf("unpausing %s: %v\n%s", node, err, out)
		}
		waitNodeBack(t, node, back)
	})
}

func (kindProcesses) thaw(t *testing.T, g Gomega, node string) {
	back := time.Now()
	out, err := docker("unpause", node)
	g.Expect(err).NotTo(HaveOccurred(), out)
	waitNodeBack(t, node, back)
}

// running reads which pods' processes run in the node: every container's processes sit in
// a cgroup named after their pod's UID (kubepods-…-pod<uid>.slice, the UID's dashes turned
// to underscores), the pod's sandbox included. Nothing is asked of the node's kubelet or
// runtime, which a thawed node's may not have caught up with.
func (kindProcesses) running(g Gomega, node string) []string {
	out, err := docker("exec", node, "sh", "-c", "cat /proc/[0-9]*/cgroup 2>/dev/null; true")
	g.Expect(err).NotTo(HaveOccurred(), out)
	seen := map[string]bool{}
	for _, m := range podCgroup.FindAllStringSubmatch(out, -1) {
		seen[strings.ReplaceAll(m[1], "_", "-")] = true
	}
	return slices.Collect(maps.Keys(seen))
}

// podCgroup is a pod's UID in a cgroup path (systemd's or cgroupfs' driver).
var podCgroup = regexp.MustCompile(`pod([0-9a-f]{8}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{12})`)

// docker runs the Docker CLI: what a test does to a node (a container) from outside.
func docker(args ...string) (string, error) { return command("docker", args...) }

// command runs a program for at most two minutes and returns its combined output.
func command(name string, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, name, args...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	if err != nil {
		err = fmt.Errorf("%s %s: %w: %s", name, strings.Join(args, " "), err, strings.TrimSpace(out.String()))
	}
	return out.String(), err
}

// waitNodeBack waits until a node's kubelet has renewed its Lease since it came back, and the
// node is Ready. A node paused for less than the node monitor's grace still reads Ready from
// before its pause: the next job's rank placed on it was taken for lost on its stale Lease
// (seen on kind: a restart before the job ever ran).
func waitNodeBack(t *testing.T, node string, since time.Time) {
	t.Helper()
	ctx := context.Background()
	deadline := time.Now().Add(3 * time.Minute)
	for ; time.Now().Before(deadline); time.Sleep(time.Second) {
		lease := &coordinationv1.Lease{}
		n := &corev1.Node{}
		if k8sClient.Get(ctx, client.ObjectKey{Namespace: corev1.NamespaceNodeLease, Name: node}, lease) != nil ||
			k8sClient.Get(ctx, client.ObjectKey{Name: node}, n) != nil || lease.Spec.RenewTime == nil ||
			!lease.Spec.RenewTime.After(since) {
			continue
		}
		for _, c := range n.Status.Conditions {
			if c.Type == corev1.NodeReady && c.Status == corev1.ConditionTrue {
				return
			}
		}
	}
	t.Errorf("node %s has not renewed its Lease since %s and been Ready", node, since.Format(time.RFC3339))
}

// The chart's release, as hack/kind/e2e.sh installs it: its Deployment and its Lease are
// both named after it.
const (
	operatorNamespace = "zaya-system"
	operatorRelease   = "zaya-operator"
)

// restartOperator rolls the chart's Deployment and finds the new pod's process.
func (*kindWorld) restartOperator(t *testing.T, g Gomega) (int, func() error) {
	out, err := kubectl("-n", operatorNamespace, "rollout", "restart", "deployment/"+operatorRelease)
	g.Expect(err).NotTo(HaveOccurred(), out)
	out, err = kubectl("-n", operatorNamespace, "rollout", "status", "deployment/"+operatorRelease, "--timeout=180s")
	g.Expect(err).NotTo(HaveOccurred(), out)
	var pod corev1.Pod
	g.Eventually(func(g Gomega) {
		pods := operatorPods(g)
		g.Expect(pods).To(HaveLen(1))
		pod = pods[0]
	}, time.Minute, interval).Should(Succeed())
	pid := processOfPod(g, pod)
	return pid, func() error {
		if _, err := os.Stat(fmt.Sprintf("/proc/%d", pid)); err != nil {
			out, _ := kubectl("-n", operatorNamespace, "logs", pod.Name, "--previous", "--tail=50")
			return fmt.Errorf("the operator's process %d is gone: %w\n%s", pid, err, out)
		}
		return nil
	}
}

// operatorPods are the chart's live operator pods, every container started.
func operatorPods(g Gomega) []corev1.Pod {
	list := &corev1.PodList{}
	g.Expect(k8sClient.List(context.Background(), list, client.InNamespace(operatorNamespace),
		client.MatchingLabels{"app.kubernetes.io/instance": operatorRelease})).To(Succeed())
	var out []corev1.Pod
	for _, p := range list.Items {
		if p.DeletionTimestamp.IsZero() && p.Status.Phase == corev1.PodRunning {
			out = append(out, p)
		}
	}
	return out
}

// processOfPod finds a pod's operator process among this machine's processes: a kind node's
// containers are processes of the host, each in the cgroup of its pod (named by the pod's
// UID, with underscores under the systemd driver).
func processOfPod(g Gomega, pod corev1.Pod) int {
	var pid int
	g.Eventually(func() int {
		pid = 0
		if pids := processesOfPod(pod, "/zaya-operator\x00"); len(pids) > 0 {
			pid = pids[len(pids)-1]
		}
		return pid
	}, time.Minute, interval).ShouldNot(BeZero(), "no process of pod %s on this machine", pod.Name)
	return pid
}

// processesOfPod are the processes on this machine (a kind node's are the host's) in pod's
// cgroup whose command line starts with cmdline ("" for any), by pid.
func processesOfPod(pod corev1.Pod, cmdline string) []int {
	uid := string(pod.UID)
	marks := []string{"pod" + uid, "pod" + strings.ReplaceAll(uid, "-", "_")}
	var pids []int
	dirs, _ := filepath.Glob("/proc/[0-9]*")
	for _, d := range dirs {
		cmd, err := os.ReadFile(d + "/cmdline")
		if err != nil || !bytes.HasPrefix(cmd, []byte(cmdline)) {
			continue
		}
		cg, err := os.ReadFile(d + "/cgroup")
		if err != nil {
			continue
		}
		for _, m := range marks {
			if bytes.Contains(cg, []byte(m)) {
				pid, _ := strconv.Atoi(filepath.Base(d))
				pids = append(pids, pid)
				break
			}
		}
	}
	slices.Sort(pids)
	return pids
}

// down kills the node's container (docker kill), as the world loses a node.
func (p kindProcesses) down(t *testing.T, g Gomega, node string) { p.k.loseNode(t, g, node) }

// kill SIGKILLs every process of the pod's worker container from the host (inside its
// container, PID 1 ignores signals it has no handler for); the pause process stays.
func (kindProcesses) kill(g Gomega, ns, name string) {
	pod := &corev1.Pod{}
	g.Expect(k8sClient.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: name}, pod)).To(Succeed())
	var killed int
	for _, pid := range processesOfPod(*pod, "") {
		if cmd, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid)); bytes.HasPrefix(cmd, []byte("/pause\x00")) {
			continue
		}
		if syscall.Kill(pid, syscall.SIGKILL) == nil {
			killed++
		}
	}
	g.Expect(killed).To(BeNumerically(">", 0), "no worker process of pod %s on this machine", name)
}

// replicas scales the chart's Deployment to two for the test; they elect a leader in the
// chart's Lease.
func (*kindWorld) replicas(t *testing.T, g Gomega, _ string) operatorReplicas {
	scale := func(n int) (string, error) {
		if out, err := kubectl("-n", operatorNamespace, "scale", "deployment/"+operatorRelease, fmt.Sprintf("--replicas=%d", n)); err != nil {
			return out, err
		}
		return kubectl("-n", operatorNamespace, "rollout", "status", "deployment/"+operatorRelease, "--timeout=180s")
	}
	out, err := scale(2)
	g.Expect(err).NotTo(HaveOccurred(), out)
	t.Cleanup(func() {
		if out, err := scale(1); err != nil {
			t.Errorf("scaling the operator back to one replica: %v\n%s", err, out)
		}
	})
	return &kindReplicas{killed: map[string]bool{}}
}

// kindReplicas are the chart's pods; a process is named by the identity it holds the Lease
// with (its pod's name and a random suffix, new for every process).
type kindReplicas struct{ killed map[string]bool }

func (r *kindReplicas) leader(g Gomega) string {
	var id string
	g.Eventually(func(g Gomega) {
		lease := &coordinationv1.Lease{}
		g.Expect(k8sClient.Get(context.Background(), client.ObjectKey{Namespace: operatorNamespace, Name: operatorRelease}, lease)).To(Succeed())
		id = ptr.Deref(lease.Spec.HolderIdentity, "")
		g.Expect(id).NotTo(BeEmpty())
		g.Expect(r.killed).NotTo(HaveKey(id), "the Lease still names the killed leader")
	}, failoverTimeout, interval).Should(Succeed(), "no replica became leader")
	return id
}

func (r *kindReplicas) kill(g Gomega, id string) {
	name, _, _ := strings.Cut(id, "_")
	pod := &corev1.Pod{}
	g.Expect(k8sClient.Get(context.Background(), client.ObjectKey{Namespace: operatorNamespace, Name: name}, pod)).To(Succeed())
	g.Expect(syscall.Kill(processOfPod(g, *pod), syscall.SIGKILL)).To(Succeed())
	r.killed[id] = true
}

// join: the killed container's kubelet restarts it (restartPolicy Always) as a new process.
func (*kindReplicas) join(Gomega) {}
