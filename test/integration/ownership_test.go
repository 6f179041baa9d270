package integration

import (
	"context"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	trainingv1alpha1 "github.com/zaya-operator/zaya-operator/api/v1alpha1"
	"github.com/zaya-operator/zaya-operator/internal/testjob"
)

// stripJobLabel removes the job-name label from a pod, as anyone who may edit pods in the
// namespace can: the operator's cache, which holds only labelled pods, loses it.
func stripJobLabel(g Gomega, ns, name string) types.UID {
	pod := &corev1.Pod{}
	g.Expect(k8sClient.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: name}, pod)).To(Succeed())
	patch := []byte(`{"metadata":{"labels":{"` + trainingv1alpha1.JobNameLabel + `":null}}}`)
	g.Expect(k8sClient.Patch(context.Background(), pod, client.RawPatch(types.MergePatchType, patch))).To(Succeed())
	return pod.UID
}

// A pod the operator made stays the job's whatever happens to its labels: a running rank
// whose job label is removed is relabelled, not taken for gone (before, the gang was restarted
// and the unlabelled pod kept running beside the new attempt, on its GPUs); a starting rank's
// is relabelled too (before, its name was reported as a conflict and the job never started).
func TestARankWhoseLabelsAreRemovedStaysTheJobs(t *testing.T) {
	for _, running := range []bool{true, false} {
		name := map[bool]string{true: "running", false: "starting"}[running]
		t.Run(name, func(t *testing.T) {
			g := NewWithT(t)
			ns := newNamespace(t)
			startManager(t)
			job := testjob.MakeZayaTrainingJob("llm", ns).Nodes(2).Obj()
			var victim string
			if running {
				runGang(g, job, 2)
				victim = "llm-0-1"
			} else {
				g.Expect(k8sClient.Create(context.Background(), job)).To(Succeed())
				waitPods(g, ns, "llm", 2)
				victim = "llm-0-0"
				// Stripped before any pass saw the pod, the rank is trusted to exist for
				// expectationTTL (30 s) before it is looked for: give that pass a moment.
				time.Sleep(time.Second)
			}
			uid := stripJobLabel(g, ns, victim)
			g.Eventually(func(g Gomega) {
				pods := jobPods(g, ns, "llm")
				g.Expect(pods).To(HaveKey(victim))
				g.Expect(pods[victim].UID).To(Equal(uid))
				g.Expect(eventNotes(g, ns, "llm", trainingv1alpha1.ReasonPodRelabelled)).To(ContainElement(ContainSubstring(victim)))
			}, 45*time.Second, interval).Should(Succeed())
			g.Consistently(func(g Gomega) {
				got := getJob(g, job)
				g.Expect(got.Status.Restarts).To(BeZero())
				c := meta.FindStatusCondition(got.Status.Conditions, trainingv1alpha1.ConditionRunning)
				g.Expect(c == nil || c.Reason != trainingv1alpha1.ReasonNameConflict).To(BeTrue(), "name conflict: %+v", c)
				all := &corev1.PodList{}
				g.Expect(k8sClient.List(context.Background(), all, client.InNamespace(ns))).To(Succeed())
				g.Expect(all.Items).To(HaveLen(2), "pods beside the gang")
			}, 3*time.Second, interval).Should(Succeed())
		})
	}
}
