// Command launch measures how long a ZayaTrainingJob takes from `create` to all ranks Running
// on a live cluster, and how much of that is the operator's: pod creation throughput, the API
// requests it makes (from its metrics endpoint), and how soon it reports Running.
//
//	go run ./hack/bench/launch -kubeconfig K -nodes 128 -runs 3 -metrics http://127.0.0.1:8080/metrics
package main

import (
	"context"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	toolscache "k8s.io/client-go/tools/cache"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	trainingv1alpha1 "github.com/zaya-operator/zaya-operator/api/v1alpha1"
	"github.com/zaya-operator/zaya-operator/hack/bench/internal/connect"
	"github.com/zaya-operator/zaya-operator/hack/bench/internal/stats"
	"github.com/zaya-operator/zaya-operator/internal/scrape"
	"github.com/zaya-operator/zaya-operator/internal/testjob"
)

// sample is one launch or recovery.
type sample struct {
	firstPod, lastPod, lastBound, lastRunning, jobRunning time.Duration
	decided, oldGone                                      time.Duration // recovery only
	requests                                              float64
	cpu                                                   float64 // operator CPU seconds

}

func main() {
	kubeconfig := flag.String("kubeconfig", os.Getenv("KUBECONFIG"), "kubeconfig of the cluster")
	nodes := flag.Int("nodes", 128, "nodes (pods) per job")
	runs := flag.Int("runs", 3, "launches to measure")
	metricsURL := flag.String("metrics", "", "the operator's /metrics URL, for its API request count")
	ns := flag.String("namespace", "bench", "namespace for the jobs")
	recoverToo := flag.Bool("recover", false, "measure a gang restart after one rank fails, not the launch")
	flag.IntVar(&operatorPID, "operator-pid", 0, "the operator's process id, for its CPU time (Linux /proc)")
	flag.Parse()

	ctx := context.Background()
	c, informers, err := connect.Cluster(ctx, *kubeconfig, *ns)
	check(err)
	go func() { check(informers.Start(ctx)) }()

	suffix := strconv.FormatInt(rand.Int64N(1<<30), 36)
	var samples []sample
	for i := range *runs {
		// Names are never reused: kwok deletes and patches pods by name, so a stale action
		// for an earlier pod would hit a new pod of the same name.
		s := launch(ctx, c, informers, *ns, fmt.Sprintf("b%d-%s-%d", *nodes, suffix, i), int32(*nodes), *metricsURL, *recoverToo)
		fmt.Fprintf(os.Stderr, "run %d: restart decided %.2fs, old attempt gone %.2fs, pods created %.2fs, bound %.2fs, running %.2fs, job Running %.2fs, %v requests\n",
			i, s.decided.Seconds(), s.oldGone.Seconds(), s.lastPod.Seconds(), s.lastBound.Seconds(), s.lastRunning.Seconds(), s.jobRunning.Seconds(), s.requests)
		samples = append(samples, s)
	}
	med := func(f func(sample) float64) float64 { return stats.Median(samples, f) }
	create := med(func(s sample) float64 { return s.lastPod.Seconds() })
	spread := med(func(s sample) float64 { return (s.lastPod - s.firstPod).Seconds() })
	running := med(func(s sample) float64 { return s.lastRunning.Seconds() })
	jobRunning := med(func(s sample) float64 { return s.jobRunning.Seconds() })
	report := med(func(s sample) float64 { return (s.jobRunning - s.lastRunning).Seconds() })
	if *recoverToo {
		// | nodes | runs | failure → restart decided | → old attempt gone | → new pods created | → new bound | → all Running | → job Running | operator share | API requests |
		decided := med(func(s sample) float64 { return s.decided.Seconds() })
		createAfterGone := med(func(s sample) float64 { return (s.lastPod - s.oldGone).Seconds() })
		fmt.Printf("| %d | %d | %.2f s | %.2f s | %.2f s | %.2f s | %.2f s | %.2f s | %.2f s | %.2f s | %.0f |\n",
			*nodes, len(samples), decided, med(func(s sample) float64 { return s.oldGone.Seconds() }), create,
			med(func(s sample) float64 { return s.lastBound.Seconds() }), running, jobRunning,
			decided+createAfterGone+report, med(func(s sample) float64 { return s.cpu }), med(func(s sample) float64 { return s.requests }))
		return
	}
	// | nodes | runs | create→all pods created | pods/s | create→all bound | create→all Running | create→job Running | operator share | API requests/job |
	fmt.Printf("| %d | %d | %.2f s | %.0f | %.2f s | %.2f s | %.2f s | %.2f s | %.2f s | %.0f |\n",
		*nodes, len(samples), create, float64(*nodes)/max(spread, 1e-3),
		med(func(s sample) float64 { return s.lastBound.Seconds() }), running, jobRunning,
		create+report, med(func(s sample) float64 { return s.cpu }), med(func(s sample) float64 { return s.requests }))
}

