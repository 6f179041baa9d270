package controllers

import (
	"context"
	"fmt"
	"maps"
	"strings"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"sigs.k8s.io/controller-runtime/pkg/client"

	trainingv1alpha1 "github.com/zaya-operator/zaya-operator/api/v1alpha1"
	"github.com/zaya-operator/zaya-operator/controllers/gang"
	"github.com/zaya-operator/zaya-operator/controllers/workerpod"
)

// A pod the operator made stays the job's whatever happens to its labels. The cache holds only
// pods with the job label, so a rank whose labels someone removed or changed would vanish from
// it: taken for deleted, its rank made again beside it (or its name reported as a conflict),
// while it kept running on its GPUs. Such a pod is found by its name, which the operator
// chose, and proven the job's by its controller reference and its mark (which signs the rank's
// identity, not its labels), and its labels are put back.

// maxReclaimLooks bounds the pods looked up by name in one pass: a gang of 2,048 whose pods
// were all deleted must not cost 2,048 calls before its restart.
const maxReclaimLooks = 16

// rankLabels are the labels by which the operator finds a rank's pod.
var rankLabels = []string{trainingv1alpha1.JobNameLabel, trainingv1alpha1.RoleLabel, trainingv1alpha1.RankLabel, trainingv1alpha1.AttemptLabel}

// rankIdentity is the name and labels of the current attempt's pod of rank.
func rankIdentity(job *trainingv1alpha1.ZayaTrainingJob, rank int32) *corev1.Pod {
	attempt := job.Status.Attempt()
	return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: workerpod.PodName(job, attempt, rank), Namespace: job.Namespace, Labels: workerpod.RankLabels(job, attempt, rank)}}
}

// relabel puts want's rank labels back on existing, a pod of want's name the cache does not
// show, if it is the job's own under those labels; it reports whether it did.
func (p *pass) relabel(ctx context.Context, existing *metav1.PartialObjectMetadata, want *corev1.Pod) (bool, error) {
	if existing.DeletionTimestamp != nil || existing.Name != want.Name {
		return false, nil
	}
	labels := maps.Clone(existing.Labels)
	if labels == nil {
		labels = map[string]string{}
	}
	var changed []string
	for _, k := range rankLabels {
		if labels[k] != want.Labels[k] {
			labels[k] = want.Labels[k]
			changed = append(changed, k)
		}
	}
	probe := existing.DeepCopy()
	probe.Labels = labels
	if len(changed) == 0 || !p.marks.made(p.job.UID, probe) {
		return false, nil
	}
	base := existing.DeepCopy()
	existing.Labels = labels
	if err := p.r.Patch(ctx, existing, client.MergeFromWithOptions(base, client.MergeFromWithOptimisticLock{})); err != nil {
		return false, client.IgnoreNotFound(err)
	}
	p.acted(corev1.EventTypeWarning, trainingv1alpha1.ReasonPodRelabelled, "Relabel",
		"pod %s is rank %s of this job but its labels %s had been removed or changed; put them back", want.Name, want.Labels[trainingv1alpha1.RankLabel], strings.Join(changed, ", "))
	return true, nil
}

// reclaimRanks looks, while the stored status has every rank ready and none being replaced, for
// the pods of the ranks the cache does not show, by name, and relabels those that are the
// job's: the rank is still there, not vanished. It reports how many it relabelled.
func (p *pass) reclaimRanks(ctx context.Context, g gang.Gang) (int, error) {
	job := p.job
	if job.Status.ReadyNodes < job.Width() || len(job.Status.Replacing) > 0 {
		return 0, nil
	}
	going := g.DisruptedRanks()
	n, looked := 0, 0
	for _, r := range g.Missing() {
		if going[r] {
			continue
		}
		if looked++; looked > maxReclaimLooks {
			break // the rest next pass: those found return to the cache meanwhile
		}
		want := rankIdentity(job, r)
		list, err := p.listByName(ctx, "Pod", want.Name)
		if err != nil {
			return n, err
		}
		for i := range list.Items {
			ok, err := p.relabel(ctx, &list.Items[i], want)
			if err != nil {
				return n, err
			}
			if ok {
				n++
			}
		}
	}
	return n, nil
}

// listByName reads the metadata of the core object of kind and name from the API server (a
// list by name, which the operator may do; it may not get every object), not the cache.
func (p *pass) listByName(ctx context.Context, kind, name string) (*metav1.PartialObjectMetadataList, error) {
	list := &metav1.PartialObjectMetadataList{}
	list.SetGroupVersionKind(corev1.SchemeGroupVersion.WithKind(kind + "List"))
	if err := p.r.apiReader().List(ctx, list, client.InNamespace(p.job.Namespace),
		client.MatchingFieldsSelector{Selector: fields.OneTermEqualSelector("metadata.name", name)}); err != nil {
		return nil, fmt.Errorf("reading %s %s: %w", kind, name, err)
	}
	return list, nil
}
