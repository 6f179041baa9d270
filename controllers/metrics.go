package controllers

import (
	"context"
	"errors"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/metrics"

	trainingv1alpha1 "github.com/zaya-operator/zaya-operator/api/v1alpha1"
	"github.com/zaya-operator/zaya-operator/controllers/attribution"
	"github.com/zaya-operator/zaya-operator/controllers/recovery"
)

// The core's metrics (the restarts' are controllers/restart's), registered with
// controller-runtime's registry when the package loads. Decisions (first runs, losses) are
// counted only once the status that records them is stored: see pass.whenStored.
var (
	podsCreated = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "zaya_worker_pods_created_total",
		Help: "Worker pods created by the operator.",
	})
	timeToRunning = prometheus.NewHistogram(prometheus.HistogramOpts{
		Name:    "zaya_job_time_to_running_seconds",
		Help:    "Seconds from a job's creation to all of its ranks running for the first time.",
		Buckets: prometheus.ExponentialBuckets(0.5, 2, 14), // 0.5 s .. ~68 min
	})
	lostSecondsTotal = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "zaya_lost_seconds_total",
		Help: "Seconds of jobs' time that went to no training (status.goodput), by category (of the failure; Startup for starts) and kind: down (until training again) or recompute (steps trained again).",
	}, []string{"category", "kind"})
)

func init() {
	metrics.Registry.MustRegister(podsCreated, timeToRunning, lostSecondsTotal)
	for _, c := range append([]string{"Startup"}, categoryNames()...) { // 0 before the first loss (restart/metrics.go)
		lostSecondsTotal.WithLabelValues(c, "down")
		lostSecondsTotal.WithLabelValues(c, "recompute")
	}
}

func categoryNames() []string {
	out := make([]string, len(attribution.Categories))
	for i, c := range attribution.Categories {
		out[i] = string(c)
	}
	return out
}

// jobsDesc describes the gauge of jobs by True condition.
var jobsDesc = prometheus.NewDesc("zaya_jobs", "ZayaTrainingJobs whose condition is True, by condition.", []string{"condition"}, nil)

// jobsCollector reports how many jobs have each condition True, read from the cache at scrape
// time so it can never drift from the objects.
type jobsCollector struct {
	reader client.Reader
}

// goodputDesc describes each job's effective-training-time ratio.
var goodputDesc = prometheus.NewDesc("zaya_job_effective_training_ratio",
	"Each started job's training time over its wall time (status.goodput), carried on to the scrape while it runs.",
	[]string{"namespace", "name"}, nil)

// quarantinedDesc describes each job's quarantined nodes (status.quarantinedNodes).
var quarantinedDesc = prometheus.NewDesc("zaya_job_quarantined_nodes",
	"Nodes each job keeps its ranks off (status.quarantinedNodes).", []string{"namespace", "name"}, nil)

// notTrainingDesc and restartsLeftDesc describe each unfinished, started job's time since it
// last trained (0 while it trains) and its restart budget left: what the alerts watch.
var (
	notTrainingDesc = prometheus.NewDesc("zaya_job_not_training_seconds",
		"Each started, unfinished job's seconds since it stopped training (status.goodput.open: a start or a failure not yet over); 0 while it trains.",
		[]string{"namespace", "name"}, nil)
	restartsLeftDesc = prometheus.NewDesc("zaya_job_restarts_left",
		"Each unfinished job's counted restarts left within its restart window (faultTolerance.maxRestarts less the restarts within restartWindow).",
		[]string{"namespace", "name"}, nil)
)

// taintedDesc describes the nodes carrying the operator's taints.
var taintedDesc = prometheus.NewDesc("zaya_nodes_tainted",
	"Nodes tainted by the operator: quarantined (a job's quarantine, nodeTaint NoSchedule) or hardware-suspect (hardware failures rooted there in several namespaces' jobs).",
	[]string{"taint"}, nil)

func (c *jobsCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- jobsDesc
	ch <- goodputDesc
	ch <- quarantinedDesc
	ch <- taintedDesc
	ch <- notTrainingDesc
	ch <- restartsLeftDesc
}

