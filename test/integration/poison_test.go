package integration

import (
	"context"
	"strings"
	"testing"

	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/client"

	trainingv1alpha1 "github.com/zaya-operator/zaya-operator/api/v1alpha1"
	"github.com/zaya-operator/zaya-operator/internal/testjob"
)

// poisonPills are stored jobs that Go cannot decode: each passes a schema looser than ours
// (an older CRD, a restore from backup, a schema bug) and names the field it poisons.
var poisonPills = []struct {
	name, patch, field string
}{
	{"duration", `{spec: {faultTolerance: {hangTimeout: 3000000h}}}`, "spec.faultTolerance.hangTimeout"},
	{"port", `{spec: {template: {spec: {containers: [{name: worker, image: zaya-worker:test, livenessProbe: {httpGet: {port: 99999999999}}}]}}}}`,
		"spec.template.spec.containers[0].livenessProbe.httpGet.port"},
	// resource.ParseQuantity takes hours over this one, with memory growing.
	{"quantity", `{spec: {template: {spec: {containers: [{name: worker, image: zaya-worker:test, resources: {limits: {cpu: "1e-999999999"}}}]}}}}`,
		"spec.template.spec.containers[0].resources.limits[cpu]"},
	{"type", `{spec: {nodes: four}}`, "spec.nodes"},
}

var crdGVK = schema.GroupVersionKind{Group: "apiextensions.k8s.io", Version: "v1", Kind: "CustomResourceDefinition"}

// loosenCRD swaps the job's spec schema for one that stores anything, until the returned
// restore is called (or the test ends).
func loosenCRD(t *testing.T, g Gomega) (restore func()) {
	t.Helper()
	ctx := context.Background()
	crd := &unstructured.Unstructured{}
	crd.SetGroupVersionKind(crdGVK)
	key := client.ObjectKey{Name: "zayatrainingjobs." + trainingv1alpha1.GroupVersion.Group}
	g.Expect(k8sClient.Get(ctx, key, crd)).To(Succeed())
	versions, _, _ := unstructured.NestedSlice(crd.Object, "spec", "versions")
	saved := unstructured.Unstructured{Object: map[string]any{"v": versions}}
	saved = *saved.DeepCopy()
	loose := saved.DeepCopy().Object["v"].([]any)
	g.Expect(unstructured.SetNestedField(loose[0].(map[string]any), map[string]any{
		"type": "object", "x-kubernetes-preserve-unknown-fields": true,
	}, "schema", "openAPIV3Schema", "properties", "spec")).To(Succeed())
	setVersions := func(v []any) {
		g.Eventually(func(g Gomega) {
			g.Expect(k8sClient.Get(ctx, key, crd)).To(Succeed())
			g.Expect(unstructured.SetNestedSlice(crd.Object, v, "spec", "versions")).To(Succeed())
			g.Expect(k8sClient.Update(ctx, crd)).To(Succeed())
		}, timeout, interval).Should(Succeed())
	}
	setVersions(loose)
	var restored bool
	restore = func() {
		if !restored {
			restored = true
			setVersions(saved.Object["v"].([]any))
		}
	}
	t.Cleanup(restore)
	return restore
}

