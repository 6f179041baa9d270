package controllers

import (
	"context"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
)

func TestFailurePatternsFollowTheirConfigMapAndABadVersionIsRefused(t *testing.T) {
	ctx := context.Background()
	key := types.NamespacedName{Namespace: "zaya-system", Name: "zaya-operator-failure-patterns"}
	c := fake.NewClientBuilder().WithScheme(testScheme()).Build()
	rec := events.NewFakeRecorder(8)
	r := &ZayaTrainingJobReconciler{}
	f := &FailurePatterns{Reader: c, Key: key, Recorder: rec, Target: r}
	shipped := defaultPatterns.Len()

	// None: the shipped rules.
	if err := f.Load(ctx); err != nil || r.failurePatterns().Len() != shipped {
		t.Fatalf("no ConfigMap: %v, %d rules, want the %d shipped", err, r.failurePatterns().Len(), shipped)
	}
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: key.Namespace, Name: key.Name},
		Data: map[string]string{FailurePatternsKey: `[{name: dataset-mount, category: Storage, regexp: 'dataset shard \d+ unreadable'}]`}}
	if err := c.Create(ctx, cm); err != nil {
		t.Fatal(err)
	}
	if err := f.Load(ctx); err != nil {
		t.Fatal(err)
	}
	if m, ok := r.failurePatterns().Match("dataset shard 3 unreadable"); !ok || m.Pattern != "dataset-mount" || r.failurePatterns().Len() != shipped+1 {
		t.Fatalf("the ConfigMap's rule is not in use: %+v, %d rules", m, r.failurePatterns().Len())
	}
	if e := <-rec.Events; !strings.HasPrefix(e, "Normal FailurePatternsLoaded reading failures with") {
		t.Errorf("event %q", e)
	}

	// A bad version: refused whole, naming the rule; the table in use stays.
	cm.Data[FailurePatternsKey] = `[{name: ok-rule, category: UserCode, regexp: 'x+y'}, {name: broken, category: GPUHardware, regexp: '(unclosed'}]`
	if err := c.Update(ctx, cm); err != nil {
		t.Fatal(err)
	}
	if err := f.Load(ctx); err != nil {
		t.Fatal(err)
	}
	if e := <-rec.Events; !strings.HasPrefix(e, "Warning InvalidFailurePatterns refused patterns.yaml") || !strings.Contains(e, `[1] "broken": regexp: error parsing regexp: missing closing )`) {
		t.Errorf("event %q: want the refusal naming rule [1] and why", e)
	}
	if _, ok := r.failurePatterns().Match("dataset shard 3 unreadable"); !ok {
		t.Error("a refused version replaced the table in use")
	}

	// Deleted: the shipped rules again.
	if err := c.Delete(ctx, cm); err != nil {
		t.Fatal(err)
	}
	if err := f.Load(ctx); err != nil || r.failurePatterns().Len() != shipped {
		t.Errorf("after deletion: %v, %d rules, want the %d shipped", err, r.failurePatterns().Len(), shipped)
	}
}
