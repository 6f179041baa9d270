package nodehealth

import (
	"context"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/tools/events"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"

	trainingv1alpha1 "github.com/zaya-operator/zaya-operator/api/v1alpha1"
)

// Cluster-wide hardware suspicion (opt-in): a node that is the root of hardware failures
// (GPUHardware, NICFabric: a fault its runtime or RCCL printed, or a device its health signals
// took away) in jobs of several namespaces within a window is tainted
// training.zaya.dev/hardware-suspect:NoSchedule for every workload until the taint expires,
// when the operator removes it. Namespaces are counted, not jobs: a tenant decides what its
// own workers print, and its jobs alone must not take a node from everyone else. The roots
// are kept on the node (annotation training.zaya.dev/hardware-roots), so they outlive the
// operator's restarts and the jobs themselves.

// HardwareTaintPolicy is the operator's cluster-wide hardware taint policy.
type HardwareTaintPolicy struct {
	// Namespaces is how many namespaces' jobs must root hardware failures on a node for it to
	// be tainted; 0 turns the policy off.
	Namespaces int
	// Window is how far back roots count; Expiry how long the taint stays.
	Window, Expiry time.Duration
}

// maxHardwareRoots bounds the roots kept on a node (the newest namespaces).
const maxHardwareRoots = 16

// hardwareRootEntry is one namespace's latest hardware failure rooted on a node.
type hardwareRootEntry struct {
	namespace string
	at        time.Time
}

// DefaultQuarantineTaintMax bounds how long a job's quarantine taint stays on a node when the
// operator is given no --quarantine-taint-max.
const DefaultQuarantineTaintMax = 24 * time.Hour

// Suspect records on node that a job of namespace rooted a hardware failure of category there
// at now and, once jobs of p.Namespaces namespaces did so within p.Window, taints it for every
// workload until now + p.Expiry. It edits node, which the caller patches, and says whether it
// tainted it and how many namespaces' roots count.
func (p HardwareTaintPolicy) Suspect(node *corev1.Node, namespace, category string, now time.Time) (tainted bool, roots int) {
	list := readHardwareRoots(node.Annotations[trainingv1alpha1.HardwareRootsAnnotation], now.Add(-p.Window))
	list = slices.DeleteFunc(list, func(r hardwareRootEntry) bool { return r.namespace == namespace })
	list = append(list, hardwareRootEntry{namespace, now})
	if len(list) > maxHardwareRoots {
		list = list[len(list)-maxHardwareRoots:]
	}
	setNodeAnnotation(node, trainingv1alpha1.HardwareRootsAnnotation, writeHardwareRoots(list))
	tainted = len(list) >= p.Namespaces &&
		!slices.ContainsFunc(node.Spec.Taints, func(t corev1.Taint) bool { return t.Key == trainingv1alpha1.HardwareSuspectTaintKey })
	if tainted {
		node.Spec.Taints = append(node.Spec.Taints, corev1.Taint{Key: trainingv1alpha1.HardwareSuspectTaintKey, Value: category, Effect: corev1.TaintEffectNoSchedule})
		node.Annotations[trainingv1alpha1.HardwareSuspectUntilAnnotation] = now.Add(p.Expiry).UTC().Format(time.RFC3339)
	}
	return tainted, len(list)
}

// readHardwareRoots reads the annotation ("<namespace>=<RFC 3339>,…"), keeping the entries
// since after. Anything unreadable is dropped: the annotation is the operator's, but anyone
// who may edit nodes may edit it.
func readHardwareRoots(v string, after time.Time) []hardwareRootEntry {
	var out []hardwareRootEntry
	for i, item := range strings.Split(v, ",") {
		if i == maxHardwareRoots {
			break
		}
		ns, at, ok := strings.Cut(item, "=")
		t, err := time.Parse(time.RFC3339, at)
		if !ok || err != nil || ns == "" || len(ns) > 63 || !t.After(after) {
			continue
		}
		out = append(out, hardwareRootEntry{ns, t})
	}
	return out
}

func writeHardwareRoots(roots []hardwareRootEntry) string {
	items := make([]string, len(roots))
	for i, r := range roots {
		items[i] = r.namespace + "=" + r.at.UTC().Format(time.RFC3339)
	}
	return strings.Join(items, ",")
}

