// Command jobs measures the operator under many concurrent jobs on a live cluster: it creates
// N jobs at once, waits until every one reports Running, then watches a quiet steady state,
// and reports the operator's CPU time, peak memory, reconcile latency, API requests per job and
// the writes it makes while nothing changes (there should be none).
//
//	go run ./hack/bench/jobs -jobs 1000 -metrics http://127.0.0.1:8080/metrics -operator-pid PID
package main

import (
	"context"
	"flag"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	toolscache "k8s.io/client-go/tools/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	trainingv1alpha1 "github.com/zaya-operator/zaya-operator/api/v1alpha1"
	"github.com/zaya-operator/zaya-operator/hack/bench/internal/connect"
	"github.com/zaya-operator/zaya-operator/internal/scrape"
	"github.com/zaya-operator/zaya-operator/internal/testjob"
)

const controllerName = "zayatrainingjob"

func main() {
	kubeconfig := flag.String("kubeconfig", os.Getenv("KUBECONFIG"), "kubeconfig of the cluster")
	jobs := flag.Int("jobs", 100, "jobs to run at once")
	nodes := flag.Int("nodes", 8, "nodes (pods) per job; each rank takes 1 GPU so 8 ranks share a fake node")
	metricsURL := flag.String("metrics", "", "the operator's /metrics URL")
	pid := flag.Int("operator-pid", 0, "the operator's process id, for CPU and memory (Linux /proc)")
	steady := flag.Duration("steady", 60*time.Second, "how long to watch the steady state once every job runs")
	settle := flag.Duration("settle", 40*time.Second, "wait after every job runs before the steady-state window opens: past the 30 s creation expectations and the 10 s capacity grace that may still requeue a job")
	foreign := flag.Int("foreign-pods", 0, "pods not the operator's to create after the steady state, to show its cache ignores them")
	ns := flag.String("namespace", "bench-jobs", "namespace for the jobs")
	label := flag.String("label", "", "first column of the row (default: the job count)")
	flag.Parse()
	if *label == "" {
		*label = strconv.Itoa(*jobs)
	}

	ctx := context.Background()
	c, informers, err := connect.Cluster(ctx, *kubeconfig, *ns, *ns+"-foreign")
	check(err)
	// Only the jobs are watched here: a pod informer would put this client's own cost on the
	// same cores as the operator's.
	jobInf, err := informers.GetInformer(ctx, &trainingv1alpha1.ZayaTrainingJob{})
	check(err)
	go func() { check(informers.Start(ctx)) }()
	informers.WaitForCacheSync(ctx)

	t := newTracker(*jobs)
	onJob := func(obj any) {
		if j, ok := obj.(*trainingv1alpha1.ZayaTrainingJob); ok && meta.IsStatusConditionTrue(j.Status.Conditions, trainingv1alpha1.ConditionRunning) {
			t.running(j.Name)
		}
	}
	_, err = jobInf.AddEventHandler(toolscache.ResourceEventHandlerFuncs{AddFunc: onJob, UpdateFunc: func(_, n any) { onJob(n) }})
	check(err)

	m0 := metrics(*metricsURL)
	cpu0 := cpu(*pid)
	suffix := strconv.FormatInt(rand.Int64N(1<<30), 36) // kwok acts on pods by name: never reuse one
	start := time.Now()
	createAll(ctx, c, t, *ns, suffix, *jobs, int32(*nodes))
	created := time.Since(start)
	t.wait(30 * time.Minute)
	allRunning := time.Since(start)
	m1 := metrics(*metricsURL)
	cpu1 := cpu(*pid)

	// Let the last coalesced progress writes (readyNodes, at most one a second per job) land
	// before the quiet window starts.
	time.Sleep(*settle)
	m1s := metrics(*metricsURL)
	cpu1s := cpu(*pid)
	time.Sleep(*steady)
	m2 := metrics(*metricsURL)
	cpu2 := cpu(*pid)
	peak := peakMemory(*pid)
	heap := m2.Sum("go_memstats_heap_inuse_bytes", nil)

	foreignHeap := ""
	if *foreign > 0 {
		createForeign(ctx, c, *ns+"-foreign", suffix, *foreign)
		time.Sleep(10 * time.Second)
		m3 := metrics(*metricsURL)
		foreignHeap = fmt.Sprintf(" | %.0f MiB with %d foreign pods (%+.0f writes)", m3.Sum("go_memstats_heap_inuse_bytes", nil)/(1<<20), *foreign, m3.Writes()-m2.Writes())
		check(c.DeleteAllOf(ctx, &corev1.Pod{}, client.InNamespace(*ns+"-foreign"), client.GracePeriodSeconds(0)))
	}

	launch := m1.Histogram("controller_runtime_reconcile_time_seconds", map[string]string{"controller": controllerName}).
		Since(m0.Histogram("controller_runtime_reconcile_time_seconds", map[string]string{"controller": controllerName}))
	reconciles := m1.Sum("controller_runtime_reconcile_total", map[string]string{"controller": controllerName}) -
		m0.Sum("controller_runtime_reconcile_total", map[string]string{"controller": controllerName})
	steadyReconciles := m2.Sum("controller_runtime_reconcile_total", map[string]string{"controller": controllerName}) -
		m1s.Sum("controller_runtime_reconcile_total", map[string]string{"controller": controllerName})
	for _, verb := range []string{"GET", "POST", "PUT", "PATCH", "DELETE"} {
		fmt.Fprintf(os.Stderr, "  %s: launch %.0f, settling %.0f, steady %.0f\n", verb, m1.Requests(verb)-m0.Requests(verb),
			m1s.Requests(verb)-m1.Requests(verb), m2.Requests(verb)-m1s.Requests(verb))
	}
	lat := t.latencies()
	n := float64(*jobs)
	fmt.Fprintf(os.Stderr, "%d jobs: created in %.1fs, all Running after %.1fs; %0.f reconciles, %.0f requests, %.0f writes; steady %v: %.0f writes, %.0f reconciles, %.2fs CPU\n",
		*jobs, created.Seconds(), allRunning.Seconds(), reconciles, m1.Requests()-m0.Requests(), m1.Writes()-m0.Writes(),
		*steady, m2.Writes()-m1s.Writes(), steadyReconciles, cpu2-cpu1s)

	// | jobs | pods | create → all Running | job create → Running p50/p90/p99 | reconciles/job | reconcile p50/p99 | requests/job | writes/job | CPU | CPU/job | steady writes | steady reconciles | steady CPU | peak RSS | heap |
	fmt.Printf("| %s | %d | %.1f s | %.1f / %.1f / %.1f s | %.1f | %.0f / %.0f ms | %.1f | %.1f | %.2f s | %.1f ms | %.0f | %.0f | %.2f s | %.0f MiB | %.0f MiB%s |\n",
		*label, *jobs**nodes, allRunning.Seconds(),
		quantile(lat, 0.5), quantile(lat, 0.9), quantile(lat, 0.99),
		reconciles/n, launch.Quantile(0.5)*1000, launch.Quantile(0.99)*1000,
		(m1.Requests()-m0.Requests())/n, (m1.Writes()-m0.Writes())/n,
		cpu1-cpu0, (cpu1-cpu0)/n*1000,
		m2.Writes()-m1s.Writes(), steadyReconciles, cpu2-cpu1s,
		peak/(1<<20), heap/(1<<20), foreignHeap)

	deleteJobs(ctx, c, *ns, suffix, *jobs)
	waitNoPods(ctx, c, *ns)
	waitNoPods(ctx, c, *ns+"-foreign")
}

