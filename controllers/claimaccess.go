package controllers

import (
	"context"
	"fmt"
	"slices"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"

	trainingv1alpha1 "github.com/zaya-operator/zaya-operator/api/v1alpha1"
)

// An existing checkpoint claim (claimName) is the user's: its access modes are checked once
// per generation of the spec, before the first pod. A claim no rank can write, or only one pod
// can mount, is refused; a ReadWriteOnce claim shared by several nodes is accepted with a
// warning, since it works on file storage the kubelet does not attach (NFS) but leaves the
// ranks on every other node in Multi-Attach on block storage.

// claimAccess judges a claim's access modes for a job: refused says why no run of the job
// could use the claim, warn why it may stall.
func claimAccess(job *trainingv1alpha1.ZayaTrainingJob, claim *corev1.PersistentVolumeClaim) (refused, warn string) {
	modes := claim.Status.AccessModes // the bound volume's, where known
	if len(modes) == 0 {
		modes = claim.Spec.AccessModes
	}
	has := func(m corev1.PersistentVolumeAccessMode) bool { return slices.Contains(modes, m) }
	switch {
	case len(modes) == 0 || has(corev1.ReadWriteMany):
		return "", ""
	case !has(corev1.ReadWriteOnce) && !has(corev1.ReadWriteOncePod):
		return fmt.Sprintf("claim %s is %v: every rank writes its shard of each checkpoint, so the claim needs ReadWriteMany", claim.Name, modes), ""
	case job.Spec.Nodes > 1 && !has(corev1.ReadWriteOnce):
		return fmt.Sprintf("claim %s is ReadWriteOncePod: only one pod can mount it and the job runs %d; use a ReadWriteMany claim", claim.Name, job.Spec.Nodes), ""
	case job.Spec.Nodes > 1:
		return "", fmt.Sprintf("claim %s is ReadWriteOnce and the job's %d ranks mount it from %d nodes: on storage attached to one node at a time (block volumes) "+
			"every rank but one waits in Multi-Attach; use a ReadWriteMany claim (file storage)", claim.Name, job.Spec.Nodes, job.Spec.Nodes)
	}
	return "", ""
}

// claimErrors reads the job's existing checkpoint claim: errors if no run could use it, a
// warning if it may stall. A claim not there yet is the scheduler's to wait for; one the
// operator may not read (an older install's RBAC) is not checked.
func (p *pass) claimErrors(ctx context.Context) (field.ErrorList, string) {
	c := p.job.Spec.Checkpoint
	if c == nil || c.Volume.ClaimName == "" {
		return nil, ""
	}
	claim := &corev1.PersistentVolumeClaim{}
	if err := p.r.apiReader().Get(ctx, client.ObjectKey{Namespace: p.job.Namespace, Name: c.Volume.ClaimName}, claim); err != nil {
		if !apierrors.IsNotFound(err) {
			log.FromContext(ctx).Info("checkpoint claim not checked", "claim", c.Volume.ClaimName, "error", err.Error())
		}
		return nil, ""
	}
	refused, warn := claimAccess(p.job, claim)
	if refused == "" {
		return nil, warn
	}
	return field.ErrorList{field.Invalid(field.NewPath("spec", "checkpoint", "volume", "claimName"), c.Volume.ClaimName, refused)}, ""
}
