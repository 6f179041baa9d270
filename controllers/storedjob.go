package controllers

import (
	"context"
	"fmt"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"

	trainingv1alpha1 "github.com/zaya-operator/zaya-operator/api/v1alpha1"
	"github.com/zaya-operator/zaya-operator/controllers/bounded"
	"github.com/zaya-operator/zaya-operator/controllers/workerpod"
	"github.com/zaya-operator/zaya-operator/internal/decode"
)

// Jobs are watched and cached as stored (JSON maps), never as Go types: the API server can
// store a job whose values Go cannot decode (see package decode), and a typed list would fail
// on it, stopping every job's watch and a fresh operator's cache sync. Each pass decodes its
// own job, so such a job is its own problem only.

// storedJob is an empty stored ZayaTrainingJob to read into.
func storedJob() *unstructured.Unstructured {
	u := &unstructured.Unstructured{}
	u.SetGroupVersionKind(trainingv1alpha1.GroupVersion.WithKind(workerpod.JobKind))
	return u
}

// storedJobList is an empty list of stored ZayaTrainingJobs to read into.
func storedJobList() *unstructured.UnstructuredList {
	l := &unstructured.UnstructuredList{}
	l.SetGroupVersionKind(trainingv1alpha1.GroupVersion.WithKind(workerpod.JobKind + "List"))
	return l
}

// ClientOptions makes the manager's client serve stored (unstructured) jobs from the cache,
// as it serves typed objects. Never read a job typed through it: that would start a typed
// informer, and with it the failure this file exists to prevent (TestPoisonPillsStayWithTheirJob
// would hang on its sync).
func ClientOptions() client.Options {
	return client.Options{Cache: &client.CacheOptions{Unstructured: true}}
}

// managedByOperator reports whether this operator reconciles the stored job, read without
// decoding the rest of it.
func managedByOperator(u *unstructured.Unstructured) bool {
	by, _, _ := unstructured.NestedString(u.Object, "spec", "managedBy")
	return by == "" || by == trainingv1alpha1.ControllerName
}

// decodeJob decodes a stored job. A status value Go cannot hold (a hand-written status, a
// restore from backup) is dropped, since the operator owns status and rewrites it: dropped
// names those fields. A spec or metadata value Go cannot hold is the job's error.
func decodeJob(u *unstructured.Unstructured) (job *trainingv1alpha1.ZayaTrainingJob, dropped []string, err error) {
	// Each round drops at least one of status's dozen fields; decode reports a bounded number.
	for range 16 {
		job = &trainingv1alpha1.ZayaTrainingJob{}
		errs := decode.Into(u.Object, job)
		if len(errs) == 0 {
			return job, dropped, nil
		}
		status, _ := u.Object["status"].(map[string]any)
		for _, e := range errs {
			rest, ok := strings.CutPrefix(e.Field, "status.")
			top := strings.FieldsFunc(rest, func(r rune) bool { return r == '.' || r == '[' })
			if !ok || status == nil || len(top) == 0 {
				return nil, nil, errs.ToAggregate()
			}
			if _, ok := status[top[0]]; ok {
				delete(status, top[0])
				dropped = append(dropped, "status."+top[0])
			}
		}
	}
	return nil, nil, fmt.Errorf("status.%s: cannot be read", "(several fields)")
}

// undecodable reports a job the operator cannot read in its status (Created=False,
// InvalidSpec) and with one Warning event. Nothing else is done for it until it changes: its
// pods, if any, are left as they are.
func (r *ZayaTrainingJobReconciler) undecodable(ctx context.Context, u *unstructured.Unstructured, cause error) error {
	msg := bounded.Message(fmt.Sprintf("the operator cannot read this job: %v", cause))
	log.FromContext(ctx).Info("job cannot be decoded", "job", client.ObjectKeyFromObject(u), "error", msg)
	if !setStoredCondition(u, metav1.Condition{
		Type:    trainingv1alpha1.ConditionCreated,
		Status:  metav1.ConditionFalse,
		Reason:  trainingv1alpha1.ReasonInvalidSpec,
		Message: msg,
	}, r.Clock.Now()) {
		return nil
	}
	if err := r.Status().Update(ctx, u); err != nil {
		if apierrors.IsConflict(err) || apierrors.IsNotFound(err) {
			return client.IgnoreNotFound(err) // a newer version (or the deletion) is on its way
		}
		// Its status cannot be written either (for example a stored status the schema now
		// refuses): the event is all the user gets, and retrying would not change that.
		msg = bounded.Message(fmt.Sprintf("%s; writing the job's status failed too: %v", msg, err))
	}
	r.Recorder.Eventf(u, nil, corev1.EventTypeWarning, trainingv1alpha1.ReasonInvalidSpec, "Validate", "%s", msg)
	return nil
}

// setStoredCondition sets cond in the stored job's status.conditions, as meta.SetStatusCondition
// does for a typed status, and reports whether anything changed.
func setStoredCondition(u *unstructured.Unstructured, cond metav1.Condition, now time.Time) bool {
	cond.ObservedGeneration = u.GetGeneration()
	conds, _, _ := unstructured.NestedSlice(u.Object, "status", "conditions")
	at := -1
	for i, c := range conds {
		if m, ok := c.(map[string]any); ok && m["type"] == cond.Type {
			at = i
			break
		}
	}
	transition := now
	if at >= 0 {
		old, _ := conds[at].(map[string]any)
		if old["status"] == string(cond.Status) {
			if old["reason"] == cond.Reason && old["message"] == cond.Message && old["observedGeneration"] == cond.ObservedGeneration {
				return false
			}
			if ts, ok := old["lastTransitionTime"].(string); ok {
				if t, err := time.Parse(time.RFC3339, ts); err == nil {
					transition = t
				}
			}
		}
	}
	entry := map[string]any{
		"type":               cond.Type,
		"status":             string(cond.Status),
		"reason":             cond.Reason,
		"message":            cond.Message,
		"observedGeneration": cond.ObservedGeneration,
		"lastTransitionTime": transition.UTC().Format(time.RFC3339),
	}
	if at >= 0 {
		conds[at] = entry
	} else {
		conds = append(conds, entry)
	}
	if err := unstructured.SetNestedSlice(u.Object, conds, "status", "conditions"); err != nil {
		// status is not an object: replace it, keeping nothing the operator could not read.
		u.Object["status"] = map[string]any{"conditions": []any{entry}}
	}
	return true
}
