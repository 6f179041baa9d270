package controllers

import (
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	trainingv1alpha1 "github.com/zaya-operator/zaya-operator/api/v1alpha1"
)

func TestSetStoredConditionWritesOnlyChanges(t *testing.T) {
	u := storedJob()
	u.SetGeneration(3)
	u.Object["status"] = map[string]any{"conditions": []any{
		map[string]any{"type": "Running", "status": "True"},
	}}
	cond := metav1.Condition{Type: trainingv1alpha1.ConditionCreated, Status: metav1.ConditionFalse,
		Reason: trainingv1alpha1.ReasonInvalidSpec, Message: "spec.nodes: bad"}
	t0 := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	if !setStoredCondition(u, cond, t0) {
		t.Fatal("first set reported no change")
	}
	if setStoredCondition(u, cond, t0.Add(time.Hour)) {
		t.Error("the same condition again reported a change: every pass would write and warn")
	}
	cond.Message = "spec.nodes: worse"
	if !setStoredCondition(u, cond, t0.Add(time.Hour)) {
		t.Error("a new message reported no change")
	}
	conds, _, _ := unstructured.NestedSlice(u.Object, "status", "conditions")
	if len(conds) != 2 {
		t.Fatalf("conditions = %v", conds)
	}
	c := conds[1].(map[string]any)
	if c["lastTransitionTime"] != t0.Format(time.RFC3339) || c["message"] != "spec.nodes: worse" || c["observedGeneration"] != int64(3) {
		t.Errorf("condition = %v: the transition time must stay while the status does", c)
	}
}

func TestManagedByOperatorReadsTheStoredField(t *testing.T) {
	u := storedJob()
	if !managedByOperator(u) {
		t.Error("unset managedBy is this operator's")
	}
	_ = unstructured.SetNestedField(u.Object, "kueue.x-k8s.io/multikueue", "spec", "managedBy")
	if managedByOperator(u) {
		t.Error("a job managed by MultiKueue is not this operator's")
	}
	_ = unstructured.SetNestedField(u.Object, trainingv1alpha1.ControllerName, "spec", "managedBy")
	if !managedByOperator(u) {
		t.Error("a job naming this operator is its own")
	}
}
