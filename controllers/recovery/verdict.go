package recovery

import (
	"fmt"
	"regexp"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	trainingv1alpha1 "github.com/zaya-operator/zaya-operator/api/v1alpha1"
	"github.com/zaya-operator/zaya-operator/controllers/bounded"
	"github.com/zaya-operator/zaya-operator/controllers/gang"
)

// Verdict is what a failure does to the job.
type Verdict struct {
	Failure trainingv1alpha1.JobFailure
	Fatal   bool        // fail the job, no restart
	Counted bool        // the restart counts against maxRestarts
	Pod     *corev1.Pod // the failed rank's pod, when one failed
}

// Stopped says whether the admission stopped pod, in its own words (admission.Gate's Stopped);
// nil: nothing stops pods but the cluster.
type Stopped func(pod *corev1.Pod) (by, why string, ok bool)

// disruptionReasons are pod failures caused by the cluster rather than the worker.
var disruptionReasons = map[string]string{
	"Evicted":                trainingv1alpha1.FailureReasonEvicted,
	"Preempting":             trainingv1alpha1.FailureReasonPreempted,
	"PreemptionByScheduler":  trainingv1alpha1.FailureReasonPreempted,
	"EvictionByEvictionAPI":  trainingv1alpha1.FailureReasonEvicted,
	"DeletionByTaintManager": trainingv1alpha1.FailureReasonNodeLost,
	"DeletionByPodGC":        trainingv1alpha1.FailureReasonNodeLost,
	"TerminationByKubelet":   trainingv1alpha1.FailureReasonEvicted,
	"NodeShutdown":           trainingv1alpha1.FailureReasonNodeLost,
	"Shutdown":               trainingv1alpha1.FailureReasonNodeLost,
	"Terminated":             trainingv1alpha1.FailureReasonNodeLost,
}

// Judge classifies the failure of a pod of the current attempt: a disruption by the cluster,
// a worker exit code (fatal, retryable or other, by spec.faultTolerance.exitCodes), or a pod
// deleted under the running gang.
func Judge(spec *trainingv1alpha1.ZayaTrainingJobSpec, pod *corev1.Pod, now time.Time, attempt int32, stopped Stopped) Verdict {
	f := failureOf(pod, now, attempt)
	ft := &spec.FaultTolerance
	disruption := func(reason string) Verdict {
		f.Reason = reason
		return Verdict{Failure: f, Counted: ft.DisruptionRestarts == trainingv1alpha1.DisruptionRestartsCounted}
	}
	if stopped != nil {
		if by, why, ok := stopped(pod); ok {
			// The admission stopped its workload (evicted, preempted, deactivated): the cluster's doing.
			f.Message = bounded.Message(fmt.Sprintf("%s stopped rank %d (pod %s): %s", by, *f.Rank, pod.Name, why))
			return disruption(trainingv1alpha1.FailureReasonPreempted)
		}
	}
	if c := gang.Condition(pod, corev1.DisruptionTarget); c != nil && c.Status == corev1.ConditionTrue {
		if r, ok := disruptionReasons[c.Reason]; ok {
			return disruption(r)
		}
		return disruption(trainingv1alpha1.FailureReasonEvicted)
	}
	if r, ok := disruptionReasons[pod.Status.Reason]; ok {
		return disruption(r)
	}
	if pod.Annotations[gang.VanishedAnnotation] != "" {
		f.Message = bounded.Message(fmt.Sprintf("rank %d (pod %s) vanished while the gang ran: deleted at once (forced, or its Node object removed)", *f.Rank, pod.Name))
		return disruption(trainingv1alpha1.FailureReasonPodDeleted)
	}
	if !pod.DeletionTimestamp.IsZero() && pod.Status.Phase != corev1.PodFailed {
		f.Message = bounded.Message(fmt.Sprintf("rank %d (pod %s on %s) was deleted while the gang ran", *f.Rank, pod.Name, pod.Spec.NodeName))
		return disruption(trainingv1alpha1.FailureReasonPodDeleted)
	}
	if Hung(pod) {
		f.Reason = trainingv1alpha1.FailureReasonHang
		return Verdict{Failure: f, Counted: true}
	}
	if f.ExitCode == nil {
		return Verdict{Failure: f, Counted: true}
	}
	code := *f.ExitCode
	switch {
	case slices.Contains(ft.ExitCodes.Fatal, code):
		f.Reason = trainingv1alpha1.FailureReasonFatalExitCode
		return Verdict{Failure: f, Fatal: true}
	case slices.Contains(ft.ExitCodes.Retryable, code), code == trainingv1alpha1.ExitStopped:
		// A worker that stopped because a peer did is worth a restart whatever other says.
		return Verdict{Failure: f, Counted: true}
	case ft.ExitCodes.Other == trainingv1alpha1.ExitCodeFail:
		f.Reason = trainingv1alpha1.FailureReasonFatalExitCode
		return Verdict{Failure: f, Fatal: true}
	}
	return Verdict{Failure: f, Counted: true}
}

// Hung reports whether the heartbeat probe killed the worker.
func Hung(pod *corev1.Pod) bool {
	msg, ok := gang.TerminationMessage(pod)
	if !ok {
		return false
	}
	for line := range strings.Lines(msg) {
		if strings.HasPrefix(strings.TrimSpace(line), trainingv1alpha1.TerminationMessageHangPrefix) {
			return true
		}
	}
	return false
}

// failureOf describes a failed pod.
func failureOf(pod *corev1.Pod, now time.Time, attempt int32) trainingv1alpha1.JobFailure {
	rank, _ := gang.Rank(pod)
	f := trainingv1alpha1.JobFailure{
		Time: metav1.Time{Time: now}, Attempt: attempt, Node: pod.Spec.NodeName,
		Rank: ptr.To(rank), Reason: trainingv1alpha1.FailureReasonExitCode,
	}
	what := "failed"
	if pod.Status.Reason != "" {
		f.Reason = podFailureReason(pod.Status.Reason)
		what = pod.Status.Reason
	}
	if s := gang.WorkerStatus(pod); s != nil && s.State.Terminated != nil {
		t := s.State.Terminated
		f.ExitCode = ptr.To(t.ExitCode)
		what = fmt.Sprintf("exited %d (%s)", t.ExitCode, t.Reason)
		if msg := strings.TrimSpace(t.Message); msg != "" {
			what += ": " + msg
		}
	} else if pod.Status.Message != "" {
		what += ": " + pod.Status.Message
	}
	node := pod.Spec.NodeName
	if node == "" {
		node = "no node"
	}
	f.Message = bounded.Message(fmt.Sprintf("rank %d (pod %s on %s) %s", rank, pod.Name, node, what))
	return f
}

// conditionReason is the pattern the API enforces on a condition's reason.
var conditionReason = regexp.MustCompile(`^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$`)

// podFailureReason turns a failed pod's status reason into a failure reason. Kubelet
// admission reasons such as OutOfamd.com/gpu are not valid condition reasons (a status
// write carrying one would be refused on every pass) and are unbounded as metric labels.
func podFailureReason(r string) string {
	if strings.HasPrefix(r, "OutOf") || r == "UnexpectedAdmissionError" || r == "NodeAffinity" ||
		len(r) > 64 || !conditionReason.MatchString(r) {
		return trainingv1alpha1.FailureReasonNodeRejected
	}
	return r
}
