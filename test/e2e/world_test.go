//go:build e2e

package e2e

import (
	"os"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"

	trainingv1alpha1 "github.com/zaya-operator/zaya-operator/api/v1alpha1"
)

// world is the cluster the suite runs on; every test runs on both. kwok (hack/e2e.sh): fake
// nodes whose pods run nothing, test/nodeagent's process-backed nodes whose pods run the
// worker binary, and the operator as a local process. kind (hack/kind/e2e.sh, make
// test-kind): real kubelets and containerd in Docker containers, fake AMD devices from
// test/fakedeviceplugin, the operator installed by its chart, and workers from their image.
// A test says what happens to a node or a worker; the world plays it as its cluster can: a
// kwok worker's exit is a status patch, a kind worker's is a process exiting in its
// container; a kwok node is lost by a Ready condition, a kind node by docker kill.
type world interface {
	// idle makes a job's workers run here until told to exit (exitWorker): on kwok nothing
	// runs; on kind the worker image's shell waits, touching its heartbeat.
	idle(job *trainingv1alpha1.ZayaTrainingJob)
	// idleContainer makes one container run here until told to exit.
	idleContainer(c *corev1.Container)
	// exitWorker makes a rank's worker exit with code, leaving "checkpoint-step=300" in its
	// termination log.
	exitWorker(g Gomega, pod corev1.Pod, code int32)
	// loseNode makes a node's kubelet go silent until the test ends.
	loseNode(t *testing.T, g Gomega, node string)
	// unhealthyGPU lowers a node's allocatable amd.com/gpu by one until the test ends.
	unhealthyGPU(t *testing.T, g Gomega, node string)
	// claimVolumes gives claims the operator will create a volume to bind to.
	claimVolumes(t *testing.T, ns string, claims ...string)
	// processes is n nodes whose pods run the real worker, for this test.
	processes(t *testing.T, n int) processNodes
	// kubeletProcesses are processes whose nodes hold a kubelet's default Lease (40 s,
	// renewed every 10 s), where processes' hold a shorter one on kwok.
	kubeletProcesses(t *testing.T, n int) processNodes
	// restartOperator restarts the suite's operator and returns its process on this machine
	// and a check that it still runs.
	restartOperator(t *testing.T, g Gomega) (pid int, alive func() error)
	// replicas runs leader-elected operator replicas for this test.
	replicas(t *testing.T, g Gomega, ns string) operatorReplicas
	// kind says the cluster is kind's.
	kind() bool
}

// processNodes are nodes whose pods run real worker processes.
type processNodes interface {
	// place puts a job's pods on these nodes, running the worker binary or image.
	place(ps *corev1.PodSpec)
	// supervise runs the worker container's command under zaya-supervisor.
	supervise(t testing.TB, c *corev1.Container)
	// inject readies the worker container for the operator to put zaya-supervisor in front
	// of its command (faultTolerance.supervisor Inject, the chart's default).
	inject(t testing.TB, c *corev1.Container)
	// placeTorch puts a PyTorch job's pods on these nodes with Debian's torchrun (kwok: the
	// host's; kind: the zaya-pytorch image), gloo on the interface their ranks share.
	placeTorch(t testing.TB, job *trainingv1alpha1.ZayaTrainingJob)
	// sharedClaim binds a claim to a volume every node shares and returns its folder here.
	sharedClaim(t testing.TB, ns, name string) string
	nodeOf(ns, pod string) string
	// runLog is the worker log of a pod's run after restarts in-place restarts ("" when the
	// cluster no longer keeps it: a kubelet keeps the current and the previous run).
	runLog(ns, pod string, restarts int32) string
	// fault writes a fault (gpu, nic, usercode, slow) to the worker's -fault-file.
	fault(g Gomega, ns, pod, fault string)
	// kill SIGKILLs a pod's worker process and whatever it started: a crash.
	kill(g Gomega, ns, pod string)
	// down loses a node: its kubelet and processes die (a power loss), until the test ends.
	down(t *testing.T, g Gomega, node string)
	// freeze freezes a node: its kubelet and processes stop, their sockets stay open.
	freeze(t *testing.T, g Gomega, node string)
	// thaw brings a frozen node back: its processes run on from where they stopped and its
	// kubelet stops those of pods deleted meanwhile.
	thaw(t *testing.T, g Gomega, node string)
	// running are the UIDs of the pods whose containers run (or are frozen) on node.
	running(g Gomega, node string) []string
}

// operatorReplicas are leader-elected operators; each process has its own identity.
type operatorReplicas interface {
	// leader waits for a live process to lead and names it.
	leader(g Gomega) string
	// kill crashes a process: SIGKILL, its Lease not released.
	kill(g Gomega, id string)
	// join brings a fresh replica in as the follower: kwok starts a process; on kind the
	// Deployment's kubelet restarts the killed container by itself.
	join(g Gomega)
}

// w is the suite's world; the sizes are what its cluster holds.
var (
	w world
	// gangNodes is the largest gang the cluster places at once.
	gangNodes int32
	// runningJobNodes is the size of the jobs the recovery tests fail: a node is left free
	// for a replacement.
	runningJobNodes int32
	// trainNodes is the size of the jobs that train with the real worker.
	trainNodes int32
	// gangTimeout covers a gang's start: kwok's pod start delay (up to ~6 s) on top of
	// scheduling; on kind the kubelet's, and a lost node's grace.
	gangTimeout time.Duration
)

// kwokOnly skips a test that is about the kwok cluster itself, not the operator.
func kwokOnly(t *testing.T, why string) {
	t.Helper()
	if w.kind() {
		t.Skip("kwok only: " + why)
	}
}

// selectWorld picks the world from ZAYA_E2E_WORLD (kwok unless "kind").
func selectWorld() (world, error) {
	if os.Getenv("ZAYA_E2E_WORLD") == "kind" {
		k, err := newKindWorld()
		if err != nil {
			return nil, err
		}
		gangNodes, runningJobNodes, trainNodes, gangTimeout = k.workers, k.workers-2, k.workers-2, 4*time.Minute
		return k, nil
	}
	gangNodes, runningJobNodes, trainNodes, gangTimeout = 16, 4, 8, time.Minute
	return kwokWorld{}, nil
}
