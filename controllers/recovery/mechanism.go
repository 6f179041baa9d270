package recovery

import (
	"slices"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"

	"github.com/zaya-operator/zaya-operator/api/contract"
	trainingv1alpha1 "github.com/zaya-operator/zaya-operator/api/v1alpha1"
	"github.com/zaya-operator/zaya-operator/controllers/gang"
	"github.com/zaya-operator/zaya-operator/controllers/workerpod"
)

// WantedMechanism is what the spec asks the gang to restart with.
func WantedMechanism(ft *trainingv1alpha1.FaultToleranceSpec) trainingv1alpha1.RestartMechanism {
	switch {
	case ft.RestartMode == trainingv1alpha1.RestartModeRecreate || len(RestartRules(ft)) == 0:
		return trainingv1alpha1.RestartMechanismRecreate
	case ft.InPlaceMechanism == trainingv1alpha1.InPlaceMechanismSupervisor:
		return trainingv1alpha1.RestartMechanismSupervisor
	}
	return trainingv1alpha1.RestartMechanismRestartRules
}

// MechanismOf is what the job's new pods are set up with: what the spec asks, unless the pass
// found that the cluster drops restart rules (status.restartMechanism Recreate).
func MechanismOf(job *trainingv1alpha1.ZayaTrainingJob) trainingv1alpha1.RestartMechanism {
	m := WantedMechanism(&job.Spec.FaultTolerance)
	if m == trainingv1alpha1.RestartMechanismRestartRules && job.Status.RestartMechanism == trainingv1alpha1.RestartMechanismRecreate {
		return trainingv1alpha1.RestartMechanismRecreate
	}
	return m
}

// SetInPlace sets a new pod up for the job's mechanism: the worker container's restart rules,
// or the supervisor's pod restartPolicy, rule annotation and variable.
func SetInPlace(job *trainingv1alpha1.ZayaTrainingJob, pod *corev1.Pod, w *corev1.Container) {
	// The annotation is the operator's word on the pod, never the template's.
	delete(pod.Annotations, trainingv1alpha1.RestartExitCodesAnnotation)
	ft := &job.Spec.FaultTolerance
	switch MechanismOf(job) {
	case trainingv1alpha1.RestartMechanismRestartRules:
		SetRestartRules(w, ft, JobRestartRules(job))
	case trainingv1alpha1.RestartMechanismSupervisor:
		rules := JobRestartRules(job)
		if len(rules) == 0 {
			return // every exit fails the pod
		}
		rule := ruleOf(rules[0]).String()
		pod.Spec.RestartPolicy = corev1.RestartPolicyOnFailure
		if pod.Annotations == nil {
			pod.Annotations = map[string]string{}
		}
		pod.Annotations[trainingv1alpha1.RestartExitCodesAnnotation] = rule
		w.Env = append(w.Env, corev1.EnvVar{Name: trainingv1alpha1.EnvRestartExitCodes, Value: rule})
	}
}

// RestartedBy is the mechanism of a restart in mode whose root cause is pod (nil: none).
func RestartedBy(pod *corev1.Pod, mode trainingv1alpha1.RestartMode) trainingv1alpha1.RestartMechanism {
	if mode != trainingv1alpha1.RestartModeInPlace {
		return trainingv1alpha1.RestartMechanismRecreate
	}
	if pod != nil {
		if _, ok := SupervisorRule(pod); ok {
			return trainingv1alpha1.RestartMechanismSupervisor
		}
	}
	return trainingv1alpha1.RestartMechanismRestartRules
}

// ruleOf is a container restart rule as the supervisor reads it.
func ruleOf(r corev1.ContainerRestartRule) contract.RestartRule {
	return contract.RestartRule{In: r.ExitCodes.Operator == corev1.ContainerRestartRuleOnExitCodesOpIn, Codes: r.ExitCodes.Values}
}

// PodRestartRules are the rules that restart pod's worker in place: its container's, or the
// supervisor's rule of a supervised pod; nil when an exit fails the pod.
func PodRestartRules(pod *corev1.Pod) []corev1.ContainerRestartRule {
	if rules := pod.Spec.Containers[workerpod.WorkerContainer(&pod.Spec)].RestartPolicyRules; len(rules) > 0 {
		return rules
	}
	if r, ok := SupervisorRule(pod); ok {
		op := corev1.ContainerRestartRuleOnExitCodesOpNotIn
		if r.In {
			op = corev1.ContainerRestartRuleOnExitCodesOpIn
		}
		return []corev1.ContainerRestartRule{{Action: corev1.ContainerRestartRuleActionRestart,
			ExitCodes: &corev1.ContainerRestartRuleOnExitCodes{Operator: op, Values: r.Codes}}}
	}
	return nil
}

// SupervisorRule is the rule of a pod the operator set up for the supervisor.
func SupervisorRule(pod *corev1.Pod) (contract.RestartRule, bool) {
	s, ok := pod.Annotations[trainingv1alpha1.RestartExitCodesAnnotation]
	if !ok || pod.Spec.RestartPolicy != corev1.RestartPolicyOnFailure {
		return contract.RestartRule{}, false
	}
	r, err := contract.ParseRestartRule(s)
	return r, err == nil
}

// SupervisorExits reads zaya-supervisor's word on the pods: a supervised worker container that
// ended with exit 0 and an "exit-code=N" line (N not 0) failed with N, and its pod failed, as
// it would have under restart rules. Changed pods are copies: the list shares the cache's.
func SupervisorExits(pods []corev1.Pod) []corev1.Pod {
	for i := range pods {
		pod := &pods[i]
		if pod.Status.Phase == corev1.PodFailed {
			continue
		}
		if _, ok := SupervisorRule(pod); !ok {
			continue
		}
		s := gang.WorkerStatus(pod)
		if s == nil || s.State.Terminated == nil || s.State.Terminated.ExitCode != 0 {
			continue
		}
		code, ok := ReportedExitCode(s.State.Terminated.Message)
		if !ok {
			continue
		}
		out := *pod
		out.Status.ContainerStatuses = slices.Clone(pod.Status.ContainerStatuses)
		ws := gang.WorkerStatus(&out)
		t := *ws.State.Terminated
		t.ExitCode, t.Reason = code, "Error"
		ws.State = corev1.ContainerState{Terminated: &t}
		out.Status.Phase = corev1.PodFailed
		pods[i] = out
	}
	return pods
}

// ReportedExitCode is the code of the last "exit-code=N" line of a termination message, when
// it is a failure.
func ReportedExitCode(msg string) (int32, bool) {
	var code int32
	found := false
	for line := range strings.Lines(msg) {
		v, ok := strings.CutPrefix(strings.TrimSpace(line), trainingv1alpha1.TerminationMessageExitCodePrefix)
		if !ok {
			continue
		}
		if c, err := strconv.ParseInt(v, 10, 32); err == nil && c >= 0 && c <= 255 { // what an exit status can be
			code, found = int32(c), c != 0
		}
	}
	return code, found
}