// TestPoisonPillsStayWithTheirJob: jobs Go cannot decode, stored next to a healthy job, are
// reported in their own status, while the operator that watched them arrive and a fresh one
// started with them present keep reconciling the healthy job: edits and a rank failure.
func TestPoisonPillsStayWithTheirJob(t *testing.T) {
	g := NewWithT(t)
	ctx := context.Background()
	ns := newNamespace(t)
	stopFirst := startStoppableManager(t)

	healthy := testjob.MakeZayaTrainingJob("healthy", ns).Nodes(2).Obj()
	g.Expect(k8sClient.Create(ctx, healthy)).To(Succeed())
	waitPods(g, ns, "healthy", 2)

	restore := loosenCRD(t, g)
	var pills []*unstructured.Unstructured
	for _, p := range poisonPills {
		u := manifest(t, p.patch)
		u.SetName("poison-" + p.name)
		u.SetNamespace(ns)
		// The apiserver serves the loose schema a moment after the update.
		g.Eventually(func() error { return k8sClient.Create(ctx, u.DeepCopy()) }, timeout, interval).Should(Succeed())
		pills = append(pills, u)
	}
	t.Cleanup(func() {
		for _, u := range pills {
			_ = k8sClient.Delete(ctx, u) // typed deletes would decode the response
		}
	})
	restore()

	// The operator that saw them arrive still reconciles: suspend deletes the healthy pods.
	suspend := func(s bool) {
		p := `{"spec":{"suspend":false}}`
		if s {
			p = `{"spec":{"suspend":true}}`
		}
		g.Expect(k8sClient.Patch(ctx, healthy, rawMergePatch([]byte(p)))).To(Succeed())
	}
	suspend(true)
	waitPods(g, ns, "healthy", 0)
	stopFirst()

	// A fresh operator syncs with the pills present and goes on.
	startManager(t)
	suspend(false)
	pods := waitPods(g, ns, "healthy", 2)
	for _, p := range pods {
		setPodStatus(g, p, runningReady)
	}
	g.Eventually(func(g Gomega) {
		g.Expect(meta.IsStatusConditionTrue(getJob(g, healthy).Status.Conditions, trainingv1alpha1.ConditionRunning)).To(BeTrue())
	}, timeout, interval).Should(Succeed())
	for _, p := range pods {
		if p.Labels[trainingv1alpha1.RankLabel] == "1" {
			setPodStatus(g, p, failedWith(1))
		}
	}
	g.Eventually(func(g Gomega) {
		g.Expect(getJob(g, healthy).Status.Restarts).To(BeEquivalentTo(1))
		for _, p := range jobPods(g, ns, "healthy") {
			g.Expect(p.Labels[trainingv1alpha1.AttemptLabel]).To(Equal("1"))
		}
	}, timeout, interval).Should(Succeed())

	// Each pill is reported on itself, naming its field; nothing was created for it.
	for i, p := range poisonPills {
		g.Eventually(func(g Gomega) {
			got := &unstructured.Unstructured{}
			got.SetGroupVersionKind(pills[i].GroupVersionKind())
			g.Expect(k8sClient.Get(ctx, client.ObjectKeyFromObject(pills[i]), got)).To(Succeed())
			conds, _, _ := unstructured.NestedSlice(got.Object, "status", "conditions")
			g.Expect(conds).To(ContainElement(And(
				HaveKeyWithValue("type", trainingv1alpha1.ConditionCreated),
				HaveKeyWithValue("status", string(metav1.ConditionFalse)),
				HaveKeyWithValue("reason", trainingv1alpha1.ReasonInvalidSpec),
				HaveKeyWithValue("message", ContainSubstring(p.field+":")),
			)), "%s", p.name)
		}, timeout, interval).Should(Succeed())
		g.Expect(jobPods(g, ns, pills[i].GetName())).To(BeEmpty())
	}
	events := &eventsv1.EventList{}
	g.Expect(k8sClient.List(ctx, events, client.InNamespace(ns))).To(Succeed())
	warned := map[string]int{}
	for _, e := range events.Items {
		if e.Type == corev1.EventTypeWarning && e.Reason == trainingv1alpha1.ReasonInvalidSpec {
			warned[e.Regarding.Name]++
		}
	}
	for _, u := range pills {
		g.Expect(warned).To(HaveKey(u.GetName()))
	}
	// One warning each, not one per pass: reporting wrote the status, which brought a pass.
	for name, n := range warned {
		g.Expect(n).To(Equal(1), "%s warned %d times", name, n)
		g.Expect(strings.HasPrefix(name, "poison-")).To(BeTrue())
	}
}
