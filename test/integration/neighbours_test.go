package integration

import (
	"context"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	trainingv1alpha1 "github.com/zaya-operator/zaya-operator/api/v1alpha1"
	"github.com/zaya-operator/zaya-operator/internal/testjob"
)

// expectNameConflict waits for the job to report a name conflict naming what, with a warning.
func expectNameConflict(g Gomega, job *trainingv1alpha1.ZayaTrainingJob, what string) {
	g.Eventually(func(g Gomega) {
		c := meta.FindStatusCondition(getJob(g, job).Status.Conditions, trainingv1alpha1.ConditionRunning)
		g.Expect(c).NotTo(BeNil())
		g.Expect(c.Reason).To(Equal(trainingv1alpha1.ReasonNameConflict))
		g.Expect(c.Message).To(ContainSubstring(what))
		events := &eventsv1.EventList{}
		g.Expect(k8sClient.List(context.Background(), events, client.InNamespace(job.Namespace))).To(Succeed())
		var notes []string
		for _, e := range events.Items {
			if e.Reason == trainingv1alpha1.ReasonNameConflict && e.Regarding.Name == job.Name {
				notes = append(notes, e.Note)
			}
		}
		g.Expect(notes).To(ContainElement(ContainSubstring(what)))
	}, timeout, interval).Should(Succeed())
}

// TestAForeignServiceIsNeverAdopted: a Service with the job's name that is not the job's
// blocks the job with a reason and an event, and the job starts once it is gone.
func TestAForeignServiceIsNeverAdopted(t *testing.T) {
	g := NewWithT(t)
	ctx := context.Background()
	ns := newNamespace(t)
	startManager(t)
	foreign := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "llm", Namespace: ns},
		Spec: corev1.ServiceSpec{Ports: []corev1.ServicePort{{Port: 80}}}}
	g.Expect(k8sClient.Create(ctx, foreign)).To(Succeed())

	job := testjob.MakeZayaTrainingJob("llm", ns).Nodes(2).Obj()
	g.Expect(k8sClient.Create(ctx, job)).To(Succeed())
	expectNameConflict(g, job, "Service llm already exists and is not this job's")
	g.Consistently(func(g Gomega) { g.Expect(jobPods(g, ns, "llm")).To(BeEmpty()) }, time.Second, interval).Should(Succeed())
	got := &corev1.Service{}
	g.Expect(k8sClient.Get(ctx, client.ObjectKeyFromObject(foreign), got)).To(Succeed())
	g.Expect(got.OwnerReferences).To(BeEmpty(), "the foreign Service was adopted")

	g.Expect(k8sClient.Delete(ctx, foreign)).To(Succeed())
	g.Eventually(func(g Gomega) { g.Expect(jobPods(g, ns, "llm")).To(HaveLen(2)) }, 3*timeout, interval).Should(Succeed())
}

// TestAForeignPodWithARanksNameIsNeverARank: a pod that took a rank's name before the
// operator could create it is reported, not counted and not deleted.
func TestAForeignPodWithARanksNameIsNeverARank(t *testing.T) {
	g := NewWithT(t)
	ctx := context.Background()
	ns := newNamespace(t)
	startManager(t)
	job := testjob.MakeZayaTrainingJob("gpt", ns).Nodes(2).Suspend(true).Obj()
	g.Expect(k8sClient.Create(ctx, job)).To(Succeed())
	squatter := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "gpt-0-1", Namespace: ns},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "sleep", Image: "busybox"}}}}
	g.Expect(k8sClient.Create(ctx, squatter)).To(Succeed())
	setPodStatus(g, squatter, runningReady)

	g.Expect(k8sClient.Patch(ctx, job, rawMergePatch([]byte(`{"spec":{"suspend":false}}`)))).To(Succeed())
	expectNameConflict(g, job, "Pod gpt-0-1 already exists and is not this job's")
	got := getJob(g, job)
	g.Expect(got.Status.ReadyNodes).To(BeZero())
	g.Expect(meta.IsStatusConditionTrue(got.Status.Conditions, trainingv1alpha1.ConditionRunning)).To(BeFalse())
	g.Expect(k8sClient.Get(ctx, client.ObjectKeyFromObject(squatter), &corev1.Pod{})).To(Succeed(), "the foreign pod was deleted")
}
