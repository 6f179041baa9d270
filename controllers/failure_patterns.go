package controllers

import (
	"context"
	"fmt"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/metrics"

	trainingv1alpha1 "github.com/zaya-operator/zaya-operator/api/v1alpha1"
	"github.com/zaya-operator/zaya-operator/controllers/attribution"
	"github.com/zaya-operator/zaya-operator/controllers/bounded"
)

// FailurePatternsKey is the ConfigMap key that holds a user's failure patterns: a YAML list of
// {name, category, regexp} (docs/recovery.md, "Why it failed").
const FailurePatternsKey = "patterns.yaml"

// DefaultFailurePatternsInterval is how often the ConfigMap is read again.
const DefaultFailurePatternsInterval = 30 * time.Second

var (
	failurePatternRules = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "zaya_failure_patterns_rules",
		Help: "Failure patterns in use: the shipped ones plus the ConfigMap's.",
	})
	failurePatternsRefused = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "zaya_failure_patterns_refused_total",
		Help: "Versions of the failure-patterns ConfigMap refused as invalid (the table in use stayed).",
	})
)

func init() { metrics.Registry.MustRegister(failurePatternRules, failurePatternsRefused) }

// FailurePatterns keeps the reconciler's failure patterns in step with one ConfigMap, read
// (a get, nothing cached) every Interval: the shipped rules plus the ConfigMap's, whose rules
// replace shipped ones of the same name. A version that does not parse is refused whole, the
// table in use stays, and a warning event on the ConfigMap names each bad rule and why. A
// missing ConfigMap means the shipped rules alone. Every replica reads it, leader or not.
type FailurePatterns struct {
	Reader   client.Reader
	Key      types.NamespacedName
	Recorder events.EventRecorder
	Target   *ZayaTrainingJobReconciler
	Interval time.Duration

	version string // the ConfigMap's resourceVersion last read; "-" for none
}

// NeedLeaderElection is false: a replica that takes over must already read failures right.
func (f *FailurePatterns) NeedLeaderElection() bool { return false }

// Start reads the ConfigMap until ctx ends.
func (f *FailurePatterns) Start(ctx context.Context) error {
	interval := f.Interval
	if interval <= 0 {
		interval = DefaultFailurePatternsInterval
	}
	failurePatternRules.Set(float64(f.Target.failurePatterns().Len()))
	for {
		if err := f.Load(ctx); err != nil {
			log.FromContext(ctx).Error(err, "reading the failure patterns", "configMap", f.Key.String())
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(interval):
		}
	}
}

// Load reads the ConfigMap once and applies it when it changed.
func (f *FailurePatterns) Load(ctx context.Context) error {
	cm := &corev1.ConfigMap{}
	err := f.Reader.Get(ctx, f.Key, cm)
	switch {
	case apierrors.IsNotFound(err):
		if f.version != "-" {
			f.Target.SetFailurePatterns(nil)
			failurePatternRules.Set(float64(f.Target.failurePatterns().Len()))
			f.version = "-"
		}
		return nil
	case err != nil:
		return err
	case cm.ResourceVersion == f.version:
		return nil
	}
	f.version = cm.ResourceVersion
	user, err := attribution.Parse([]byte(cm.Data[FailurePatternsKey]))
	if err != nil {
		failurePatternsRefused.Inc()
		f.Recorder.Eventf(cm, nil, corev1.EventTypeWarning, trainingv1alpha1.ReasonInvalidFailurePatterns, "Load",
			"%s", bounded.Message(fmt.Sprintf("refused %s (the failure patterns in use stay): %v", FailurePatternsKey, err)))
		log.FromContext(ctx).Info("refused the failure patterns", "configMap", f.Key.String(), "error", err.Error())
		return nil
	}
	f.Target.SetFailurePatterns(user)
	n := f.Target.failurePatterns().Len()
	failurePatternRules.Set(float64(n))
	f.Recorder.Eventf(cm, nil, corev1.EventTypeNormal, trainingv1alpha1.ReasonFailurePatternsLoaded, "Load",
		"reading failures with %d patterns (%d of them from this ConfigMap)", n, user.Len())
	return nil
}
