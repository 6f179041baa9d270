package restart

import (
	"github.com/prometheus/client_golang/prometheus"
	"sigs.k8s.io/controller-runtime/pkg/metrics"

	trainingv1alpha1 "github.com/zaya-operator/zaya-operator/api/v1alpha1"
	"github.com/zaya-operator/zaya-operator/controllers/attribution"
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
	resizesTotal = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "zaya_gang_resizes_total",
		Help: "Elastic gangs restarted on fewer nodes (shrink) or back on more (grow).",
	}, []string{"direction"})
)

func init() {
	metrics.Registry.MustRegister(restartsTotal, recoverySeconds, escalationsTotal, failuresTotal, podsReplacedTotal, resizesTotal)
	resizesTotal.WithLabelValues("shrink")
	resizesTotal.WithLabelValues("grow")
	// Every series a fault can raise starts at 0, so a rate over it is 0, not "no data", and a
	// dashboard finds it before the first fault.
	for _, mode := range []trainingv1alpha1.RestartMode{trainingv1alpha1.RestartModeInPlace, trainingv1alpha1.RestartModeRecreate} {
		recoverySeconds.WithLabelValues(string(mode))
	}
	for _, reason := range []string{trainingv1alpha1.ReasonInPlaceTimedOut, trainingv1alpha1.ReasonInPlaceFailed} {
		escalationsTotal.WithLabelValues(reason)
		podsReplacedTotal.WithLabelValues(reason)
	}
	for _, c := range attribution.Categories {
		failuresTotal.WithLabelValues(string(c), "root")
		failuresTotal.WithLabelValues(string(c), "cascade")
	}
	for _, reason := range []string{trainingv1alpha1.FailureReasonExitCode, trainingv1alpha1.FailureReasonNodeLost, trainingv1alpha1.FailureReasonDeviceUnhealthy,
		trainingv1alpha1.FailureReasonHang, trainingv1alpha1.FailureReasonEvicted, trainingv1alpha1.FailureReasonPreempted} {
		restartsTotal.WithLabelValues(reason, string(trainingv1alpha1.RestartModeInPlace), string(trainingv1alpha1.RestartMechanismRestartRules))
		restartsTotal.WithLabelValues(reason, string(trainingv1alpha1.RestartModeRecreate), string(trainingv1alpha1.RestartMechanismRecreate))
		podsReplacedTotal.WithLabelValues(reason)
	}
}
