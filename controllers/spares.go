package controllers

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	trainingv1alpha1 "github.com/zaya-operator/zaya-operator/api/v1alpha1"
	"github.com/zaya-operator/zaya-operator/controllers/admission"
	"github.com/zaya-operator/zaya-operator/controllers/bounded"
	"github.com/zaya-operator/zaya-operator/controllers/gang"
	"github.com/zaya-operator/zaya-operator/controllers/nodehealth"
	"github.com/zaya-operator/zaya-operator/controllers/recovery"
	"github.com/zaya-operator/zaya-operator/controllers/workerpod"
)

// Warm spares (faultTolerance.spares). A spare is a pod that holds a node as a rank would (the
// template's placement, the worker container's resources, GPUs and NICs) and runs nothing but
// a pause container. When an in-place restart replaces a rank's pod, the rank takes a ready
// spare's node: the spare is deleted and the new pod requires that node, so it neither waits
// for room nor competes for it. The gang always comes first: no spare is made until every
// rank is placed, and none is held while a rank waits for room.

// DefaultSpareImage is the spares' container image: it only has to hold the node.
const DefaultSpareImage = "registry.k8s.io/pause:3.10.2"

// spareGrace is a spare's grace period: the pause container stops at once, and its kubelet
// confirms before the node's devices are offered to the rank that takes them.
const spareGrace = 1

// spareName is the name of the job's spare i. Ranks are <job>-<attempt>-<rank>, so the two
// never meet.
func spareName(job *trainingv1alpha1.ZayaTrainingJob, i int32) string {
	return job.Name + "-spare-" + strconv.FormatInt(int64(i), 10)
}

// spareIndex reports whether pod is one of job's spares, by its name (which the pod mark
// covers, so a label cannot make a rank a spare), and which.
func spareIndex(job *trainingv1alpha1.ZayaTrainingJob, pod *corev1.Pod) (int32, bool) {
	s, ok := strings.CutPrefix(pod.Name, job.Name+"-spare-")
	if !ok {
		return 0, false
	}
	i, err := strconv.ParseInt(s, 10, 32)
	if err != nil || i < 0 || strconv.FormatInt(i, 10) != s {
		return 0, false
	}
	return int32(i), true
}

// splitSpares separates the job's spares from its ranks' pods.
func splitSpares(job *trainingv1alpha1.ZayaTrainingJob, pods []corev1.Pod) ([]corev1.Pod, []*corev1.Pod) {
	n := 0
	for i := range pods {
		if _, ok := spareIndex(job, &pods[i]); ok {
			n++
		}
	}
	if n == 0 {
		return pods, nil
	}
	ranks := make([]corev1.Pod, 0, len(pods)-n)
	spares := make([]*corev1.Pod, 0, n)
	for i := range pods {
		if _, ok := spareIndex(job, &pods[i]); ok {
			spares = append(spares, &pods[i])
		} else {
			ranks = append(ranks, pods[i])
		}
	}
	slices.SortFunc(spares, func(a, b *corev1.Pod) int { return strings.Compare(a.Name, b.Name) })
	return ranks, spares
}

// wantedSpares is how many spares the job holds: only ranks that restart in place are ever
// replaced alone.
func wantedSpares(job *trainingv1alpha1.ZayaTrainingJob) int32 {
	// (The admission may allow fewer: see ensureSpares.)
	if recovery.WantedMechanism(&job.Spec.FaultTolerance) == trainingv1alpha1.RestartMechanismRecreate {
		return 0
	}
	return min(max(job.Spec.FaultTolerance.Spares, 0), 16)
}

// newSparePod is the job's spare i: a rank's placement and resources (those of rank 0's pod,
// quarantined nodes avoided), holding them with one pause container.
func newSparePod(job *trainingv1alpha1.ZayaTrainingJob, i int32, image, sparePriorityClass string) *corev1.Pod {
	rank := newWorkerPod(job, nil, 0)
	rs := &rank.Spec
	w := &rs.Containers[workerpod.WorkerContainer(rs)]
	labels := map[string]string{}
	for k, v := range rank.Labels {
		if k != trainingv1alpha1.RankLabel && k != trainingv1alpha1.AttemptLabel && k != trainingv1alpha1.RoleLabel {
			labels[k] = v
		}
	}
	labels[trainingv1alpha1.SpareLabel] = strconv.FormatInt(int64(i), 10)
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			Name: spareName(job, i), Namespace: job.Namespace, Labels: labels,
			OwnerReferences: rank.OwnerReferences,
		},
		Spec: corev1.PodSpec{
			NodeSelector: rs.NodeSelector, Affinity: rs.Affinity, Tolerations: rs.Tolerations,
			TopologySpreadConstraints: rs.TopologySpreadConstraints,
			// Never the template's priority: an idle spare must not preempt another team's
			// running pods. The platform may name a class for spares (--spare-priority-class).
			PriorityClassName: sparePriorityClass, SchedulerName: rs.SchedulerName,
			// Where the rank it stands in for can run: its runtime class too.
			RuntimeClassName: rs.RuntimeClassName,
			ImagePullSecrets: rs.ImagePullSecrets, Overhead: rs.Overhead,
			RestartPolicy:                 corev1.RestartPolicyAlways,
			AutomountServiceAccountToken:  ptr.To(false),
			EnableServiceLinks:            ptr.To(false),
			TerminationGracePeriodSeconds: ptr.To[int64](spareGrace),
			// Restricted, whatever the template runs as: pause needs nothing.
			SecurityContext: &corev1.PodSecurityContext{
				RunAsNonRoot: ptr.To(true), RunAsUser: ptr.To[int64](65535), RunAsGroup: ptr.To[int64](65535),
				SeccompProfile: &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault},
			},
			Containers: []corev1.Container{{
				Name: "hold", Image: image, Resources: *w.Resources.DeepCopy(),
				SecurityContext: &corev1.SecurityContext{
					AllowPrivilegeEscalation: ptr.To(false), ReadOnlyRootFilesystem: ptr.To(true),
					Capabilities: &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}},
				},
			}},
		},
	}
}

