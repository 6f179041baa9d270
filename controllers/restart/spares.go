package restart

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	trainingv1alpha1 "github.com/zaya-operator/zaya-operator/api/v1alpha1"
	"github.com/zaya-operator/zaya-operator/controllers/bounded"
	"github.com/zaya-operator/zaya-operator/controllers/gang"
	"github.com/zaya-operator/zaya-operator/controllers/nodehealth"
	"github.com/zaya-operator/zaya-operator/controllers/recovery"
)

// Warm spares (faultTolerance.spares). A spare is a pod that holds a node as a rank would (the
// template's placement, the worker container's resources, GPUs and NICs) and runs nothing but
// a pause container. When an in-place restart replaces a rank's pod, the rank takes a ready
// spare's node: the spare is deleted and the new pod requires that node, so it neither waits
// for room nor competes for it. The gang always comes first: no spare is made until every
// rank is placed, and none is held while a rank waits for room.

// takeSpare picks a ready spare for a rank replaced off node failed and returns its node ("":
// none). The spare is deleted by EnsureSpares; it is counted here.
func (e *Executor) takeSpare(ctx context.Context, failed string) string {
	st := &e.Job.Status
	for _, s := range e.Spares {
		node := s.Spec.NodeName
		if !s.DeletionTimestamp.IsZero() || !gang.Ready(s) || node == "" || node == failed || e.quarantined(node) ||
			slices.ContainsFunc(st.Replacing, func(r trainingv1alpha1.ReplacedPod) bool { return r.SpareNode == node }) ||
			e.spareNodeUnfit(ctx, node) != "" {
			continue
		}
		st.SparesTaken = bounded.Count(st.SparesTaken, 1)
		return node
	}
	return ""
}

// spareNodeUnfit says why a spare's node can no longer take a rank ("" if it can): it went
// unhealthy or was lost since the spare came up, or a job or the platform tainted it (the
// spare was placed before the taint; the rank would sit on a node everyone else avoids).
func (e *Executor) spareNodeUnfit(ctx context.Context, name string) string {
	node := &corev1.Node{}
	if err := e.Cluster.Get(ctx, client.ObjectKey{Name: name}, node); err != nil {
		if apierrors.IsNotFound(err) {
			_, msg := nodehealth.Problem(name, nil)
			return msg
		}
		return fmt.Sprintf("node %s could not be read: %v", name, err)
	}
	if _, msg := nodehealth.Problem(name, node); msg != "" {
		return msg
	}
	for _, t := range node.Spec.Taints {
		if t.Key == trainingv1alpha1.QuarantineTaintKey || t.Key == trainingv1alpha1.HardwareSuspectTaintKey {
			return fmt.Sprintf("node %s is tainted %s", name, t.Key)
		}
	}
	return ""
}

// SpareRetry is how long a spare the kubelet refused (or that failed) stays before it is made
// again: a node that refuses it would otherwise see a new one every pass.
const SpareRetry = 30 * time.Second

// EnsureSpares deletes the spares that cannot serve (taken, surplus, finished, on a
// quarantined node, or held while a rank waits for room), makes the missing ones once every
// rank is placed, and reports how many are ready.
func (e *Executor) EnsureSpares(ctx context.Context, g gang.Gang) (time.Duration, error) {
	job := e.Job
	want := e.Host.Spares(recovery.WantedSpares(job))
	if g.Unschedulable > 0 {
		want = 0 // the gang first
	}
	taken := map[string]bool{}
	for _, r := range job.Status.Replacing {
		if r.SpareNode != "" {
			taken[r.SpareNode] = true
		}
	}
	var drop []*corev1.Pod
	var retry time.Duration
	have := map[int32]bool{}
	var ready int32
	for _, s := range e.Spares {
		i, _ := recovery.SpareIndex(job, s)
		have[i] = true // a name still in use, deleting or not
		if !s.DeletionTimestamp.IsZero() {
			continue
		}
		if gang.Finished(s) && i < want && e.Now.Sub(s.CreationTimestamp.Time) < SpareRetry {
			// Refused or failed: kept (its name held) until SpareRetry has passed since it was made.
			if left := SpareRetry - e.Now.Sub(s.CreationTimestamp.Time); retry == 0 || left < retry {
				retry = left
			}
			continue
		}
		if i >= want || gang.Finished(s) || taken[s.Spec.NodeName] || (s.Spec.NodeName != "" && e.quarantined(s.Spec.NodeName)) ||
			(s.Spec.NodeName != "" && gang.Ready(s) && e.spareNodeUnfit(ctx, s.Spec.NodeName) != "") {
			drop = append(drop, s)
			continue
		}
		if gang.Ready(s) {
			ready++
		}
	}
	job.Status.ReadySpares = ready
	if err := e.Host.DeletePods(ctx, drop, ptr.To[int64](recovery.SpareGrace)); err != nil {
		return 0, err
	}
	if g.Scheduled < job.Width() {
		return retry, nil // a rank's pod is still to be made or placed
	}
	var made []string
	for i := range want {
		if have[i] {
			continue
		}
		name, err := e.Host.CreateSpare(ctx, i)
		if err != nil {
			// A spare is a convenience: a quota, a webhook or a name taken by another pod
			// costs the job its spare, never its ranks. The rest would most likely meet the
			// same refusal: they wait for a later pass, so an elastic job missing thousands of
			// nodes makes one refused request a pass, not thousands.
			e.Host.Warning(trainingv1alpha1.ReasonSpareUnavailable, "Create", "warm spare %s: %s", name, bounded.Message(err.Error()))
			break
		}
		made = append(made, name)
	}
	if len(made) > 0 {
		e.Host.Acted(corev1.EventTypeNormal, trainingv1alpha1.ReasonSparesCreated, "Create", "created warm spares %s", strings.Join(made, ", "))
	}
	return retry, nil
}
