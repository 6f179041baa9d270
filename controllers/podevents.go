package controllers

import (
	"context"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/workqueue"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	trainingv1alpha1 "github.com/zaya-operator/zaya-operator/api/v1alpha1"
	"github.com/zaya-operator/zaya-operator/controllers/gang"
	"github.com/zaya-operator/zaya-operator/controllers/workerpod"
)

// progressBatch is how long a job's pass waits after a pod event that only reports progress
// (created, scheduled, started, ready): during a launch of N ranks such events arrive by the
// thousand and each pass walks every pod, so one pass per batch keeps the cost linear.
const progressBatch = 200 * time.Millisecond

// podEvents enqueues a pod's job: at once when the pod failed, finished or is going away
// (recovery must not wait), after progressBatch otherwise (the queue merges the waits).
type podEvents struct{}

func (podEvents) Create(_ context.Context, e event.CreateEvent, q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
	enqueueOwner(e.Object, q, progressBatch)
}

func (podEvents) Update(_ context.Context, e event.UpdateEvent, q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
	delay := progressBatch
	if pod, ok := e.ObjectNew.(*corev1.Pod); ok && (!pod.DeletionTimestamp.IsZero() ||
		pod.Status.Phase == corev1.PodFailed || pod.Status.Phase == corev1.PodSucceeded || pod.Status.Reason != "" ||
		workerExited(e.ObjectOld, pod)) {
		delay = 0
	}
	enqueueOwner(e.ObjectNew, q, delay)
}

func (podEvents) Delete(_ context.Context, e event.DeleteEvent, q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
	enqueueOwner(e.Object, q, 0)
}

func (podEvents) Generic(_ context.Context, e event.GenericEvent, q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
	enqueueOwner(e.Object, q, 0)
}

// workerExited reports whether the update shows a worker process that ended by a fault of its
// own: exited now, or restarted in place since the old version, with an exit other than 75.
// A worker that stopped because a peer failed (75) is the cascade of a fault already on its
// way: at 2,048 ranks those exits come by the thousand, and batching them like progress keeps
// the restart's passes, each over every pod, from piling up.
func workerExited(old client.Object, pod *corev1.Pod) bool {
	s := gang.WorkerStatus(pod)
	if s == nil {
		return false
	}
	if t := s.State.Terminated; t != nil {
		return t.ExitCode != trainingv1alpha1.ExitStopped
	}
	o, ok := old.(*corev1.Pod)
	if !ok {
		return false
	}
	// No earlier status is a container starting, which is progress like any other.
	os := gang.WorkerStatus(o)
	if os == nil || os.RestartCount == s.RestartCount {
		return false
	}
	last := s.LastTerminationState.Terminated
	return last == nil || last.ExitCode != trainingv1alpha1.ExitStopped
}

// enqueueOwner queues the job that controls obj, after delay. A rank controlled by nothing
// (orphaned by kubectl delete --cascade=orphan) queues the job its label names: it holds that
// job's Kueue quota until it ends.
func enqueueOwner(obj client.Object, q workqueue.TypedRateLimitingInterface[reconcile.Request], delay time.Duration) {
	name, ok := workerpod.OwningJob(obj)
	if !ok && metav1.GetControllerOf(obj) == nil {
		name = obj.GetLabels()[trainingv1alpha1.JobNameLabel]
		ok = name != ""
	}
	if !ok {
		return
	}
	req := reconcile.Request{NamespacedName: types.NamespacedName{Namespace: obj.GetNamespace(), Name: name}}
	if delay > 0 {
		q.AddAfter(req, delay)
		return
	}
	q.Add(req)
}
