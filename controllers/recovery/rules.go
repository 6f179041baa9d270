package recovery

import (
	"slices"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/utils/ptr"

	trainingv1alpha1 "github.com/zaya-operator/zaya-operator/api/v1alpha1"
	"github.com/zaya-operator/zaya-operator/controllers/gang"
)

// RestartRules are the worker container's restart rules for the spec's exit-code policy:
// restart in place on exactly the codes judge would restart the gang on, so a fatal code
// still fails the pod (and the job). Exit 0 is never restarted: the rank is done.
func RestartRules(ft *trainingv1alpha1.FaultToleranceSpec) []corev1.ContainerRestartRule {
	var req corev1.ContainerRestartRuleOnExitCodes
	if ft.ExitCodes.Other == trainingv1alpha1.ExitCodeFail {
		var codes []int32
		for _, c := range append([]int32{trainingv1alpha1.ExitStopped}, ft.ExitCodes.Retryable...) {
			if !slices.Contains(codes, c) && !slices.Contains(ft.ExitCodes.Fatal, c) {
				codes = append(codes, c)
			}
		}
		if len(codes) == 0 {
			return nil // every exit fails the pod: nothing to restart in place
		}
		req = corev1.ContainerRestartRuleOnExitCodes{Operator: corev1.ContainerRestartRuleOnExitCodesOpIn, Values: codes}
	} else {
		codes := []int32{0}
		for _, c := range ft.ExitCodes.Fatal {
			if !slices.Contains(codes, c) {
				codes = append(codes, c)
			}
		}
		req = corev1.ContainerRestartRuleOnExitCodes{Operator: corev1.ContainerRestartRuleOnExitCodesOpNotIn, Values: codes}
	}
	slices.Sort(req.Values)
	return []corev1.ContainerRestartRule{{Action: corev1.ContainerRestartRuleActionRestart, ExitCodes: &req}}
}

// JobRestartRules are the job's rules: RestartRules, but an elastic job's worker that exits
// ExitNoResize is not restarted in place: its pod fails, for the operator to give the job its
// full width back (a worker that refuses its width would refuse it again in place).
func JobRestartRules(job *trainingv1alpha1.ZayaTrainingJob) []corev1.ContainerRestartRule {
	rules := RestartRules(&job.Spec.FaultTolerance)
	if job.Spec.Elastic == nil || len(rules) == 0 {
		return rules
	}
	req := *rules[0].ExitCodes
	if req.Operator == corev1.ContainerRestartRuleOnExitCodesOpIn {
		req.Values = slices.DeleteFunc(slices.Clone(req.Values), func(c int32) bool { return c == trainingv1alpha1.ExitNoResize })
		if len(req.Values) == 0 {
			return nil
		}
	} else if !slices.Contains(req.Values, trainingv1alpha1.ExitNoResize) {
		req.Values = append(slices.Clone(req.Values), trainingv1alpha1.ExitNoResize)
		slices.Sort(req.Values)
	}
	return []corev1.ContainerRestartRule{{Action: rules[0].Action, ExitCodes: &req}}
}

// SetRestartRules makes the worker container restart in place (restartMode InPlace) by rules.
// The container's restartPolicy must be set with rules; Never keeps the pod's own behaviour
// for every other exit.
func SetRestartRules(c *corev1.Container, ft *trainingv1alpha1.FaultToleranceSpec, rules []corev1.ContainerRestartRule) {
	if ft.RestartMode == trainingv1alpha1.RestartModeRecreate || len(rules) == 0 {
		return
	}
	c.RestartPolicy = ptr.To(corev1.ContainerRestartPolicyNever)
	c.RestartPolicyRules = rules
}

// Ended is pod as it was when its worker container's run ended with exit: what judge and
// the termination-message readers expect of a failed pod.
func Ended(pod *corev1.Pod, exit *corev1.ContainerStateTerminated) *corev1.Pod {
	out := &corev1.Pod{ObjectMeta: pod.ObjectMeta, Spec: pod.Spec, Status: pod.Status}
	out.Status.ContainerStatuses = slices.Clone(pod.Status.ContainerStatuses)
	if s := gang.WorkerStatus(out); s != nil {
		s.State = corev1.ContainerState{Terminated: exit}
	}
	out.Status.Phase = corev1.PodFailed
	return out
}

// LastExit is how pod's worker container last ended while the pod lives on: its current state
// if it exited (not 0: a rank that is done), else the run before its last restart.
func LastExit(pod *corev1.Pod) *corev1.ContainerStateTerminated {
	s := gang.WorkerStatus(pod)
	if s == nil || gang.Finished(pod) || len(PodRestartRules(pod)) == 0 {
		return nil // no rules: an exit fails the pod, which is the Recreate path's to see
	}
	if t := s.State.Terminated; t != nil {
		if t.ExitCode == 0 {
			return nil
		}
		return t
	}
	if s.RestartCount > 0 {
		return s.LastTerminationState.Terminated
	}
	return nil
}

// RulesRestart reports whether rules restart a container that exited with code.
func RulesRestart(rules []corev1.ContainerRestartRule, code int32) bool {
	for _, r := range rules {
		if r.ExitCodes == nil {
			continue
		}
		in := slices.Contains(r.ExitCodes.Values, code)
		if (r.ExitCodes.Operator == corev1.ContainerRestartRuleOnExitCodesOpIn) == in {
			return r.Action == corev1.ContainerRestartRuleActionRestart
		}
	}
	return false
}

// RestartBackoff is the wait before the k-th counted restart (k from 1).
func RestartBackoff(spec trainingv1alpha1.BackoffSpec, k int) time.Duration {
	if spec.Initial == nil || spec.Initial.Duration <= 0 || k <= 0 {
		return 0
	}
	limit := trainingv1alpha1.DefaultBackoffMax
	if spec.Max != nil {
		limit = spec.Max.Duration
	}
	b := wait.Backoff{Duration: spec.Initial.Duration, Factor: 2, Steps: k, Cap: limit}
	var d time.Duration
	for range min(k, 64) { // any initial of 1ns or more meets a cap of at most 1h within 42 doublings
		d = b.Step()
	}
	return min(d, limit)
}

// Replaceable reports whether v's rank can get a new pod while its peers restart in place:
// its node or pod is gone or unusable. A worker's own exit is the kubelet's to restart; a pod
// that failed on one its rules cover shows a kubelet without them (InPlaceUnsupported).
func Replaceable(v Verdict, ft *trainingv1alpha1.FaultToleranceSpec) bool {
	if v.Fatal || !ReplacesPods(ft) || v.Failure.Rank == nil {
		return false
	}
	switch v.Failure.Reason {
	case trainingv1alpha1.FailureReasonNodeLost, trainingv1alpha1.FailureReasonDeviceUnhealthy, trainingv1alpha1.FailureReasonEvicted,
		trainingv1alpha1.FailureReasonPreempted, trainingv1alpha1.FailureReasonPodDeleted, trainingv1alpha1.FailureReasonNodeRejected,
		trainingv1alpha1.FailureReasonStraggler:
		return true
	}
	return v.Pod != nil && v.Failure.ExitCode == nil && v.Pod.Status.Phase == corev1.PodFailed
}

// ReplacesPods reports whether the job's ranks restart in place, so one can be replaced alone.
func ReplacesPods(ft *trainingv1alpha1.FaultToleranceSpec) bool {
	return ft.RestartMode == trainingv1alpha1.RestartModeInPlace && len(RestartRules(ft)) > 0
}
