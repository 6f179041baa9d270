package controllers

import (
	"encoding/json"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	"github.com/zaya-operator/zaya-operator/api/contract"
	trainingv1alpha1 "github.com/zaya-operator/zaya-operator/api/v1alpha1"
	"github.com/zaya-operator/zaya-operator/internal/testjob"
)

const testSupervisorImage = "registry.example/zaya-worker:v1"

func supervisedJob(command ...string) *trainingv1alpha1.ZayaTrainingJob {
	job := testjob.MakeZayaTrainingJob("llm", "ns").Nodes(2).Defaulted().Obj()
	w := &job.Spec.Template.Spec.Containers[0]
	w.Command, w.Args = command, []string{"train.py", "--steps=$(STEPS)"}
	return job
}

// The worker's command runs under the supervisor copied in by an init container: arguments
// unchanged, the binary read-only, the init container restricted whatever the pod's context.
func TestTheSupervisorIsPutInFrontOfTheWorkersCommand(t *testing.T) {
	job := supervisedJob("torchrun", "--nproc-per-node=1")
	pod := newWorkerPod(job, nil, 1)
	if skip := injectSupervisor(job, pod, testSupervisorImage); skip != "" {
		t.Fatalf("not injected: %s", skip)
	}
	w := pod.Spec.Containers[workerContainer(&pod.Spec)]
	if want := []string{"/zaya/bin/zaya-supervisor", "--", "torchrun", "--nproc-per-node=1"}; !slices.Equal(w.Command, want) {
		t.Errorf("command %q, want %q", w.Command, want)
	}
	if want := []string{"train.py", "--steps=$(STEPS)"}; !slices.Equal(w.Args, want) {
		t.Errorf("args %q, want %q unchanged", w.Args, want)
	}
	if i := slices.IndexFunc(w.VolumeMounts, func(m corev1.VolumeMount) bool { return m.Name == trainingv1alpha1.SupervisorVolumeName }); i < 0 ||
		w.VolumeMounts[i].MountPath != "/zaya/bin" || !w.VolumeMounts[i].ReadOnly {
		t.Errorf("worker mounts %+v, want zaya-bin read-only at /zaya/bin", w.VolumeMounts)
	}
	if i := slices.IndexFunc(w.Env, func(e corev1.EnvVar) bool { return e.Name == contract.EnvPodIP }); i < 0 ||
		w.Env[i].ValueFrom == nil || w.Env[i].ValueFrom.FieldRef.FieldPath != "status.podIP" {
		t.Errorf("worker env %v: want %s from status.podIP (where the supervisor binds)", w.Env, contract.EnvPodIP)
	}
	if len(pod.Spec.InitContainers) != 1 {
		t.Fatalf("init containers %+v, want the install one", pod.Spec.InitContainers)
	}
	in := pod.Spec.InitContainers[0]
	if in.Image != testSupervisorImage || !slices.Equal(in.Command, []string{trainingv1alpha1.SupervisorImagePath, "install", "/zaya/bin"}) {
		t.Errorf("init container runs %q %q", in.Image, in.Command)
	}
	sc := in.SecurityContext
	if sc == nil || !*sc.RunAsNonRoot || *sc.AllowPrivilegeEscalation || !*sc.ReadOnlyRootFilesystem || sc.SeccompProfile == nil ||
		!slices.Equal(sc.Capabilities.Drop, []corev1.Capability{"ALL"}) {
		t.Errorf("init container security context %+v, want restricted", sc)
	}
	if len(in.Env) != 0 || len(in.EnvFrom) != 0 {
		t.Errorf("the init container sees %v: it needs nothing of the job's", in.Env)
	}
	if v := pod.Spec.Volumes[slices.IndexFunc(pod.Spec.Volumes, func(v corev1.Volume) bool { return v.Name == trainingv1alpha1.SupervisorVolumeName })]; v.EmptyDir == nil || v.EmptyDir.SizeLimit == nil {
		t.Errorf("volume %+v, want a bounded emptyDir", v)
	}
	if _, ok := in.Resources.Limits[corev1.ResourceMemory]; !ok {
		t.Errorf("init container resources %+v: want a memory limit", in.Resources)
	}
	b, _ := json.Marshal(pod)
	plain, _ := json.Marshal(newWorkerPod(job, nil, 1))
	t.Logf("the pod grows by %d bytes", len(b)-len(plain))
}

// Where it is not injected, and why: the job turned it off, the command already is the
// supervisor, the operator has no image, the template sets no command.
func TestTheSupervisorIsInjectedOnlyWhereItCanBe(t *testing.T) {
	off := supervisedJob("torchrun")
	off.Spec.FaultTolerance.Supervisor = trainingv1alpha1.SupervisorOff
	for _, tc := range []struct {
		name  string
		job   *trainingv1alpha1.ZayaTrainingJob
		image string
		skip  supervisorSkip
	}{
		{"turned off", off, testSupervisorImage, ""},
		{"already the supervisor", supervisedJob("/usr/local/bin/zaya-supervisor", "--", "torchrun"), testSupervisorImage, ""},
		{"no image", supervisedJob("torchrun"), "", supervisorNoImage},
		{"no command", supervisedJob(), testSupervisorImage, supervisorNoCommand},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pod := newWorkerPod(tc.job, nil, 0)
			want := pod.DeepCopy()
			if skip := injectSupervisor(tc.job, pod, tc.image); skip != tc.skip {
				t.Errorf("skip %q, want %q", skip, tc.skip)
			}
			if diff := cmp.Diff(want, pod); diff != "" {
				t.Errorf("the pod changed (-before +after):\n%s", diff)
			}
		})
	}
}

// The reconciler injects into the pods it creates, and says once per creation when a job asks
// for the supervisor but its template names no command.
func TestTheReconcilerInjectsTheSupervisor(t *testing.T) {
	for _, tc := range []struct {
		name    string
		command []string
		wrapped bool
	}{{"command", []string{"torchrun"}, true}, {"no command", nil, false}} {
		t.Run(tc.name, func(t *testing.T) {
			job := supervisedJob(tc.command...)
			job.Generation = 1
			h := newHarness(t, interceptor.Funcs{}, job)
			h.r.SupervisorImage = testSupervisorImage
			h.mustReconcile(t, job)
			pods := h.pods(t)
			if len(pods) != 2 {
				t.Fatalf("%d pods, want 2", len(pods))
			}
			for name, p := range pods {
				got := len(p.Spec.InitContainers) == 1
				if got != tc.wrapped {
					t.Errorf("pod %s: supervisor injected %v, want %v", name, got, tc.wrapped)
				}
			}
			warned := slices.ContainsFunc(h.drainEvents(), func(e string) bool {
				return strings.Contains(e, trainingv1alpha1.ReasonSupervisorNotInjected) && strings.Contains(e, "sets no command")
			})
			if warned == tc.wrapped {
				t.Errorf("SupervisorNotInjected warning %v, want %v", warned, !tc.wrapped)
			}
		})
	}
}
