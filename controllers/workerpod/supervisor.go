package workerpod

import (
	"path"
	"slices"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/utils/ptr"

	"github.com/zaya-operator/zaya-operator/api/contract"
	trainingv1alpha1 "github.com/zaya-operator/zaya-operator/api/v1alpha1"
)

// Putting zaya-supervisor in front of any trainer (faultTolerance.supervisor Inject): its
// gang watch stops and restarts every rank within seconds of one failing, which a trainer
// that does not notice a lost peer (torchrun, docs/design/gang-watch.md) never does alone.
// The binary comes from the supervisor image through an emptyDir an init container fills:
// the worker's image needs nothing of ours, and no shell is run in either.

// supervisorBinary is the supervisor as the worker container sees it.
var supervisorBinary = path.Join(trainingv1alpha1.SupervisorMountPath, "zaya-supervisor")

// SupervisorSkip says why a pod's worker is not put under the supervisor ("" when it is, or
// the job turned it off).
type SupervisorSkip string

// Why a worker was not put under the supervisor, as its SupervisorNotInjected event says.
const (
	SupervisorNoImage   SupervisorSkip = "the operator was installed without a supervisor image (the chart's supervisorImage, --supervisor-image)"
	SupervisorNoCommand SupervisorSkip = "the worker container sets no command, and the operator cannot know the image's entrypoint without pulling it: set spec.template's worker command (e.g. [torchrun, train.py])"
)

// InjectSupervisor wraps pod's worker command in zaya-supervisor, copied from image by an
// init container into an emptyDir mounted read-only at /zaya/bin. A command that already
// starts with zaya-supervisor is left as it is.
func InjectSupervisor(job *trainingv1alpha1.ZayaTrainingJob, pod *corev1.Pod, image string) SupervisorSkip {
	if job.Spec.FaultTolerance.Supervisor == trainingv1alpha1.SupervisorOff {
		return ""
	}
	ps := &pod.Spec
	w := &ps.Containers[WorkerContainer(ps)]
	switch {
	case len(w.Command) > 0 && path.Base(w.Command[0]) == "zaya-supervisor":
		return ""
	case image == "":
		return SupervisorNoImage
	case len(w.Command) == 0:
		return SupervisorNoCommand
	}
	ps.Volumes = append(ps.Volumes, corev1.Volume{
		Name: trainingv1alpha1.SupervisorVolumeName,
		// The static binary is about 10 MiB.
		VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{SizeLimit: ptr.To(resource.MustParse("64Mi"))}},
	})
	install := corev1.Container{
		Name:    trainingv1alpha1.SupervisorInitContainerName,
		Image:   image,
		Command: []string{trainingv1alpha1.SupervisorImagePath, "install", trainingv1alpha1.SupervisorMountPath},
		Resources: corev1.ResourceRequirements{
			Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("10m"), corev1.ResourceMemory: resource.MustParse("32Mi")},
			Limits:   corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("64Mi")},
		},
		VolumeMounts:             []corev1.VolumeMount{{Name: trainingv1alpha1.SupervisorVolumeName, MountPath: trainingv1alpha1.SupervisorMountPath}},
		TerminationMessagePolicy: corev1.TerminationMessageFallbackToLogsOnError,
		// Pod Security "restricted" whatever the pod's: it copies one file into an emptyDir
		// (mode 0777), which any user may do, and the copy is r-x for every user.
		SecurityContext: &corev1.SecurityContext{
			RunAsNonRoot: ptr.To(true), RunAsUser: ptr.To[int64](65532), RunAsGroup: ptr.To[int64](65532),
			AllowPrivilegeEscalation: ptr.To(false), ReadOnlyRootFilesystem: ptr.To(true),
			Capabilities:   &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}},
			SeccompProfile: &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault},
		},
	}
	// First: the template's own init containers may already run the trainer's tools.
	ps.InitContainers = slices.Insert(ps.InitContainers, 0, install)
	w.VolumeMounts = append(w.VolumeMounts, corev1.VolumeMount{
		Name: trainingv1alpha1.SupervisorVolumeName, MountPath: trainingv1alpha1.SupervisorMountPath, ReadOnly: true,
	})
	w.Command = append([]string{supervisorBinary, "--"}, w.Command...)
	// The port the supervisor answers the operator on: declared, it says that the supervisor
	// there is one that answers (docs/design/fast-node-loss.md). A template that took the
	// number or the name keeps it, and its ranks are judged by their Leases alone.
	if !slices.ContainsFunc(w.Ports, func(p corev1.ContainerPort) bool {
		return p.ContainerPort == contract.SupervisorPort || p.Name == contract.SupervisorPortName
	}) {
		w.Ports = append(w.Ports, corev1.ContainerPort{Name: contract.SupervisorPortName, ContainerPort: contract.SupervisorPort, Protocol: corev1.ProtocolTCP})
	}
	w.Env = append(w.Env, corev1.EnvVar{Name: contract.EnvPodIP, ValueFrom: &corev1.EnvVarSource{
		FieldRef: &corev1.ObjectFieldSelector{FieldPath: "status.podIP"},
	}})
	return ""
}