// tracker records when each job first reports Running.
type tracker struct {
	mu      sync.Mutex
	created map[string]time.Time
	ran     map[string]time.Duration
	want    int
	done    chan struct{}
}

func newTracker(want int) *tracker {
	return &tracker{created: map[string]time.Time{}, ran: map[string]time.Duration{}, want: want, done: make(chan struct{})}
}

func (t *tracker) create(name string, at time.Time) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.created[name] = at
}

func (t *tracker) running(name string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	at, ok := t.created[name]
	if _, seen := t.ran[name]; !ok || seen {
		return
	}
	t.ran[name] = time.Since(at)
	if len(t.ran) == t.want {
		close(t.done)
	}
}

func (t *tracker) wait(limit time.Duration) {
	deadline := time.After(limit)
	tick := time.NewTicker(15 * time.Second)
	defer tick.Stop()
	for {
		select {
		case <-t.done:
			return
		case <-tick.C:
			t.mu.Lock()
			fmt.Fprintf(os.Stderr, "  %d of %d jobs Running\n", len(t.ran), t.want)
			t.mu.Unlock()
		case <-deadline:
			check(fmt.Errorf("not every job Running after %v", limit))
		}
	}
}

func (t *tracker) latencies() []float64 {
	t.mu.Lock()
	defer t.mu.Unlock()
	out := make([]float64, 0, len(t.ran))
	for _, d := range t.ran {
		out = append(out, d.Seconds())
	}
	slices.Sort(out)
	return out
}

