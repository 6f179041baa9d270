package controllers

import (
	"slices"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"

	trainingv1alpha1 "github.com/zaya-operator/zaya-operator/api/v1alpha1"
	"github.com/zaya-operator/zaya-operator/internal/testjob"
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

func TestDecodeJobDropsUnreadableStatusOnly(t *testing.T) {
	good := testjob.MakeZayaTrainingJob("llm", "ns").Defaulted().Obj()
	obj, err := runtime.DefaultUnstructuredConverter.ToUnstructured(good)
	if err != nil {
		t.Fatal(err)
	}
	u := &unstructured.Unstructured{Object: obj}
	u.Object["status"] = map[string]any{
		"restarts":   "four",
		"startTime":  "yesterday",
		"conditions": []any{map[string]any{"type": "Running", "status": "True", "lastTransitionTime": "never"}},
		"readyNodes": int64(2),
	}
	job, dropped, err := decodeJob(u)
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"status.restarts", "status.startTime", "status.conditions"}; !slices.Equal(slices.Sorted(slices.Values(dropped)), slices.Sorted(slices.Values(want))) {
		t.Errorf("dropped %v, want %v", dropped, want)
	}
	if job.Status.ReadyNodes != 2 || job.Status.Restarts != 0 || job.Status.StartTime != nil || job.Spec.Nodes != 2 {
		t.Errorf("decoded status %+v", job.Status)
	}

	_ = unstructured.SetNestedField(u.Object, "3000000h", "spec", "faultTolerance", "hangTimeout")
	if _, _, err := decodeJob(u); err == nil || !strings.Contains(err.Error(), "spec.faultTolerance.hangTimeout") {
		t.Errorf("a spec Go cannot hold decoded: %v", err)
	}
}
