package controllers

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	trainingv1alpha1 "github.com/zaya-operator/zaya-operator/api/v1alpha1"
	"github.com/zaya-operator/zaya-operator/controllers/recovery"
	"github.com/zaya-operator/zaya-operator/controllers/workerpod"
	"github.com/zaya-operator/zaya-operator/internal/testjob"
)

func supervised(job *trainingv1alpha1.ZayaTrainingJob) {
	job.Spec.FaultTolerance.InPlaceMechanism = trainingv1alpha1.InPlaceMechanismSupervisor
}

func TestEachMechanismSetsThePodUpItsWay(t *testing.T) {
	for _, c := range []struct {
		name   string
		mutate func(*trainingv1alpha1.ZayaTrainingJob)
		policy corev1.RestartPolicy
		rule   string // the annotation and variable; "" for none
		rules  bool   // container restart rules
	}{
		{"RestartRules", func(*trainingv1alpha1.ZayaTrainingJob) {}, corev1.RestartPolicyNever, "", true},
		{"Supervisor", supervised, corev1.RestartPolicyOnFailure, "NotIn:0,78", false},
		{"Supervisor, other exits fail", func(j *trainingv1alpha1.ZayaTrainingJob) {
			supervised(j)
			j.Spec.FaultTolerance.ExitCodes = trainingv1alpha1.ExitCodePolicy{Retryable: []int32{3}, Other: trainingv1alpha1.ExitCodeFail}
		}, corev1.RestartPolicyOnFailure, "In:3,75", false},
		{"Recreate", func(j *trainingv1alpha1.ZayaTrainingJob) {
			supervised(j)
			j.Spec.FaultTolerance.RestartMode = trainingv1alpha1.RestartModeRecreate
		}, corev1.RestartPolicyNever, "", false},
		{"rules the API server drops", func(j *trainingv1alpha1.ZayaTrainingJob) {
			j.Status.RestartMechanism = trainingv1alpha1.RestartMechanismRecreate
		}, corev1.RestartPolicyNever, "", false},
	} {
		t.Run(c.name, func(t *testing.T) {
			job := testjob.MakeZayaTrainingJob("llm", "ns").Nodes(2).Defaulted().Obj()
			// A template cannot speak for the operator.
			job.Spec.Template.Annotations = map[string]string{trainingv1alpha1.RestartExitCodesAnnotation: "NotIn:0"}
			c.mutate(job)
			pod := newWorkerPod(job, nil, 1)
			w := pod.Spec.Containers[workerpod.WorkerContainer(&pod.Spec)]
			env := slices.IndexFunc(w.Env, func(e corev1.EnvVar) bool { return e.Name == trainingv1alpha1.EnvRestartExitCodes })
			ann, hasAnn := pod.Annotations[trainingv1alpha1.RestartExitCodesAnnotation]
			if pod.Spec.RestartPolicy != c.policy || (len(w.RestartPolicyRules) > 0) != c.rules || hasAnn != (c.rule != "") || ann != c.rule ||
				(env >= 0) != (c.rule != "") || (env >= 0 && w.Env[env].Value != c.rule) {
				t.Errorf("restartPolicy %q, container rules %v, annotation %q, env at %d: want %q, rules %v, rule %q",
					pod.Spec.RestartPolicy, w.RestartPolicyRules, ann, env, c.policy, c.rules, c.rule)
			}
			if got := len(recovery.PodRestartRules(pod)) > 0; got != (c.rules || c.rule != "") {
				t.Errorf("the operator reads the pod back as restarting in place: %v", got)
			}
		})
	}
}

func TestASupervisedRankRestartedByTheKubeletRestartsTheGangInPlace(t *testing.T) {
	h, job := inPlaceGang(t, supervised)
	if got := h.get(t, job).Status.RestartMechanism; got != trainingv1alpha1.RestartMechanismSupervisor {
		t.Fatalf("status.restartMechanism %q, want Supervisor", got)
	}
	fault := now.Add(-3 * time.Second)
	h.setPod(t, "llm-0-1", restartedInPlace("node-llm-0-1", 1, 1, fault, fault.Add(time.Second)))
	h.mustReconcile(t, job)
	st := h.get(t, job).Status
	if st.InPlaceRestarts != 1 || st.Attempt() != 0 || st.LastFailure == nil || *st.LastFailure.ExitCode != 1 {
		t.Fatalf("in place %d, attempt %d, lastFailure %+v: want one in-place restart after rank 1's exit 1", st.InPlaceRestarts, st.Attempt(), st.LastFailure)
	}
	if got := recovery.RestartedBy(h.pods(t)["llm-0-1"], trainingv1alpha1.RestartModeInPlace); got != trainingv1alpha1.RestartMechanismSupervisor {
		t.Errorf("counted as %q, want Supervisor", got)
	}
}

