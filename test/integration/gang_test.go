package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"sort"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	trainingv1alpha1 "github.com/zaya-operator/zaya-operator/api/v1alpha1"
	"github.com/zaya-operator/zaya-operator/internal/testjob"
)

// jobPods lists the job's pods by name.
func jobPods(g Gomega, ns, job string) map[string]*corev1.Pod {
	list := &corev1.PodList{}
	g.Expect(k8sClient.List(context.Background(), list, client.InNamespace(ns),
		client.MatchingLabels{trainingv1alpha1.JobNameLabel: job})).To(Succeed())
	out := map[string]*corev1.Pod{}
	for i := range list.Items {
		out[list.Items[i].Name] = &list.Items[i]
	}
	return out
}

// waitPods waits until the job has exactly n pods and returns them by name.
func waitPods(g Gomega, ns, job string, n int) map[string]*corev1.Pod {
	var pods map[string]*corev1.Pod
	g.Eventually(func(g Gomega) {
		pods = jobPods(g, ns, job)
		g.Expect(pods).To(HaveLen(n))
	}, timeout, interval).Should(Succeed())
	return pods
}

// setPodStatus plays kubelet: there is none in envtest.
func setPodStatus(g Gomega, pod *corev1.Pod, status corev1.PodStatus) {
	pod.Status = status
	g.Expect(k8sClient.Status().Update(context.Background(), pod)).To(Succeed())
}

var runningReady = corev1.PodStatus{Phase: corev1.PodRunning, Conditions: []corev1.PodCondition{
	{Type: corev1.PodReady, Status: corev1.ConditionTrue},
	{Type: corev1.PodScheduled, Status: corev1.ConditionTrue},
}}

// explainOnFailure logs, if the test fails, what the job and its pods looked like at the end
// and the job's events: the state a flaky run in CI left, where no debugger can go.
func explainOnFailure(t *testing.T, ns, name string) {
	t.Cleanup(func() {
		if !t.Failed() {
			return
		}
		ctx := context.Background()
		job := &trainingv1alpha1.ZayaTrainingJob{}
		if err := k8sClient.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, job); err != nil {
			t.Logf("job %s/%s: %v", ns, name, err)
			return
		}
		status, _ := json.MarshalIndent(job.Status, "", "  ")
		t.Logf("job %s/%s generation %d, status:\n%s", ns, name, job.Generation, status)
		pods := &corev1.PodList{}
		_ = k8sClient.List(ctx, pods, client.InNamespace(ns), client.MatchingLabels{trainingv1alpha1.JobNameLabel: name})
		for _, p := range pods.Items {
			t.Logf("pod %s rv %s phase %s node %q deleting %v finalizers %v", p.Name, p.ResourceVersion,
				p.Status.Phase, p.Spec.NodeName, p.DeletionTimestamp, p.Finalizers)
		}
		events := &eventsv1.EventList{}
		_ = k8sClient.List(ctx, events, client.InNamespace(ns))
		sort.Slice(events.Items, func(i, j int) bool {
			return events.Items[i].CreationTimestamp.Before(&events.Items[j].CreationTimestamp)
		})
		for _, e := range events.Items {
			t.Logf("event %s %s %s: %s", e.CreationTimestamp.Format(time.TimeOnly), e.Regarding.Name, e.Reason, e.Note)
		}
	})
}

// runGang creates the job, plays its n ranks running and ready, and waits for Running.
func runGang(g Gomega, job *trainingv1alpha1.ZayaTrainingJob, n int) map[string]*corev1.Pod {
	g.Expect(k8sClient.Create(context.Background(), job)).To(Succeed())
	pods := waitPods(g, job.Namespace, job.Name, n)
	for _, p := range pods {
		setPodStatus(g, p, runningReady)
	}
	g.Eventually(func(g Gomega) {
		g.Expect(meta.IsStatusConditionTrue(getJob(g, job).Status.Conditions, trainingv1alpha1.ConditionRunning)).To(BeTrue())
	}, timeout, interval).Should(Succeed())
	return pods
}

func getJob(g Gomega, job *trainingv1alpha1.ZayaTrainingJob) *trainingv1alpha1.ZayaTrainingJob {
	got := &trainingv1alpha1.ZayaTrainingJob{}
	g.Expect(k8sClient.Get(context.Background(), client.ObjectKeyFromObject(job), got)).To(Succeed())
	return got
}

