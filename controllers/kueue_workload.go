package controllers

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	schedulingv1 "k8s.io/api/scheduling/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	trainingv1alpha1 "github.com/zaya-operator/zaya-operator/api/v1alpha1"
	"github.com/zaya-operator/zaya-operator/controllers/gang"
	"github.com/zaya-operator/zaya-operator/controllers/workerpod"
	"github.com/zaya-operator/zaya-operator/internal/kueue"
)

// A job that names a Kueue queue (label kueue.x-k8s.io/queue-name) while the operator runs
// with KueueWorkloads is one Kueue workload, as Kueue's own Job is (its external-framework
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
func (r *ZayaTrainingJobReconciler) kueueWorkload(job metav1.Object) bool {
	return r.KueueWorkloads && job.GetLabels()[kueue.QueueNameLabel] != ""
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
// (they hold GPUs too). Built from the spec alone, as attempt 0 with nothing quarantined, and
// with the supervisor's init container where the ranks get it (its requests count).
func workloadPodSets(job *trainingv1alpha1.ZayaTrainingJob, supervisorImage string) []kueue.PodSet {
	base := &trainingv1alpha1.ZayaTrainingJob{ObjectMeta: job.ObjectMeta, Spec: job.Spec}
	rank := newWorkerPod(base, nil, 0) // the environment is left out anyway
	workerpod.InjectSupervisor(base, rank, supervisorImage)
	sets := []kueue.PodSet{{
		Name:            workersPodSet,
		Count:           job.Spec.Nodes,
		Template:        podSetTemplate(rank),
		TopologyRequest: topologyRequest(job),
	}}
	if n := wantedSpares(job); n > 0 {
		spare := newSparePod(base, 0, DefaultSpareImage, "")
		sets = append(sets, kueue.PodSet{Name: sparesPodSet, Count: n, Template: podSetTemplate(spare)})
	}
	return sets
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
func newWorkload(job *trainingv1alpha1.ZayaTrainingJob, prio *workloadPriority, supervisorImage string) *kueue.Workload {
	sets := workloadPodSets(job, supervisorImage)
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

func (p *pass) workloadPriority(ctx context.Context) (*workloadPriority, error) {
	if name := p.job.Labels[kueue.PriorityClassLabel]; name != "" {
		wpc := &kueue.WorkloadPriorityClass{}
		if err := p.r.Get(ctx, types.NamespacedName{Name: name}, wpc); err != nil {
			return nil, fmt.Errorf("WorkloadPriorityClass %q (label %s): %w", name, kueue.PriorityClassLabel, err)
		}
		return &workloadPriority{&kueue.PriorityClassRef{Group: kueue.GroupVersion.Group, Kind: "WorkloadPriorityClass", Name: name}, wpc.Value}, nil
	}
	if name := p.job.Spec.Template.Spec.PriorityClassName; name != "" {
		pc := &schedulingv1.PriorityClass{}
		if err := p.r.Get(ctx, types.NamespacedName{Name: name}, pc); err != nil {
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

// kueueInputError is a job's Kueue label or annotation that cannot be used: the job waits,
// saying which and why, until it is fixed.
type kueueInputError struct {
	msg   string
	retry time.Duration // look again after this long (0: at the job's next edit)
}

func (e *kueueInputError) Error() string { return e.msg }

// kueueInputs checks what the job asks of Kueue beyond its queue.
func kueueInputs(job *trainingv1alpha1.ZayaTrainingJob) error {
	if q := job.Labels[kueue.QueueNameLabel]; q != "" && len(validation.IsDNS1123Subdomain(q)) > 0 {
		return &kueueInputError{msg: fmt.Sprintf("label %s: %q is not a LocalQueue name (a lowercase RFC 1123 subdomain)", kueue.QueueNameLabel, q)}
	}
	if v, ok := job.Labels[kueue.MaxExecTimeLabel]; ok {
		if s, err := strconv.ParseInt(v, 10, 32); err != nil || s < 1 {
			return &kueueInputError{msg: fmt.Sprintf("label %s: %q is not a whole number of seconds from 1 to 2147483647", kueue.MaxExecTimeLabel, v)}
		}
	}
	if v, ok := job.Annotations[kueue.SliceSizeAnnotation]; ok {
		if s, err := strconv.ParseInt(v, 10, 32); err != nil || s < 1 || s > int64(job.Spec.Nodes) {
			return &kueueInputError{msg: fmt.Sprintf("annotation %s: %q is not a slice size from 1 to spec.nodes (%d)", kueue.SliceSizeAnnotation, v, job.Spec.Nodes)}
		}
	}
	if podGroupQueued(job) {
		return &kueueInputError{msg: fmt.Sprintf("the job is queued twice: label %s on the job (a Kueue workload) and in spec.template.metadata.labels (Kueue pod groups); keep one", kueue.QueueNameLabel)}
	}
	return nil
}

// workloadFor returns the job's Workload, creating it (or replacing one that no longer
// describes the job and holds no quota) where needed. Nil with no error while there is none
// to run under: one being replaced, MultiKueue's not made yet.
func (p *pass) workloadFor(ctx context.Context, pods []corev1.Pod) (*kueue.Workload, error) {
	job := p.job
	key := types.NamespacedName{Namespace: job.Namespace, Name: job.Name}
	wl, err := p.ownWorkload(ctx)
	switch {
	case err != nil:
		return nil, err
	case wl == nil:
		// None yet: made under the name the job's labels give now.
		wl = &kueue.Workload{}
		err = p.r.Get(ctx, types.NamespacedName{Namespace: job.Namespace, Name: workloadName(job)}, wl)
	}
	if gone, ok := p.r.goneWorkloads.Load(key); ok {
		if err == nil && gone == wl.UID {
			return nil, nil // deleted by the operator; the cache has yet to see it go
		}
		p.r.goneWorkloads.Delete(key)
	}
	switch {
	case apierrors.IsNotFound(err):
		// What the job asks of Kueue is checked when its Workload is made: a later edit
		// never stops a gang that runs under one.
		if err := kueueInputs(job); err != nil {
			return nil, err
		}
		if prebuiltWorkload(job) != "" {
			// Not owned by the job yet, so its arrival wakes nothing: look again.
			return nil, &kueueInputError{msg: fmt.Sprintf("waiting for MultiKueue's Workload %s (annotation %s)", prebuiltWorkload(job), kueue.PrebuiltWorkloadLabel), retry: 5 * time.Second}
		}
		prio, err := p.workloadPriority(ctx)
		if err != nil {
			return nil, err
		}
		wl = newWorkload(job, prio, p.r.SupervisorImage)
		if err := p.r.Create(ctx, wl); err != nil && !apierrors.IsAlreadyExists(err) {
			if refusedForGood(err) {
				// Asked again, the answer would be the same: say why, look again slowly.
				return nil, &kueueInputError{msg: truncate(fmt.Sprintf("creating Workload %s: %v", wl.Name, err)), retry: time.Minute}
			}
			return nil, fmt.Errorf("creating Workload %s: %w", wl.Name, err)
		}
		p.acted(corev1.EventTypeNormal, trainingv1alpha1.ReasonWaitingForKueue, "Create",
			"created Workload %s in queue %s", wl.Name, wl.Spec.QueueName)
		return wl, nil
	case err != nil:
		return nil, fmt.Errorf("reading Workload: %w", err)
	}
	if !metav1.IsControlledBy(wl, job) {
		if prebuiltWorkload(job) == "" {
			return nil, &nameConflict{kind: "Workload", name: wl.Name}
		}
		if err := p.adoptWorkload(ctx, wl); err != nil {
			return nil, err
		}
	}
	if !wl.DeletionTimestamp.IsZero() {
		// Deleted by someone: stop the gang, then let it go; a new one queues the job again.
		return wl, nil
	}
	// Rendered only once the job's spec changed since the Workload was made: not on every
	// pass of a running gang.
	if !fromMultiKueue(wl) && wl.Annotations[jobGenerationAnnotation] != specKey(job) {
		sets := workloadPodSets(job, p.r.SupervisorImage)
		// Ranks of another shape (nodes, GPUs, template: edited while suspended, resumed
		// before the old pods were gone) never run under the old admission. Otherwise the
		// job asks for something else (its spares): a Workload holding quota stays until
		// the job stops, the spares capped by it; one holding none is replaced.
		p.reshaped = wl.Annotations[ranksHashAnnotation] != "" && wl.Annotations[ranksHashAnnotation] != ranksHash(sets)
		if p.reshaped || (!holdsQuota(wl) && wl.Annotations[podSetsHashAnnotation] != podSetsHash(sets)) {
			if len(p.jobPodsLeft(pods)) > 0 {
				return wl, nil
			}
			p.reshaped = false
			return nil, p.releaseWorkload(ctx, wl, "", "")
		}
	}
	return wl, nil
}

// refusedForGood reports whether the API server refused a write for what it holds (invalid,
// too large, forbidden), not for a passing reason.
func refusedForGood(err error) bool {
	return apierrors.IsInvalid(err) || apierrors.IsBadRequest(err) || apierrors.IsForbidden(err) ||
		apierrors.IsRequestEntityTooLargeError(err) || objectTooLarge(err)
}

// ownWorkload is the Workload the job controls, whatever its labels say now: the name is
// fixed when it is made, so a label or annotation edited later (a prebuilt name added, the
// queue label removed) neither takes the job past Kueue nor orphans its admission.
func (p *pass) ownWorkload(ctx context.Context) (*kueue.Workload, error) {
	if p.ownedChecked {
		return p.owned, nil
	}
	list := &kueue.WorkloadList{}
	if err := p.r.List(ctx, list, client.InNamespace(p.job.Namespace), client.MatchingFields{workloadOwnerKey: p.job.Name}); err != nil {
		return nil, fmt.Errorf("listing Workloads: %w", err)
	}
	name := workloadName(p.job)
	for i := range list.Items {
		wl := &list.Items[i]
		if !metav1.IsControlledBy(wl, p.job) {
			continue
		}
		// One not being deleted first, then the one the labels name.
		if o := p.owned; o == nil || (!o.DeletionTimestamp.IsZero() && wl.DeletionTimestamp.IsZero()) ||
			(o.DeletionTimestamp.IsZero() == wl.DeletionTimestamp.IsZero() && wl.Name == name) {
			p.owned = wl
		}
	}
	p.ownedChecked = true
	return p.owned, nil
}

// holdsQuota reports whether Kueue reserved quota for the Workload.
func holdsQuota(wl *kueue.Workload) bool {
	return wl.Status.Admission != nil || meta.IsStatusConditionTrue(wl.Status.Conditions, kueue.WorkloadQuotaReserved)
}

// adoptWorkload makes MultiKueue's prebuilt Workload the job's own. Only one nobody owns, made
// for no other job, and asking for what this job asks for: a tenant naming another
// workload's Workload (a pod group's, say) must not run under its admission.
func (p *pass) adoptWorkload(ctx context.Context, wl *kueue.Workload) error {
	if len(wl.OwnerReferences) > 0 || (wl.Labels[kueue.JobUIDLabel] != "" && wl.Labels[kueue.JobUIDLabel] != string(p.job.UID)) {
		return &nameConflict{kind: "Workload", name: wl.Name}
	}
	live := &kueue.Workload{}
	if err := p.r.apiReader().Get(ctx, client.ObjectKeyFromObject(wl), live); err != nil {
		return fmt.Errorf("reading Workload %s: %w", wl.Name, err)
	}
	if !samePodSets(live.Spec.PodSets, workloadPodSets(p.job, p.r.SupervisorImage)) {
		return &kueueInputError{msg: fmt.Sprintf("MultiKueue's Workload %s (annotation %s) asks for other pods than the job's: its pod sets differ in names, counts or resources",
			wl.Name, kueue.PrebuiltWorkloadLabel)}
	}
	patch := map[string]any{"metadata": map[string]any{
		"resourceVersion": wl.ResourceVersion,
		"ownerReferences": []metav1.OwnerReference{workerpod.OwnerRef(p.job)},
		"labels":          map[string]string{kueue.JobUIDLabel: string(p.job.UID)},
	}}
	if err := p.r.patchWorkload(ctx, wl, patch, ""); err != nil {
		return err
	}
	wl.OwnerReferences = []metav1.OwnerReference{workerpod.OwnerRef(p.job)}
	return nil
}

// samePodSets reports whether two lists of pod sets ask for the same pods: names, counts and
// each template's summed requests.
func samePodSets(a, b []kueue.PodSet) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i].Name != b[i].Name || a[i].Count != b[i].Count ||
			!apiequality.Semantic.DeepEqual(podRequests(&a[i].Template.Spec), podRequests(&b[i].Template.Spec)) {
			return false
		}
	}
	return true
}

// podRequests sums a pod's containers' requests.
func podRequests(spec *corev1.PodSpec) corev1.ResourceList {
	out := corev1.ResourceList{}
	for _, c := range spec.Containers {
		for name, q := range c.Resources.Requests {
			sum := out[name]
			sum.Add(q)
			out[name] = sum
		}
	}
	return out
}

// jobPodsLeft are the job's pods that still exist and are not finished: what holds devices.
func (p *pass) jobPodsLeft(pods []corev1.Pod) []*corev1.Pod {
	var out []*corev1.Pod
	for i := range pods {
		if !gang.Finished(&pods[i]) {
			out = append(out, &pods[i])
		}
	}
	return out
}

// inKueue reports whether the job runs under a Workload of this operator's: it names a queue,
// or it still owns the Workload it was queued with (the label removed from a queued or
// running job does not let it past Kueue).
func (p *pass) inKueue(ctx context.Context) bool {
	if p.kueueChecked {
		return p.kueueManaged
	}
	p.kueueChecked = true
	switch {
	case !p.r.KueueWorkloads:
	case p.r.kueueWorkload(p.job):
		p.kueueManaged = true
	default:
		wl, err := p.ownWorkload(ctx)
		p.kueueManaged = err == nil && wl != nil
	}
	return p.kueueManaged
}

// admitted runs the Kueue side of a pass and reports whether the gang may run. One that may
// not (queued, evicted, its Workload going) is stopped, and once none of its pods holds a
// device, an evicted Workload's quota is handed back.
func (p *pass) admitted(ctx context.Context, pods []corev1.Pod) (bool, ctrl.Result, error) {
	if !p.inKueue(ctx) {
		return true, ctrl.Result{}, nil
	}
	wl, err := p.workloadFor(ctx, pods)
	var conflict *nameConflict
	var input *kueueInputError
	why, retry := "", time.Duration(0)
	switch {
	case errors.As(err, &input):
		why, retry = input.msg, input.retry // held, saying why
	case errors.As(err, &conflict):
		return false, ctrl.Result{}, err
	case err != nil:
		// Say why on the job (a priority class that does not exist, say), not only in the log.
		p.setCondition(trainingv1alpha1.ConditionQueued, metav1.ConditionTrue, trainingv1alpha1.ReasonWaitingForKueue,
			"cannot queue the job in Kueue: "+err.Error())
		return false, ctrl.Result{}, err
	}
	p.workload = wl
	if wl != nil && wl.DeletionTimestamp.IsZero() && workloadAdmitted(wl) && !p.reshaped {
		place, err := p.placement(ctx, wl)
		var clash *placementConflict
		switch {
		case errors.As(err, &clash):
			p.fail(trainingv1alpha1.ReasonInvalidPodTemplate, "Kueue's admission cannot be applied to the pods: "+err.Error())
			return false, ctrl.Result{}, nil
		case err != nil:
			p.placeErr = err // no pod is made until it reads; the gang that runs is still looked after
			place = map[string]*podPlacement{}
		}
		p.place = place
		p.admittedNow()
		return true, ctrl.Result{}, nil
	}
	wasHeld := meta.IsStatusConditionTrue(p.job.Status.Conditions, trainingv1alpha1.ConditionQueued)
	ran := p.job.Status.StartTime != nil || len(gang.Active(pods)) > 0
	p.holdForKueue(pods, wl, why)
	if !wasHeld && ran {
		p.job.Status.Restarts = addCount(p.job.Status.Restarts, 1) // the next admission starts a new attempt, as a resume does
	}
	if err := p.stopGang(ctx, pods); err != nil {
		return false, ctrl.Result{}, err
	}
	if wl == nil {
		return false, ctrl.Result{RequeueAfter: retry}, nil
	}
	// Quota goes back only once no pod holds a device; a pod on a lost node is force-deleted
	// after terminatingTimeout rather than holding it forever.
	next, err := p.clearStuck(ctx, terminatingPods(pods))
	if err != nil || len(p.jobPodsLeft(pods)) > 0 {
		return false, ctrl.Result{RequeueAfter: next}, err
	}
	switch {
	case !wl.DeletionTimestamp.IsZero():
	case meta.IsStatusConditionTrue(wl.Status.Conditions, kueue.WorkloadEvicted) && holdsQuota(wl):
	default:
		return false, ctrl.Result{}, nil
	}
	// The cache may not have seen pods created moments ago: ask the API server.
	if live, err := p.livePods(ctx); err != nil || live > 0 {
		return false, ctrl.Result{RequeueAfter: time.Second}, err
	}
	if !wl.DeletionTimestamp.IsZero() {
		return false, ctrl.Result{}, p.releaseWorkload(ctx, wl, "", "")
	}
	return false, ctrl.Result{}, p.r.unsetQuotaReservation(ctx, wl)
}

// terminatingPods are the job's pods being deleted that have not stopped.
func terminatingPods(pods []corev1.Pod) []*corev1.Pod {
	var out []*corev1.Pod
	for i := range pods {
		if !pods[i].DeletionTimestamp.IsZero() && !gang.Finished(&pods[i]) {
			out = append(out, &pods[i])
		}
	}
	return out
}

// livePods counts the job's pods that have not stopped, as the API server has them.
func (p *pass) livePods(ctx context.Context) (int, error) {
	pods := &corev1.PodList{}
	if err := p.r.apiReader().List(ctx, pods, client.InNamespace(p.job.Namespace),
		client.MatchingLabels{trainingv1alpha1.JobNameLabel: p.job.Name}); err != nil {
		return 0, fmt.Errorf("listing the job's pods: %w", err)
	}
	n := 0
	for i := range pods.Items {
		// The operator's own pods only: one forged with the job's owner is never deleted, so
		// it must not hold the quota either.
		if p.marks.made(p.job.UID, &pods.Items[i]) && !gang.Finished(&pods.Items[i]) {
			n++
		}
	}
	return n, nil
}

// holdForKueue says why the job waits: queued, or stopped by Kueue.
func (p *pass) holdForKueue(pods []corev1.Pod, wl *kueue.Workload, why string) {
	msg := "waiting for Kueue to admit the job's Workload"
	if why != "" {
		msg = "cannot queue the job in Kueue: " + why
	}
	reason := trainingv1alpha1.ReasonWaitingForKueue
	if wl != nil {
		msg = fmt.Sprintf("waiting for Kueue to admit Workload %s (queue %s)", wl.Name, wl.Spec.QueueName)
		if c := meta.FindStatusCondition(wl.Status.Conditions, kueue.WorkloadQuotaReserved); c != nil && c.Status == metav1.ConditionFalse && c.Message != "" {
			msg += ": " + c.Reason + ": " + c.Message
		}
		if c := meta.FindStatusCondition(wl.Status.Conditions, kueue.WorkloadEvicted); c != nil && c.Status == metav1.ConditionTrue {
			reason = "Kueue" + c.Reason
			msg = fmt.Sprintf("Kueue evicted Workload %s: %s: %s", wl.Name, c.Reason, c.Message)
		}
		if !wl.DeletionTimestamp.IsZero() {
			msg = fmt.Sprintf("Workload %s is being deleted: the gang stops and the job queues again", wl.Name)
		}
		if p.reshaped {
			msg = fmt.Sprintf("the job's ranks changed while it was suspended: Workload %s admitted the old ones, and is replaced once their pods are gone", wl.Name)
		}
	}
	if len(gang.Active(pods)) > 0 {
		p.normal(reason, "Stop", "%s: stopping the gang", msg)
	}
	p.setCondition(trainingv1alpha1.ConditionQueued, metav1.ConditionTrue, reason, truncate(msg))
	p.clearCondition(trainingv1alpha1.ConditionRunning, trainingv1alpha1.ReasonWaitingForKueue, "the job waits for Kueue")
	p.clearCondition(trainingv1alpha1.ConditionRestarting, trainingv1alpha1.ReasonWaitingForKueue, "the job waits for Kueue")
	p.clearCondition(trainingv1alpha1.ConditionWaitingForCapacity, trainingv1alpha1.ReasonWaitingForKueue, "the job waits for Kueue")
}

// admittedNow marks the end of a wait in Kueue's queue. The held job has no start time: its
// clock (activeDeadlineSeconds) starts now.
func (p *pass) admittedNow() {
	c := meta.FindStatusCondition(p.job.Status.Conditions, trainingv1alpha1.ConditionQueued)
	if c == nil || c.Status != metav1.ConditionTrue {
		return
	}
	waited := p.now.Sub(c.LastTransitionTime.Time).Round(1e9)
	p.setCondition(trainingv1alpha1.ConditionQueued, metav1.ConditionFalse, trainingv1alpha1.ReasonAdmitted,
		fmt.Sprintf("Kueue admitted Workload %s to ClusterQueue %s after %s", p.workload.Name, p.workload.Status.Admission.ClusterQueue, waited))
}

// podPlacement is what Kueue's admission adds to a pod set's pods.
type podPlacement struct {
	count        int32 // how many pods of the set Kueue admitted
	nodeSelector map[string]string
	tolerations  []corev1.Toleration
	labels       map[string]string
	annotations  map[string]string
	topology     bool // Kueue's topology gate: its ungater picks each rank's domain
}

// placement reads the admission's flavors (their node labels and tolerations), the
// admission checks' pod set updates and the topology assignment, for each pod set.
func (p *pass) placement(ctx context.Context, wl *kueue.Workload) (map[string]*podPlacement, error) {
	out := map[string]*podPlacement{}
	for _, a := range wl.Status.Admission.PodSetAssignments {
		pl := &podPlacement{
			nodeSelector: map[string]string{}, labels: map[string]string{kueue.PodSetLabel: a.Name},
			annotations: map[string]string{},
		}
		for _, ps := range wl.Spec.PodSets {
			if ps.Name == a.Name {
				pl.count = ps.Count
			}
		}
		if a.Count != nil {
			pl.count = *a.Count
		}
		for _, name := range slices.Compact(slices.Sorted(maps.Values(a.Flavors))) {
			rf := &kueue.ResourceFlavor{}
			if err := p.r.Get(ctx, types.NamespacedName{Name: name}, rf); err != nil {
				return nil, fmt.Errorf("ResourceFlavor %s of the admission: %w", name, err)
			}
			if err := mergeInto(pl.nodeSelector, rf.Spec.NodeLabels, "ResourceFlavor "+name+" nodeLabels"); err != nil {
				return nil, err
			}
			pl.tolerations = appendNew(pl.tolerations, rf.Spec.Tolerations...)
		}
		for _, check := range wl.Status.AdmissionChecks {
			for _, u := range check.PodSetUpdates {
				if u.Name != a.Name {
					continue
				}
				what := "admission check " + check.Name
				if err := errors.Join(mergeInto(pl.nodeSelector, u.NodeSelector, what+" nodeSelector"),
					mergeInto(pl.labels, u.Labels, what+" labels"), mergeInto(pl.annotations, u.Annotations, what+" annotations")); err != nil {
					return nil, err
				}
				pl.tolerations = appendNew(pl.tolerations, u.Tolerations...)
			}
		}
		if a.TopologyAssignment != nil {
			// Kueue's ungater serves only pods that say they are topology-aware, and finds
			// them by their Workload.
			pl.topology = true
			pl.annotations[kueue.WorkloadAnnotation] = wl.Name
			switch t := topologyRequest(p.job); {
			case t != nil && t.Required != nil:
				pl.annotations[kueue.RequiredTopologyAnnotation] = *t.Required
			case t != nil && t.Preferred != nil:
				pl.annotations[kueue.PreferredTopologyAnnotation] = *t.Preferred
			default:
				pl.annotations[kueue.UnconstrainedTopologyAnnotation] = "true"
			}
		}
		out[a.Name] = pl
	}
	if out[workersPodSet] == nil {
		return nil, &placementConflict{fmt.Sprintf("Workload %s was admitted without pod set %q", wl.Name, workersPodSet)}
	}
	return out, nil
}

// placementConflict is an admission whose placement contradicts itself or the template.
type placementConflict struct{ msg string }

func (e *placementConflict) Error() string { return e.msg }

func mergeInto(dst, src map[string]string, what string) error {
	for k, v := range src {
		if old, ok := dst[k]; ok && old != v {
			return &placementConflict{fmt.Sprintf("%s sets %s=%s, but it is already %s", what, k, v, old)}
		}
		dst[k] = v
	}
	return nil
}

func appendNew(list []corev1.Toleration, add ...corev1.Toleration) []corev1.Toleration {
	for _, t := range add {
		if !slices.ContainsFunc(list, func(o corev1.Toleration) bool {
			return o.MatchToleration(&t) && o.Value == t.Value && o.TolerationSeconds == t.TolerationSeconds
		}) {
			list = append(list, t)
		}
	}
	return list
}

// placeOn adds the admission's placement for podSet to a pod the pass creates. A template's
// own node selector keeps its values: the admission was computed with them.
func (p *pass) placeOn(pod *corev1.Pod, podSet string) {
	pl := p.place[podSet]
	if pl == nil {
		return
	}
	ps := &pod.Spec
	if len(pl.nodeSelector) > 0 {
		if ps.NodeSelector == nil {
			ps.NodeSelector = map[string]string{}
		}
		for k, v := range pl.nodeSelector {
			if _, ok := ps.NodeSelector[k]; !ok {
				ps.NodeSelector[k] = v
			}
		}
	}
	ps.Tolerations = appendNew(ps.Tolerations, pl.tolerations...)
	if pod.Labels == nil {
		pod.Labels = map[string]string{}
	}
	copyNotOurs(pod.Labels, pl.labels)
	if len(pl.annotations) > 0 {
		if pod.Annotations == nil {
			pod.Annotations = map[string]string{}
		}
		copyNotOurs(pod.Annotations, pl.annotations)
	}
	if pl.topology {
		ps.SchedulingGates = append(ps.SchedulingGates, corev1.PodSchedulingGate{Name: kueue.TopologyGate})
	}
}

// copyNotOurs copies an admission's labels or annotations, but never over the operator's own
// (rank, attempt, job name, the pod's mark): the pod would stop being the rank it is.
func copyNotOurs(dst, src map[string]string) {
	for k, v := range src {
		if !strings.HasPrefix(k, trainingv1alpha1.GroupVersion.Group+"/") {
			dst[k] = v
		}
	}
}

// syncWorkload tells Kueue how the job is doing: PodsReady while it runs, Finished once it
// ended (then Kueue's finalizer goes: the quota is free).
func (p *pass) syncWorkload(ctx context.Context) error {
	if err := p.loadWorkload(ctx); err != nil {
		return err
	}
	wl := p.workload
	if wl == nil || !wl.DeletionTimestamp.IsZero() {
		return nil
	}
	job := p.job
	var conds []metav1.Condition
	if finished(job) {
		reason, c := kueue.ReasonSucceeded, meta.FindStatusCondition(job.Status.Conditions, trainingv1alpha1.ConditionSucceeded)
		if c == nil || c.Status != metav1.ConditionTrue {
			reason, c = kueue.ReasonFailed, meta.FindStatusCondition(job.Status.Conditions, trainingv1alpha1.ConditionFailed)
		}
		if !meta.IsStatusConditionTrue(wl.Status.Conditions, kueue.WorkloadFinished) {
			conds = append(conds, metav1.Condition{Type: kueue.WorkloadFinished, Status: metav1.ConditionTrue, Reason: reason, Message: c.Message})
		}
	} else if wl.Status.Admission != nil {
		conds = append(conds, podsReadyCondition(wl, workloadAdmitted(wl) && job.Status.ReadyNodes >= job.Spec.Nodes &&
			meta.IsStatusConditionTrue(job.Status.Conditions, trainingv1alpha1.ConditionRunning)))
	}
	if err := p.r.setWorkloadConditions(ctx, wl, conds...); err != nil {
		return err
	}
	if finished(job) && len(p.jobPodsLeft(p.pods)) == 0 {
		return p.r.dropFinalizer(ctx, wl)
	}
	return nil
}

// podsReadyCondition is Kueue's PodsReady for the gang: Started the first time every rank is
// ready, WaitForRecovery while a restart brings it back, Recovered when it is back.
func podsReadyCondition(wl *kueue.Workload, ready bool) metav1.Condition {
	old := meta.FindStatusCondition(wl.Status.Conditions, kueue.WorkloadPodsReady)
	c := metav1.Condition{Type: kueue.WorkloadPodsReady, Status: metav1.ConditionFalse, Reason: kueue.ReasonWaitForStart,
		Message: "not all ranks are ready"}
	switch {
	case ready && old != nil && old.Reason == kueue.ReasonWaitRecovery:
		c.Status, c.Reason, c.Message = metav1.ConditionTrue, kueue.ReasonRecovered, "every rank is ready again"
	case ready && old != nil && old.Status == metav1.ConditionTrue:
		c.Status, c.Reason, c.Message = metav1.ConditionTrue, old.Reason, old.Message
	case ready:
		c.Status, c.Reason, c.Message = metav1.ConditionTrue, kueue.ReasonStarted, "every rank is ready"
	case old != nil && (old.Status == metav1.ConditionTrue || old.Reason == kueue.ReasonWaitRecovery):
		c.Reason, c.Message = kueue.ReasonWaitRecovery, "the gang restarts: not all ranks are ready"
	}
	return c
}

// setWorkloadConditions writes conditions that changed, keeping every other one.
func (r *ZayaTrainingJobReconciler) setWorkloadConditions(ctx context.Context, wl *kueue.Workload, conds ...metav1.Condition) error {
	all := slices.Clone(wl.Status.Conditions)
	changed := false
	for _, c := range conds {
		c.ObservedGeneration = wl.Generation
		changed = meta.SetStatusCondition(&all, c) || changed
	}
	if !changed {
		return nil
	}
	return r.patchWorkload(ctx, wl, map[string]any{
		"metadata": map[string]any{"resourceVersion": wl.ResourceVersion},
		"status":   map[string]any{"conditions": all},
	}, "status")
}

// unsetQuotaReservation hands an evicted Workload's quota back once its pods are gone, as
// Kueue's own job controller does: Kueue then requeues it (after its backoff).
func (r *ZayaTrainingJobReconciler) unsetQuotaReservation(ctx context.Context, wl *kueue.Workload) error {
	ev := meta.FindStatusCondition(wl.Status.Conditions, kueue.WorkloadEvicted)
	all := slices.Clone(wl.Status.Conditions)
	requeued := metav1.ConditionFalse
	if ev.Reason == kueue.ReasonPreempted || ev.Reason == kueue.ReasonNodeFailures {
		requeued = metav1.ConditionTrue
	}
	for _, c := range []metav1.Condition{
		{Type: kueue.WorkloadQuotaReserved, Status: metav1.ConditionFalse, Reason: kueue.ReasonPending, Message: ev.Message},
		{Type: kueue.WorkloadAdmitted, Status: metav1.ConditionFalse, Reason: kueue.ReasonNoReservation, Message: "The workload has no reservation"},
		{Type: kueue.WorkloadRequeued, Status: requeued, Reason: ev.Reason, Message: ev.Message},
	} {
		c.ObservedGeneration = wl.Generation
		meta.SetStatusCondition(&all, c)
	}
	if c := meta.FindStatusCondition(all, kueue.WorkloadPodsReady); c != nil {
		meta.SetStatusCondition(&all, metav1.Condition{Type: kueue.WorkloadPodsReady, Status: metav1.ConditionFalse,
			Reason: kueue.ReasonWaitForStart, Message: "the workload is not admitted", ObservedGeneration: wl.Generation})
	}
	return r.patchWorkload(ctx, wl, map[string]any{
		"metadata": map[string]any{"resourceVersion": wl.ResourceVersion},
		"status":   map[string]any{"conditions": all, "admission": nil},
	}, "status")
}

// releaseWorkload lets a Workload go: finished (reason, when given) so Kueue frees its quota,
// its finalizer dropped, and deleted unless that was already asked for.
func (p *pass) releaseWorkload(ctx context.Context, wl *kueue.Workload, reason, msg string) error {
	if err := p.r.releaseWorkload(ctx, wl, reason, msg); err != nil {
		return err
	}
	if reason == "" {
		// Gone, though the cache may hold it a moment longer: never run under it again.
		p.r.goneWorkloads.Store(types.NamespacedName{Namespace: p.job.Namespace, Name: p.job.Name}, wl.UID)
	}
	return nil
}

func (r *ZayaTrainingJobReconciler) releaseWorkload(ctx context.Context, wl *kueue.Workload, reason, msg string) error {
	if reason != "" && !meta.IsStatusConditionTrue(wl.Status.Conditions, kueue.WorkloadFinished) {
		if err := r.setWorkloadConditions(ctx, wl, metav1.Condition{Type: kueue.WorkloadFinished, Status: metav1.ConditionTrue, Reason: reason, Message: msg}); err != nil {
			return err
		}
	}
	if err := r.dropFinalizer(ctx, wl); err != nil {
		return err
	}
	if wl.DeletionTimestamp.IsZero() && reason == "" {
		if err := r.Delete(ctx, wl, client.Preconditions{UID: &wl.UID}); err != nil && !apierrors.IsNotFound(err) {
			return fmt.Errorf("deleting Workload %s: %w", wl.Name, err)
		}
	}
	return nil
}

// dropFinalizer removes Kueue's resource-in-use finalizer, which the job's controller owns.
func (r *ZayaTrainingJobReconciler) dropFinalizer(ctx context.Context, wl *kueue.Workload) error {
	if !slices.Contains(wl.Finalizers, kueue.ResourceInUseFinalizer) {
		return nil
	}
	rest := slices.DeleteFunc(slices.Clone(wl.Finalizers), func(f string) bool { return f == kueue.ResourceInUseFinalizer })
	return r.patchWorkload(ctx, wl, map[string]any{
		"metadata": map[string]any{"resourceVersion": wl.ResourceVersion, "finalizers": rest},
	}, "")
}

// patchWorkload merge-patches a Workload (its status when sub is "status"), guarded by the
// resourceVersion in the patch: fields these types lack are never touched, and a Workload that
// changed meanwhile is reread by the next pass (its watch event brings one).
func (r *ZayaTrainingJobReconciler) patchWorkload(ctx context.Context, wl *kueue.Workload, patch map[string]any, sub string) error {
	b, err := json.Marshal(patch)
	if err != nil {
		return err
	}
	raw := client.RawPatch(types.MergePatchType, b)
	if sub == "status" {
		err = r.Status().Patch(ctx, wl, raw)
	} else {
		err = r.Patch(ctx, wl, raw)
	}
	switch {
	case apierrors.IsNotFound(err):
		return nil
	case err != nil:
		return fmt.Errorf("updating Workload %s: %w", wl.Name, err)
	}
	return nil
}

// releaseOrphanedWorkloads lets the Workloads of jobs named key that are gone (or going; all
// but the job of UID keep) go once none of their pods holds a device: Finished with
// OwnerNotFound and unblocked, so neither the quota nor a foreground delete waits on them
// longer than the pods do. A pod past its deletion's due time by terminatingTimeout's default
// is on a lost node and holds nothing back.
func (r *ZayaTrainingJobReconciler) releaseOrphanedWorkloads(ctx context.Context, key types.NamespacedName, keep types.UID, deletePods bool) (time.Duration, error) {
	if !r.KueueWorkloads {
		return 0, nil
	}
	// Controlled by a job of that name, or orphaned from one (kubectl delete --cascade=orphan
	// takes the owner off every dependent: the Workload's label and job UID still say whose).
	list := &kueue.WorkloadList{}
	if err := r.List(ctx, list, client.InNamespace(key.Namespace), client.MatchingFields{workloadOwnerKey: key.Name}); err != nil {
		return 0, fmt.Errorf("listing Workloads: %w", err)
	}
	var next time.Duration
	for _, wl := range list.Items {
		uid := types.UID("")
		if name, ok := owningJob(&wl); ok && name == key.Name {
			uid = metav1.GetControllerOf(&wl).UID
		} else if metav1.GetControllerOf(&wl) == nil && wl.Annotations[podSetsHashAnnotation] != "" {
			uid = types.UID(wl.Labels[kueue.JobUIDLabel])
		}
		if uid == "" || uid == keep || !slices.Contains(wl.Finalizers, kueue.ResourceInUseFinalizer) {
			continue // (one without the finalizer is let go already)
		}
		held, wait, err := r.orphanPodsHold(ctx, key, uid, deletePods)
		if err != nil {
			return 0, err
		}
		if held {
			if wait > 0 && (next == 0 || wait < next) {
				next = wait
			}
			continue // their deletion (or the time it is due) brings the next look
		}
		if err := r.releaseWorkload(ctx, &wl, kueue.ReasonOwnerNotFound, "the ZayaTrainingJob is gone"); err != nil {
			return 0, err
		}
	}
	return next, nil
}

// orphanPodsHold reports whether pods the operator made for the job of uid still hold devices,
// and when to look again if only the clock can change that: those it controls, and those
// orphaned from it (kubectl delete --cascade=orphan: they run on, and keep its quota). Under a
// foreground delete (deletePods) the operator deletes them itself, as the garbage collector
// would.
func (r *ZayaTrainingJobReconciler) orphanPodsHold(ctx context.Context, key types.NamespacedName, uid types.UID, deletePods bool) (bool, time.Duration, error) {
	pods := &corev1.PodList{}
	if err := r.List(ctx, pods, client.InNamespace(key.Namespace), client.MatchingLabels{trainingv1alpha1.JobNameLabel: key.Name},
		client.UnsafeDisableDeepCopy); err != nil {
		return false, 0, fmt.Errorf("listing pods: %w", err)
	}
	if len(pods.Items) == 0 {
		return false, 0, nil
	}
	marks, err := r.podMarkKey(ctx)
	if err != nil {
		return false, 0, err
	}
	now := r.Clock.Now()
	held, next := false, time.Duration(0)
	for i := range pods.Items {
		pod := &pods.Items[i]
		if ours := marks.made(uid, pod) || marks.orphaned(uid, pod); !ours || gang.Finished(pod) {
			continue
		}
		if pod.DeletionTimestamp.IsZero() {
			held = true
			if deletePods && metav1.IsControlledBy(pod, &metav1.ObjectMeta{UID: uid}) {
				if err := r.Delete(ctx, pod, client.Preconditions{UID: &pod.UID}); err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
					return false, 0, fmt.Errorf("deleting pod %s: %w", pod.Name, err)
				}
			}
			continue
		}
		if wait := pod.DeletionTimestamp.Add(trainingv1alpha1.DefaultTerminatingTimeout).Sub(now); wait > 0 {
			held = true
			if next == 0 || wait < next {
				next = wait
			}
		}
	}
	return held, next, nil
}

// suspendWorkload lets a suspended job's Workload go once none of its pods holds a device: a
// suspended job holds no quota. Resuming queues it again with a new Workload.
func (p *pass) suspendWorkload(ctx context.Context, pods []corev1.Pod) error {
	if !p.inKueue(ctx) || len(p.jobPodsLeft(pods)) > 0 {
		return nil
	}
	wl, err := p.ownWorkload(ctx)
	if err != nil || wl == nil || fromMultiKueue(wl) {
		return err // MultiKueue's prebuilt one is its manager's to end
	}
	return p.releaseWorkload(ctx, wl, "", "")
}

// multiKueueManager serves a job that MultiKueue runs in a worker cluster (spec.managedBy):
// here the job only has a Workload for MultiKueue to dispatch. Its pods and status are the
// worker cluster's; the Workload goes once MultiKueue says it finished.
func (r *ZayaTrainingJobReconciler) multiKueueManager(ctx context.Context, job *trainingv1alpha1.ZayaTrainingJob) (ctrl.Result, error) {
	if errs := trainingv1alpha1.ValidateSpec(&job.Spec); len(errs) > 0 {
		return ctrl.Result{}, nil // refused at apply; one stored before that rule waits for a fix
	}
	p := &pass{r: r, job: job, now: r.Clock.Now()}
	defer p.emit(true)
	wl, err := p.workloadFor(ctx, nil)
	var input *kueueInputError
	var conflict *nameConflict
	switch {
	case errors.As(err, &input), errors.As(err, &conflict):
		// The job's status is the worker cluster's to write: an event says why, and the job
		// is looked at again slowly rather than retried as an API error.
		p.acted(corev1.EventTypeWarning, trainingv1alpha1.ReasonWaitingForKueue, "Queue", "cannot queue the job in Kueue: %v", err)
		if input != nil && input.retry > 0 {
			return ctrl.Result{RequeueAfter: input.retry}, nil
		}
		return ctrl.Result{RequeueAfter: time.Minute}, nil
	case err != nil || wl == nil:
		return ctrl.Result{}, err
	}
	if meta.IsStatusConditionTrue(wl.Status.Conditions, kueue.WorkloadFinished) {
		return ctrl.Result{}, r.dropFinalizer(ctx, wl)
	}
	return ctrl.Result{}, nil
}

// loadWorkload reads the job's own Workload for a pass that did not (a finished job's).
func (p *pass) loadWorkload(ctx context.Context) error {
	if p.workload != nil || !p.inKueue(ctx) {
		return nil
	}
	wl, err := p.ownWorkload(ctx)
	p.workload = wl
	return err
}
