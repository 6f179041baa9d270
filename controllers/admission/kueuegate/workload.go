package kueuegate

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	schedulingv1 "k8s.io/api/scheduling/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/utils/ptr"

	trainingv1alpha1 "github.com/zaya-operator/zaya-operator/api/v1alpha1"
	"github.com/zaya-operator/zaya-operator/controllers/workerpod"
	"github.com/zaya-operator/zaya-operator/internal/kueue"
)

// A job that names a Kueue queue (label kueue.x-k8s.io/queue-name) while the operator runs
// with --kueue-workloads is one Kueue workload, as Kueue's own Job is (its external-framework
// model): the operator creates and owns the job's Workload, runs no pod until Kueue admits
// it, places the pods where the admission says, stops them when Kueue evicts, and tells
// Kueue when the gang is ready and when it finished. Gang restarts and in-place recoveries
// stay inside one admission: the Workload's pod sets depend on the spec alone, never on the
// attempt, so nothing about a restart asks Kueue for anything.

// RBAC for this lives in config/kueue/operator_role.yaml (bound only where Kueue is on): the
// generated role stays exactly what a job without Kueue needs.

const (
	workersPodSet = "workers"
	sparesPodSet  = "spares"
	// podSetsHashAnnotation holds the hash of the pod sets the Workload was made from: one
	// whose hash is not the job's, and that holds no quota, is replaced.
	podSetsHashAnnotation = "training.zaya.dev/podsets-hash"
	// ranksHashAnnotation is ranksHash of the pod sets: an admission for ranks of another
	// shape (the job reshaped while suspended) is never run under, quota or not.
	ranksHashAnnotation = "training.zaya.dev/ranks-hash"
	// jobGenerationAnnotation is specKey of the job the Workload was made for: while it is
	// the job's, nothing Kueue admits on changed and no pod is rendered to check.
	jobGenerationAnnotation = "training.zaya.dev/job-generation"
)

// kueueWorkload reports whether the job is run as a Kueue workload by this operator.
func (g *Gate) kueueWorkload(job metav1.Object) bool {
	return g.workloads && job.GetLabels()[kueue.QueueNameLabel] != ""
}

// workloadName is the name of the job's Workload: MultiKueue's prebuilt name where it gave
// one, else the job's name with a hash of its identity (a job recreated under the same name
// gets a new Workload).
func workloadName(job *trainingv1alpha1.ZayaTrainingJob) string {
	if n := prebuiltWorkload(job); n != "" {
		return n
	}
	sum := sha256.Sum256([]byte(job.Name + "\n" + string(job.UID)))
	base := "zayatrainingjob-" + job.Name
	if len(base) > 240 {
		base = base[:240]
	}
	return strings.TrimRight(base, "-.") + "-" + hex.EncodeToString(sum[:])[:8]
}

// prebuiltWorkload is the Workload MultiKueue made for this job in a worker cluster.
func prebuiltWorkload(job *trainingv1alpha1.ZayaTrainingJob) string {
	if n := job.Annotations[kueue.PrebuiltWorkloadLabel]; n != "" {
		return n
	}
	return job.Labels[kueue.PrebuiltWorkloadLabel]
}

// workloadPodSets are the pod sets Kueue admits for the job: its ranks, and its warm spares
// (they hold GPUs too). Built from the spec alone (rank and spare are rank 0's and spare 0's
// pods as attempt 0 with nothing quarantined, the supervisor's init container where the ranks
// get it: its requests count).
func workloadPodSets(job *trainingv1alpha1.ZayaTrainingJob, rank, spare *corev1.Pod, spares int32) []kueue.PodSet {
	sets := []kueue.PodSet{{
		Name:            workersPodSet,
		Count:           job.Spec.Nodes,
		Template:        podSetTemplate(rank),
		TopologyRequest: topologyRequest(job),
	}}
	if spare != nil && spares > 0 && !podGroupQueued(job) {
		sets = append(sets, kueue.PodSet{Name: sparesPodSet, Count: spares, Template: podSetTemplate(spare)})
	}
	return sets
}