func (c *jobsCollector) Collect(ch chan<- prometheus.Metric) {
	jobs := storedJobList()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := c.reader.List(ctx, jobs); err != nil {
		ch <- prometheus.NewInvalidMetric(jobsDesc, err)
		return
	}
	counts := make(map[string]int, len(conditionTypes))
	for _, t := range conditionTypes {
		counts[t] = 0
	}
	now := time.Now()
	for i := range jobs.Items {
		// Read as stored: a job whose spec cannot be decoded still counts by its conditions.
		conds, _, _ := unstructured.NestedSlice(jobs.Items[i].Object, "status", "conditions")
		running := false
		for _, c := range conds {
			if m, ok := c.(map[string]any); ok && m["status"] == string(metav1.ConditionTrue) {
				// Only the operator's condition types: any tenant with status access may store
				// others, and each would be a new series on the cluster's Prometheus.
				if t, ok := m["type"].(string); ok {
					if _, known := counts[t]; known {
						counts[t]++
					}
					running = running || t == trainingv1alpha1.ConditionRunning
				}
			}
		}
		if ratio, ok := goodputRatio(jobs.Items[i].Object, running, now); ok {
			ch <- prometheus.MustNewConstMetric(goodputDesc, prometheus.GaugeValue, ratio, jobs.Items[i].GetNamespace(), jobs.Items[i].GetName())
		}
		quarantined, _, _ := unstructured.NestedSlice(jobs.Items[i].Object, "status", "quarantinedNodes")
		ch <- prometheus.MustNewConstMetric(quarantinedDesc, prometheus.GaugeValue, float64(len(quarantined)), jobs.Items[i].GetNamespace(), jobs.Items[i].GetName())
		if job, _, err := decodeJob(&jobs.Items[i]); err == nil && !recovery.Finished(job) {
			jobGauges(ch, job, now)
		}
	}
	nodes := &corev1.NodeList{}
	if err := c.reader.List(ctx, nodes, client.UnsafeDisableDeepCopy); err != nil {
		ch <- prometheus.NewInvalidMetric(taintedDesc, err)
	} else {
		tainted := map[string]int{trainingv1alpha1.QuarantineTaintKey: 0, trainingv1alpha1.HardwareSuspectTaintKey: 0}
		for i := range nodes.Items {
			for _, t := range nodes.Items[i].Spec.Taints {
				if _, ours := tainted[t.Key]; ours {
					tainted[t.Key]++
				}
			}
		}
		ch <- prometheus.MustNewConstMetric(taintedDesc, prometheus.GaugeValue, float64(tainted[trainingv1alpha1.QuarantineTaintKey]), "quarantined")
		ch <- prometheus.MustNewConstMetric(taintedDesc, prometheus.GaugeValue, float64(tainted[trainingv1alpha1.HardwareSuspectTaintKey]), "hardware-suspect")
	}
	for t, n := range counts {
		ch <- prometheus.MustNewConstMetric(jobsDesc, prometheus.GaugeValue, float64(n), t)
	}
}

// jobGauges reports an unfinished job's time since it trained and its restart budget left.
func jobGauges(ch chan<- prometheus.Metric, job *trainingv1alpha1.ZayaTrainingJob, now time.Time) {
	ns, name := job.Namespace, job.Name
	ch <- prometheus.MustNewConstMetric(restartsLeftDesc, prometheus.GaugeValue, float64(recovery.RestartsLeft(job, now)), ns, name)
	g := job.Status.Goodput
	if g == nil || job.Spec.Suspend {
		return // not started, or suspended: not meant to train
	}
	idle := 0.0
	if g.Open != nil {
		// No longer than the job has existed: goodput.open.since is status, which others may
		// write (a managedBy job's manager), and the alerts page on this number.
		since := g.Open.Since.Time
		if c := job.CreationTimestamp.Time; since.Before(c) {
			since = c
		}
		idle = max(now.Sub(since).Seconds(), 0)
	}
	ch <- prometheus.MustNewConstMetric(notTrainingDesc, prometheus.GaugeValue, idle, ns, name)
}

// registerJobsCollector makes reg's jobs gauge read from reader, replacing the collector of
// an earlier manager in the same process (tests start several) rather than keeping its client.
func registerJobsCollector(reg prometheus.Registerer, reader client.Reader) error {
	c := &jobsCollector{reader: reader}
	if err := reg.Register(c); err != nil {
		var dup prometheus.AlreadyRegisteredError
		if !errors.As(err, &dup) {
			return err
		}
		reg.Unregister(dup.ExistingCollector)
		return reg.Register(c)
	}
	return nil
}

// goodputRatio is a stored job's training time over its wall time: as of status.goodput.asOf,
// and for a running job up to now (the time since has all been training).
func goodputRatio(obj map[string]any, running bool, now time.Time) (float64, bool) {
	wall, ok1, _ := unstructured.NestedInt64(obj, "status", "goodput", "wallMilliseconds")
	training, _, _ := unstructured.NestedInt64(obj, "status", "goodput", "trainingMilliseconds")
	asOf, ok2, _ := unstructured.NestedString(obj, "status", "goodput", "asOf")
	if !ok1 || !ok2 || wall < 0 || training < 0 {
		return 0, false
	}
	// In floating point: the stored counters and asOf are status others may write, and an
	// asOf of year 1 added to a large counter wrapped int64 (a ratio of -2.6e12 was exported).
	w, tr := float64(wall), float64(training)
	if t, err := time.Parse(time.RFC3339, asOf); err == nil && running && now.After(t) {
		d := float64(now.Sub(t) / time.Millisecond)
		w, tr = w+d, tr+d
	}
	if w <= 0 {
		return 0, false
	}
	return min(max(tr/w, 0), 1), true
}