// TaintExpiry removes the taints the operator added once they expire: hardware-suspect taints
// and jobs' quarantine taints, whoever's job added them and whether or not it still exists.
// It is a manager.Runnable.
type TaintExpiry struct {
	Client   client.Client
	Recorder events.EventRecorder
	// Every is how often nodes are looked at (default 1m).
	Every time.Duration
	// QuarantineMax is given to a quarantine taint with no expiry on record (an older
	// operator's): it goes that long after it is first seen (0: 24h).
	QuarantineMax time.Duration
	// Now is the clock (default time.Now).
	Now func() time.Time
}

// NeedLeaderElection is true: only the leader untaints.
func (e *TaintExpiry) NeedLeaderElection() bool { return true }

// Start looks at the nodes every Every until ctx ends.
func (e *TaintExpiry) Start(ctx context.Context) error {
	every := e.Every
	if every <= 0 {
		every = time.Minute
	}
	wait.UntilWithContext(ctx, func(ctx context.Context) {
		if err := e.Expire(ctx); err != nil {
			log.FromContext(ctx).Error(err, "expiring taints")
		}
	}, every)
	return nil
}

// expiringTaint is a taint the operator adds, the annotation that says when it goes, and the
// annotations that go with it.
type expiringTaint struct {
	key, until string
	also       []string
}

var expiringTaints = []expiringTaint{
	{trainingv1alpha1.HardwareSuspectTaintKey, trainingv1alpha1.HardwareSuspectUntilAnnotation, []string{trainingv1alpha1.HardwareRootsAnnotation}},
	{trainingv1alpha1.QuarantineTaintKey, trainingv1alpha1.QuarantineTaintUntilAnnotation, nil},
}

// Expire removes every expired taint, and its annotations, from the nodes; a quarantine taint
// with no expiry on record is given one.
func (e *TaintExpiry) Expire(ctx context.Context) error {
	now := time.Now
	if e.Now != nil {
		now = e.Now
	}
	nodes := &corev1.NodeList{}
	if err := e.Client.List(ctx, nodes); err != nil {
		return err
	}
	for i := range nodes.Items {
		node := &nodes.Items[i]
		base := node.DeepCopy()
		var removed []string
		for _, x := range expiringTaints {
			until, recorded := node.Annotations[x.until]
			tainted := slices.ContainsFunc(node.Spec.Taints, func(t corev1.Taint) bool { return t.Key == x.key })
			if !recorded && x.key == trainingv1alpha1.QuarantineTaintKey && tainted {
				limit := e.QuarantineMax
				if limit <= 0 {
					limit = DefaultQuarantineTaintMax
				}
				setNodeAnnotation(node, x.until, now().Add(limit).UTC().Format(time.RFC3339))
				continue
			}
			if !recorded {
				continue
			}
			if t, err := time.Parse(time.RFC3339, until); err == nil && now().Before(t) {
				continue
			}
			delete(node.Annotations, x.until)
			for _, a := range x.also {
				delete(node.Annotations, a)
			}
			node.Spec.Taints = slices.DeleteFunc(node.Spec.Taints, func(t corev1.Taint) bool { return t.Key == x.key })
			if tainted {
				removed = append(removed, x.key)
			}
		}
		if equality.Semantic.DeepEqual(base, node) {
			continue
		}
		if err := e.Client.Patch(ctx, node, client.MergeFromWithOptions(base, client.MergeFromWithOptimisticLock{})); err != nil {
			if apierrors.IsNotFound(err) || apierrors.IsConflict(err) {
				continue // gone, or changed: the next round sees it
			}
			return err
		}
		if e.Recorder != nil {
			for _, key := range removed {
				reason := trainingv1alpha1.ReasonHardwareSuspect
				if key == trainingv1alpha1.QuarantineTaintKey {
					reason = trainingv1alpha1.ReasonNodeReleased
				}
				e.Recorder.Eventf(node, nil, corev1.EventTypeNormal, reason, "Untaint", "removed %s from node %s: the taint expired", key, node.Name)
			}
		}
	}
	return nil
}

func setNodeAnnotation(node *corev1.Node, key, value string) {
	if node.Annotations == nil {
		node.Annotations = map[string]string{}
	}
	node.Annotations[key] = value
}
