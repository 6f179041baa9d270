package integration

import (
	"context"
	"fmt"
	"strings"
	"testing"

	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/controller-runtime/pkg/client"

	trainingv1alpha1 "github.com/zaya-operator/zaya-operator/api/v1alpha1"
	"github.com/zaya-operator/zaya-operator/internal/testjob"
)

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

	pills, err := testjob.StorePoisonPills(ctx, k8sClient, ns, "poison", 1)
	t.Cleanup(func() {
		for _, u := range pills {
			_ = k8sClient.Delete(ctx, u)
		}
	})
	g.Expect(err).NotTo(HaveOccurred())

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
	g.Eventually(func(g Gomega) {
		g.Expect(meta.IsStatusConditionTrue(getJob(g, healthy).Status.Conditions, trainingv1alpha1.ConditionSuspended)).To(BeTrue())
	}, timeout, interval).Should(Succeed())
	stopFirst()

	// A fresh operator syncs with the pills present and goes on.
	startManager(t)
	suspend(false)
	pods := waitPods(g, ns, "healthy", 2)
	for _, p := range pods {
		setPodStatus(g, p, runningReady)
	}
	var attempt int32 // resuming starts a new attempt
	g.Eventually(func(g Gomega) {
		got := getJob(g, healthy)
		g.Expect(meta.IsStatusConditionTrue(got.Status.Conditions, trainingv1alpha1.ConditionRunning)).To(BeTrue())
		attempt = got.Status.Restarts
	}, timeout, interval).Should(Succeed())
	for _, p := range pods {
		if p.Labels[trainingv1alpha1.RankLabel] == "1" {
			setPodStatus(g, p, failedWith(1))
		}
	}
	g.Eventually(func(g Gomega) {
		g.Expect(getJob(g, healthy).Status.Restarts).To(Equal(attempt + 1))
		next := fmt.Sprint(attempt + 1)
		g.Expect(jobPods(g, ns, "healthy")).To(SatisfyAll(HaveKey("healthy-"+next+"-0"), HaveKey("healthy-"+next+"-1")))
	}, timeout, interval).Should(Succeed())

	// Each pill is reported on itself, naming its field; nothing was created for it.
	for i, p := range testjob.PoisonPills {
		g.Eventually(func(g Gomega) {
			got := &unstructured.Unstructured{}
			got.SetGroupVersionKind(pills[i].GroupVersionKind())
			g.Expect(k8sClient.Get(ctx, client.ObjectKeyFromObject(pills[i]), got)).To(Succeed())
			conds, _, _ := unstructured.NestedSlice(got.Object, "status", "conditions")
			g.Expect(conds).To(ContainElement(And(
				HaveKeyWithValue("type", trainingv1alpha1.ConditionCreated),
				HaveKeyWithValue("status", string(metav1.ConditionFalse)),
				HaveKeyWithValue("reason", trainingv1alpha1.ReasonInvalidSpec),
				HaveKeyWithValue("message", ContainSubstring(p.Field+":")),
			)), "%s", p.Name)
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
		g.Expect(strings.HasPrefix(name, "poison0-")).To(BeTrue())
	}
}

// TestUnreadableStatusIsReset: a status Go cannot hold (hand-written, restored from backup)
// does not stop its job: the operator resets those fields, says so, and runs the job.
func TestUnreadableStatusIsReset(t *testing.T) {
	g := NewWithT(t)
	ctx := context.Background()
	ns := newNamespace(t)
	job := testjob.MakeZayaTrainingJob("restored", ns).Nodes(2).Suspend(true).Obj()
	g.Expect(k8sClient.Create(ctx, job)).To(Succeed())

	restore, err := testjob.LoosenSchema(ctx, k8sClient)
	g.Expect(err).NotTo(HaveOccurred())
	u := &unstructured.Unstructured{}
	u.SetGroupVersionKind(trainingv1alpha1.GroupVersion.WithKind("ZayaTrainingJob"))
	g.Eventually(func(g Gomega) {
		g.Expect(k8sClient.Get(ctx, client.ObjectKeyFromObject(job), u)).To(Succeed())
		u.Object["status"] = map[string]any{"restarts": "four", "startTime": "yesterday"}
		g.Expect(k8sClient.Status().Update(ctx, u)).To(Succeed())
	}, timeout, interval).Should(Succeed())
	g.Expect(restore(ctx)).To(Succeed())

	startManager(t)
	g.Expect(k8sClient.Patch(ctx, u, rawMergePatch([]byte(`{"spec":{"suspend":false}}`)))).To(Succeed())
	waitPods(g, ns, "restored", 2)
	g.Eventually(func(g Gomega) {
		got := getJob(g, job)
		g.Expect(got.Status.Restarts).To(BeZero())
		g.Expect(meta.IsStatusConditionTrue(got.Status.Conditions, trainingv1alpha1.ConditionCreated)).To(BeTrue())
		events := &eventsv1.EventList{}
		g.Expect(k8sClient.List(ctx, events, client.InNamespace(ns))).To(Succeed())
		var notes []string
		for _, e := range events.Items {
			notes = append(notes, e.Note)
		}
		g.Expect(notes).To(ContainElement(And(ContainSubstring("status.restarts"), ContainSubstring("status.startTime"))))
	}, timeout, interval).Should(Succeed())
}
