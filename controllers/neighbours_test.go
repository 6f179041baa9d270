package controllers

import (
	"context"
	"testing"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	"github.com/zaya-operator/zaya-operator/internal/testjob"
)

// TestATerminatingNamespaceEndsTheJobQuietly: creates refused because the namespace is being
// deleted are neither errors to retry nor events.
func TestATerminatingNamespaceEndsTheJobQuietly(t *testing.T) {
	job := testjob.MakeZayaTrainingJob("llm", "ns").Nodes(2).Generation(1).Defaulted().Obj()
	h := newHarness(t, interceptor.Funcs{
		Create: func(ctx context.Context, c client.WithWatch, obj client.Object, opts ...client.CreateOption) error {
			if _, ok := obj.(*corev1.Pod); ok {
				err := apierrors.NewForbidden(corev1.Resource("pods"), obj.GetName(), nil)
				err.ErrStatus.Details.Causes = []metav1.StatusCause{{Type: corev1.NamespaceTerminatingCause}}
				return err
			}
			return c.Create(ctx, obj, opts...)
		},
	}, job)
	for range 2 {
		res, err := h.reconcile(t, job)
		if err != nil || res.RequeueAfter != 0 {
			t.Fatalf("reconcile = %+v, %v: want quiet", res, err)
		}
	}
	for _, e := range h.drainEvents() {
		if containsPrefix([]string{e}, "Warning FailedCreate") {
			t.Errorf("event %q", e)
		}
	}
}