// podSets are the job's pod sets, from the core's rendering of its pods.
func (t *ticket) podSets() []kueue.PodSet {
	rank, spare, spares := t.host.Shape()
	return workloadPodSets(t.job, rank, spare, spares)
}

// podSetTemplate is a pod as Kueue wants it in a pod set: labels and annotations only in its
// metadata, no environment (Kueue needs the resources and placement, and a big env would
// double the Workload's size).
func podSetTemplate(pod *corev1.Pod) corev1.PodTemplateSpec {
	spec := *pod.Spec.DeepCopy()
	for _, list := range [][]corev1.Container{spec.InitContainers, spec.Containers} {
		for i := range list {
			list[i].Env, list[i].EnvFrom = nil, nil
		}
	}
	labels := map[string]string{}
	for k, v := range pod.Labels {
		if k != trainingv1alpha1.RankLabel && k != trainingv1alpha1.AttemptLabel && k != trainingv1alpha1.SpareLabel {
			labels[k] = v
		}
	}
	return corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: labels, Annotations: pod.Annotations}, Spec: spec}
}

// topologyRequest is the job's topology-aware scheduling request, from Kueue's annotations on
// the job. A ring-attention group that spans nodes is a slice: with a slice topology (the
// rail block's label, say) and no slice size, the size is the group's node count. The rank
// is the pod index, so the ranks of a group land in one domain.
func topologyRequest(job *trainingv1alpha1.ZayaTrainingJob) *kueue.TopologyRequest {
	a := job.Annotations
	t := &kueue.TopologyRequest{PodIndexLabel: ptr.To(trainingv1alpha1.RankLabel)}
	switch {
	case a[kueue.RequiredTopologyAnnotation] != "":
		t.Required = ptr.To(a[kueue.RequiredTopologyAnnotation])
	case a[kueue.PreferredTopologyAnnotation] != "":
		t.Preferred = ptr.To(a[kueue.PreferredTopologyAnnotation])
	case a[kueue.UnconstrainedTopologyAnnotation] == "true":
		t.Unconstrained = ptr.To(true)
	}
	if s := a[kueue.SliceRequiredTopologyAnnotation]; s != "" {
		size, err := strconv.ParseInt(a[kueue.SliceSizeAnnotation], 10, 32)
		if err != nil || size < 1 {
			size = int64(ringNodes(job))
		}
		t.PodSetSliceRequiredTopology, t.PodSetSliceSize = ptr.To(s), ptr.To(int32(size))
	}
	if t.Required == nil && t.Preferred == nil && t.Unconstrained == nil && t.PodSetSliceRequiredTopology == nil {
		return nil
	}
	return t
}

// ringNodes is how many nodes one ring-attention group spans (1 when it fits in a node).
func ringNodes(job *trainingv1alpha1.ZayaTrainingJob) int32 {
	cp, g := max(job.Spec.Parallelism.ContextParallel, 1), max(job.Spec.GPUsPerNode, 1)
	if cp <= g {
		return 1
	}
	return min((cp+g-1)/g, job.Spec.Nodes)
}