// observation is what the informers saw of one launch.
type observation struct {
	mu                   sync.Mutex
	start                time.Time
	name                 string
	nodes                int
	attempt              int32 // the attempt whose pods are followed
	seen, bound, running map[string]bool
	oldDeleted           int
	s                    sample
	done                 chan struct{}
}

func newObservation(name string, nodes int, attempt int32) *observation {
	return &observation{name: name, nodes: nodes, attempt: attempt, seen: map[string]bool{}, bound: map[string]bool{},
		running: map[string]bool{}, done: make(chan struct{})}
}

// deleted counts pods of earlier attempts going away (the failed rank's pod stays for its logs).
func (o *observation) deleted(obj any) {
	pod, ok := obj.(*corev1.Pod)
	if !ok || pod.Labels[trainingv1alpha1.JobNameLabel] != o.name || pod.Labels[trainingv1alpha1.AttemptLabel] == fmt.Sprint(o.attempt) {
		return
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	o.oldDeleted++
	if o.oldDeleted == o.nodes-1 {
		o.s.oldGone = time.Since(o.start)
	}
}

func (o *observation) pod(obj any) {
	pod, ok := obj.(*corev1.Pod)
	if !ok || pod.Labels[trainingv1alpha1.JobNameLabel] != o.name || pod.Labels[trainingv1alpha1.AttemptLabel] != fmt.Sprint(o.attempt) {
		return
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	at := time.Since(o.start)
	if !o.seen[pod.Name] {
		o.seen[pod.Name] = true
		if len(o.seen) == 1 {
			o.s.firstPod = at
		}
		if len(o.seen) == o.nodes {
			o.s.lastPod = at
		}
	}
	if pod.Spec.NodeName != "" && !o.bound[pod.Name] {
		o.bound[pod.Name] = true
		if len(o.bound) == o.nodes {
			o.s.lastBound = at
		}
	}
	if pod.Status.Phase == corev1.PodRunning && !o.running[pod.Name] {
		o.running[pod.Name] = true
		if len(o.running) == o.nodes {
			o.s.lastRunning = at
		}
	}
	o.check()
}

func (o *observation) job(obj any) {
	j, ok := obj.(*trainingv1alpha1.ZayaTrainingJob)
	if !ok || j.Name != o.name {
		return
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.s.decided == 0 && j.Status.Restarts == o.attempt {
		o.s.decided = time.Since(o.start)
	}
	if o.s.jobRunning == 0 && j.Status.Restarts == o.attempt && meta.IsStatusConditionTrue(j.Status.Conditions, trainingv1alpha1.ConditionRunning) {
		o.s.jobRunning = time.Since(o.start)
	}
	o.check()
}

// check closes done once the job reports Running and every pod runs; mu is held.
func (o *observation) check() {
	if o.s.jobRunning != 0 && len(o.running) == o.nodes && o.done != nil {
		close(o.done)
		o.done = nil
	}
}

// follow registers o's handlers, runs act (which starts the clock), and waits until the
// followed attempt runs with the job reporting Running.
func follow(ctx context.Context, informers cache.Cache, o *observation, act func()) sample {
	podInf, err := informers.GetInformer(ctx, &corev1.Pod{})
	check(err)
	jobInf, err := informers.GetInformer(ctx, &trainingv1alpha1.ZayaTrainingJob{})
	check(err)
	handler := func(f func(any)) toolscache.ResourceEventHandlerFuncs {
		return toolscache.ResourceEventHandlerFuncs{AddFunc: f, UpdateFunc: func(_, n any) { f(n) }}
	}
	podHandler := handler(o.pod)
	podHandler.DeleteFunc = o.deleted
	o.start = time.Now()
	podReg, err := podInf.AddEventHandler(podHandler)
	check(err)
	jobReg, err := jobInf.AddEventHandler(handler(o.job))
	check(err)
	o.mu.Lock()
	o.start = time.Now()
	o.mu.Unlock()
	act()

	progress := time.NewTicker(10 * time.Second)
	defer progress.Stop()
	deadline := time.After(10 * time.Minute)
wait:
	for {
		select {
		case <-o.done:
			break wait
		case <-progress.C:
			o.mu.Lock()
			fmt.Fprintf(os.Stderr, "  %s attempt %d: %d created, %d bound, %d running\n", o.name, o.attempt, len(o.seen), len(o.bound), len(o.running))
			o.mu.Unlock()
		case <-deadline:
			check(fmt.Errorf("job %s attempt %d not Running after 10 minutes", o.name, o.attempt))
		}
	}
	check(podInf.RemoveEventHandler(podReg))
	check(jobInf.RemoveEventHandler(jobReg))
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.s
}

// launch creates one job and follows it until it runs; with recoverToo it then fails one
// rank and follows the gang restart instead. The job is deleted at the end.
func launch(ctx context.Context, c client.Client, informers cache.Cache, ns, name string, nodes int32, metricsURL string, recoverToo bool) sample {
	job := testjob.MakeZayaTrainingJob(name, ns).Nodes(nodes).Obj()
	before, cpu := requests(metricsURL), operatorCPU()
	s := follow(ctx, informers, newObservation(name, int(nodes), 0), func() { check(c.Create(ctx, job)) })
	if recoverToo {
		before, cpu = requests(metricsURL), operatorCPU()
		s = follow(ctx, informers, newObservation(name, int(nodes), 1), func() { failRank(ctx, c, ns, name, nodes/2) })
	}
	s.requests, s.cpu = requests(metricsURL)-before, operatorCPU()-cpu

	check(c.Delete(ctx, job, client.PropagationPolicy(metav1.DeletePropagationForeground)))
	for {
		list := &corev1.PodList{}
		check(c.List(ctx, list, client.InNamespace(ns)))
		if len(list.Items) == 0 {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	return s
}

// failRank makes one rank's worker exit 1, as its kubelet would report a crash.
func failRank(ctx context.Context, c client.Client, ns, job string, rank int32) {
	pod := &corev1.Pod{}
	check(c.Get(ctx, client.ObjectKey{Namespace: ns, Name: fmt.Sprintf("%s-0-%d", job, rank)}, pod))
	patch := client.MergeFrom(pod.DeepCopy())
	pod.Status.Phase = corev1.PodFailed
	pod.Status.ContainerStatuses = []corev1.ContainerStatus{{Name: "worker", Image: pod.Spec.Containers[0].Image,
		State: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: 1, Reason: "Error", FinishedAt: metav1.Now()}}}}
	check(c.Status().Patch(ctx, pod, patch))
}

var operatorPID int

// operatorCPU is the operator's user+system CPU seconds so far (0 without -operator-pid).
func operatorCPU() float64 {
	if operatorPID == 0 {
		return 0
	}
	s, err := scrape.CPUSeconds(operatorPID)
	check(err)
	return s
}

// requests counts the operator's API requests so far (0 without -metrics).
func requests(url string) float64 {
	m, err := scrape.Get(url)
	check(err)
	return m.Requests()
}

func check(err error) {
	if err != nil {
		fmt.Fprintln(os.Stderr, "launch:", err)
		os.Exit(1)
	}
}
