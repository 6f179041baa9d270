// Command restart measures one gang restart on the local kwok cluster, in place against
// recreate: a running job of N nodes loses one rank, to a crash (its worker exits 1) or to its
// node (NotReady), and the clock runs from the fault to the job's Recovered with every rank
// running. kwok does not restart containers, so the benchmark plays the kubelets the fault
// reaches: in place, the crashed rank's container and, at once, every other rank's (their
// workers lost a peer: exit 75) restart in their pods; a lost node's kubelet does nothing.
// It counts the pods deleted and created and the operator's API writes. Prints one markdown
// row per mode and fault, prefixed "restart|"; the case Elastic/node, an elastic job's shrink
// and grow (resize.go), prints its own, prefixed "resize|".
package main

import (
	"context"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	toolscache "k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/retry"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	trainingv1alpha1 "github.com/zaya-operator/zaya-operator/api/v1alpha1"
	"github.com/zaya-operator/zaya-operator/hack/bench/internal/connect"
	"github.com/zaya-operator/zaya-operator/hack/bench/internal/stats"
	"github.com/zaya-operator/zaya-operator/internal/scrape"
	"github.com/zaya-operator/zaya-operator/internal/testjob"
)

// faultLabel makes kwok leave a node alone (hack/cluster/stages.yaml): a dead kubelet.
const faultLabel = "zaya.dev/fault"

type sample struct {
	decided, recovered time.Duration // fault → restart recorded; → Recovered, every rank running
	kubelets           time.Duration // fault → the benchmark's last kubelet write (in place)
	deleted, created   int           // pods of the job
	writes, requests   float64       // the operator's
	cpu                float64       // the operator's CPU seconds
	escalated          bool          // an in-place restart that ended as a recreate of the gang
}

func main() {
	kubeconfig := flag.String("kubeconfig", os.Getenv("KUBECONFIG"), "kubeconfig of the cluster")
	nodes := flag.Int("nodes", 128, "nodes (pods) per job")
	runs := flag.Int("runs", 3, "restarts to measure per mode and fault")
	metricsURL := flag.String("metrics", "", "the operator's /metrics URL")
	operatorPID := flag.Int("operator-pid", 0, "the operator's process id, for its CPU time")
	ns := flag.String("namespace", "bench-restart", "namespace for the jobs")
	cases := flag.String("cases", "InPlace/crash,InPlace/node,Recreate/crash,Recreate/node", "mode/fault pairs to measure")
	flag.Parse()

	ctx := context.Background()
	c, informers, err := connect.Cluster(ctx, *kubeconfig, *ns)
	check(err)
	go func() { check(informers.Start(ctx)) }()
	b := &bench{c: c, informers: informers, ns: *ns, nodes: int32(*nodes), metrics: *metricsURL, pid: *operatorPID}

	suffix := strconv.FormatInt(rand.Int64N(1<<30), 36)
	for _, cs := range splitCases(*cases) {
		if cs.elastic() {
			b.resizes(ctx, suffix, *runs)
			continue
		}
		var samples []sample
		for i := range *runs {
			// Names are never reused: kwok acts on pods by name.
			name := fmt.Sprintf("r%d-%s-%s-%d", *nodes, suffix, cs.short(), i)
			s := b.run(ctx, name, cs)
			fmt.Fprintf(os.Stderr, "%s %s run %d: decided %.2fs, kubelets done %.2fs, recovered %.2fs, pods deleted %d created %d, writes %.0f, requests %.0f, cpu %.2fs, escalated %t\n",
				cs.mode, cs.fault, i, s.decided.Seconds(), s.kubelets.Seconds(), s.recovered.Seconds(), s.deleted, s.created, s.writes, s.requests, s.cpu, s.escalated)
			samples = append(samples, s)
		}
		med := func(f func(sample) float64) float64 { return stats.Median(samples, f) }
		escalated, slowest := 0, 0.0
		for _, s := range samples {
			if s.escalated {
				escalated++
			}
			slowest = max(slowest, s.recovered.Seconds())
		}
		// | nodes | mode | fault | runs | fault → decided | fault → recovered | pods deleted | pods created | operator writes | operator requests | operator CPU | slowest recovery | escalated |
		fmt.Printf("restart|| %d | %s | %s | %d | %.2f s | %.2f s | %.0f | %.0f | %.0f | %.0f | %.2f s | %.2f s | %d |\n", *nodes, cs.mode, cs.fault, len(samples),
			med(func(s sample) float64 { return s.decided.Seconds() }), med(func(s sample) float64 { return s.recovered.Seconds() }),
			med(func(s sample) float64 { return float64(s.deleted) }), med(func(s sample) float64 { return float64(s.created) }),
			med(func(s sample) float64 { return s.writes }), med(func(s sample) float64 { return s.requests }),
			med(func(s sample) float64 { return s.cpu }), slowest, escalated)
	}
}

