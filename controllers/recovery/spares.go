package recovery

import (
	"slices"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	trainingv1alpha1 "github.com/zaya-operator/zaya-operator/api/v1alpha1"
	"github.com/zaya-operator/zaya-operator/controllers/workerpod"
)

// Warm spares (faultTolerance.spares): pods of the job that hold a node each, with a rank's
// placement and resources, so that a rank whose node is lost gets a node at once. Which pods
// are spares, how many the job wants and what a spare is; the core makes, takes and deletes
// them.

// DefaultSpareImage is the spares' container image: it only has to hold the node.
const DefaultSpareImage = "registry.k8s.io/pause:3.10.2"

// SpareGrace is a spare's grace period: the pause container stops at once, and its kubelet
// confirms before the node's devices are offered to the rank that takes them.
const SpareGrace = 1

// SpareName is the name of the job's spare i. Ranks are <job>-<attempt>-<rank>, so the two
// never meet.
func SpareName(job *trainingv1alpha1.ZayaTrainingJob, i int32) string {
	return job.Name + "-spare-" + strconv.FormatInt(int64(i), 10)
}

// SpareIndex reports whether pod is one of job's spares, by its name (which the pod mark
// covers, so a label cannot make a rank a spare), and which.
func SpareIndex(job *trainingv1alpha1.ZayaTrainingJob, pod *corev1.Pod) (int32, bool) {
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

// SplitSpares separates the job's spares from its ranks' pods.
func SplitSpares(job *trainingv1alpha1.ZayaTrainingJob, pods []corev1.Pod) ([]corev1.Pod, []*corev1.Pod) {
	n := 0
	for i := range pods {
		if _, ok := SpareIndex(job, &pods[i]); ok {
			n++
		}
	}
	if n == 0 {
		return pods, nil
	}
	ranks := make([]corev1.Pod, 0, len(pods)-n)
	spares := make([]*corev1.Pod, 0, n)
	for i := range pods {
		if _, ok := SpareIndex(job, &pods[i]); ok {
			spares = append(spares, &pods[i])
		} else {
			ranks = append(ranks, pods[i])
		}
	}
	slices.SortFunc(spares, func(a, b *corev1.Pod) int { return strings.Compare(a.Name, b.Name) })
	return ranks, spares
}

// WantedSpares is how many spares the job holds: its warm spares, then the grow holders of a
// shrunk elastic job (GrowHolders), spares of the higher indices.
func WantedSpares(job *trainingv1alpha1.ZayaTrainingJob) int32 {
	// (The admission may allow fewer: see restart.Executor.EnsureSpares.)
	return warmSpares(job) + GrowHolders(job)
}

// warmSpares is faultTolerance.spares: only ranks that restart in place are ever replaced alone.
func warmSpares(job *trainingv1alpha1.ZayaTrainingJob) int32 {
	if WantedMechanism(&job.Spec.FaultTolerance) == trainingv1alpha1.RestartMechanismRecreate {
		return 0
	}
	return min(max(job.Spec.FaultTolerance.Spares, 0), 16)
}

// HoldersOf are the job's grow holders among its spares: those past its warm spares.
func HoldersOf(job *trainingv1alpha1.ZayaTrainingJob, spares []*corev1.Pod) []*corev1.Pod {
	warm := warmSpares(job)
	var out []*corev1.Pod
	for _, s := range spares {
		if i, ok := SpareIndex(job, s); ok && i >= warm {
			out = append(out, s)
		}
	}
	return out
}

// SparePod is the job's spare i: rank's placement and resources (rank 0's pod as the core
// renders it, quarantined nodes avoided), holding them with one pause container.
func SparePod(job *trainingv1alpha1.ZayaTrainingJob, rank *corev1.Pod, i int32, image, sparePriorityClass string) *corev1.Pod {
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
			Name: SpareName(job, i), Namespace: job.Namespace, Labels: labels,
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
			TerminationGracePeriodSeconds: ptr.To[int64](SpareGrace),
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