func TestGangIsCreatedAndRuns(t *testing.T) {
	g := NewWithT(t)
	ns := newNamespace(t)
	startManager(t)
	ctx := context.Background()

	job := testjob.MakeZayaTrainingJob("llm", ns).Nodes(8).NewCheckpoint("1Ti", "ibmc-vpc-file-3000-iops").Obj()
	g.Expect(k8sClient.Create(ctx, job)).To(Succeed())

	pods := waitPods(g, ns, "llm", 8)

	// Every rank's pod passed the apiserver's own pod validation and carries the contract.
	for r := range 8 {
		p := pods[fmt.Sprintf("llm-0-%d", r)]
		g.Expect(p).NotTo(BeNil(), "rank %d", r)
		g.Expect(p.Spec.Hostname).To(Equal(fmt.Sprintf("llm-%d", r)))
		g.Expect(p.Spec.Subdomain).To(Equal("llm"))
		g.Expect(p.Spec.RestartPolicy).To(Equal(corev1.RestartPolicyNever))
		g.Expect(*p.Spec.AutomountServiceAccountToken).To(BeFalse())
		g.Expect(p.Spec.Containers[0].Resources.Limits).To(HaveKeyWithValue(corev1.ResourceName("amd.com/gpu"), resource.MustParse("8")))
		g.Expect(p.Spec.Containers[0].Env).To(ContainElement(corev1.EnvVar{Name: "NODE_RANK", Value: fmt.Sprint(r)}))
		g.Expect(p.Spec.Containers[0].Env).To(ContainElement(corev1.EnvVar{Name: "MASTER_ADDR", Value: "llm-0.llm." + ns + ".svc"}))
		g.Expect(metav1.IsControlledBy(p, getJob(g, job))).To(BeTrue())
	}
	svc := &corev1.Service{}
	g.Expect(k8sClient.Get(ctx, client.ObjectKey{Namespace: ns, Name: "llm"}, svc)).To(Succeed())
	g.Expect(svc.Spec.ClusterIP).To(Equal(corev1.ClusterIPNone))
	pvc := &corev1.PersistentVolumeClaim{}
	g.Expect(k8sClient.Get(ctx, client.ObjectKey{Namespace: ns, Name: "llm-checkpoints"}, pvc)).To(Succeed())
	g.Expect(pvc.OwnerReferences).To(BeEmpty(), "a retained checkpoint claim must not be garbage-collected with the job")

	for _, p := range pods {
		setPodStatus(g, p, runningReady)
	}
	g.Eventually(func(g Gomega) {
		got := getJob(g, job)
		g.Expect(got.Status.ReadyNodes).To(Equal(int32(8)))
		g.Expect(meta.IsStatusConditionTrue(got.Status.Conditions, trainingv1alpha1.ConditionRunning)).To(BeTrue())
	}, timeout, interval).Should(Succeed())

	// Rank 0 finishing ends the job and the rest are cleaned up.
	setPodStatus(g, pods["llm-0-0"], corev1.PodStatus{Phase: corev1.PodSucceeded, ContainerStatuses: []corev1.ContainerStatus{{
		Name: "worker", State: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: 0, Reason: "Completed"}},
	}}})
	g.Eventually(func(g Gomega) {
		got := getJob(g, job)
		g.Expect(meta.IsStatusConditionTrue(got.Status.Conditions, trainingv1alpha1.ConditionSucceeded)).To(BeTrue())
		g.Expect(got.Status.CompletionTime).NotTo(BeNil())
		g.Expect(jobPods(g, ns, "llm")).To(HaveLen(1))
	}, timeout, interval).Should(Succeed())
}