type benchCase struct {
	mode  trainingv1alpha1.RestartMode // or elasticMode
	fault string                       // crash, node, node+spare (a warm spare held)
}

// elasticMode names the resize case, Elastic/node: resize.go.
const elasticMode = "Elastic"

func (c benchCase) elastic() bool { return c.mode == elasticMode }

func (c benchCase) short() string {
	s := "r" + c.fault[:1]
	if c.mode == trainingv1alpha1.RestartModeInPlace {
		s = "i" + c.fault[:1]
	}
	if c.spare() {
		s += "s"
	}
	return s
}

func (c benchCase) spare() bool { return strings.HasSuffix(c.fault, "+spare") }

// lostNode reports whether the case loses a node, with or without a spare.
func (c benchCase) lostNode() bool { return strings.HasPrefix(c.fault, "node") }

func splitCases(s string) []benchCase {
	var out []benchCase
	for _, f := range strings.Split(s, ",") {
		mode, fault, _ := strings.Cut(strings.TrimSpace(f), "/")
		if mode == elasticMode && fault == "node" {
			out = append(out, benchCase{elasticMode, fault})
			continue
		}
		if (mode != string(trainingv1alpha1.RestartModeInPlace) && mode != string(trainingv1alpha1.RestartModeRecreate)) ||
			(fault != "crash" && fault != "node" && (fault != "node+spare" || mode != string(trainingv1alpha1.RestartModeInPlace))) {
			check(fmt.Errorf("unknown case %q (want InPlace or Recreate, /, crash or node; or InPlace/node+spare; or Elastic/node)", f))
		}
		out = append(out, benchCase{trainingv1alpha1.RestartMode(mode), fault})
	}
	return out
}

type bench struct {
	c         client.Client
	informers cache.Cache
	ns        string
	nodes     int32
	metrics   string
	pid       int
}

