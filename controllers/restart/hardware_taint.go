package restart

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"

	trainingv1alpha1 "github.com/zaya-operator/zaya-operator/api/v1alpha1"
	"github.com/zaya-operator/zaya-operator/controllers/attribution"
)

// suspectNode records that a job's hardware failure is rooted on f's node and, when jobs of
// enough namespaces did so within the window, taints the node for everyone
// (nodehealth.HardwareTaintPolicy).
func (e *Executor) suspectNode(ctx context.Context, f *trainingv1alpha1.JobFailure) error {
	policy := e.HardwareTaint
	if policy.Namespaces <= 0 || f.Node == "" || !attribution.Hardware(attribution.Category(f.Category)) {
		return nil
	}
	node := &corev1.Node{}
	if err := e.Cluster.Get(ctx, client.ObjectKey{Name: f.Node}, node); err != nil {
		return client.IgnoreNotFound(err)
	}
	base := node.DeepCopy()
	taint, roots := policy.Suspect(node, e.Job.Namespace, f.Category, e.Now)
	if err := e.Cluster.Patch(ctx, node, client.MergeFromWithOptions(base, client.MergeFromWithOptimisticLock{})); err != nil {
		switch {
		case apierrors.IsNotFound(err):
			return nil
		case apierrors.IsInvalid(err) || apierrors.IsForbidden(err) || apierrors.IsBadRequest(err):
			e.Host.Warning(trainingv1alpha1.ReasonHardwareSuspect, "Taint", "could not record node %s's hardware failure cluster-wide: %v", f.Node, err)
			return nil
		}
		return fmt.Errorf("recording node %s's hardware failure: %w", f.Node, err)
	}
	if taint {
		e.Host.Acted(corev1.EventTypeWarning, trainingv1alpha1.ReasonHardwareSuspect, "Taint",
			"tainted node %s %s=%s:NoSchedule for every workload until %s: hardware failures rooted there in jobs of %d namespaces within %s",
			f.Node, trainingv1alpha1.HardwareSuspectTaintKey, f.Category, node.Annotations[trainingv1alpha1.HardwareSuspectUntilAnnotation], roots, policy.Window)
	}
	return nil
}
