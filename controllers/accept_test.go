package controllers

import (
	"context"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	trainingv1alpha1 "github.com/zaya-operator/zaya-operator/api/v1alpha1"
	"github.com/zaya-operator/zaya-operator/controllers/workerpod"
	"github.com/zaya-operator/zaya-operator/internal/testjob"
)

func TestAPodGrownWhileSuspendedIsRefusedBeforeResume(t *testing.T) {
	job := testjob.MakeZayaTrainingJob("llm", "ns").Nodes(2).Generation(1).Suspend(true).Defaulted().Obj()
	h := newHarness(t, interceptor.Funcs{}, job)
	h.mustReconcile(t, job)
	if !meta.IsStatusConditionTrue(h.get(t, job).Status.Conditions, trainingv1alpha1.ConditionCreated) {
		t.Fatal("the job was not accepted")
	}

	// While suspended the template may change: it grows past what a pod can hold.
	stored := h.get(t, job)
	c := &stored.Spec.Template.Spec.Containers[0]
	c.Env = append(c.Env, corev1.EnvVar{Name: "BLOB", Value: strings.Repeat("x", workerpod.MaxPodBytes+1)})
	stored.Generation = 2
	if err := h.r.Update(context.Background(), stored); err != nil {
		t.Fatal(err)
	}
	h.mustReconcile(t, job)
	got := h.get(t, job)
	created := condition(got, trainingv1alpha1.ConditionCreated)
	if created.Status != metav1.ConditionFalse || created.Reason != trainingv1alpha1.ReasonInvalidSpec ||
		!strings.Contains(created.Message, "spec.template") || created.ObservedGeneration != 2 {
		t.Fatalf("Created = %+v, want False/InvalidSpec naming spec.template for generation 2", created)
	}

	// Resuming the oversized job creates nothing and keeps saying why.
	got.Spec.Suspend = false
	got.Generation = 3
	if err := h.r.Update(context.Background(), got); err != nil {
		t.Fatal(err)
	}
	h.mustReconcile(t, job)
	if n := len(h.pods(t)); n != 0 {
		t.Errorf("%d pods created for a job whose pods cannot be stored", n)
	}
	if c := condition(h.get(t, job), trainingv1alpha1.ConditionCreated); c.Reason != trainingv1alpha1.ReasonInvalidSpec {
		t.Errorf("Created = %+v after resume", c)
	}
}

func TestThePodSizeIsCheckedOncePerGeneration(t *testing.T) {
	job := testjob.MakeZayaTrainingJob("llm", "ns").Nodes(2).Generation(1).Defaulted().Obj()
	h := newHarness(t, interceptor.Funcs{}, job)
	h.mustReconcile(t, job)
	stored := h.get(t, job)
	var pods []corev1.Pod
	for _, pod := range h.pods(t) {
		pods = append(pods, *pod)
	}
	p := &pass{r: h.r, job: stored, now: now, pods: pods}
	if p.needsSizeCheck() {
		t.Error("an accepted generation is checked again on every pass")
	}
	stored.Generation++
	if !p.needsSizeCheck() {
		t.Error("a new generation is not checked")
	}
}
func TestOversizedPodsAreRefusedUpFront(t *testing.T) {
	for _, tc := range []struct {
		nodes      int32
		valueBytes int
		sidecar    bool
		refused    bool
	}{
		{1, 100 << 10, false, false}, {1, 600 << 10, false, false}, {1, 600 << 10, true, true}, {1, 1100 << 10, false, true},
		// The whole gang is bounded too: etcd is shared by every job.
		{1024, 100 << 10, false, false}, {4096, 100 << 10, false, true}, {512, 600 << 10, false, true},
	} {
		w := testjob.MakeZayaTrainingJob("llm", "ns").Nodes(tc.nodes).WorkerEnv("BLOB", strings.Repeat("x", tc.valueBytes))
		job := w.Defaulted().Obj()
		if tc.sidecar {
			job.Spec.Template.Spec.Containers = append(job.Spec.Template.Spec.Containers, job.Spec.Template.Spec.Containers[0])
			job.Spec.Template.Spec.Containers[1].Name = "sidecar"
		}
		errs := podSizeErrors(job)
		if (len(errs) > 0) != tc.refused {
			t.Errorf("%d nodes, %d KiB value, sidecar %v: errors %v, want refused=%v", tc.nodes, tc.valueBytes>>10, tc.sidecar, errs, tc.refused)
		}
		if len(errs) > 0 && !strings.Contains(errs[0].Error(), "spec.template") {
			t.Errorf("the error should name the field: %v", errs[0])
		}
	}
}

