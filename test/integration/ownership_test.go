package integration

import (
	"context"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
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
				// Pending, unplaced for a while: WaitingForCapacity shows once a pass has seen
				// the pods (stripped before, a rank is trusted to exist for expectationTTL,
				// 30 s, before it is looked for).
				unplaced := corev1.PodStatus{Phase: corev1.PodPending, Conditions: []corev1.PodCondition{{Type: corev1.PodScheduled,
					Status: corev1.ConditionFalse, Reason: corev1.PodReasonUnschedulable, LastTransitionTime: metav1.NewTime(time.Now().Add(-time.Minute))}}}
				for _, p := range waitPods(g, ns, "llm", 2) {
					setPodStatus(g, p, unplaced)
				}
				g.Eventually(func(g Gomega) {
					g.Expect(meta.IsStatusConditionTrue(getJob(g, job).Status.Conditions, trainingv1alpha1.ConditionWaitingForCapacity)).To(BeTrue())
				}, timeout, interval).Should(Succeed())
				victim = "llm-0-0"
			}
			uid := stripJobLabel(g, ns, victim)
			g.Eventually(func(g Gomega) {
				pods := jobPods(g, ns, "llm")
				g.Expect(pods).To(HaveKey(victim))
				g.Expect(pods[victim].UID).To(Equal(uid))
				g.Expect(eventNotes(g, ns, "llm", trainingv1alpha1.ReasonPodRelabelled)).To(ContainElement(ContainSubstring(victim)))
			}, timeout, interval).Should(Succeed())
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

// An existing checkpoint claim no rank can write is refused before the first pod, naming the
// field; a ReadWriteOnce one mounted from several nodes runs, with one warning.
func TestAnExistingClaimsAccessModeIsCheckedOnTheAPIServer(t *testing.T) {
	g := NewWithT(t)
	ctx := context.Background()
	ns := newNamespace(t)
	startManager(t)
	for _, c := range []struct {
		job  string
		mode corev1.PersistentVolumeAccessMode
	}{{"ro", corev1.ReadOnlyMany}, {"rwo", corev1.ReadWriteOnce}} {
		claim := &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Name: c.job + "-ckpt", Namespace: ns},
			Spec: corev1.PersistentVolumeClaimSpec{AccessModes: []corev1.PersistentVolumeAccessMode{c.mode},
				Resources: corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Gi")}}}}
		g.Expect(k8sClient.Create(ctx, claim)).To(Succeed())
		g.Expect(k8sClient.Create(ctx, testjob.MakeZayaTrainingJob(c.job, ns).Nodes(2).ClaimCheckpoint(claim.Name).Obj())).To(Succeed())
	}
	g.Eventually(func(g Gomega) {
		c := meta.FindStatusCondition(getJob(g, testjob.MakeZayaTrainingJob("ro", ns).Obj()).Status.Conditions, trainingv1alpha1.ConditionCreated)
		g.Expect(c).NotTo(BeNil())
		g.Expect(c.Status).To(Equal(metav1.ConditionFalse))
		g.Expect(c.Message).To(And(ContainSubstring("spec.checkpoint.volume.claimName"), ContainSubstring("needs ReadWriteMany")))
		g.Expect(jobPods(g, ns, "rwo")).To(HaveLen(2))
		g.Expect(eventNotes(g, ns, "rwo", trainingv1alpha1.ReasonCheckpointClaimAccessMode)).To(ConsistOf(ContainSubstring("Multi-Attach")))
	}, timeout, interval).Should(Succeed())
	g.Expect(jobPods(g, ns, "ro")).To(BeEmpty())
}

// A scheduling gate the template sets (or a webhook adds) holds the ranks for good: the job
// names it once the scheduler has said the pods are gated.
func TestAForeignSchedulingGateIsNamedOnTheAPIServer(t *testing.T) {
	g := NewWithT(t)
	ns := newNamespace(t)
	startManager(t)
	job := testjob.MakeZayaTrainingJob("llm", ns).Nodes(2).Obj()
	job.Spec.Template.Spec.SchedulingGates = []corev1.PodSchedulingGate{{Name: "example.com/hold"}}
	g.Expect(k8sClient.Create(context.Background(), job)).To(Succeed())
	pods := waitPods(g, ns, "llm", 2)
	// What the scheduler writes of a gated pod (envtest runs none).
	gated := corev1.PodStatus{Phase: corev1.PodPending, Conditions: []corev1.PodCondition{{Type: corev1.PodScheduled, Status: corev1.ConditionFalse,
		Reason: corev1.PodReasonSchedulingGated, Message: "Scheduling is blocked due to non-empty scheduling gates", LastTransitionTime: metav1.Now()}}}
	for _, p := range pods {
		setPodStatus(g, p, gated)
	}
	g.Eventually(func(g Gomega) {
		c := meta.FindStatusCondition(getJob(g, job).Status.Conditions, trainingv1alpha1.ConditionWaitingForCapacity)
		g.Expect(c).NotTo(BeNil())
		g.Expect(c.Status).To(Equal(metav1.ConditionTrue))
		g.Expect(c.Message).To(ContainSubstring("held by scheduling gates the operator did not set (example.com/hold)"))
	}, 2*timeout, interval).Should(Succeed())
}
