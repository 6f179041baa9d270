package controllers

import (
	"context"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/metrics"

	trainingv1alpha1 "github.com/zaya-operator/zaya-operator/api/v1alpha1"
)

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
		Help: "Whole-gang restarts, by failure reason.",
	}, []string{"reason"})
	recoverySeconds = prometheus.NewHistogram(prometheus.HistogramOpts{
		Name:    "zaya_gang_recovery_seconds",
		Help:    "Seconds from a failure being seen to every rank of the new attempt running.",
		Buckets: prometheus.ExponentialBuckets(0.5, 2, 14),
	})
	registerOnce sync.Once
)

// jobsCollector reports how many jobs have each condition True, read from the cache at scrape
// time so it can never drift from the objects.
type jobsCollector struct {
	reader client.Reader
	desc   *prometheus.Desc
}

func (c *jobsCollector) Describe(ch chan<- *prometheus.Desc) { ch <- c.desc }

func (c *jobsCollector) Collect(ch chan<- prometheus.Metric) {
	jobs := &trainingv1alpha1.ZayaTrainingJobList{}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := c.reader.List(ctx, jobs); err != nil {
		ch <- prometheus.NewInvalidMetric(c.desc, err)
		return
	}
	counts := map[string]int{}
	for _, t := range []string{
		trainingv1alpha1.ConditionCreated, trainingv1alpha1.ConditionRunning, trainingv1alpha1.ConditionRestarting,
		trainingv1alpha1.ConditionWaitingForCapacity, trainingv1alpha1.ConditionSuspended,
		trainingv1alpha1.ConditionSucceeded, trainingv1alpha1.ConditionFailed,
	} {
		counts[t] = 0
	}
	for i := range jobs.Items {
		for _, cond := range jobs.Items[i].Status.Conditions {
			if cond.Status == metav1.ConditionTrue {
				counts[cond.Type]++
			}
		}
	}
	for t, n := range counts {
		ch <- prometheus.MustNewConstMetric(c.desc, prometheus.GaugeValue, float64(n), t)
	}
}

// registerMetrics adds the operator's metrics to controller-runtime's registry (once per process).
func registerMetrics(reader client.Reader) {
	registerOnce.Do(func() {
		metrics.Registry.MustRegister(podsCreated, timeToRunning, restartsTotal, recoverySeconds, &jobsCollector{
			reader: reader,
			desc:   prometheus.NewDesc("zaya_jobs", "ZayaTrainingJobs whose condition is True, by condition.", []string{"condition"}, nil),
		})
	})
}

// observe records metrics for status transitions that were just stored.
func (p *pass) observe(old *trainingv1alpha1.ZayaTrainingJobStatus) {
	wasRunning := meta.IsStatusConditionTrue(old.Conditions, trainingv1alpha1.ConditionRunning)
	isRunning := meta.IsStatusConditionTrue(p.job.Status.Conditions, trainingv1alpha1.ConditionRunning)
	if !wasRunning && isRunning && p.job.Status.Restarts == 0 {
		timeToRunning.Observe(p.now.Sub(p.job.CreationTimestamp.Time).Seconds())
	}
}
