// Command launch measures how long a ZayaTrainingJob takes from `create` to all ranks Running
// on a live cluster, and how much of that is the operator's: pod creation throughput, the API
// requests it makes (from its metrics endpoint), and how soon it reports Running.
//
//	go run ./hack/bench/launch -kubeconfig K -nodes 128 -runs 3 -metrics http://127.0.0.1:8080/metrics
package main

import (
	"bufio"
	"context"
	"flag"
	"fmt"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	toolscache "k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"

	trainingv1alpha1 "github.com/zaya-operator/zaya-operator/api/v1alpha1"
	"github.com/zaya-operator/zaya-operator/internal/testjob"
)

// sample is one launch.
type sample struct {
	firstPod, lastPod, lastBound, lastRunning, jobRunning time.Duration
	requests                                              float64
}

func main() {
	kubeconfig := flag.String("kubeconfig", os.Getenv("KUBECONFIG"), "kubeconfig of the cluster")
	nodes := flag.Int("nodes", 128, "nodes (pods) per job")
	runs := flag.Int("runs", 3, "launches to measure")
	metricsURL := flag.String("metrics", "", "the operator's /metrics URL, for its API request count")
	ns := flag.String("namespace", "bench", "namespace for the jobs")
	flag.Parse()
	log.SetLogger(logr.Discard()) // the informers' watch restarts are expected, not news

	cfg, err := clientcmd.BuildConfigFromFlags("", *kubeconfig)
	check(err)
	cfg.QPS, cfg.Burst = 1000, 2000
	scheme := runtime.NewScheme()
	check(clientgoscheme.AddToScheme(scheme))
	check(trainingv1alpha1.AddToScheme(scheme))
	c, err := client.New(cfg, client.Options{Scheme: scheme})
	check(err)
	ctx := context.Background()
	informers, err := cache.New(cfg, cache.Options{Scheme: scheme, DefaultNamespaces: map[string]cache.Config{*ns: {}}})
	check(err)
	go func() { check(informers.Start(ctx)) }()
	if err := c.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: *ns}}); err != nil && !strings.Contains(err.Error(), "already exists") {
		check(err)
	}

	var samples []sample
	for i := range *runs {
		// Names are never reused: kwok deletes and patches pods by name, so a stale action
		// for an earlier pod would hit a new pod of the same name.
		s := launch(ctx, c, informers, *ns, fmt.Sprintf("b%d-%d-%d", *nodes, time.Now().Unix()%100000, i), int32(*nodes), *metricsURL)
		fmt.Fprintf(os.Stderr, "run %d: pods created %.2fs, bound %.2fs, running %.2fs, job Running %.2fs, %v requests\n",
			i, s.lastPod.Seconds(), s.lastBound.Seconds(), s.lastRunning.Seconds(), s.jobRunning.Seconds(), s.requests)
		samples = append(samples, s)
	}
	med := func(f func(sample) float64) float64 {
		v := make([]float64, 0, len(samples))
		for _, s := range samples {
			v = append(v, f(s))
		}
		slices.Sort(v)
		return v[len(v)/2]
	}
	create := med(func(s sample) float64 { return s.lastPod.Seconds() })
	spread := med(func(s sample) float64 { return (s.lastPod - s.firstPod).Seconds() })
	running := med(func(s sample) float64 { return s.lastRunning.Seconds() })
	jobRunning := med(func(s sample) float64 { return s.jobRunning.Seconds() })
	report := med(func(s sample) float64 { return (s.jobRunning - s.lastRunning).Seconds() })
	// | nodes | runs | create→all pods created | pods/s | create→all bound | create→all Running | create→job Running | operator share | API requests/job |
	fmt.Printf("| %d | %d | %.2f s | %.0f | %.2f s | %.2f s | %.2f s | %.2f s | %.0f |\n",
		*nodes, len(samples), create, float64(*nodes)/max(spread, 1e-3),
		med(func(s sample) float64 { return s.lastBound.Seconds() }), running, jobRunning,
		create+report, med(func(s sample) float64 { return s.requests }))
}

// observation is what the informers saw of one launch.
type observation struct {
	mu                   sync.Mutex
	start                time.Time
	name                 string
	nodes                int
	seen, bound, running map[string]bool
	s                    sample
	done                 chan struct{}
}

func (o *observation) pod(obj any) {
	pod, ok := obj.(*corev1.Pod)
	if !ok || pod.Labels[trainingv1alpha1.JobNameLabel] != o.name {
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
	if o.s.jobRunning == 0 && meta.IsStatusConditionTrue(j.Status.Conditions, trainingv1alpha1.ConditionRunning) {
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

// launch creates one job, follows its pods and the job through informers (which re-watch
// on their own) until it is Running, then deletes it.
func launch(ctx context.Context, c client.Client, informers cache.Cache, ns, name string, nodes int32, metricsURL string) sample {
	done := make(chan struct{})
	o := &observation{name: name, nodes: int(nodes), seen: map[string]bool{}, bound: map[string]bool{}, running: map[string]bool{}, done: done}
	podInf, err := informers.GetInformer(ctx, &corev1.Pod{})
	check(err)
	jobInf, err := informers.GetInformer(ctx, &trainingv1alpha1.ZayaTrainingJob{})
	check(err)
	handler := func(f func(any)) toolscache.ResourceEventHandlerFuncs {
		return toolscache.ResourceEventHandlerFuncs{AddFunc: f, UpdateFunc: func(_, n any) { f(n) }}
	}
	before := requests(metricsURL)
	o.start = time.Now()
	podReg, err := podInf.AddEventHandler(handler(o.pod))
	check(err)
	jobReg, err := jobInf.AddEventHandler(handler(o.job))
	check(err)
	job := testjob.MakeZayaTrainingJob(name, ns).Nodes(nodes).Obj()
	o.mu.Lock()
	o.start = time.Now()
	o.mu.Unlock()
	check(c.Create(ctx, job))

	progress := time.NewTicker(10 * time.Second)
	defer progress.Stop()
	deadline := time.After(10 * time.Minute)
wait:
	for {
		select {
		case <-done:
			break wait
		case <-progress.C:
			o.mu.Lock()
			fmt.Fprintf(os.Stderr, "  %s: %d created, %d bound, %d running, job Running after %v\n", name, len(o.seen), len(o.bound), len(o.running), o.s.jobRunning)
			o.mu.Unlock()
		case <-deadline:
			check(fmt.Errorf("job %s not Running after 10 minutes", name))
		}
	}
	check(podInf.RemoveEventHandler(podReg))
	check(jobInf.RemoveEventHandler(jobReg))
	o.mu.Lock()
	s := o.s
	o.mu.Unlock()
	s.requests = requests(metricsURL) - before

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

// requests sums the operator's client-go request counter.
func requests(url string) float64 {
	if url == "" {
		return 0
	}
	resp, err := http.Get(url)
	check(err)
	defer func() { _ = resp.Body.Close() }()
	total := 0.0
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, "rest_client_requests_total{") {
			continue
		}
		f := strings.Fields(line)
		v, err := strconv.ParseFloat(f[len(f)-1], 64)
		check(err)
		total += v
	}
	return total
}

func check(err error) {
	if err != nil {
		fmt.Fprintln(os.Stderr, "launch:", err)
		os.Exit(1)
	}
}
