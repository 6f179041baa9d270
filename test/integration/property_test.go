package integration

import (
	"context"
	"fmt"
	"math/rand/v2"
	"testing"

	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	trainingv1alpha1 "github.com/zaya-operator/zaya-operator/api/v1alpha1"
	"github.com/zaya-operator/zaya-operator/internal/testjob"
)

// TestConstructorsOutputPassesAPIServerValidation: for random jobs (testjob.Random: edge and
// hostile values, most of them invalid), whatever the API server accepts, the operator either
// refuses with InvalidSpec or builds pods, Service and claim that the API server accepts in
// turn — never InvalidPodTemplate, which would mean the constructors emitted an invalid object
// for a valid job (a template that is no valid pod by itself may fail that way: the CRD
// cannot validate an embedded pod template, and the job fails with the API's message). Sizes are capped at 8 nodes to keep envtest quick; FuzzConstructors
// (controllers) covers the constructors at any size.
func TestConstructorsOutputPassesAPIServerValidation(t *testing.T) {
	g := NewWithT(t)
	ctx := context.Background()
	ns := newNamespace(t)
	startManager(t)

	rng := rand.New(rand.NewPCG(20261121, 7))
	var accepted []*trainingv1alpha1.ZayaTrainingJob
	refused := 0
	for i := range 400 {
		job := testjob.Random(rng, fmt.Sprintf("j%d", i), ns)
		if job.Spec.Nodes > 8 {
			job.Spec.Nodes = int32(1 + i%8)
		}
		if err := k8sClient.Create(ctx, job); err != nil {
			refused++
			continue
		}
		accepted = append(accepted, job)
	}
	t.Logf("%d random jobs: %d refused at apply time, %d accepted", 400, refused, len(accepted))
	g.Expect(len(accepted)).To(BeNumerically(">=", 40), "the generator should produce enough valid jobs to mean something")
	g.Expect(refused).To(BeNumerically(">=", 100), "the generator should produce hostile input too")

	invalidSpec, built, finished := 0, 0, 0
	for _, job := range accepted {
		gone := func() bool {
			return apierrors.IsNotFound(k8sClient.Get(ctx, client.ObjectKeyFromObject(job), &trainingv1alpha1.ZayaTrainingJob{}))
		}
		g.Eventually(func(g Gomega) {
			if gone() {
				return // finished fast (activeDeadlineSeconds: 1) and deleted (ttlSecondsAfterFinished: 0)
			}
			got := getJob(g, job)
			created := meta.FindStatusCondition(got.Status.Conditions, trainingv1alpha1.ConditionCreated)
			g.Expect(created).NotTo(BeNil())
			if created.Status == metav1.ConditionFalse {
				g.Expect(created.Reason).To(Equal(trainingv1alpha1.ReasonInvalidSpec))
				return
			}
			failed := meta.FindStatusCondition(got.Status.Conditions, trainingv1alpha1.ConditionFailed)
			if failed != nil && failed.Reason == trainingv1alpha1.ReasonInvalidPodTemplate {
				// Fair only if the user's template is no valid pod by itself (the CRD cannot
				// validate an embedded pod template; the job fails with the API's message).
				bare := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "bare-" + got.Name, Namespace: ns}, Spec: got.Spec.Template.Spec}
				err := k8sClient.Create(ctx, bare, client.DryRunAll)
				y, _ := yaml.Marshal(got.Spec)
				g.Expect(err).To(HaveOccurred(), "the operator built an invalid pod from a valid template:\n%s\n%s", failed.Message, y)
			}
			if failed != nil && failed.Status == metav1.ConditionTrue {
				return // e.g. activeDeadlineSeconds: 1 ran out before the pods were looked at
			}
			y, _ := yaml.Marshal(got)
			g.Expect(jobPods(g, ns, got.Name)).To(HaveLen(int(got.Spec.Nodes)), "%s", y)
		}, timeout, interval).Should(Succeed(), job.Name)
		got := &trainingv1alpha1.ZayaTrainingJob{}
		err := k8sClient.Get(ctx, client.ObjectKeyFromObject(job), got)
		switch {
		case apierrors.IsNotFound(err), meta.IsStatusConditionTrue(got.Status.Conditions, trainingv1alpha1.ConditionFailed):
			finished++
		case meta.IsStatusConditionFalse(got.Status.Conditions, trainingv1alpha1.ConditionCreated):
			invalidSpec++
		default:
			built++
		}
	}
	t.Logf("accepted jobs: %d refused by the operator (InvalidSpec), %d built, %d finished before they were looked at", invalidSpec, built, finished)
	g.Expect(built).To(BeNumerically(">=", 20))
	g.Expect(k8sClient.DeleteAllOf(ctx, &trainingv1alpha1.ZayaTrainingJob{}, client.InNamespace(ns))).To(Succeed())
}