// run starts a job, waits for it to run, injects the fault and follows the restart to
// Recovered; the job is deleted and a lost node brought back at the end.
func (b *bench) run(ctx context.Context, name string, cs benchCase) sample {
	job := testjob.MakeZayaTrainingJob(name, b.ns).Nodes(b.nodes).Obj()
	job.Spec.FaultTolerance.RestartMode = cs.mode
	if cs.spare() {
		job.Spec.FaultTolerance.Spares = 1
	}
	check(b.c.Create(ctx, job))
	b.waitJob(ctx, name, 10*time.Minute, func(j *trainingv1alpha1.ZayaTrainingJob) bool {
		return j.Status.ReadyNodes == b.nodes && meta.IsStatusConditionTrue(j.Status.Conditions, trainingv1alpha1.ConditionRunning) &&
			j.Status.ReadySpares == job.Spec.FaultTolerance.Spares
	})
	pods := b.pods(ctx, name)
	if j := b.waitJob(ctx, name, time.Second, func(*trainingv1alpha1.ZayaTrainingJob) bool { return true }); j.Status.Restarts != 0 {
		check(fmt.Errorf("job %s restarted before the fault: %+v", name, j.Status.LastFailure))
	}
	victim := pods[len(pods)/2]

	var mu sync.Mutex
	var s sample
	count := b.countPods(ctx, name, pods)
	var start time.Time
	jobInf, err := b.informers.GetInformer(ctx, &trainingv1alpha1.ZayaTrainingJob{})
	check(err)
	// The decision is seen as it happens, while the benchmark may still be playing kubelets.
	seeJob := func(obj any) {
		if j, ok := obj.(*trainingv1alpha1.ZayaTrainingJob); ok && j.Name == name && j.Status.Restarts > 0 {
			mu.Lock()
			if s.decided == 0 && !start.IsZero() {
				s.decided = time.Since(start)
			}
			mu.Unlock()
		}
	}
	jobReg, err := jobInf.AddEventHandler(toolscache.ResourceEventHandlerFuncs{AddFunc: seeJob, UpdateFunc: func(_, n any) { seeJob(n) }})
	check(err)
	writes, requests, cpu := b.operatorCounts()

	mu.Lock()
	start = time.Now()
	mu.Unlock()
	at := metav1.NewTime(start)
	switch cs.fault {
	case "crash":
		if cs.mode == trainingv1alpha1.RestartModeInPlace {
			b.restartInPlace(ctx, victim, 1, at)
		} else {
			b.fail(ctx, victim, 1, at)
		}
	case "node", "node+spare":
		b.loseNode(ctx, victim.Spec.NodeName)
	}
	if cs.mode == trainingv1alpha1.RestartModeInPlace {
		// The other workers lost a peer: exit 75, and their containers restart.
		var wg sync.WaitGroup
		work := make(chan corev1.Pod)
		for range 64 {
			wg.Go(func() {
				for p := range work {
					b.restartInPlace(ctx, p, trainingv1alpha1.ExitStopped, at)
				}
			})
		}
		for _, p := range pods {
			if p.Name != victim.Name {
				work <- p
			}
		}
		close(work)
		wg.Wait()
		s.kubelets = time.Since(start)
	}
	j := b.waitJob(ctx, name, 15*time.Minute, func(j *trainingv1alpha1.ZayaTrainingJob) bool {
		c := meta.FindStatusCondition(j.Status.Conditions, trainingv1alpha1.ConditionRestarting)
		return j.Status.Restarts == 1 && c != nil && c.Status == metav1.ConditionFalse && c.Reason == trainingv1alpha1.ReasonRecovered &&
			j.Status.ReadyNodes == b.nodes && meta.IsStatusConditionTrue(j.Status.Conditions, trainingv1alpha1.ConditionRunning)
	})
	s.recovered = time.Since(start)
	s.escalated = cs.mode == trainingv1alpha1.RestartModeInPlace && j.Status.Attempt() > 0
	w, r, c := b.operatorCounts()
	s.writes, s.requests, s.cpu = w-writes, r-requests, c-cpu
	s.created, s.deleted = count.stop()
	check(jobInf.RemoveEventHandler(jobReg))
	if j.Status.Restarts != 1 {
		check(fmt.Errorf("job %s: %d restarts, want 1", name, j.Status.Restarts))
	}

	check(b.c.Delete(ctx, job, client.PropagationPolicy(metav1.DeletePropagationForeground)))
	if cs.spare() {
		if j.Status.SparesTaken != 1 {
			check(fmt.Errorf("job %s: %d spares taken, want 1", name, j.Status.SparesTaken))
		}
	}
	if cs.lostNode() {
		b.restoreNode(ctx, victim.Spec.NodeName)
	}
	b.drain(ctx)
	return s
}

// drain waits until the namespace has no pods left, forcing those a lost node's kubelet
// never finished terminating.
func (b *bench) drain(ctx context.Context) {
	for {
		list := &corev1.PodList{}
		check(b.c.List(ctx, list, client.InNamespace(b.ns)))
		if len(list.Items) == 0 {
			return
		}
		for _, p := range list.Items {
			if p.DeletionTimestamp != nil {
				_ = b.c.Delete(ctx, &p, client.GracePeriodSeconds(0))
			}
		}
		time.Sleep(200 * time.Millisecond)
	}
}

