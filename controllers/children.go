package controllers

import (
	"context"
	"fmt"
	"slices"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	trainingv1alpha1 "github.com/zaya-operator/zaya-operator/api/v1alpha1"
	"github.com/zaya-operator/zaya-operator/controllers/admission"
	"github.com/zaya-operator/zaya-operator/controllers/workerpod"
)

// ensureChildren creates the job's Service and, when the operator provides one, its
// checkpoint claim.
func (p *pass) ensureChildren(ctx context.Context) error {
	if _, err := p.ensure(ctx, workerpod.Service(p.job), "Service"); err != nil {
		return err
	}
	pvc := workerpod.CheckpointClaim(p.job)
	if pvc == nil {
		return p.shareClaim(ctx)
	}
	created, err := p.ensure(ctx, pvc, "PersistentVolumeClaim")
	if created {
		p.acted(corev1.EventTypeNormal, trainingv1alpha1.ReasonCheckpointClaimCreated, "Create", "created checkpoint claim %s (%s)",
			pvc.Name, pvc.Spec.Resources.Requests.Storage().String())
	}
	return err
}

// nameConflict is an object the job needs whose name is taken by one that is not the job's:
// its Service, claim or pods, or what its admission makes.
type nameConflict = admission.NameConflict

// ensure creates obj, a core object of kind, unless the cache shows the job's own; it reports
// whether this call created it. An object of that name that is not the job's is never
// adopted: a nameConflict says so.
func (p *pass) ensure(ctx context.Context, obj client.Object, kind string) (bool, error) {
	existing := metadataOf(kind)
	err := p.r.Get(ctx, client.ObjectKeyFromObject(obj), existing)
	switch {
	case err == nil:
		if !p.isOwn(existing, obj) {
			return false, &nameConflict{Kind: kind, Name: obj.GetName()}
		}
		return false, nil
	case !apierrors.IsNotFound(err):
		return false, err
	}
	if err := p.r.Create(ctx, obj); err != nil {
		if apierrors.IsAlreadyExists(err) {
			// Not in the cache: the cache holds only objects with the job label, so this is
			// someone else's, unless it is this job's and the cache is a moment behind.
			return false, p.checkTaken(ctx, obj, kind)
		}
		return false, fmt.Errorf("creating %s %s: %w", kind, obj.GetName(), err)
	}
	return true, nil
}

// isOwn reports whether existing is the job's version of want: controlled by this job, or, for
// a claim without an owner (retainOnDelete), labelled for a job of this name, which is what
// lets a re-created job resume from the checkpoints it kept.
func (p *pass) isOwn(existing, want client.Object) bool {
	if _, pod := want.(*corev1.Pod); pod {
		return p.marks.made(p.job.UID, existing)
	}
	if ref := metav1.GetControllerOf(existing); ref != nil {
		return ref.UID == p.job.UID
	}
	return len(want.GetOwnerReferences()) == 0 && existing.GetLabels()[trainingv1alpha1.JobNameLabel] == p.job.Name
}

// checkTaken reads the object of obj's name from the API server and returns a nameConflict
// unless it is the job's own.
func (p *pass) checkTaken(ctx context.Context, obj client.Object, kind string) error {
	list, err := p.listByName(ctx, kind, obj.GetName())
	if err != nil {
		return err
	}
	for i := range list.Items {
		if pod, ok := obj.(*corev1.Pod); ok {
			// The job's own pod out of the cache's sight: it lost its labels.
			if relabelled, err := p.relabel(ctx, &list.Items[i], pod); err != nil || relabelled {
				return err
			}
		}
		if p.isOwn(&list.Items[i], obj) {
			return nil
		}
	}
	return &nameConflict{Kind: kind, Name: obj.GetName()}
}

// shareClaim makes a job that mounts another job's claim by claimName (one the operator made
// with retainOnDelete false, so owned by that job) an owner of it too: the garbage collector
// deletes an object only once all its owners are gone, so deleting the first job can never
// delete checkpoints the second one still uses.
func (p *pass) shareClaim(ctx context.Context) error {
	c := p.job.Spec.Checkpoint
	if c == nil || c.Volume.ClaimName == "" {
		return nil
	}
	claim := metadataOf("PersistentVolumeClaim")
	err := p.r.Get(ctx, client.ObjectKey{Namespace: p.job.Namespace, Name: c.Volume.ClaimName}, claim)
	if err != nil {
		return client.IgnoreNotFound(err) // not one the operator made (the cache holds only those)
	}
	owner := metav1.GetControllerOf(claim)
	if owner == nil || owner.UID == p.job.UID || slices.ContainsFunc(claim.OwnerReferences, func(r metav1.OwnerReference) bool { return r.UID == p.job.UID }) {
		return nil
	}
	base := claim.DeepCopy()
	ref := workerpod.OwnerRef(p.job)
	ref.Controller, ref.BlockOwnerDeletion = ptr.To(false), nil
	claim.OwnerReferences = append(claim.OwnerReferences, ref)
	if err := p.r.Patch(ctx, claim, client.MergeFromWithOptions(base, client.MergeFromWithOptimisticLock{})); err != nil {
		return client.IgnoreNotFound(err)
	}
	p.acted(corev1.EventTypeNormal, trainingv1alpha1.ReasonCheckpointClaimShared, "Share",
		"claim %s belongs to job %s; added this job as an owner so deleting %s keeps it", claim.Name, owner.Name, owner.Name)
	return nil
}
