package workerpod

import (
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strconv"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"k8s.io/utils/ptr"

	trainingv1alpha1 "github.com/zaya-operator/zaya-operator/api/v1alpha1"
)

// WorkerContainer is the index of the container that gets the GPUs: the one named "worker",
// else the first.
func WorkerContainer(spec *corev1.PodSpec) int {
	if i := slices.IndexFunc(spec.Containers, func(c corev1.Container) bool { return c.Name == "worker" }); i >= 0 {
		return i
	}
	return 0
}

// contractEnv is the rendezvous and job part of the worker contract for one rank.
func contractEnv(job *trainingv1alpha1.ZayaTrainingJob, attempt, rank int32) []corev1.EnvVar {
	s := &job.Spec
	itoa := func(v int32) string { return strconv.FormatInt(int64(v), 10) }
	width := job.Width() // this attempt's nodes: fewer than spec.nodes while an elastic job is shrunk
	env := []corev1.EnvVar{
		{Name: trainingv1alpha1.EnvMasterAddr, Value: MasterAddr(job)},
		{Name: trainingv1alpha1.EnvMasterPort, Value: itoa(trainingv1alpha1.MasterPort)},
		{Name: trainingv1alpha1.EnvWorldSize, Value: strconv.FormatInt(int64(width)*int64(s.GPUsPerNode), 10)},
		{Name: trainingv1alpha1.EnvNNodes, Value: itoa(width)},
		{Name: trainingv1alpha1.EnvNodeRank, Value: itoa(rank)},
		{Name: trainingv1alpha1.EnvGPUsPerNode, Value: itoa(s.GPUsPerNode)},
		{Name: trainingv1alpha1.EnvLocalWorldSize, Value: itoa(s.GPUsPerNode)},
		// torchrun's meanings for the pod's one process, local rank 0 of its node.
		{Name: trainingv1alpha1.EnvRank, Value: strconv.FormatInt(int64(rank)*int64(s.GPUsPerNode), 10)},
		{Name: trainingv1alpha1.EnvLocalRank, Value: "0"},
		{Name: trainingv1alpha1.EnvGroupRank, Value: itoa(rank)},
		// torchrun reads its arguments from PET_<FLAG>, so `torchrun train.py` works unchanged.
		{Name: "PET_NNODES", Value: itoa(width)},
		{Name: "PET_NODE_RANK", Value: itoa(rank)},
		{Name: "PET_NPROC_PER_NODE", Value: itoa(s.GPUsPerNode)},
		{Name: "PET_MASTER_ADDR", Value: MasterAddr(job)},
		{Name: "PET_MASTER_PORT", Value: itoa(trainingv1alpha1.MasterPort)},
		{Name: trainingv1alpha1.EnvJobName, Value: job.Name},
		// The job's UID: its ranks' rendezvous token, and the owner of its checkpoint directory.
		{Name: trainingv1alpha1.EnvJobUID, Value: string(job.UID)},
		{Name: trainingv1alpha1.EnvRestartAttempt, Value: itoa(attempt)},
		{Name: trainingv1alpha1.EnvContextParallel, Value: itoa(s.Parallelism.ContextParallel)},
		{Name: trainingv1alpha1.EnvHeartbeatFile, Value: trainingv1alpha1.HeartbeatFile},
	}
	if s.Elastic != nil {
		env = append(env, corev1.EnvVar{Name: trainingv1alpha1.EnvTargetNodes, Value: itoa(s.Nodes)})
	}
	if c := s.Checkpoint; c != nil {
		every := ""
		if c.Interval != nil && c.Interval.Steps != nil {
			every = itoa(*c.Interval.Steps)
		} else if c.Interval != nil && c.Interval.Duration != nil {
			every = c.Interval.Duration.Duration.String()
		}
		env = append(env,
			corev1.EnvVar{Name: trainingv1alpha1.EnvCheckpointDir, Value: c.MountPath},
			corev1.EnvVar{Name: trainingv1alpha1.EnvCheckpointEvery, Value: every},
			corev1.EnvVar{Name: trainingv1alpha1.EnvCheckpointKeep, Value: itoa(c.Keep)},
		)
	}
	return env
}

