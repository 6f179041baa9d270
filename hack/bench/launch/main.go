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
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/client"

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

	cfg, err := clientcmd.BuildConfigFromFlags("", *kubeconfig)
	check(err)
	cfg.QPS, cfg.Burst = 1000, 2000
	scheme := runtime.NewScheme()
	check(clientgoscheme.AddToScheme(scheme))
	check(trainingv1alpha1.AddToScheme(scheme))
	c, err := client.NewWithWatch(cfg, client.Options{Scheme: scheme})
	check(err)
	ctx := context.Background()
	if err := c.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: *ns}}); err != nil && !strings.Contains(err.Error(), "already exists") {
		check(err)
	}

	var samples []sample
	for i := range *runs {
		s := launch(ctx, c, *ns, fmt.Sprintf("bench-%d-%d", *nodes, i), int32(*nodes), *metricsURL)
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

// launch creates one job, follows its pods and the job until it is Running, then deletes it.
func launch(ctx context.Context, c client.WithWatch, ns, name string, nodes int32, metricsURL string) sample {
	podWatch, err := c.Watch(ctx, &corev1.PodList{}, client.InNamespace(ns), client.MatchingLabels{trainingv1alpha1.JobNameLabel: name})
	check(err)
	defer podWatch.Stop()
	jobWatch, err := c.Watch(ctx, &trainingv1alpha1.ZayaTrainingJobList{}, client.InNamespace(ns))
	check(err)
	defer jobWatch.Stop()

	before := requests(metricsURL)
	job := testjob.MakeZayaTrainingJob(name, ns).Nodes(nodes).Obj()
	start := time.Now()
	check(c.Create(ctx, job))

	var s sample
	seen, bound, running := map[string]bool{}, map[string]bool{}, map[string]bool{}
	deadline := time.After(10 * time.Minute)
	for s.jobRunning == 0 || len(running) < int(nodes) {
		select {
		case ev := <-podWatch.ResultChan():
			pod, ok := ev.Object.(*corev1.Pod)
			if !ok || ev.Type == watch.Deleted {
				continue
			}
			at := time.Since(start)
			if !seen[pod.Name] {
				seen[pod.Name] = true
				if len(seen) == 1 {
					s.firstPod = at
				}
				if len(seen) == int(nodes) {
					s.lastPod = at
				}
			}
			if pod.Spec.NodeName != "" && !bound[pod.Name] {
				bound[pod.Name] = true
				if len(bound) == int(nodes) {
					s.lastBound = at
				}
			}
			if pod.Status.Phase == corev1.PodRunning && !running[pod.Name] {
				running[pod.Name] = true
				if len(running) == int(nodes) {
					s.lastRunning = at
				}
			}
		case ev := <-jobWatch.ResultChan():
			j, ok := ev.Object.(*trainingv1alpha1.ZayaTrainingJob)
			if ok && j.Name == name && s.jobRunning == 0 && meta.IsStatusConditionTrue(j.Status.Conditions, trainingv1alpha1.ConditionRunning) {
				s.jobRunning = time.Since(start)
			}
		case <-deadline:
			check(fmt.Errorf("job %s not Running after 10 minutes (%d created, %d bound, %d running)", name, len(seen), len(bound), len(running)))
		}
	}
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