func TestUnplaceableGangReportsCapacity(t *testing.T) {
	g := NewWithT(t)
	ns := newNamespace(t)
	startManager(t)
	ctx := context.Background()

	job := testjob.MakeZayaTrainingJob("big", ns).Nodes(3).Obj()
	g.Expect(k8sClient.Create(ctx, job)).To(Succeed())
	pods := waitPods(g, ns, "big", 3)

	setPodStatus(g, pods["big-0-0"], runningReady)
	for _, name := range []string{"big-0-1", "big-0-2"} {
		setPodStatus(g, pods[name], corev1.PodStatus{Phase: corev1.PodPending, Conditions: []corev1.PodCondition{{
			Type: corev1.PodScheduled, Status: corev1.ConditionFalse, Reason: corev1.PodReasonUnschedulable,
			Message: "0/1 nodes are available: 1 Insufficient amd.com/gpu.", LastTransitionTime: metav1.NewTime(time.Now().Add(-time.Minute)),
		}}})
	}
	g.Eventually(func(g Gomega) {
		c := meta.FindStatusCondition(getJob(g, job).Status.Conditions, trainingv1alpha1.ConditionWaitingForCapacity)
		g.Expect(c).NotTo(BeNil())
		g.Expect(c.Status).To(Equal(metav1.ConditionTrue))
		g.Expect(c.Message).To(ContainSubstring("2 unschedulable"))
		g.Expect(c.Message).To(ContainSubstring("Insufficient amd.com/gpu"))
	}, timeout, interval).Should(Succeed())
}

// TestAStopWriteMaySuspendAndRestoreTheTemplateAtOnce: Kueue stops a job it evicts with one
// write that suspends it and restores the pod template it changed at admission (node
// selectors, tolerations); that write is accepted, while a template edit that leaves the job
// running is not.
func TestAStopWriteMaySuspendAndRestoreTheTemplateAtOnce(t *testing.T) {
	g := NewWithT(t)
	ns := newNamespace(t)
	startManager(t)
	ctx := context.Background()

	job := testjob.MakeZayaTrainingJob("llm", ns).Nodes(2).Obj()
	job.Spec.Template.Spec.NodeSelector = map[string]string{"kueue-flavor": "mi300x-a"}
	g.Expect(k8sClient.Create(ctx, job)).To(Succeed())
	g.Eventually(func(g Gomega) { g.Expect(jobPods(g, ns, "llm")).To(HaveLen(2)) }, timeout, interval).Should(Succeed())

	err := k8sClient.Patch(ctx, job, rawMergePatch([]byte(`{"spec":{"template":{"spec":{"nodeSelector":null}}}}`)))
	g.Expect(err).To(HaveOccurred(), "a running job's template changed")
	g.Expect(err.Error()).To(ContainSubstring("template can change only while the job is suspended"))

	g.Expect(k8sClient.Patch(ctx, job, rawMergePatch([]byte(`{"spec":{"suspend":true,"template":{"spec":{"nodeSelector":null}}}}`)))).To(Succeed())
	g.Eventually(func(g Gomega) {
		got := getJob(g, job)
		g.Expect(got.Spec.Template.Spec.NodeSelector).To(BeEmpty())
		g.Expect(meta.IsStatusConditionTrue(got.Status.Conditions, trainingv1alpha1.ConditionSuspended)).To(BeTrue())
		g.Expect(jobPods(g, ns, "llm")).To(BeEmpty())
	}, timeout, interval).Should(Succeed())
}

func TestSuspendDeletesPodsAndResumeRecreatesThem(t *testing.T) {
	g := NewWithT(t)
	ns := newNamespace(t)
	startManager(t)
	ctx := context.Background()

	job := testjob.MakeZayaTrainingJob("llm", ns).Nodes(2).Obj()
	g.Expect(k8sClient.Create(ctx, job)).To(Succeed())
	g.Eventually(func(g Gomega) { g.Expect(jobPods(g, ns, "llm")).To(HaveLen(2)) }, timeout, interval).Should(Succeed())

	patch := func(suspend bool) {
		p := fmt.Sprintf(`{"spec":{"suspend":%v}}`, suspend)
		g.Expect(k8sClient.Patch(ctx, job, client.RawPatch("application/merge-patch+json", []byte(p)))).To(Succeed())
	}
	patch(true)
	g.Eventually(func(g Gomega) {
		g.Expect(jobPods(g, ns, "llm")).To(BeEmpty())
		g.Expect(meta.IsStatusConditionTrue(getJob(g, job).Status.Conditions, trainingv1alpha1.ConditionSuspended)).To(BeTrue())
	}, timeout, interval).Should(Succeed())

	patch(false)
	g.Eventually(func(g Gomega) {
		g.Expect(jobPods(g, ns, "llm")).To(HaveLen(2))
		c := meta.FindStatusCondition(getJob(g, job).Status.Conditions, trainingv1alpha1.ConditionSuspended)
		g.Expect(c.Status).To(Equal(metav1.ConditionFalse))
	}, timeout, interval).Should(Succeed())
}