// quantile of sorted values (nearest rank).
func quantile(sorted []float64, q float64) float64 {
	if len(sorted) == 0 {
		return math.NaN()
	}
	return sorted[min(len(sorted)-1, int(math.Ceil(q*float64(len(sorted))))-1)]
}

// inParallel calls f(0) … f(n-1), 32 at a time, as a burst of users would.
func inParallel(n int, f func(i int)) {
	next := make(chan int)
	var wg sync.WaitGroup
	for range 32 {
		wg.Go(func() {
			for i := range next {
				f(i)
			}
		})
	}
	for i := range n {
		next <- i
	}
	close(next)
	wg.Wait()
}

func jobName(suffix string, i int) string { return fmt.Sprintf("j%s-%d", suffix, i) }

// createAll creates the jobs, each 8 ranks of 1 GPU that may share nodes.
func createAll(ctx context.Context, c client.Client, t *tracker, ns, suffix string, jobs int, nodes int32) {
	inParallel(jobs, func(i int) {
		job := testjob.MakeZayaTrainingJob(jobName(suffix, i), ns).Nodes(nodes).GPUsPerNode(1).Obj()
		job.Spec.Placement.NodeSharing = trainingv1alpha1.NodeSharingShared
		t.create(job.Name, time.Now())
		check(c.Create(ctx, job))
	})
}

// createForeign creates pods the operator does not own (no job label).
func createForeign(ctx context.Context, c client.Client, ns, suffix string, n int) {
	inParallel(n, func(i int) {
		pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("f%s-%d", suffix, i), Namespace: ns,
			Labels: map[string]string{"app": "bystander"}},
			Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "busybox"}}}}
		check(c.Create(ctx, pod))
	})
}

// deleteJobs deletes the jobs one by one: a single deletecollection of 1000 jobs outlasts the
// API server's request timeout on 2 cores.
func deleteJobs(ctx context.Context, c client.Client, ns, suffix string, jobs int) {
	inParallel(jobs, func(i int) {
		job := &trainingv1alpha1.ZayaTrainingJob{ObjectMeta: metav1.ObjectMeta{Name: jobName(suffix, i), Namespace: ns}}
		check(client.IgnoreNotFound(c.Delete(ctx, job, client.PropagationPolicy(metav1.DeletePropagationBackground))))
	})
}

func waitNoPods(ctx context.Context, c client.Client, ns string) {
	for range 3000 {
		list := &metav1.PartialObjectMetadataList{}
		list.SetGroupVersionKind(corev1.SchemeGroupVersion.WithKind("PodList"))
		check(c.List(ctx, list, client.InNamespace(ns), client.Limit(1)))
		if len(list.Items) == 0 {
			return
		}
		time.Sleep(200 * time.Millisecond)
	}
	check(fmt.Errorf("pods in %s not gone after 10 minutes", ns))
}

func metrics(url string) scrape.Metrics {
	m, err := scrape.Get(url)
	check(err)
	return m
}

func cpu(pid int) float64 {
	if pid == 0 {
		return 0
	}
	s, err := scrape.CPUSeconds(pid)
	check(err)
	return s
}

func peakMemory(pid int) float64 {
	if pid == 0 {
		return 0
	}
	_, peak, err := scrape.Memory(pid)
	check(err)
	return peak
}

func check(err error) {
	if err != nil {
		fmt.Fprintln(os.Stderr, "jobs:", err)
		os.Exit(1)
	}
}
