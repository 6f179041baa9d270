package restart

import (
	"github.com/prometheus/client_golang/prometheus"
	"sigs.k8s.io/controller-runtime/pkg/metrics"
)

// The restarts' metrics, registered with controller-runtime's registry when the package loads.
// Each is counted only once the status that records its decision is stored (Host.WhenStored).
var (
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
	metrics.Registry.MustRegister(restartsTotal, recoverySeconds, escalationsTotal, failuresTotal, podsReplacedTotal)
}
