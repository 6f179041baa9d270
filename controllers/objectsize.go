package controllers

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"sigs.k8s.io/controller-runtime/pkg/log"

	trainingv1alpha1 "github.com/zaya-operator/zaya-operator/api/v1alpha1"
)

// What a job can do with its own size: be too large to carry the status the operator keeps.

// maxStatusBytes is more than the largest status the operator writes (16 conditions and 9
// failures with 1 KiB messages and their recovery timelines, 1,024 restart times, 256
// quarantined nodes, 4,096 ranks' restart counts: about 208 KiB).
const maxStatusBytes = 256 << 10

// maxJobBytes leaves room for that status under the 1.5 MiB etcd stores per object.
const maxJobBytes = 3<<19 - maxStatusBytes

// jobSizeErrors refuses a job whose metadata and spec leave no room for its status: every
// status write would be refused, and with it every restart the operator must record.
func jobSizeErrors(job *trainingv1alpha1.ZayaTrainingJob) field.ErrorList {
	meta, err1 := json.Marshal(&job.ObjectMeta)
	spec, err2 := json.Marshal(&job.Spec)
	if n := len(meta) + len(spec); err1 == nil && err2 == nil && n > maxJobBytes {
		return field.ErrorList{field.Invalid(field.NewPath("spec", "template"), "(omitted)", fmt.Sprintf(
			"the job is %d bytes, more than the %d that leave room for its status (etcd stores at most 1.5 MiB per object): shorten the template, its env values or the job's annotations",
			n, maxJobBytes))}
	}
	return nil
}

// objectTooLarge reports whether a write was refused for the object's size: by the API
// server (413) or by etcd behind it (a 500 that only its message tells apart).
func objectTooLarge(err error) bool {
	return apierrors.IsRequestEntityTooLargeError(err) ||
		(apierrors.IsInternalError(err) && strings.Contains(err.Error(), "request is too large"))
}

// statusTooLarge reports a status write refused for the job's size, once per generation, and
// ends the pass without a retry: a retry would be refused the same way, forever. The next
// edit of the spec (or a change of the job's pods) brings the next pass.
func (r *ZayaTrainingJobReconciler) statusTooLarge(ctx context.Context, job *trainingv1alpha1.ZayaTrainingJob, err error) {
	key := types.NamespacedName{Namespace: job.Namespace, Name: job.Name}
	if g, ok := r.tooLarge.Load(key); ok && g.(int64) == job.Generation {
		return
	}
	r.tooLarge.Store(key, job.Generation)
	log.FromContext(ctx).Error(err, "the job's status cannot be stored: the object is too large")
	r.Recorder.Eventf(job, nil, "Warning", trainingv1alpha1.ReasonStatusTooLarge, "UpdateStatus",
		"the job's status cannot be stored: with it the object passes the API server's size limit (etcd stores at most 1.5 MiB per object); shorten spec.template, its env values or the job's annotations")
}