// zaya-supervisor ends the container of a fatal exit with 0 (the pod's OnFailure would restart
// anything else) and the code in the termination message: the job fails as under rules.
func TestASupervisorsFatalExitFailsTheJob(t *testing.T) {
	h, job := inPlaceGang(t, supervised)
	h.setPod(t, "llm-0-2", func(p *corev1.Pod) {
		p.Status.Phase = corev1.PodSucceeded
		p.Status.ContainerStatuses = []corev1.ContainerStatus{{Name: "worker", State: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{
			ExitCode: 0, Reason: "Completed", FinishedAt: metav1.NewTime(now), Message: "checkpoint-step=40\nexit-code=78\n"}}}}
	})
	h.mustReconcile(t, job)
	got := h.get(t, job)
	f := got.Status.LastFailure
	if c := condition(got, "Failed"); c == nil || c.Status != metav1.ConditionTrue || c.Reason != trainingv1alpha1.ReasonFatalFailure ||
		f == nil || *f.Rank != 2 || *f.ExitCode != 78 || f.Reason != trainingv1alpha1.FailureReasonFatalExitCode {
		t.Fatalf("Failed = %+v, lastFailure %+v: want FatalFailure by rank 2's exit 78", c, f)
	}
	// The same line from a pod the supervisor does not run is nobody's word: rank 0 done.
	h2, job2 := inPlaceGang(t)
	h2.setPod(t, "llm-0-0", func(p *corev1.Pod) {
		p.Status.Phase = corev1.PodSucceeded
		p.Status.ContainerStatuses = []corev1.ContainerStatus{{Name: "worker", State: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{
			ExitCode: 0, Reason: "Completed", FinishedAt: metav1.NewTime(now), Message: "exit-code=78\n"}}}}
	})
	h2.mustReconcile(t, job2)
	if c := condition(h2.get(t, job2), "Failed"); c != nil && c.Status == metav1.ConditionTrue {
		t.Errorf("an unsupervised pod's exit-code line failed the job: %+v", c)
	}
}

// On a cluster whose API server drops restart rules the operator finds out before it makes
// the pods, says so once, and sets the gang up to be recreated.
func TestRulesTheAPIServerDropsAreFoundBeforeThePodsAreMade(t *testing.T) {
	job := testjob.MakeZayaTrainingJob("llm", "ns").Nodes(2).Generation(1).Defaulted().Obj()
	var asked int
	h := newHarness(t, interceptor.Funcs{}, job)
	inner := h.r.Client
	h.r.Client = interceptor.NewClient(inner.(client.WithWatch), interceptor.Funcs{
		Create: func(ctx context.Context, c client.WithWatch, obj client.Object, opts ...client.CreateOption) error {
			if pod, ok := obj.(*corev1.Pod); ok {
				for i := range pod.Spec.Containers { // as the API server does with the gate off
					pod.Spec.Containers[i].RestartPolicy, pod.Spec.Containers[i].RestartPolicyRules = nil, nil
				}
				if dryRun(opts) {
					asked++
					return nil
				}
			}
			return c.Create(ctx, obj, opts...)
		},
	})
	h.mustReconcile(t, job)
	h.mustReconcile(t, job)
	if got := h.get(t, job).Status.RestartMechanism; got != trainingv1alpha1.RestartMechanismRecreate {
		t.Errorf("status.restartMechanism %q, want Recreate", got)
	}
	ev := h.drainEvents()
	if n := len(slices.DeleteFunc(ev, func(e string) bool { return !strings.HasPrefix(e, "Warning InPlaceUnsupported the API server drops") })); n != 1 {
		t.Errorf("%d InPlaceUnsupported events, want 1: %q", n, ev)
	}
	if asked != 1 {
		t.Errorf("asked the API server %d times in two passes, want once", asked)
	}
	for name, pod := range h.pods(t) {
		if len(recovery.PodRestartRules(pod)) > 0 {
			t.Errorf("%s restarts in place", name)
		}
	}
}

// An API server before 1.34 refuses restartPolicy on a regular container (it knows it for
// sidecars only): that refusal is its answer, and the gang is set up to be recreated, not
// failed on its first pod.
func TestRulesTheAPIServerRefusesAreAnAnswer(t *testing.T) {
	job := testjob.MakeZayaTrainingJob("llm", "ns").Nodes(2).Generation(1).Defaulted().Obj()
	h := newHarness(t, interceptor.Funcs{}, job)
	inner := h.r.Client
	h.r.Client = interceptor.NewClient(inner.(client.WithWatch), interceptor.Funcs{
		Create: func(ctx context.Context, c client.WithWatch, obj client.Object, opts ...client.CreateOption) error {
			if pod, ok := obj.(*corev1.Pod); ok && pod.Spec.Containers[0].RestartPolicy != nil {
				return apierrors.NewInvalid(corev1.SchemeGroupVersion.WithKind("Pod").GroupKind(), pod.Name, field.ErrorList{
					field.Forbidden(field.NewPath("spec", "containers").Index(0).Child("restartPolicy"), "may not be set for non-init containers")})
			}
			return c.Create(ctx, obj, opts...)
		},
	})
	h.mustReconcile(t, job)
	h.mustReconcile(t, job)
	got := h.get(t, job)
	if got.Status.RestartMechanism != trainingv1alpha1.RestartMechanismRecreate || finished(got) {
		t.Errorf("status %+v: want the Recreate mechanism and a running job", got.Status)
	}
	if pods := h.pods(t); len(pods) != 2 {
		t.Errorf("%d pods, want the gang of 2 made without restart rules", len(pods))
	}
}
