package integration

import (
	"context"
	"fmt"
	"strconv"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	trainingv1alpha1 "github.com/zaya-operator/zaya-operator/api/v1alpha1"
	"github.com/zaya-operator/zaya-operator/internal/testjob"
)

// eventNotes are the notes of the events with reason about the job named name.
func eventNotes(g Gomega, ns, name, reason string) []string {
	events := &eventsv1.EventList{}
	g.Expect(k8sClient.List(context.Background(), events, client.InNamespace(ns))).To(Succeed())
	var notes []string
	for _, e := range events.Items {
		if e.Reason == reason && e.Regarding.Name == name {
			notes = append(notes, e.Note)
		}
	}
	return notes
}

// expectNameConflict waits for the job to report a name conflict naming what, with a warning.
func expectNameConflict(g Gomega, job *trainingv1alpha1.ZayaTrainingJob, what string) {
	g.Eventually(func(g Gomega) {
		c := meta.FindStatusCondition(getJob(g, job).Status.Conditions, trainingv1alpha1.ConditionRunning)
		g.Expect(c).NotTo(BeNil())
		g.Expect(c.Reason).To(Equal(trainingv1alpha1.ReasonNameConflict))
		g.Expect(c.Message).To(ContainSubstring(what))
		g.Expect(eventNotes(g, job.Namespace, job.Name, trainingv1alpha1.ReasonNameConflict)).To(ContainElement(ContainSubstring(what)))
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

// forgedPod is a pod anyone who may create pods in the namespace can make: the job's labels
// and controller reference, and a mark that was not made with the operator's key.
func forgedPod(job *trainingv1alpha1.ZayaTrainingJob, name, rank, mark string) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: job.Namespace,
			Labels:      map[string]string{trainingv1alpha1.JobNameLabel: job.Name, trainingv1alpha1.RankLabel: rank, trainingv1alpha1.AttemptLabel: "0"},
			Annotations: map[string]string{trainingv1alpha1.PodMarkAnnotation: mark},
			OwnerReferences: []metav1.OwnerReference{{APIVersion: trainingv1alpha1.GroupVersion.String(), Kind: "ZayaTrainingJob",
				Name: job.Name, UID: job.UID, Controller: ptr.To(true)}}},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "worker", Image: "busybox"}}},
	}
}

// TestAPodForgedAsTheJobsIsNeverARank: pods carrying the job's labels and controller
// reference that the operator did not make are never counted, adopted or deleted; one that
// holds a rank's name is reported as a conflict, one under another name is passed over.
func TestAPodForgedAsTheJobsIsNeverARank(t *testing.T) {
	g := NewWithT(t)
	ctx := context.Background()
	ns := newNamespace(t)
	startManager(t)
	job := testjob.MakeZayaTrainingJob("gpt", ns).Nodes(2).Suspend(true).Obj()
	g.Expect(k8sClient.Create(ctx, job)).To(Succeed())
	// A ready rank 1 under its own name with a made-up mark, and a ready "rank 0" under
	// another name with none.
	squatter := forgedPod(job, "gpt-0-1", "1", "v1.AAAAAAAAAAAAAAAAAAAAAA")
	extra := forgedPod(job, "gpt-extra", "0", "")
	for _, p := range []*corev1.Pod{squatter, extra} {
		g.Expect(k8sClient.Create(ctx, p)).To(Succeed())
		setPodStatus(g, p, runningReady)
	}

	g.Expect(k8sClient.Patch(ctx, job, rawMergePatch([]byte(`{"spec":{"suspend":false}}`)))).To(Succeed())
	expectNameConflict(g, job, "Pod gpt-0-1 already exists and is not this job's")
	// Rank 0 gets the operator's own pod, marked, in spite of the forged rank 0.
	pods := waitPods(g, ns, "gpt", 3)
	g.Expect(pods).To(HaveKey("gpt-0-0"))
	g.Expect(pods["gpt-0-0"].Annotations).To(HaveKeyWithValue(trainingv1alpha1.PodMarkAnnotation, HavePrefix("v2.")))
	setPodStatus(g, pods["gpt-0-0"], runningReady)
	g.Consistently(func(g Gomega) {
		got := getJob(g, job)
		g.Expect(got.Status.ReadyNodes).To(BeNumerically("<=", 1))
		g.Expect(meta.IsStatusConditionTrue(got.Status.Conditions, trainingv1alpha1.ConditionRunning)).To(BeFalse())
	}, 2*time.Second, interval).Should(Succeed())
	g.Expect(k8sClient.Get(ctx, client.ObjectKeyFromObject(squatter), &corev1.Pod{})).To(Succeed(), "the forged pod was deleted")

	// Once the name is free the operator makes rank 1 itself and the job runs; the pod under
	// another name is still not its to delete.
	g.Expect(k8sClient.Delete(ctx, squatter, client.GracePeriodSeconds(0))).To(Succeed())
	g.Eventually(func(g Gomega) {
		p := &corev1.Pod{}
		g.Expect(k8sClient.Get(ctx, client.ObjectKey{Namespace: ns, Name: "gpt-0-1"}, p)).To(Succeed())
		g.Expect(p.Annotations).To(HaveKey(trainingv1alpha1.PodMarkAnnotation))
		if p.Status.Phase != corev1.PodRunning {
			setPodStatus(g, p, runningReady)
		}
		got := getJob(g, job)
		g.Expect(meta.IsStatusConditionTrue(got.Status.Conditions, trainingv1alpha1.ConditionRunning)).To(BeTrue(), "%+v", got.Status)
	}, 3*timeout, interval).Should(Succeed())
	g.Expect(getJob(g, job).Status.Restarts).To(BeZero())
	g.Expect(k8sClient.Get(ctx, client.ObjectKeyFromObject(extra), &corev1.Pod{})).To(Succeed(), "the forged pod was deleted")
}

