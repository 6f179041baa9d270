package workerpod

import (
	"encoding/json"
	"slices"
	"testing"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"

	"github.com/zaya-operator/zaya-operator/api/contract"
	trainingv1alpha1 "github.com/zaya-operator/zaya-operator/api/v1alpha1"
	"github.com/zaya-operator/zaya-operator/internal/testjob"
)

const testSupervisorImage = "registry.example/zaya-worker:v1"

func supervisedJob(command ...string) *trainingv1alpha1.ZayaTrainingJob {
	return testjob.MakeZayaTrainingJob("llm", "ns").Nodes(2).WorkerCommand(command, "train.py", "--steps=$(STEPS)").Defaulted().Obj()
}

// The worker's command runs under the supervisor copied in by an init container: arguments
// unchanged, the binary read-only, the init container restricted whatever the pod's context.
func TestTheSupervisorIsPutInFrontOfTheWorkersCommand(t *testing.T) {
	job := supervisedJob("torchrun", "--nproc-per-node=1")
	pod := Render(job, nil, 1)
	if skip := InjectSupervisor(job, pod, testSupervisorImage); skip != "" {
		t.Fatalf("not injected: %s", skip)
	}
	w := pod.Spec.Containers[WorkerContainer(&pod.Spec)]
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
	if want := []corev1.ContainerPort{{Name: contract.SupervisorPortName, ContainerPort: contract.SupervisorPort, Protocol: corev1.ProtocolTCP}}; !cmp.Equal(w.Ports, want) {
		t.Errorf("worker ports %+v, want %+v (what tells the operator it may ask)", w.Ports, want)
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
	plain, _ := json.Marshal(Render(job, nil, 1))
	t.Logf("the pod grows by %d bytes", len(b)-len(plain))
}

// A template that already uses the port's number or name keeps its own: its ranks are then
// judged by their Leases alone.
func TestATemplatesOwnPortIsKept(t *testing.T) {
	for _, own := range []corev1.ContainerPort{
		{Name: "metrics", ContainerPort: contract.SupervisorPort},
		{Name: contract.SupervisorPortName, ContainerPort: 8080},
	} {
		job := supervisedJob("torchrun")
		job.Spec.Template.Spec.Containers[0].Ports = []corev1.ContainerPort{own}
		pod := Render(job, nil, 1)
		if skip := InjectSupervisor(job, pod, testSupervisorImage); skip != "" {
			t.Fatalf("not injected: %s", skip)
		}
		if got := pod.Spec.Containers[WorkerContainer(&pod.Spec)].Ports; !cmp.Equal(got, []corev1.ContainerPort{own}) {
			t.Errorf("ports %+v, want the template's %+v alone", got, own)
		}
	}
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
		skip  SupervisorSkip
	}{
		{"turned off", off, testSupervisorImage, ""},
		{"already the supervisor", supervisedJob("/usr/local/bin/zaya-supervisor", "--", "torchrun"), testSupervisorImage, ""},
		{"no image", supervisedJob("torchrun"), "", SupervisorNoImage},
		{"no command", supervisedJob(), testSupervisorImage, SupervisorNoCommand},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pod := Render(tc.job, nil, 0)
			want := pod.DeepCopy()
			if skip := InjectSupervisor(tc.job, pod, tc.image); skip != tc.skip {
				t.Errorf("skip %q, want %q", skip, tc.skip)
			}
			if diff := cmp.Diff(want, pod); diff != "" {
				t.Errorf("the pod changed (-before +after):\n%s", diff)
			}
		})
	}
}