// A generation an earlier operator accepted keeps running when this one's rules refuse it:
// said once, and the next edit must pass them.
func TestAnAcceptedGenerationSurvivesStricterRules(t *testing.T) {
	job := testjob.MakeZayaTrainingJob("llm", "ns").Nodes(2).Generation(4).Defaulted().Obj()
	h := newHarness(t, interceptor.Funcs{}, job)
	h.mustReconcile(t, job) // accepted, its gang made: what an earlier operator left
	h.drainEvents()
	// This operator's rules refuse the same generation.
	old := h.get(t, job)
	c := &old.Spec.Template.Spec.Containers[0]
	c.EnvFrom = append(c.EnvFrom, corev1.EnvFromSource{Prefix: "ZAYA_", ConfigMapRef: &corev1.ConfigMapEnvSource{
		LocalObjectReference: corev1.LocalObjectReference{Name: "settings"}}})
	if trainingv1alpha1.ValidateSpec(&old.Spec) == nil {
		t.Fatal("the rule this test relies on is gone")
	}
	if err := h.r.Update(context.Background(), old); err != nil || old.Generation != 4 {
		t.Fatalf("storing the spec under generation 4: %v (generation %d)", err, old.Generation)
	}
	for range 3 {
		h.mustReconcile(t, job)
	}
	if n := len(h.pods(t)); n != 2 {
		t.Fatalf("%d pods, want the gang of 2 to run", n)
	}
	created := condition(h.get(t, job), trainingv1alpha1.ConditionCreated)
	if created.Status != metav1.ConditionTrue || created.Reason != trainingv1alpha1.ReasonAcceptedBeforeUpgrade ||
		!strings.Contains(created.Message, "envFrom[0].prefix") {
		t.Errorf("Created = %+v, want True/AcceptedBeforeUpgrade naming the field", created)
	}
	var warnings int
	for _, e := range h.drainEvents() {
		if strings.Contains(e, trainingv1alpha1.ReasonAcceptedBeforeUpgrade) {
			warnings++
		}
	}
	if warnings != 1 {
		t.Errorf("%d AcceptedBeforeUpgrade events in 3 passes, want 1", warnings)
	}

	// The next edit is held to the new rules.
	stored := h.get(t, job)
	stored.Generation = 5
	if err := h.r.Update(context.Background(), stored); err != nil {
		t.Fatal(err)
	}
	h.mustReconcile(t, job)
	if c := condition(h.get(t, job), trainingv1alpha1.ConditionCreated); c.Reason != trainingv1alpha1.ReasonInvalidSpec {
		t.Errorf("Created = %+v after an edit, want InvalidSpec", c)
	}
}

func TestAJobWithNoRoomForItsStatusIsRefused(t *testing.T) {
	job := testjob.MakeZayaTrainingJob("llm", "ns").Nodes(2).Defaulted().Obj()
	if errs := jobSizeErrors(job); len(errs) != 0 {
		t.Fatalf("a small job refused: %v", errs)
	}
	// Under the pod's limit, but with the job's own annotations no status fits.
	job.Annotations = map[string]string{"notes": strings.Repeat("x", maxJobBytes-workerpod.MaxPodBytes/2)}
	if errs := podSizeErrors(job); len(errs) != 0 {
		t.Fatalf("the pod is refused already: %v", errs)
	}
	job.Spec.Template.Spec.Containers[0].Env = append(job.Spec.Template.Spec.Containers[0].Env, corev1.EnvVar{Name: "BLOB", Value: strings.Repeat("x", workerpod.MaxPodBytes/2)})
	errs := jobSizeErrors(job)
	if len(errs) != 1 || !strings.Contains(errs[0].Error(), "leave room for its status") {
		t.Errorf("errors %v, want the job refused for its size", errs)
	}
}

// Created=True written by someone with status access, on a spec this operator refuses: no
// pod of the operator's backs it, so the spec is refused, not run as "accepted before".
func TestAForgedAcceptanceRunsNoRefusedSpec(t *testing.T) {
	job := testjob.MakeZayaTrainingJob("llm", "ns").Nodes(2).Generation(4).Defaulted().Obj()
	c := &job.Spec.Template.Spec.Containers[0]
	c.EnvFrom = append(c.EnvFrom, corev1.EnvFromSource{Prefix: "ZAYA_", ConfigMapRef: &corev1.ConfigMapEnvSource{
		LocalObjectReference: corev1.LocalObjectReference{Name: "settings"}}})
	job.Status.Conditions = []metav1.Condition{{Type: trainingv1alpha1.ConditionCreated, Status: metav1.ConditionTrue,
		Reason: trainingv1alpha1.ReasonAccepted, ObservedGeneration: 4, LastTransitionTime: metav1.NewTime(now)}}
	h := newHarness(t, interceptor.Funcs{}, job)
	for range 3 {
		h.mustReconcile(t, job)
	}
	if n := len(h.pods(t)); n != 0 {
		t.Fatalf("%d pods made for a refused spec on a forged acceptance", n)
	}
	if created := condition(h.get(t, job), trainingv1alpha1.ConditionCreated); created.Status != metav1.ConditionFalse || created.Reason != trainingv1alpha1.ReasonInvalidSpec {
		t.Errorf("Created = %+v, want False/InvalidSpec", created)
	}
}
