package integration

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	trainingv1alpha1 "github.com/zaya-operator/zaya-operator/api/v1alpha1"
	"github.com/zaya-operator/zaya-operator/controllers"
	"github.com/zaya-operator/zaya-operator/internal/testjob"
)

// TestFailuresAreReadWithTheConfigMapsPatterns: a platform team adds a rule to the operator's
// failure-patterns ConfigMap; a rank that fails with a line it matches is attributed to it.
// A broken version of the ConfigMap is refused with a warning event on it, and the rule in use
// still names the next failure.
func TestFailuresAreReadWithTheConfigMapsPatterns(t *testing.T) {
	g := NewWithT(t)
	ctx := context.Background()
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: failurePatternsConfigMap.Namespace, Name: failurePatternsConfigMap.Name},
		Data: map[string]string{controllers.FailurePatternsKey: `[{name: zz-dataset-mount, category: Storage, regexp: 'zz dataset shard \d+ unreadable'}]`}}
	g.Expect(k8sClient.Create(ctx, cm)).To(Succeed())
	t.Cleanup(func() { _ = k8sClient.Delete(context.Background(), cm) })
	ns := newNamespace(t)
	startManager(t)
	patternEvents := func(g Gomega, reason string) []eventsv1.Event {
		list := &eventsv1.EventList{}
		g.Expect(k8sClient.List(ctx, list, client.InNamespace(cm.Namespace))).To(Succeed())
		return slices.DeleteFunc(list.Items, func(e eventsv1.Event) bool { return e.Regarding.Name != cm.Name || e.Reason != reason })
	}
	g.Eventually(func(g Gomega) {
		g.Expect(patternEvents(g, trainingv1alpha1.ReasonFailurePatternsLoaded)).NotTo(BeEmpty())
	}, timeout, interval).Should(Succeed())

	// A broken version: refused, naming the rule.
	g.Expect(k8sClient.Get(ctx, client.ObjectKeyFromObject(cm), cm)).To(Succeed())
	cm.Data[controllers.FailurePatternsKey] = `[{name: zz-broken, category: Storage, regexp: '(unclosed'}]`
	g.Expect(k8sClient.Update(ctx, cm)).To(Succeed())
	g.Eventually(func(g Gomega) {
		ev := patternEvents(g, trainingv1alpha1.ReasonInvalidFailurePatterns)
		g.Expect(ev).NotTo(BeEmpty())
		g.Expect(ev[0].Note).To(ContainSubstring(`[0] "zz-broken": regexp: error parsing regexp`))
	}, timeout, interval).Should(Succeed())

	job := testjob.MakeZayaTrainingJob("llm", ns).Nodes(2).RestartMode(trainingv1alpha1.RestartModeRecreate).Obj()
	g.Expect(k8sClient.Create(ctx, job)).To(Succeed())
	pods := waitPods(g, ns, "llm", 2)
	for _, p := range pods {
		setPodStatus(g, p, runningReady)
	}
	p := pods["llm-0-1"]
	setPodStatus(g, p, corev1.PodStatus{Phase: corev1.PodFailed, ContainerStatuses: []corev1.ContainerStatus{{
		Name: "worker", Image: "x", ImageID: "x", State: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{
			ExitCode: 1, Reason: "Error", FinishedAt: metav1.NewTime(time.Now()),
			Message: "loading\nloader: zz dataset shard 17 unreadable, giving up\n"}},
	}}})
	g.Eventually(func(g Gomega) {
		f := getJob(g, job).Status.LastFailure
		g.Expect(f).NotTo(BeNil())
		g.Expect(f.Category).To(Equal("Storage"))
		g.Expect(f.Rule).To(Equal("zz-dataset-mount"))
		g.Expect(strings.Contains(f.Evidence, "zz dataset shard 17 unreadable")).To(BeTrue(), "evidence %q", f.Evidence)
	}, timeout, interval).Should(Succeed())
}