// terminationLogEnv tells a container where its termination message goes: its
// terminationMessagePath, the kubelet's default unless the template sets one.
func terminationLogEnv(c *corev1.Container) corev1.EnvVar {
	path := c.TerminationMessagePath
	if path == "" {
		path = corev1.TerminationMessagePathDefault
	}
	return corev1.EnvVar{Name: trainingv1alpha1.EnvTerminationLog, Value: path}
}

// containerEnv is what a container of the worker pod sees: the contract, then the network
// environment minus the names the template's container sets itself (the template wins),
// then the template's own variables, which may refer to the others as $(NODE_RANK).
func containerEnv(contract, network []corev1.EnvVar, c *corev1.Container) []corev1.EnvVar {
	own := make(map[string]bool, len(c.Env))
	for _, e := range c.Env {
		own[e.Name] = true
	}
	env := make([]corev1.EnvVar, 0, len(contract)+len(network)+len(c.Env))
	env = append(env, contract...)
	for _, e := range network {
		if !own[e.Name] {
			env = append(env, e)
		}
	}
	return append(env, c.Env...)
}

// Decoration adds to a rank's pod what concerns outside the pod place on it: the admission's
// pod-group labels, the restart mechanism's rules, the nodes recovery keeps it off or on.
// worker is the pod's worker container.
type Decoration func(pod *corev1.Pod, worker *corev1.Container)

// Render is rank's pod of the job's current attempt. The template is copied and only added
// to: GPU and NIC requests on the worker container, the contract's and network's environment,
// /dev/shm and the checkpoint volume, hostname and subdomain, labels, pod security defaults,
// the heartbeat probe, placement rules, then each decoration in order. ValidateSpec refuses
// templates that would collide with any of these.
func Render(job *trainingv1alpha1.ZayaTrainingJob, network []corev1.EnvVar, rank int32, decorations ...Decoration) *corev1.Pod {
	s := &job.Spec
	attempt := job.Status.Attempt()
	tmpl := s.Template.DeepCopy()
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			Name:            PodName(job, attempt, rank),
			Namespace:       job.Namespace,
			Labels:          tmpl.Labels,
			Annotations:     tmpl.Annotations,
			OwnerReferences: []metav1.OwnerReference{OwnerRef(job)},
		},
		Spec: tmpl.Spec,
	}
	if pod.Labels == nil {
		pod.Labels = map[string]string{}
	}
	maps.Copy(pod.Labels, RankLabels(job, attempt, rank))

	ps := &pod.Spec
	ps.RestartPolicy = corev1.RestartPolicyNever
	ps.Hostname = Hostname(job, rank)
	ps.Subdomain = job.Name
	if ps.AutomountServiceAccountToken == nil {
		ps.AutomountServiceAccountToken = ptr.To(false)
	}

	ps.Volumes = append(ps.Volumes, corev1.Volume{
		Name:         trainingv1alpha1.ShmVolumeName,
		VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{Medium: corev1.StorageMediumMemory}},
	})
	mounts := []corev1.VolumeMount{{Name: trainingv1alpha1.ShmVolumeName, MountPath: trainingv1alpha1.ShmMountPath}}
	if c := s.Checkpoint; c != nil {
		ps.Volumes = append(ps.Volumes, corev1.Volume{
			Name: trainingv1alpha1.CheckpointVolumeName,
			VolumeSource: corev1.VolumeSource{PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{
				ClaimName: ClaimName(job),
			}},
		})
		mounts = append(mounts, corev1.VolumeMount{Name: trainingv1alpha1.CheckpointVolumeName, MountPath: c.MountPath})
	}

	contract := contractEnv(job, attempt, rank)
	for _, list := range [][]corev1.Container{ps.InitContainers, ps.Containers} {
		for i := range list {
			c := &list[i]
			c.Env = containerEnv(append(contract[:len(contract):len(contract)], terminationLogEnv(c)), network, c)
			c.VolumeMounts = append(c.VolumeMounts, mounts...)
		}
	}

	w := &ps.Containers[WorkerContainer(ps)]
	if w.TerminationMessagePolicy == "" {
		// A worker that dies without writing its termination message (a segfault, a Python
		// traceback) still leaves the tail of its log as evidence of why.
		w.TerminationMessagePolicy = corev1.TerminationMessageFallbackToLogsOnError
	}
	setDevice(&w.Resources, ResourceAMDGPU, int64(s.GPUsPerNode))
	if nics := s.NICsPerNode(); nics > 0 {
		setDevice(&w.Resources, ResourceAMDNIC, int64(nics))
	}
	for _, list := range [][]corev1.Container{ps.InitContainers, ps.Containers} {
		for i := range list {
			restrictByDefault(&list[i], ps.SecurityContext)
		}
	}
	if ipcLock(&s.Network) {
		addCapability(w, "IPC_LOCK")
	}
	if w.LivenessProbe == nil && s.FaultTolerance.HangTimeout != nil {
		w.LivenessProbe = heartbeatProbe(s.FaultTolerance.HangTimeout.Duration)
	}

	if s.Placement.GPUNodeSelector == trainingv1alpha1.GPUNodeSelectorNFD {
		RequireAMDGPU(ps)
	}
	if s.Placement.NodeSharing == trainingv1alpha1.NodeSharingExclusive && s.GPUsPerNode < 8 {
		addRankAntiAffinity(ps, job.Name)
	}
	for _, d := range decorations {
		d(pod, w)
	}
	return pod
}

