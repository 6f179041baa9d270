package kueuegate

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/zaya-operator/zaya-operator/internal/kueue"
)

// setWorkloadConditions writes conditions that changed, keeping every other one.
func (g *Gate) setWorkloadConditions(ctx context.Context, wl *kueue.Workload, conds ...metav1.Condition) error {
	all := slices.Clone(wl.Status.Conditions)
	changed := false
	for _, c := range conds {
		c.ObservedGeneration = wl.Generation
		changed = meta.SetStatusCondition(&all, c) || changed
	}
	if !changed {
		return nil
	}
	return g.patchWorkload(ctx, wl, map[string]any{
		"metadata": map[string]any{"resourceVersion": wl.ResourceVersion},
		"status":   map[string]any{"conditions": all},
	}, "status")
}

// unsetQuotaReservation hands an evicted Workload's quota back once its pods are gone, as
// Kueue's own job controller does: Kueue then requeues it (after its backoff).
func (g *Gate) unsetQuotaReservation(ctx context.Context, wl *kueue.Workload) error {
	ev := meta.FindStatusCondition(wl.Status.Conditions, kueue.WorkloadEvicted)
	all := slices.Clone(wl.Status.Conditions)
	requeued := metav1.ConditionFalse
	if ev.Reason == kueue.ReasonPreempted || ev.Reason == kueue.ReasonNodeFailures {
		requeued = metav1.ConditionTrue
	}
	for _, c := range []metav1.Condition{
		{Type: kueue.WorkloadQuotaReserved, Status: metav1.ConditionFalse, Reason: kueue.ReasonPending, Message: ev.Message},
		{Type: kueue.WorkloadAdmitted, Status: metav1.ConditionFalse, Reason: kueue.ReasonNoReservation, Message: "The workload has no reservation"},
		{Type: kueue.WorkloadRequeued, Status: requeued, Reason: ev.Reason, Message: ev.Message},
	} {
		c.ObservedGeneration = wl.Generation
		meta.SetStatusCondition(&all, c)
	}
	if c := meta.FindStatusCondition(all, kueue.WorkloadPodsReady); c != nil {
		meta.SetStatusCondition(&all, metav1.Condition{Type: kueue.WorkloadPodsReady, Status: metav1.ConditionFalse,
			Reason: kueue.ReasonWaitForStart, Message: "the workload is not admitted", ObservedGeneration: wl.Generation})
	}
	return g.patchWorkload(ctx, wl, map[string]any{
		"metadata": map[string]any{"resourceVersion": wl.ResourceVersion},
		"status":   map[string]any{"conditions": all, "admission": nil},
	}, "status")
}

// releaseWorkload lets a Workload go: finished (reason, when given) so Kueue frees its quota,
// its finalizer dropped, and deleted unless that was already asked for.
func (t *ticket) releaseWorkload(ctx context.Context, wl *kueue.Workload, reason, msg string) error {
	if err := t.g.releaseWorkload(ctx, wl, reason, msg); err != nil {
		return err
	}
	if reason == "" {
		// Gone, though the cache may hold it a moment longer: never run under it again.
		t.g.gone.Store(types.NamespacedName{Namespace: t.job.Namespace, Name: t.job.Name}, wl.UID)
	}
	return nil
}

func (g *Gate) releaseWorkload(ctx context.Context, wl *kueue.Workload, reason, msg string) error {
	if reason != "" && !meta.IsStatusConditionTrue(wl.Status.Conditions, kueue.WorkloadFinished) {
		if err := g.setWorkloadConditions(ctx, wl, metav1.Condition{Type: kueue.WorkloadFinished, Status: metav1.ConditionTrue, Reason: reason, Message: msg}); err != nil {
			return err
		}
	}
	if err := g.dropFinalizer(ctx, wl); err != nil {
		return err
	}
	if wl.DeletionTimestamp.IsZero() && reason == "" {
		if err := g.Delete(ctx, wl, client.Preconditions{UID: &wl.UID}); err != nil && !apierrors.IsNotFound(err) {
			return fmt.Errorf("deleting Workload %s: %w", wl.Name, err)
		}
	}
	return nil
}

// dropFinalizer removes Kueue's resource-in-use finalizer, which the job's controller owns.
func (g *Gate) dropFinalizer(ctx context.Context, wl *kueue.Workload) error {
	if !slices.Contains(wl.Finalizers, kueue.ResourceInUseFinalizer) {
		return nil
	}
	rest := slices.DeleteFunc(slices.Clone(wl.Finalizers), func(f string) bool { return f == kueue.ResourceInUseFinalizer })
	return g.patchWorkload(ctx, wl, map[string]any{
		"metadata": map[string]any{"resourceVersion": wl.ResourceVersion, "finalizers": rest},
	}, "")
}

// patchWorkload merge-patches a Workload (its status when sub is "status"), guarded by the
// resourceVersion in the patch: fields these types lack are never touched, and a Workload that
// changed meanwhile is reread by the next pass (its watch event brings one).
func (g *Gate) patchWorkload(ctx context.Context, wl *kueue.Workload, patch map[string]any, sub string) error {
	b, err := json.Marshal(patch)
	if err != nil {
		return err
	}
	raw := client.RawPatch(types.MergePatchType, b)
	if sub == "status" {
		err = g.Status().Patch(ctx, wl, raw)
	} else {
		err = g.Patch(ctx, wl, raw)
	}
	switch {
	case apierrors.IsNotFound(err):
		return nil
	case err != nil:
		return fmt.Errorf("updating Workload %s: %w", wl.Name, err)
	}
	return nil
}
