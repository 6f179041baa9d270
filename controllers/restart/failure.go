package restart

import (
	"context"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	trainingv1alpha1 "github.com/zaya-operator/zaya-operator/api/v1alpha1"
	"github.com/zaya-operator/zaya-operator/controllers/bounded"
	"github.com/zaya-operator/zaya-operator/controllers/gang"
	"github.com/zaya-operator/zaya-operator/controllers/nodehealth"
	"github.com/zaya-operator/zaya-operator/controllers/recovery"
)

// FirstFailure is the failure that ends the current attempt: a failed or deleted pod, else a
// rank on a node that lost its health (the device plugin never evicts those pods). While every
// failure so far is a stop over a peer whose cause may still show, it returns how long to wait.
func (e *Executor) FirstFailure(ctx context.Context, g gang.Gang) (*recovery.Verdict, time.Duration, error) {
	if pod, cascaded := recovery.RootFailure(g, e.Patterns); pod != nil {
		if gang.StoppedByPeer(pod) {
			// Only ranks that stopped over a peer: a rank on a node that is gone or unhealthy
			// (its pod not yet failed: its kubelet is the one gone) is what they stopped over.
			f, err := e.unhealthyRank(ctx, g)
			if err != nil {
				return nil, 0, err
			}
			if f == nil {
				// A lost node's Node stays Ready for the node lifecycle controller's grace
				// period (50 s by default), but its kubelet renews no Lease from the moment
				// it is gone: judged on a Ready node alone, the new gang would be placed on it.
				var wait time.Duration
				if f, wait, err = e.lapsedRank(ctx, g, gang.FailedAt(pod)); err != nil {
					return nil, 0, err
				} else if f == nil && wait > 0 {
					return nil, wait, nil
				}
			}
			if f != nil {
				e.attribute(f, nil)
				f.Cascaded = cascaded + 1
				return &recovery.Verdict{Failure: *f, Counted: true}, 0, nil
			}
		}
		v := recovery.Judge(&e.Job.Spec, pod, e.Now, e.Job.Status.Restarts, e.Stopped)
		e.attribute(&v.Failure, pod)
		if s := gang.WorkerStatus(pod); s != nil && s.State.Terminated != nil {
			recovery.BlameSilentPeer(&v.Failure, s.State.Terminated.Message, g, e.Job.Spec.GPUsPerNode)
		}
		if gang.StoppedByPeer(pod) && v.Failure.Reason != trainingv1alpha1.FailureReasonHang {
			// Nothing but stops over a peer yet: the peer's own failure, its node's loss or a
			// stop naming it silent is moments behind. The gang is broken either way; a
			// moment's wait names the cause instead of a bystander.
			if wait := recovery.CascadeWait(gang.FailedAt(pod), e.Now); wait > 0 {
				return nil, wait, nil
			}
		}
		v.Failure.Cascaded = cascaded
		v.Pod = pod
		return &v, 0, nil
	}
	f, err := e.unhealthyRank(ctx, g)
	if f == nil || err != nil {
		return nil, 0, err
	}
	return &recovery.Verdict{Failure: *f, Counted: true}, 0, nil
}

// unhealthyRank finds the lowest rank of the current attempt whose node can no longer run it
// and returns it as a failure. Nodes come from one cached list, without copies.
func (e *Executor) unhealthyRank(ctx context.Context, g gang.Gang) (*trainingv1alpha1.JobFailure, error) {
	var nodes map[string]*corev1.Node
	for rank, pod := range g.Ranks {
		if pod == nil || pod.Spec.NodeName == "" || pod.Status.Phase == corev1.PodSucceeded || pod.Status.Phase == corev1.PodFailed {
			continue
		}
		if nodes == nil {
			list := &corev1.NodeList{}
			if err := e.Cluster.List(ctx, list, client.UnsafeDisableDeepCopy); err != nil {
				return nil, fmt.Errorf("listing nodes: %w", err)
			}
			nodes = make(map[string]*corev1.Node, len(list.Items))
			for i := range list.Items {
				nodes[list.Items[i].Name] = &list.Items[i]
			}
		}
		reason, msg := nodehealth.Problem(pod.Spec.NodeName, nodes[pod.Spec.NodeName])
		if reason == "" {
			continue
		}
		return &trainingv1alpha1.JobFailure{
			Time: metav1.Time{Time: e.Now}, Reason: reason, Attempt: e.Job.Status.Restarts,
			Node: pod.Spec.NodeName, Rank: ptr.To(int32(rank)),
			Message: bounded.Message(fmt.Sprintf("rank %d (pod %s): %s", rank, pod.Name, msg)),
		}, nil
	}
	return nil, nil
}

// Act carries out the verdict on a failed or lost pod of the current attempt: the node at
// fault is quarantined, then the gang restarts (recoverFrom) or the job fails.
func (e *Executor) Act(ctx context.Context, v recovery.Verdict, g gang.Gang) error {
	if recovery.Quarantines(v.Failure.Reason) {
		if err := e.quarantine(ctx, &v.Failure); err != nil {
			return err
		}
	} else if recovery.HardwareRoot(v.Failure) && !v.Fatal {
		if err := e.quarantine(ctx, recovery.QuarantinedFor(v.Failure)); err != nil {
			return err
		}
	}
	return e.recoverFrom(ctx, v, g)
}
