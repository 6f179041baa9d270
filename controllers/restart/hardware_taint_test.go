package restart

import (
	"context"
	"slices"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	trainingv1alpha1 "github.com/zaya-operator/zaya-operator/api/v1alpha1"
	"github.com/zaya-operator/zaya-operator/controllers/nodehealth"
	"github.com/zaya-operator/zaya-operator/internal/testjob"
)

// A node that roots hardware failures in three namespaces' jobs is tainted for everyone; the
// same tenant's jobs alone, a cascade's category or an expired root never taint it; the taint
// goes when it expires.
func TestANodeRootingHardwareFailuresInSeveralNamespacesIsTainted(t *testing.T) {
	c := fake.NewClientBuilder().WithObjects(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "bad"}}).Build()
	policy := nodehealth.HardwareTaintPolicy{Namespaces: 3, Window: time.Hour, Expiry: 2 * time.Hour}
	ctx := context.Background()
	now := time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)
	root := func(ns, category string, at time.Time) {
		t.Helper()
		job := testjob.MakeZayaTrainingJob("llm", ns).Nodes(2).Defaulted().Obj()
		e := &Executor{Job: job, Now: at, Host: &host{}, Cluster: c, HardwareTaint: policy}
		f := trainingv1alpha1.JobFailure{Node: "bad", Category: category, Rank: ptr.To[int32](0), Reason: category}
		if err := e.quarantine(ctx, &f); err != nil {
			t.Fatal(err)
		}
	}
	tainted := func() bool {
		node := &corev1.Node{}
		if err := c.Get(ctx, client.ObjectKey{Name: "bad"}, node); err != nil {
			t.Fatal(err)
		}
		return slices.ContainsFunc(node.Spec.Taints, func(x corev1.Taint) bool {
			return x.Key == trainingv1alpha1.HardwareSuspectTaintKey && x.Effect == corev1.TaintEffectNoSchedule
		})
	}
	root("old", "GPUHardware", now.Add(-2*time.Hour)) // out of the window by the third
	root("a", "GPUHardware", now)
	root("a", "GPUHardware", now.Add(time.Minute))
	root("b", "Unknown", now.Add(2*time.Minute))
	root("b", "GPUHardware", now.Add(3*time.Minute))
	if tainted() {
		t.Fatal("tainted after roots in two namespaces (and an expired one, and a failure of no hardware)")
	}
	root("c", "NICFabric", now.Add(4*time.Minute))
	if !tainted() {
		t.Fatal("not tainted after hardware roots in three namespaces")
	}
	expiry := &nodehealth.TaintExpiry{Client: c, Now: func() time.Time { return now.Add(time.Hour) }}
	if err := expiry.Expire(ctx); err != nil || !tainted() {
		t.Fatalf("the taint went before it expired (%v)", err)
	}
	expiry.Now = func() time.Time { return now.Add(3 * time.Hour) }
	if err := expiry.Expire(ctx); err != nil || tainted() {
		t.Fatalf("the taint stayed after it expired (%v)", err)
	}
}