func (b *bench) pods(ctx context.Context, job string) []corev1.Pod {
	list := &corev1.PodList{}
	check(b.c.List(ctx, list, client.InNamespace(b.ns), client.MatchingLabels{trainingv1alpha1.JobNameLabel: job}))
	list.Items = slices.DeleteFunc(list.Items, func(p corev1.Pod) bool { return isSpare(&p) })
	slices.SortFunc(list.Items, func(a, b corev1.Pod) int {
		ra, _ := strconv.Atoi(a.Labels[trainingv1alpha1.RankLabel])
		rb, _ := strconv.Atoi(b.Labels[trainingv1alpha1.RankLabel])
		return ra - rb
	})
	return list.Items
}

// podCounter counts a job's rank pods created and deleted, from its start to stop.
type podCounter struct {
	mu               sync.Mutex
	known            map[types.UID]bool
	created, deleted int
	stop             func() (created, deleted int)
}

// countPods starts counting the job's rank pods other than pods.
func (b *bench) countPods(ctx context.Context, job string, pods []corev1.Pod) *podCounter {
	c := &podCounter{known: map[types.UID]bool{}}
	for _, p := range pods {
		c.known[p.UID] = true
	}
	rank := func(obj any) *corev1.Pod {
		if t, ok := obj.(toolscache.DeletedFinalStateUnknown); ok {
			obj = t.Obj
		}
		if p, ok := obj.(*corev1.Pod); ok && p.Labels[trainingv1alpha1.JobNameLabel] == job && !isSpare(p) {
			return p
		}
		return nil
	}
	inf, err := b.informers.GetInformer(ctx, &corev1.Pod{})
	check(err)
	reg, err := inf.AddEventHandler(toolscache.ResourceEventHandlerFuncs{
		AddFunc: func(obj any) {
			if p := rank(obj); p != nil {
				c.mu.Lock()
				if !c.known[p.UID] {
					c.known[p.UID] = true
					c.created++
				}
				c.mu.Unlock()
			}
		},
		DeleteFunc: func(obj any) {
			if p := rank(obj); p != nil {
				c.mu.Lock()
				c.deleted++
				c.mu.Unlock()
			}
		},
	})
	check(err)
	c.stop = func() (int, int) {
		check(inf.RemoveEventHandler(reg))
		c.mu.Lock()
		defer c.mu.Unlock()
		return c.created, c.deleted
	}
	return c
}

// isSpare reports whether p is a warm spare, not a rank.
func isSpare(p *corev1.Pod) bool {
	_, ok := p.Labels[trainingv1alpha1.SpareLabel]
	return ok
}

func (b *bench) waitJob(ctx context.Context, name string, within time.Duration, done func(*trainingv1alpha1.ZayaTrainingJob) bool) *trainingv1alpha1.ZayaTrainingJob {
	var j *trainingv1alpha1.ZayaTrainingJob
	err := wait.PollUntilContextTimeout(ctx, 5*time.Millisecond, within, true, func(ctx context.Context) (bool, error) {
		j = &trainingv1alpha1.ZayaTrainingJob{}
		err := b.informers.Get(ctx, client.ObjectKey{Namespace: b.ns, Name: name}, j)
		if apierrors.IsNotFound(err) { // just created: not in the cache yet
			return false, nil
		}
		return err == nil && done(j), err
	})
	if err != nil {
		check(fmt.Errorf("job %s: not there after %v: %w", name, within, err))
	}
	return j
}

// restartInPlace is a kubelet restarting the pod's worker container after it exited with
// code at `at`: restartCount +1, the exit as lastState, running again now.
func (b *bench) restartInPlace(ctx context.Context, pod corev1.Pod, code int32, at metav1.Time) {
	check(retry.RetryOnConflict(retry.DefaultRetry, func() error {
		p := &corev1.Pod{}
		if err := b.c.Get(ctx, client.ObjectKeyFromObject(&pod), p); err != nil {
			return err
		}
		for i := range p.Status.ContainerStatuses {
			cs := &p.Status.ContainerStatuses[i]
			if cs.Name != "worker" {
				continue
			}
			cs.LastTerminationState = corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: code, Reason: "Error", FinishedAt: at}}
			cs.RestartCount++
			cs.State = corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: metav1.Now()}}
			cs.Ready, cs.Started = true, ptr.To(true)
		}
		return b.c.Status().Update(ctx, p)
	}))
}

