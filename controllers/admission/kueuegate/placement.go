package kueuegate

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	trainingv1alpha1 "github.com/zaya-operator/zaya-operator/api/v1alpha1"
	"github.com/zaya-operator/zaya-operator/controllers/admission"
	"github.com/zaya-operator/zaya-operator/internal/kueue"
)

// Place adds what Kueue places on a pod the pass creates: a rank joins its attempt's pod
// group, and either takes its pod set's placement from the Workload's admission.
func (t *ticket) Place(pod *corev1.Pod, set admission.PodSet) {
	switch set {
	case admission.Ranks:
		joinPodGroup(t.job, pod, t.job.Status.Attempt())
		t.placeOn(pod, workersPodSet)
	case admission.Spares:
		t.placeOn(pod, sparesPodSet)
	}
}

// Unplaceable says why no pod may be made now: the admission's placement cannot be read.
func (t *ticket) Unplaceable() error {
	if t.placeErr != nil {
		return fmt.Errorf("placing the pods where Kueue admitted them: %w", t.placeErr)
	}
	return nil
}

// Spares caps the job's warm spares: none in a pod group (a spare would be a pod outside the
// attempt's group); under a Workload no more than its admission counted (the job's spares may
// have grown since), none while the placement cannot be read.
func (t *ticket) Spares(want int32) int32 {
	switch {
	case podGroupQueued(t.job):
		return 0
	case t.place == nil:
		return want
	case t.place[sparesPodSet] != nil && t.placeErr == nil:
		return min(want, t.place[sparesPodSet].count)
	}
	return 0
}

// podPlacement is what Kueue's admission adds to a pod set's pods.
type podPlacement struct {
	count        int32 // how many pods of the set Kueue admitted
	nodeSelector map[string]string
	tolerations  []corev1.Toleration
	labels       map[string]string
	annotations  map[string]string
	topology     bool // Kueue's topology gate: its ungater picks each rank's domain
}

// placement reads the admission's flavors (their node labels and tolerations), the
// admission checks' pod set updates and the topology assignment, for each pod set.
func (t *ticket) placement(ctx context.Context, wl *kueue.Workload) (map[string]*podPlacement, error) {
	out := map[string]*podPlacement{}
	for _, a := range wl.Status.Admission.PodSetAssignments {
		pl := &podPlacement{
			nodeSelector: map[string]string{}, labels: map[string]string{kueue.PodSetLabel: a.Name},
			annotations: map[string]string{},
		}
		for _, ps := range wl.Spec.PodSets {
			if ps.Name == a.Name {
				pl.count = ps.Count
			}
		}
		if a.Count != nil {
			pl.count = *a.Count
		}
		for _, name := range slices.Compact(slices.Sorted(maps.Values(a.Flavors))) {
			rf := &kueue.ResourceFlavor{}
			if err := t.g.Get(ctx, types.NamespacedName{Name: name}, rf); err != nil {
				return nil, fmt.Errorf("ResourceFlavor %s of the admission: %w", name, err)
			}
			if err := mergeInto(pl.nodeSelector, rf.Spec.NodeLabels, "ResourceFlavor "+name+" nodeLabels"); err != nil {
				return nil, err
			}
			pl.tolerations = appendNew(pl.tolerations, rf.Spec.Tolerations...)
		}
		for _, check := range wl.Status.AdmissionChecks {
			for _, u := range check.PodSetUpdates {
				if u.Name != a.Name {
					continue
				}
				what := "admission check " + check.Name
				if err := errors.Join(mergeInto(pl.nodeSelector, u.NodeSelector, what+" nodeSelector"),
					mergeInto(pl.labels, u.Labels, what+" labels"), mergeInto(pl.annotations, u.Annotations, what+" annotations")); err != nil {
					return nil, err
				}
				pl.tolerations = appendNew(pl.tolerations, u.Tolerations...)
			}
		}
		if a.TopologyAssignment != nil {
			// Kueue's ungater serves only pods that say they are topology-aware, and finds
			// them by their Workload.
			pl.topology = true
			pl.annotations[kueue.WorkloadAnnotation] = wl.Name
			switch t := topologyRequest(t.job); {
			case t != nil && t.Required != nil:
				pl.annotations[kueue.RequiredTopologyAnnotation] = *t.Required
			case t != nil && t.Preferred != nil:
				pl.annotations[kueue.PreferredTopologyAnnotation] = *t.Preferred
			default:
				pl.annotations[kueue.UnconstrainedTopologyAnnotation] = "true"
			}
		}
		out[a.Name] = pl
	}
	if out[workersPodSet] == nil {
		return nil, &placementConflict{fmt.Sprintf("Workload %s was admitted without pod set %q", wl.Name, workersPodSet)}
	}
	return out, nil
}

// placementConflict is an admission whose placement contradicts itself or the template.
type placementConflict struct{ msg string }

func (e *placementConflict) Error() string { return e.msg }

func mergeInto(dst, src map[string]string, what string) error {
	for k, v := range src {
		if old, ok := dst[k]; ok && old != v {
			return &placementConflict{fmt.Sprintf("%s sets %s=%s, but it is already %s", what, k, v, old)}
		}
		dst[k] = v
	}
	return nil
}

func appendNew(list []corev1.Toleration, add ...corev1.Toleration) []corev1.Toleration {
	for _, t := range add {
		if !slices.ContainsFunc(list, func(o corev1.Toleration) bool {
			return o.MatchToleration(&t) && o.Value == t.Value && o.TolerationSeconds == t.TolerationSeconds
		}) {
			list = append(list, t)
		}
	}
	return list
}

// placeOn adds the admission's placement for podSet to a pod the pass creates. A template's
// own node selector keeps its values: the admission was computed with them.
func (t *ticket) placeOn(pod *corev1.Pod, podSet string) {
	pl := t.place[podSet]
	if pl == nil {
		return
	}
	ps := &pod.Spec
	if len(pl.nodeSelector) > 0 {
		if ps.NodeSelector == nil {
			ps.NodeSelector = map[string]string{}
		}
		for k, v := range pl.nodeSelector {
			if _, ok := ps.NodeSelector[k]; !ok {
				ps.NodeSelector[k] = v
			}
		}
	}
	ps.Tolerations = appendNew(ps.Tolerations, pl.tolerations...)
	if pod.Labels == nil {
		pod.Labels = map[string]string{}
	}
	copyNotOurs(pod.Labels, pl.labels)
	if len(pl.annotations) > 0 {
		if pod.Annotations == nil {
			pod.Annotations = map[string]string{}
		}
		copyNotOurs(pod.Annotations, pl.annotations)
	}
	if pl.topology {
		ps.SchedulingGates = append(ps.SchedulingGates, corev1.PodSchedulingGate{Name: kueue.TopologyGate})
	}
}

// copyNotOurs copies an admission's labels or annotations, but never over the operator's own
// (rank, attempt, job name, the pod's mark): the pod would stop being the rank it is.
func copyNotOurs(dst, src map[string]string) {
	for k, v := range src {
		if !strings.HasPrefix(k, trainingv1alpha1.GroupVersion.Group+"/") {
			dst[k] = v
		}
	}
}
