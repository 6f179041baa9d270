package controllers

import (
	"context"
	"errors"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/metrics"
)

// The operator's own metrics, registered with controller-runtime's registry when the package
// loads. Decisions (restarts, recoveries, first runs) are counted only once the status that
// records them is stored: see pass.whenStored.
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
	restartsTotal = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "zaya_gang_restarts_total",
		Help: "Whole-gang restarts, by failure reason, by mode (InPlace, Recreate) and by mechanism (RestartRules, Supervisor, Recreate).",
	}, []string{"reason", "mode", "mechanism"})
	recoverySeconds = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "zaya_gang_recovery_seconds",
		Help:    "Seconds from a failure (for in-place restarts: the fault itself) to every rank running again, by the mode the restart ended in.",
		Buckets: prometheus.ExponentialBuckets(0.5, 2, 14),
	}, []string{"mode"})
	escalationsTotal = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "zaya_gang_restart_escalations_total",
		Help: "In-place restarts turned into a recreate of the gang, by why.",
	}, []string{"reason"})
	failuresTotal = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "zaya_failures_total",
		Help: "Rank failures that restarted or failed a job, by category (of the root cause) and role: root (the cause) or cascade (ranks that failed with it).",
	}, []string{"category", "role"})
	podsReplacedTotal = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "zaya_gang_pods_replaced_total",
		Help: "Worker pods replaced during in-place restarts (the other ranks restarted in place), by why.",
	}, []string{"reason"})
)

func init() {
	metrics.Registry.MustRegister(podsCreated, timeToRunning, restartsTotal, recoverySeconds, escalationsTotal, podsReplacedTotal, failuresTotal)
}

// jobsDesc describes the gauge of jobs by True condition.
var jobsDesc = prometheus.NewDesc("zaya_jobs", "ZayaTrainingJobs whose condition is True, by condition.", []string{"condition"}, nil)

// jobsCollector reports how many jobs have each condition True, read from the cache at scrape
// time so it can never drift from the objects.
type jobsCollector struct {
	reader client.Reader
}

func (c *jobsCollector) Describe(ch chan<- *prometheus.Desc) { ch <- jobsDesc }

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
	for i := range jobs.Items {
		// Read as stored: a job whose spec cannot be decoded still counts by its conditions.
		conds, _, _ := unstructured.NestedSlice(jobs.Items[i].Object, "status", "conditions")
		for _, c := range conds {
			if m, ok := c.(map[string]any); ok && m["status"] == string(metav1.ConditionTrue) {
				if t, ok := m["type"].(string); ok {
					counts[t]++
				}
			}
		}
	}
	for t, n := range counts {
		ch <- prometheus.MustNewConstMetric(jobsDesc, prometheus.GaugeValue, float64(n), t)
	}
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
