package controllers

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
	"github.com/zaya-operator/zaya-operator/controllers/workerpod"
)

// quarantineRepeated quarantines the node of a worker failure that is the third rooted there
// within restartWindow (recovery.RepeatedOnNode), and reports whether it did: the gang must then
// be recreated elsewhere, not restarted in place.
func (p *pass) quarantineRepeated(ctx context.Context, f trainingv1alpha1.JobFailure) (bool, error) {
	n := recovery.RepeatedOnNode(f, p.job.Status.RecentFailures, p.now.Add(-p.job.Spec.FaultTolerance.RestartWindow.Duration))
	if n < recovery.RepeatedFailuresToQuarantine {
		return false, nil
	}
	q := f
	q.Reason = trainingv1alpha1.FailureReasonRepeatedFailures
	q.Message = fmt.Sprintf("%d failures on it within %s, the last: %s", n, p.job.Spec.FaultTolerance.RestartWindow.Duration, f.Message)
	return true, p.quarantine(ctx, &q)
}

// quarantine adds a node to the job's exclusion list (oldest entries go when it is full) and,
// if asked, taints it. The taint is checked even when the node is listed already: a pass whose
// taint request failed still writes the list, and the retry must not stop at it.
func (p *pass) quarantine(ctx context.Context, f *trainingv1alpha1.JobFailure) error {
	st := &p.job.Status
	if f.Node == "" {
		return nil
	}
	if !slices.ContainsFunc(st.QuarantinedNodes, func(q trainingv1alpha1.QuarantinedNode) bool { return q.Name == f.Node }) {
		st.QuarantinedNodes = append(st.QuarantinedNodes, trainingv1alpha1.QuarantinedNode{Name: f.Node, Reason: f.Reason, Since: metav1.Time{Time: p.now}})
		if over := len(st.QuarantinedNodes) - int(p.job.Spec.FaultTolerance.Quarantine.MaxNodes); over > 0 {
			st.QuarantinedNodes = st.QuarantinedNodes[over:]
		}
		p.warning(trainingv1alpha1.ReasonNodeQuarantined, "Quarantine", "quarantined node %s for this job: %s", f.Node, f.Message)
	}
	if err := p.suspectNode(ctx, f); err != nil {
		return err
	}
	if p.job.Spec.FaultTolerance.Quarantine.NodeTaint != trainingv1alpha1.QuarantineTaintNoSchedule || !recovery.PlatformSignal(f.Reason) {
		return nil
	}
	return p.taintNode(ctx, f.Node)
}

// quarantineTaintUntil is when a taint added now expires: the job's expireAfter, within the
// platform's bound.
func (p *pass) quarantineTaintUntil() time.Time {
	limit := p.r.QuarantineTaintMax
	if limit <= 0 {
		limit = nodehealth.DefaultQuarantineTaintMax
	}
	return p.now.Add(min(p.job.Spec.FaultTolerance.Quarantine.ExpireAfter.Duration, limit))
}

// taintNode adds training.zaya.dev/quarantined:NoSchedule to a node, once, and records when it
// expires (the later of the recorded and this job's expiry, when another job tainted it).
func (p *pass) taintNode(ctx context.Context, name string) error {
	node := &corev1.Node{}
	if err := p.r.Get(ctx, client.ObjectKey{Name: name}, node); err != nil {
		return client.IgnoreNotFound(err)
	}
	until := p.quarantineTaintUntil()
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
			Key: trainingv1alpha1.QuarantineTaintKey, Value: recovery.TaintValue(p.job.Namespace, p.job.Name), Effect: corev1.TaintEffectNoSchedule,
		})
	}
	if err := p.r.Patch(ctx, node, client.MergeFromWithOptions(base, client.MergeFromWithOptimisticLock{})); err != nil {
		switch {
		case apierrors.IsNotFound(err):
			return nil
		case apierrors.IsInvalid(err) || apierrors.IsForbidden(err) || apierrors.IsBadRequest(err):
			// A retry would be refused the same way; the gang restart must not wait on it.
			p.warning(trainingv1alpha1.ReasonNodeQuarantined, "Taint", "could not taint node %s (the job still keeps off it): %v", name, err)
			return nil
		}
		return fmt.Errorf("tainting node %s: %w", name, err)
	}
	if !tainted {
		p.acted(corev1.EventTypeWarning, trainingv1alpha1.ReasonNodeQuarantined, "Taint", "tainted node %s %s:NoSchedule until %s",
			name, trainingv1alpha1.QuarantineTaintKey, node.Annotations[trainingv1alpha1.QuarantineTaintUntilAnnotation])
	}
	return nil
}

// expireQuarantine releases nodes quarantined longer than quarantine.expireAfter
// (recovery.ExpireQuarantine), and returns when the next one is due (0 for none).
func (p *pass) expireQuarantine() time.Duration {
	after := p.job.Spec.FaultTolerance.Quarantine.ExpireAfter.Duration
	released, next := recovery.ExpireQuarantine(&p.job.Status, after, p.now)
	for _, q := range released {
		p.normal(trainingv1alpha1.ReasonNodeReleased, "Quarantine", "released node %s from quarantine after %s", q.Name, after)
	}
	return next
}

// avoidQuarantined keeps a pod off the job's quarantined nodes: a NotIn on each node's name
// (the apiserver allows one value per node-name field requirement) is added to every required
// node-affinity term of the template (terms are ORed, so each needs them).
func avoidQuarantined(ps *corev1.PodSpec, quarantined []trainingv1alpha1.QuarantinedNode) {
	names := make([]string, len(quarantined))
	for i, q := range quarantined {
		names[i] = q.Name
	}
	workerpod.AvoidNodes(ps, names)
}

// quarantined reports whether the job keeps its ranks off node.
func (p *pass) quarantined(node string) bool {
	return slices.ContainsFunc(p.job.Status.QuarantinedNodes, func(q trainingv1alpha1.QuarantinedNode) bool { return q.Name == node })
}
