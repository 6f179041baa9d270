package kueuegate

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	trainingv1alpha1 "github.com/zaya-operator/zaya-operator/api/v1alpha1"
	"github.com/zaya-operator/zaya-operator/controllers/workerpod"
	"github.com/zaya-operator/zaya-operator/internal/kueue"
)

// Kueue's pod integration (plain pod groups), for teams that enable only that: the template
// carries kueue.x-k8s.io/queue-name and Kueue's pod webhook gates every rank until it admits
// the group. Each attempt is a group of its own, `nodes` ranks, named after the job and the
// attempt: Kueue never matches a new attempt's pods to a group it finished, and a count the
// user wrote cannot disagree with the gang. An attempt the job leaves (a restart, a
// suspension, the end) is let go: its pods say retriable-in-group "false" so Kueue finishes
// its group and frees the quota, and Kueue's finalizer is taken off those being deleted, so
// neither a restart nor a delete waits on it (a pod whose node is gone would hold it forever).
// The price: every attempt queues again, where the Workload path (workload.go) keeps
// restarts inside one admission.

// podGroupQueued reports whether the job's pods are Kueue pod groups.
func podGroupQueued(job *trainingv1alpha1.ZayaTrainingJob) bool {
	return job.Spec.Template.Labels[kueue.QueueNameLabel] != ""
}

// podGroupName is the group of the job's attempt: a label value (63 characters at most), the
// job's UID in it so a job recreated under the same name starts a group of its own.
func podGroupName(job *trainingv1alpha1.ZayaTrainingJob, attempt int32) string {
	sum := sha256.Sum256([]byte(job.UID))
	suffix := "-" + hex.EncodeToString(sum[:])[:6] + "-" + strconv.FormatInt(int64(attempt), 10)
	name := job.Name
	if len(name) > 63-len(suffix) {
		name = strings.TrimRight(name[:63-len(suffix)], "-.")
	}
	return name + suffix
}

// joinPodGroup makes a rank's pod a member of its attempt's group.
func joinPodGroup(job *trainingv1alpha1.ZayaTrainingJob, pod *corev1.Pod, attempt int32) {
	if !podGroupQueued(job) {
		return
	}
	pod.Labels[kueue.PodGroupNameLabel] = podGroupName(job, attempt)
	if pod.Annotations == nil {
		pod.Annotations = map[string]string{}
	}
	pod.Annotations[kueue.PodGroupTotalCount] = strconv.FormatInt(int64(job.Width()), 10) // each attempt its own group: a shrunk one asks for less
	// Topology-aware placement ranks pods by this label: rank r in the r-th slot.
	pod.Annotations[kueue.PodGroupPodIndexLabel] = trainingv1alpha1.RankLabel
	delete(pod.Annotations, kueue.RetriableInGroup)
	// The group's life is the operator's: a serving group outlives its pods (a left attempt
	// would keep its quota), a prebuilt Workload's admission is not the attempt's.
	delete(pod.Annotations, kueue.PodGroupServing)
	delete(pod.Annotations, kueue.PrebuiltWorkloadLabel)
	delete(pod.Labels, kueue.PrebuiltWorkloadLabel)
}

// releasePodGroups lets go of the groups the job no longer runs (every group but current;
// all of them when current is "": the job ended or is suspended), and takes Kueue's finalizer
// off every pod of the job being deleted, of the current group too: a rank replaced in place
// gets a pod of the same name only once the old one is gone. Best effort: an error (no RBAC
// to patch pods, say) is reported and retried, never blocks the pass.
func (t *ticket) releasePodGroups(ctx context.Context, pods []corev1.Pod, current string) {
	var failed error
	for i := range pods {
		pod := &pods[i]
		group := pod.Labels[kueue.PodGroupNameLabel]
		if group == "" {
			continue
		}
		if err := t.g.letGoOfGroupPod(ctx, pod, group != current); err != nil {
			failed = err
		}
	}
	if failed != nil {
		t.host.Acted(corev1.EventTypeWarning, trainingv1alpha1.ReasonBlockedByFinalizer, "Patch",
			"letting Kueue's pod group go: %v (the operator needs patch on pods: config/kueue, or the chart's kueue.enabled)", failed)
	}
}