// TestPodsOlderThanThePodMarkKeyAreTrusted: an operator that did not mark pods (the version
// before an upgrade) made a running gang; the operator that makes the key keeps it running
// as it is.
func TestPodsOlderThanThePodMarkKeyAreTrusted(t *testing.T) {
	g := NewWithT(t)
	ctx := context.Background()
	ns := newNamespace(t)
	job := testjob.MakeZayaTrainingJob("old", ns).Nodes(2).Obj()
	g.Expect(k8sClient.Create(ctx, job)).To(Succeed())
	uids := map[string]types.UID{}
	for r := range 2 {
		p := forgedPod(job, fmt.Sprintf("old-0-%d", r), strconv.Itoa(r), "")
		delete(p.Annotations, trainingv1alpha1.PodMarkAnnotation)
		g.Expect(k8sClient.Create(ctx, p)).To(Succeed())
		setPodStatus(g, p, runningReady)
		uids[p.Name] = p.UID
	}
	time.Sleep(1100 * time.Millisecond) // creation times are in whole seconds

	startManagerMarking(t, cfg, nil, types.NamespacedName{Namespace: ns, Name: "mark-key"})
	g.Eventually(func(g Gomega) {
		got := getJob(g, job)
		g.Expect(got.Status.ReadyNodes).To(Equal(int32(2)))
		g.Expect(meta.IsStatusConditionTrue(got.Status.Conditions, trainingv1alpha1.ConditionRunning)).To(BeTrue())
	}, timeout, interval).Should(Succeed())
	key := &corev1.Secret{}
	g.Expect(k8sClient.Get(ctx, client.ObjectKey{Namespace: ns, Name: "mark-key"}, key)).To(Succeed())
	g.Expect(key.Data["key"]).To(HaveLen(32))
	pods := jobPods(g, ns, "old")
	g.Expect(pods).To(HaveLen(2))
	for name, uid := range uids {
		g.Expect(pods[name].UID).To(Equal(uid), "%s was replaced", name)
	}
}

// TestDeletingTheNamespaceRestartsNothing: the namespace controller deletes the pods before it
// reaches the job; their loss is no failure to restart from (no restart counted or recorded).
func TestDeletingTheNamespaceRestartsNothing(t *testing.T) {
	g := NewWithT(t)
	ctx := context.Background()
	ns := newNamespace(t)
	startManager(t)
	job := testjob.MakeZayaTrainingJob("llm", ns).Nodes(2).Obj()
	g.Expect(k8sClient.Create(ctx, job)).To(Succeed())
	for _, pod := range waitPods(g, ns, "llm", 2) {
		setPodStatus(g, pod, runningReady)
	}
	g.Eventually(func(g Gomega) {
		g.Expect(meta.IsStatusConditionTrue(getJob(g, job).Status.Conditions, trainingv1alpha1.ConditionRunning)).To(BeTrue())
	}, timeout, interval).Should(Succeed())

	// envtest runs no namespace controller: the namespace stays Terminating and the test
	// deletes the pods as that controller would.
	g.Expect(k8sClient.Delete(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}})).To(Succeed())
	g.Expect(k8sClient.DeleteAllOf(ctx, &corev1.Pod{}, client.InNamespace(ns))).To(Succeed())
	g.Eventually(func(g Gomega) {
		for _, pod := range jobPods(g, ns, "llm") {
			g.Expect(pod.DeletionTimestamp).NotTo(BeNil())
		}
	}, timeout, interval).Should(Succeed())
	g.Consistently(func(g Gomega) {
		got := getJob(g, job)
		g.Expect(got.Status.Restarts).To(BeZero())
		g.Expect(got.Status.LastFailure).To(BeNil())
	}, 3*time.Second, interval).Should(Succeed())
}