// newWorkload is the job's Workload: one pod set of `nodes` ranks (and the spares'), owned by
// the job, held by Kueue's finalizer until the operator says the job is done with it.
func newWorkload(job *trainingv1alpha1.ZayaTrainingJob, prio *workloadPriority, sets []kueue.PodSet) *kueue.Workload {
	wl := &kueue.Workload{
		ObjectMeta: metav1.ObjectMeta{
			Name:      workloadName(job),
			Namespace: job.Namespace,
			Labels:    map[string]string{kueue.JobUIDLabel: string(job.UID), trainingv1alpha1.JobNameLabel: job.Name},
			Annotations: map[string]string{podSetsHashAnnotation: podSetsHash(sets), ranksHashAnnotation: ranksHash(sets),
				jobGenerationAnnotation: specKey(job)},
			OwnerReferences: []metav1.OwnerReference{workerpod.OwnerRef(job)},
			Finalizers:      []string{kueue.ResourceInUseFinalizer},
		},
		Spec: kueue.WorkloadSpec{PodSets: sets, QueueName: job.Labels[kueue.QueueNameLabel]},
	}
	if s, err := strconv.ParseInt(job.Labels[kueue.MaxExecTimeLabel], 10, 32); err == nil && s > 0 {
		wl.Spec.MaximumExecutionTimeSeconds = ptr.To(int32(s))
	}
	if prio != nil {
		wl.Spec.PriorityClassRef, wl.Spec.Priority = prio.ref, ptr.To(prio.value)
	}
	return wl
}

// podSetsHash fingerprints what Kueue admits pod sets on: their names and counts, topology
// requests, and each template's resources and placement. Nothing else of the job (probes,
// fault tolerance, the environment) moves a job out of its Workload.
func podSetsHash(sets []kueue.PodSet) string {
	type shape struct {
		Name     string
		Count    int32
		Topology *kueue.TopologyRequest
		Spec     corev1.PodSpec
	}
	shapes := make([]shape, len(sets))
	for i, ps := range sets {
		t := &ps.Template.Spec
		spec := corev1.PodSpec{NodeSelector: t.NodeSelector, Affinity: t.Affinity, Tolerations: t.Tolerations,
			PriorityClassName: t.PriorityClassName, RuntimeClassName: t.RuntimeClassName, Overhead: t.Overhead,
			TopologySpreadConstraints: t.TopologySpreadConstraints, ResourceClaims: t.ResourceClaims}
		for _, c := range t.InitContainers {
			if c.Name == trainingv1alpha1.SupervisorInitContainerName {
				continue // the operator's, alike in every job: turning it on or upgrading reshapes no gang
			}
			spec.InitContainers = append(spec.InitContainers, corev1.Container{Name: c.Name, Resources: c.Resources, RestartPolicy: c.RestartPolicy})
		}
		for _, c := range t.Containers {
			spec.Containers = append(spec.Containers, corev1.Container{Name: c.Name, Resources: c.Resources})
		}
		shapes[i] = shape{ps.Name, ps.Count, ps.TopologyRequest, spec}
	}
	b, _ := json.Marshal(shapes)
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:16])
}

// ranksHash fingerprints what the ranks' pods take from the quota: their count and each
// container's resources, which change only while the job is suspended (its topology request,
// spares and fault tolerance may change while it runs, and an operator upgrade that places
// pods otherwise must not reshape every running gang).
func ranksHash(sets []kueue.PodSet) string {
	t := &sets[0].Template.Spec
	ranks := kueue.PodSet{Name: sets[0].Name, Count: sets[0].Count, Template: corev1.PodTemplateSpec{Spec: corev1.PodSpec{
		Overhead: t.Overhead, InitContainers: t.InitContainers, Containers: t.Containers}}}
	return podSetsHash([]kueue.PodSet{ranks})
}

// specKey says which of the job's specs a Workload was made for: its generation, and the
// Kueue annotations it takes its topology request from (an annotation edit bumps no
// generation).
func specKey(job *trainingv1alpha1.ZayaTrainingJob) string {
	req, _ := json.Marshal(topologyRequest(job))
	sum := sha256.Sum256(req)
	return strconv.FormatInt(job.Generation, 10) + "-" + hex.EncodeToString(sum[:4])
}

// fromMultiKueue reports whether MultiKueue made wl in this (worker) cluster: a copy of its
// manager's, which is the manager's to end and describe.
func fromMultiKueue(wl *kueue.Workload) bool {
	return wl.Labels[kueue.MultiKueueOriginLabel] != "" || wl.Annotations[podSetsHashAnnotation] == ""
}