// fail is a kubelet reporting the pod's only container's exit: the pod fails.
func (b *bench) fail(ctx context.Context, pod corev1.Pod, code int32, at metav1.Time) {
	p := pod.DeepCopy()
	patch := client.MergeFrom(pod.DeepCopy())
	p.Status.Phase = corev1.PodFailed
	p.Status.ContainerStatuses = []corev1.ContainerStatus{{Name: "worker", Image: pod.Spec.Containers[0].Image,
		State: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: code, Reason: "Error", FinishedAt: at}}}}
	check(b.c.Status().Patch(ctx, p, patch))
}

// loseNode stops kwok playing the node's kubelet and reports it NotReady, as the node
// lifecycle controller does once its grace period passes.
func (b *bench) loseNode(ctx context.Context, name string) {
	check(retry.RetryOnConflict(retry.DefaultRetry, func() error {
		n := &corev1.Node{}
		if err := b.c.Get(ctx, client.ObjectKey{Name: name}, n); err != nil {
			return err
		}
		n.Labels[faultLabel] = "down"
		return b.c.Update(ctx, n)
	}))
	check(retry.RetryOnConflict(retry.DefaultRetry, func() error {
		n := &corev1.Node{}
		if err := b.c.Get(ctx, client.ObjectKey{Name: name}, n); err != nil {
			return err
		}
		for i := range n.Status.Conditions {
			if n.Status.Conditions[i].Type == corev1.NodeReady {
				n.Status.Conditions[i].Status, n.Status.Conditions[i].Reason = corev1.ConditionUnknown, "NodeStatusUnknown"
				n.Status.Conditions[i].LastTransitionTime = metav1.Now()
			}
		}
		return b.c.Status().Update(ctx, n)
	}))
}

// restoreNode hands the node back to kwok and waits until it is Ready again and the node
// lifecycle controller has lifted its not-ready and unreachable taints: a job of the next run
// placed on it before would lose it at once.
func (b *bench) restoreNode(ctx context.Context, name string) {
	check(retry.RetryOnConflict(retry.DefaultRetry, func() error {
		n := &corev1.Node{}
		if err := b.c.Get(ctx, client.ObjectKey{Name: name}, n); err != nil {
			return err
		}
		delete(n.Labels, faultLabel)
		return b.c.Update(ctx, n)
	}))
	err := wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
		n := &corev1.Node{}
		if err := b.c.Get(ctx, client.ObjectKey{Name: name}, n); err != nil {
			return false, err
		}
		ready := slices.ContainsFunc(n.Status.Conditions, func(c corev1.NodeCondition) bool {
			return c.Type == corev1.NodeReady && c.Status == corev1.ConditionTrue
		})
		tainted := slices.ContainsFunc(n.Spec.Taints, func(t corev1.Taint) bool {
			return t.Key == corev1.TaintNodeNotReady || t.Key == corev1.TaintNodeUnreachable
		})
		return ready && !tainted, nil
	})
	if err != nil {
		check(fmt.Errorf("node %s not Ready and untainted two minutes after its fault ended: %w", name, err))
	}
}

func (b *bench) operatorCounts() (writes, requests, cpu float64) {
	if b.metrics != "" {
		m, err := scrape.Get(b.metrics)
		check(err)
		writes, requests = m.Writes(), m.Requests()
	}
	if b.pid != 0 {
		var err error
		cpu, err = scrape.CPUSeconds(b.pid)
		check(err)
	}
	return writes, requests, cpu
}

func check(err error) {
	if err != nil {
		fmt.Fprintln(os.Stderr, "restart:", err)
		os.Exit(1)
	}
}