// takeSpare picks a ready spare for a rank replaced off node failed and returns its node ("":
// none). The spare is deleted by ensureSpares; it is counted here.
func (p *pass) takeSpare(ctx context.Context, failed string) string {
	st := &p.job.Status
	for _, s := range p.spares {
		node := s.Spec.NodeName
		if !s.DeletionTimestamp.IsZero() || !gang.Ready(s) || node == "" || node == failed || p.quarantined(node) ||
			slices.ContainsFunc(st.Replacing, func(r trainingv1alpha1.ReplacedPod) bool { return r.SpareNode == node }) ||
			p.spareNodeUnfit(ctx, node) != "" {
			continue
		}
		st.SparesTaken = addCount(st.SparesTaken, 1)
		return node
	}
	return ""
}

// spareNodeUnfit says why a spare's node can no longer take a rank ("" if it can): it went
// unhealthy or was lost since the spare came up, or a job or the platform tainted it (the
// spare was placed before the taint; the rank would sit on a node everyone else avoids).
func (p *pass) spareNodeUnfit(ctx context.Context, name string) string {
	node := &corev1.Node{}
	if err := p.r.Get(ctx, client.ObjectKey{Name: name}, node); err != nil {
		if apierrors.IsNotFound(err) {
			_, msg := nodehealth.Problem(name, nil)
			return msg
		}
		return fmt.Sprintf("node %s could not be read: %v", name, err)
	}
	if _, msg := nodehealth.Problem(name, node); msg != "" {
		return msg
	}
	for _, t := range node.Spec.Taints {
		if t.Key == trainingv1alpha1.QuarantineTaintKey || t.Key == trainingv1alpha1.HardwareSuspectTaintKey {
			return fmt.Sprintf("node %s is tainted %s", name, t.Key)
		}
	}
	return ""
}

// spareRetry is how long a spare the kubelet refused (or that failed) stays before it is made
// again: a node that refuses it would otherwise see a new one every pass.
const spareRetry = 30 * time.Second

// ensureSpares deletes the spares that cannot serve (taken, surplus, finished, on a
// quarantined node, or held while a rank waits for room), makes the missing ones once every
// rank is placed, and reports how many are ready.
func (p *pass) ensureSpares(ctx context.Context, g gang.Gang) (time.Duration, error) {
	job := p.job
	want := p.admission.Spares(wantedSpares(job))
	if g.Unschedulable > 0 {
		want = 0 // the gang first
	}
	taken := map[string]bool{}
	for _, r := range job.Status.Replacing {
		if r.SpareNode != "" {
			taken[r.SpareNode] = true
		}
	}
	var drop []*corev1.Pod
	var retry time.Duration
	have := map[int32]bool{}
	var ready int32
	for _, s := range p.spares {
		i, _ := spareIndex(job, s)
		have[i] = true // a name still in use, deleting or not
		if !s.DeletionTimestamp.IsZero() {
			continue
		}
		if gang.Finished(s) && i < want && p.now.Sub(s.CreationTimestamp.Time) < spareRetry {
			// Refused or failed: kept (its name held) until spareRetry has passed since it was made.
			if left := spareRetry - p.now.Sub(s.CreationTimestamp.Time); retry == 0 || left < retry {
				retry = left
			}
			continue
		}
		if i >= want || gang.Finished(s) || taken[s.Spec.NodeName] || (s.Spec.NodeName != "" && p.quarantined(s.Spec.NodeName)) ||
			(s.Spec.NodeName != "" && gang.Ready(s) && p.spareNodeUnfit(ctx, s.Spec.NodeName) != "") {
			drop = append(drop, s)
			continue
		}
		if gang.Ready(s) {
			ready++
		}
	}
	job.Status.ReadySpares = ready
	if err := p.deletePods(ctx, drop, ptr.To[int64](spareGrace)); err != nil {
		return 0, err
	}
	if g.Scheduled < job.Spec.Nodes {
		return retry, nil // a rank's pod is still to be made or placed
	}
	var made []string
	var unhealthy []string
	listed := false
	for i := range want {
		if have[i] {
			continue
		}
		if !listed {
			var err error
			if unhealthy, err = p.unhealthyNodes(ctx); err != nil {
				return 0, err
			}
			listed = true
		}
		pod := newSparePod(job, i, p.r.spareImage(), p.r.SparePriorityClass)
		workerpod.PreferOtherNodes(&pod.Spec, unhealthy)
		p.admission.Place(pod, admission.Spares)
		p.marks.stamp(job, pod, p.r.Clock.Now()) // at the send: see markWindow
		if err := p.r.Create(ctx, pod); err != nil {
			// A spare is a convenience: a quota, a webhook or a name taken by another pod
			// costs the job its spare, never its ranks.
			p.warning(trainingv1alpha1.ReasonSpareUnavailable, "Create", "warm spare %s: %s", pod.Name, bounded.Message(err.Error()))
			continue
		}
		made = append(made, pod.Name)
	}
	if len(made) > 0 {
		p.acted(corev1.EventTypeNormal, trainingv1alpha1.ReasonSparesCreated, "Create", "created warm spares %s", strings.Join(made, ", "))
	}
	return retry, nil
}

// spareImage is the spares' container image.
func (r *ZayaTrainingJobReconciler) spareImage() string {
	if r.SpareImage != "" {
		return r.SpareImage
	}
	return DefaultSpareImage
}
