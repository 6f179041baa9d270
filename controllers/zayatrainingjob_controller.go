// Package controllers reconciles ZayaTrainingJobs into gangs of AMD GPU worker pods and
// keeps them alive.
package controllers

import (
	"context"
	"fmt"
	"unicode/utf8"

	corev1 "k8s.io/api/core/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/events"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/log"

	trainingv1alpha1 "github.com/zaya-operator/zaya-operator/api/v1alpha1"
)

// maxMessageLength bounds condition messages (the API allows 32768; status stays small).
const maxMessageLength = 1024

// ZayaTrainingJobReconciler reconciles ZayaTrainingJob objects.
type ZayaTrainingJobReconciler struct {
	client.Client
	Recorder events.EventRecorder
	Clock    clock.PassiveClock
}

// +kubebuilder:rbac:groups=training.zaya.dev,resources=zayatrainingjobs,verbs=get;list;watch
// +kubebuilder:rbac:groups=training.zaya.dev,resources=zayatrainingjobs/status,verbs=get;update;patch
// +kubebuilder:rbac:groups=events.k8s.io,resources=events,verbs=create;patch

// Reconcile brings one job one step closer to its spec and writes its status once.
func (r *ZayaTrainingJobReconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	job := &trainingv1alpha1.ZayaTrainingJob{}
	if err := r.Get(ctx, req.NamespacedName, job); err != nil {
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	if !job.DeletionTimestamp.IsZero() || !job.ManagedByOperator() {
		return ctrl.Result{}, nil
	}
	logger := log.FromContext(ctx).WithValues("job", klog.KObj(job))
	ctx = log.IntoContext(ctx, logger)

	oldStatus := job.Status.DeepCopy()
	pending := r.reconcile(ctx, job)

	if !apiequality.Semantic.DeepEqual(oldStatus, &job.Status) {
		if err := r.Status().Update(ctx, job); err != nil {
			if apierrors.IsConflict(err) {
				// A newer version is on its way through the watch; it triggers the next pass.
				logger.V(1).Info("status update conflicted, waiting for the newer version")
				return ctrl.Result{}, nil
			}
			return ctrl.Result{}, fmt.Errorf("updating status: %w", err)
		}
	}
	for _, e := range pending {
		r.Recorder.Eventf(job, nil, e.eventType, e.reason, e.action, "%s", e.note)
	}
	return ctrl.Result{}, nil
}

// event is an event to emit once the status it describes is stored.
type event struct {
	eventType, reason, action, note string
}

// reconcile runs the steps of one pass on job, changing job.Status in memory only.
func (r *ZayaTrainingJobReconciler) reconcile(ctx context.Context, job *trainingv1alpha1.ZayaTrainingJob) []event {
	var events []event
	job.Status.ObservedGeneration = job.Generation

	if errs := trainingv1alpha1.ValidateSpec(&job.Spec); len(errs) > 0 {
		msg := truncate(errs.ToAggregate().Error())
		if r.setCondition(job, trainingv1alpha1.ConditionCreated, metav1.ConditionFalse, trainingv1alpha1.ReasonInvalidSpec, msg) {
			events = append(events, event{corev1.EventTypeWarning, trainingv1alpha1.ReasonInvalidSpec, "Validate", msg})
			log.FromContext(ctx).Info("job spec is invalid", "errors", msg)
		}
		return events
	}

	if r.setCondition(job, trainingv1alpha1.ConditionCreated, metav1.ConditionTrue, trainingv1alpha1.ReasonAccepted,
		fmt.Sprintf("accepted a gang of %d nodes x %d GPUs", job.Spec.Nodes, job.Spec.GPUsPerNode)) {
		events = append(events, event{corev1.EventTypeNormal, trainingv1alpha1.ReasonAccepted, "Create",
			fmt.Sprintf("accepted: world size %d, context parallel %d, network %s",
				job.Spec.WorldSize(), job.Spec.Parallelism.ContextParallel, job.Spec.Network.Profile)})
	}
	return events
}

// setCondition sets a condition on job's status and reports whether it changed.
func (r *ZayaTrainingJobReconciler) setCondition(job *trainingv1alpha1.ZayaTrainingJob, condType string, status metav1.ConditionStatus, reason, message string) bool {
	return meta.SetStatusCondition(&job.Status.Conditions, metav1.Condition{
		Type:               condType,
		Status:             status,
		Reason:             reason,
		Message:            truncate(message),
		ObservedGeneration: job.Generation,
		LastTransitionTime: metav1.NewTime(r.Clock.Now()),
	})
}

// truncate bounds a message to maxMessageLength bytes.
func truncate(s string) string {
	if len(s) <= maxMessageLength {
		return s
	}
	cut := maxMessageLength - len("...")
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + "..."
}

// SetupWithManager registers the reconciler with mgr.
func (r *ZayaTrainingJobReconciler) SetupWithManager(mgr ctrl.Manager, concurrency int) error {
	return ctrl.NewControllerManagedBy(mgr).
		For(&trainingv1alpha1.ZayaTrainingJob{}).
		WithOptions(controller.Options{MaxConcurrentReconciles: concurrency}).
		Named("zayatrainingjob").
		Complete(r)
}
