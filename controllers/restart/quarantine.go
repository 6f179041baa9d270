package restart

import (
	"context"
	"fmt"
	"slices"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	trainingv1alpha1 "github.com/zaya-operator/zaya-operator/api/v1alpha1"
	"github.com/zaya-operator/zaya-operator/controllers/nodehealth"
	"github.com/zaya-operator/zaya-operator/controllers/recovery"
)

// quarantineRepeated quarantines the node of a worker failure that is the third rooted there
// within restartWindow (recovery.RepeatedOnNode), and reports whether it did: the gang must then
// be recreated elsewhere, not restarted in place.
func (e *Executor) quarantineRepeated(ctx context.Context, f trainingv1alpha1.JobFailure) (bool, error) {
	n := recovery.RepeatedOnNode(f, e.Job.Status.RecentFailures, e.Now.Add(-e.Job.Spec.FaultTolerance.RestartWindow.Duration))
	if n < recovery.RepeatedFailuresToQuarantine {
		return false, nil
	}
	q := f
	q.Reason = trainingv1alpha1.FailureReasonRepeatedFailures
	q.Message = fmt.Sprintf("%d failures on it within %s, the last: %s", n, e.Job.Spec.FaultTolerance.RestartWindow.Duration, f.Message)
	return true, e.quarantine(ctx, &q)
}

// quarantine adds a node to the job's exclusion list (oldest entries go when it is full) and,
// if asked, taints it. The taint is checked even when the node is listed already: a pass whose
// taint request failed still writes the list, and the retry must not stop at it.
func (e *Executor) quarantine(ctx context.Context, f *trainingv1alpha1.JobFailure) error {
	st := &e.Job.Status
	if f.Node == "" {
		return nil
	}
	if !slices.ContainsFunc(st.QuarantinedNodes, func(q trainingv1alpha1.QuarantinedNode) bool { return q.Name == f.Node }) {
		st.QuarantinedNodes = append(st.QuarantinedNodes, trainingv1alpha1.QuarantinedNode{Name: f.Node, Reason: f.Reason, Since: metav1.Time{Time: e.Now}})
		if over := len(st.QuarantinedNodes) - int(e.Job.Spec.FaultTolerance.Quarantine.MaxNodes); over > 0 {
			st.QuarantinedNodes = st.QuarantinedNodes[over:]
		}
		e.Host.Warning(trainingv1alpha1.ReasonNodeQuarantined, "Quarantine", "quarantined node %s for this job: %s", f.Node, f.Message)
	}
	if err := e.suspectNode(ctx, f); err != nil {
		return err
	}
	if e.Job.Spec.FaultTolerance.Quarantine.NodeTaint != trainingv1alpha1.QuarantineTaintNoSchedule || !recovery.PlatformSignal(f.Reason) {
		return nil
	}
	return e.taintNode(ctx, f.Node)
}

// quarantineTaintUntil is when a taint added now expires: the job's expireAfter, within the
// platform's bound.
func (e *Executor) quarantineTaintUntil() time.Time {
	limit := e.TaintMax
	if limit <= 0 {
		limit = nodehealth.DefaultQuarantineTaintMax
	}
	return e.Now.Add(min(e.Job.Spec.FaultTolerance.Quarantine.ExpireAfter.Duration, limit))
}

// taintNode adds training.zaya.dev/quarantined:NoSchedule to a node, once, and records when it
// expires (the later of the recorded and this job's expiry, when another job tainted it).
func (e *Executor) taintNode(ctx context.Context, name string) error {
	node := &corev1.Node{}
	if err := e.Cluster.Get(ctx, client.ObjectKey{Name: name}, node); err != nil {
		return client.IgnoreNotFound(err)
	}
	until := e.quarantineTaintUntil()
	tainted := slices.ContainsFunc(node.Spec.Taints, func(t corev1.Taint) bool { return t.Key == trainingv1alpha1.QuarantineTaintKey })
	recorded, err := time.Parse(time.RFC3339, node.Annotations[trainingv1alpha1.QuarantineTaintUntilAnnotation])
	if tainted && err == nil && !recorded.Before(until.Truncate(time.Second)) {
		return nil
	}
	base := node.DeepCopy()
	if node.Annotations == nil {
		node.Annotations = map[string]string{}
	}
	node.Annotations[trainingv1alpha1.QuarantineTaintUntilAnnotation] = until.UTC().Format(time.RFC3339)
	if !tainted {
		node.Spec.Taints = append(node.Spec.Taints, corev1.Taint{
			Key: trainingv1alpha1.QuarantineTaintKey, Value: recovery.TaintValue(e.Job.Namespace, e.Job.Name), Effect: corev1.TaintEffectNoSchedule,
		})
	}
	if err := e.Cluster.Patch(ctx, node, client.MergeFromWithOptions(base, client.MergeFromWithOptimisticLock{})); err != nil {
		switch {
		case apierrors.IsNotFound(err):
			return nil
		case apierrors.IsInvalid(err) || apierrors.IsForbidden(err) || apierrors.IsBadRequest(err):
			// A retry would be refused the same way; the gang restart must not wait on it.
			e.Host.Warning(trainingv1alpha1.ReasonNodeQuarantined, "Taint", "could not taint node %s (the job still keeps off it): %v", name, err)
			return nil
		}
		return fmt.Errorf("tainting node %s: %w", name, err)
	}
	if !tainted {
		e.Host.Acted(corev1.EventTypeWarning, trainingv1alpha1.ReasonNodeQuarantined, "Taint", "tainted node %s %s:NoSchedule until %s",
			name, trainingv1alpha1.QuarantineTaintKey, node.Annotations[trainingv1alpha1.QuarantineTaintUntilAnnotation])
	}
	return nil
}

// ExpireQuarantine releases nodes quarantined longer than quarantine.expireAfter
// (recovery.ExpireQuarantine), and returns when the next one is due (0 for none).
func (e *Executor) ExpireQuarantine() time.Duration {
	after := e.Job.Spec.FaultTolerance.Quarantine.ExpireAfter.Duration
	released, next := recovery.ExpireQuarantine(&e.Job.Status, after, e.Now)
	for _, q := range released {
		e.Host.Normal(trainingv1alpha1.ReasonNodeReleased, "Quarantine", "released node %s from quarantine after %s", q.Name, after)
	}
	return next
}

// quarantined reports whether the job keeps its ranks off node.
func (e *Executor) quarantined(node string) bool { return recovery.Quarantined(&e.Job.Status, node) }