// setDevice requests and limits n of an extended resource (they must be equal).
func setDevice(r *corev1.ResourceRequirements, name corev1.ResourceName, n int64) {
	q := *resource.NewQuantity(n, resource.DecimalSI)
	if r.Requests == nil {
		r.Requests = corev1.ResourceList{}
	}
	if r.Limits == nil {
		r.Limits = corev1.ResourceList{}
	}
	r.Requests[name], r.Limits[name] = q, q
}

// addRankAntiAffinity keeps two ranks of the job off one node, next to the template's own rules.
func addRankAntiAffinity(ps *corev1.PodSpec, job string) {
	if ps.Affinity == nil {
		ps.Affinity = &corev1.Affinity{}
	}
	if ps.Affinity.PodAntiAffinity == nil {
		ps.Affinity.PodAntiAffinity = &corev1.PodAntiAffinity{}
	}
	a := ps.Affinity.PodAntiAffinity
	a.RequiredDuringSchedulingIgnoredDuringExecution = append(a.RequiredDuringSchedulingIgnoredDuringExecution, corev1.PodAffinityTerm{
		LabelSelector: &metav1.LabelSelector{MatchLabels: map[string]string{trainingv1alpha1.JobNameLabel: job}},
		TopologyKey:   corev1.LabelHostname,
	})
}

// MaxPodBytes keeps worker pods well inside what the API server stores: etcd refuses
// requests over 1.5 MiB by default, and a job near the API's 3 MiB limit (long env values,
// say) would otherwise be accepted and then never get a pod.
const MaxPodBytes = 1 << 20

// maxGangBytes bounds what one job's pods take in etcd together (its default quota is 2 GiB,
// shared by every tenant): 4,096 pods of 1 MiB each would fill it for the whole cluster.
const maxGangBytes = 256 << 20

// SizeErrors refuses a spec whose worker pod (the last rank's, rendered: the longest names)
// would be too large to store, alone or as one of the job's nodes pods.
func SizeErrors(pod *corev1.Pod, nodes int32) field.ErrorList {
	b, err := json.Marshal(pod)
	switch {
	case err != nil:
		return nil
	case len(b) > MaxPodBytes:
		return field.ErrorList{field.Invalid(field.NewPath("spec", "template"), "(omitted)", fmt.Sprintf(
			"the worker pod would be %d bytes, more than the %d the operator creates (etcd stores at most 1.5 MiB per object): shorten env values, annotations or the template",
			len(b), MaxPodBytes))}
	case int64(len(b))*int64(nodes) > maxGangBytes:
		return field.ErrorList{field.Invalid(field.NewPath("spec", "template"), "(omitted)", fmt.Sprintf(
			"%d worker pods of %d bytes would take %d MiB, more than the %d MiB one job may store (etcd is shared by every job in the cluster): shorten env values, annotations or the template",
			nodes, len(b), int64(len(b))*int64(nodes)>>20, maxGangBytes>>20))}
	}
	return nil
}