// workloadPriority is where the job's priority comes from, as Kueue's own jobs take it: a
// WorkloadPriorityClass named by the job's label, else the template's PriorityClass.
type workloadPriority struct {
	ref   *kueue.PriorityClassRef
	value int32
}

func (t *ticket) workloadPriority(ctx context.Context) (*workloadPriority, error) {
	if name := t.job.Labels[kueue.PriorityClassLabel]; name != "" {
		wpc := &kueue.WorkloadPriorityClass{}
		if err := t.g.Get(ctx, types.NamespacedName{Name: name}, wpc); err != nil {
			return nil, fmt.Errorf("WorkloadPriorityClass %q (label %s): %w", name, kueue.PriorityClassLabel, err)
		}
		return &workloadPriority{&kueue.PriorityClassRef{Group: kueue.GroupVersion.Group, Kind: "WorkloadPriorityClass", Name: name}, wpc.Value}, nil
	}
	if name := t.job.Spec.Template.Spec.PriorityClassName; name != "" {
		pc := &schedulingv1.PriorityClass{}
		if err := t.g.Get(ctx, types.NamespacedName{Name: name}, pc); err != nil {
			return nil, fmt.Errorf("PriorityClass %q (template.spec.priorityClassName): %w", name, err)
		}
		return &workloadPriority{&kueue.PriorityClassRef{Group: schedulingv1.GroupName, Kind: "PriorityClass", Name: name}, pc.Value}, nil
	}
	return nil, nil
}

// workloadAdmitted reports whether Kueue admitted the Workload and has not evicted it.
func workloadAdmitted(wl *kueue.Workload) bool {
	return wl.Status.Admission != nil && meta.IsStatusConditionTrue(wl.Status.Conditions, kueue.WorkloadAdmitted) &&
		!meta.IsStatusConditionTrue(wl.Status.Conditions, kueue.WorkloadEvicted) &&
		!meta.IsStatusConditionTrue(wl.Status.Conditions, kueue.WorkloadFinished)
}

// inputError is a job's Kueue label or annotation that cannot be used: the job waits,
// saying which and why, until it is fixed.
type inputError struct {
	msg   string
	retry time.Duration // look again after this long (0: at the job's next edit)
}

func (e *inputError) Error() string { return e.msg }

// inputs checks what the job asks of Kueue beyond its queue.
func inputs(job *trainingv1alpha1.ZayaTrainingJob) error {
	if q := job.Labels[kueue.QueueNameLabel]; q != "" && len(validation.IsDNS1123Subdomain(q)) > 0 {
		return &inputError{msg: fmt.Sprintf("label %s: %q is not a LocalQueue name (a lowercase RFC 1123 subdomain)", kueue.QueueNameLabel, q)}
	}
	if v, ok := job.Labels[kueue.MaxExecTimeLabel]; ok {
		if s, err := strconv.ParseInt(v, 10, 32); err != nil || s < 1 {
			return &inputError{msg: fmt.Sprintf("label %s: %q is not a whole number of seconds from 1 to 2147483647", kueue.MaxExecTimeLabel, v)}
		}
	}
	if v, ok := job.Annotations[kueue.SliceSizeAnnotation]; ok {
		if s, err := strconv.ParseInt(v, 10, 32); err != nil || s < 1 || s > int64(job.Spec.Nodes) {
			return &inputError{msg: fmt.Sprintf("annotation %s: %q is not a slice size from 1 to spec.nodes (%d)", kueue.SliceSizeAnnotation, v, job.Spec.Nodes)}
		}
	}
	if podGroupQueued(job) {
		return &inputError{msg: fmt.Sprintf("the job is queued twice: label %s on the job (a Kueue workload) and in spec.template.metadata.labels (Kueue pod groups); keep one", kueue.QueueNameLabel)}
	}
	return nil
}