// letGoOfGroupPod takes Kueue's finalizer off a pod being deleted and, for a pod of a group
// the job left, marks it not retriable: Kueue then finishes that group once none of its pods
// runs, and frees its quota.
func (g *Gate) letGoOfGroupPod(ctx context.Context, pod *corev1.Pod, left bool) error {
	meta := map[string]any{}
	if left && pod.Annotations[kueue.RetriableInGroup] != "false" {
		meta["annotations"] = map[string]string{kueue.RetriableInGroup: "false"}
	}
	if !pod.DeletionTimestamp.IsZero() && slices.Contains(pod.Finalizers, kueue.ManagedFinalizer) {
		meta["finalizers"] = slices.DeleteFunc(slices.Clone(pod.Finalizers), func(f string) bool { return f == kueue.ManagedFinalizer })
		meta["resourceVersion"] = pod.ResourceVersion
	}
	if len(meta) == 0 {
		return nil
	}
	b, err := json.Marshal(map[string]any{"metadata": meta})
	if err != nil {
		return err
	}
	// A fresh object: pod may be the cache's own copy, which the reply must not overwrite.
	target := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: pod.Namespace, Name: pod.Name}}
	err = g.Patch(ctx, target, client.RawPatch(types.MergePatchType, b))
	if err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
		return fmt.Errorf("pod %s: %w", pod.Name, err)
	}
	return nil
}

// releaseOrphanedGroupPods lets go of the pod groups of a job that is gone: its pods, being
// garbage-collected, would otherwise wait on Kueue's finalizer with the group's quota held.
func (g *Gate) releaseOrphanedGroupPods(ctx context.Context, key types.NamespacedName) error {
	pods := &corev1.PodList{}
	// Only pods of a group are copied out of the cache: a gone job's pods each wake a pass
	// while they are collected, so copying all of them every pass is quadratic in the gang.
	if err := g.List(ctx, pods, client.InNamespace(key.Namespace), client.MatchingFields{workerpod.OwnerIndex: key.Name},
		client.HasLabels{kueue.PodGroupNameLabel}); err != nil {
		return fmt.Errorf("listing pods: %w", err)
	}
	for i := range pods.Items {
		pod := &pods.Items[i]
		if pod.Labels[kueue.PodGroupNameLabel] == "" || pod.Labels[trainingv1alpha1.JobNameLabel] != key.Name {
			continue
		}
		if err := g.letGoOfGroupPod(ctx, pod, true); err != nil {
			return err
		}
	}
	return nil
}

// runningGroup is the pod group of the attempt the job runs now; "" when it runs none (ended,
// suspended, or held by Kueue's Workload).
func (t *ticket) runningGroup() string {
	if ended(t.job) || t.job.Spec.Suspend || !podGroupQueued(t.job) {
		return ""
	}
	return podGroupName(t.job, t.job.Status.Attempt())
}

// Queueing behind Kueue's pod integration: its webhook gives every pod it manages the
// kueue.x-k8s.io/admission scheduling gate and lifts it once it admits the group. A gang whose
// ranks are gated has not started: Queued=True says so, activeDeadlineSeconds does not run out
// in the queue, and a job admitted for the first time starts its clock (startTime, goodput)
// at admission, as a job unsuspended by Kueue does.

// kueueAdmissionGate is the scheduling gate Kueue's pod webhook adds.
const kueueAdmissionGate = "kueue.x-k8s.io/admission"

// admissionGates are the scheduling gates Kueue lifts when it admits a job: not the ones a
// rank waits on for nothing.
var admissionGates = []string{kueueAdmissionGate, kueue.TopologyGate}

// queuedRanks counts the current attempt's pods that Kueue's admission gate holds.
func queuedRanks(job *trainingv1alpha1.ZayaTrainingJob, pods []corev1.Pod) int {
	attempt := strconv.FormatInt(int64(job.Status.Attempt()), 10)
	n := 0
	for i := range pods {
		pod := &pods[i]
		if pod.Labels[trainingv1alpha1.AttemptLabel] == attempt && pod.DeletionTimestamp.IsZero() &&
			slices.ContainsFunc(pod.Spec.SchedulingGates, func(g corev1.PodSchedulingGate) bool { return g.Name == kueueAdmissionGate }) {
			n++
		}
	}
	return n
}

// Queued sets Queued from the pods and reports whether the gang waits in Kueue's queue, and
// whether its wait ended now.
func (t *ticket) Queued(pods []corev1.Pod) (queued, admittedNow bool) {
	st := &t.job.Status
	if n := queuedRanks(t.job, pods); n > 0 {
		t.host.SetCondition(trainingv1alpha1.ConditionQueued, metav1.ConditionTrue, trainingv1alpha1.ReasonWaitingForKueue,
			fmt.Sprintf("%d/%d ranks wait for Kueue to admit them (scheduling gate %s); activeDeadlineSeconds does not run out meanwhile",
				n, t.job.Width(), kueueAdmissionGate))
		return true, false
	}
	c := meta.FindStatusCondition(st.Conditions, trainingv1alpha1.ConditionQueued)
	if c == nil || c.Status != metav1.ConditionTrue {
		return false, false
	}
	waited := t.host.Now().Sub(c.LastTransitionTime.Time).Round(time.Second)
	t.host.SetCondition(trainingv1alpha1.ConditionQueued, metav1.ConditionFalse, trainingv1alpha1.ReasonAdmitted,
		fmt.Sprintf("Kueue admitted the gang after %s in the queue", waited))
	return false, true
}
