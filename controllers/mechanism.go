package controllers

import (
	"context"
	"errors"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/zaya-operator/zaya-operator/api/contract"
	trainingv1alpha1 "github.com/zaya-operator/zaya-operator/api/v1alpha1"
	"github.com/zaya-operator/zaya-operator/controllers/gang"
	"github.com/zaya-operator/zaya-operator/controllers/workerpod"
)

// What restarts a worker in its pod (faultTolerance.inPlaceMechanism), and how the operator
// reads it back. Either way the kubelet restarts the container, so the operator sees every
// in-place restart the same way (restartCount, the exit, the termination message):
//   - RestartRules: the worker container's restart rules (KEP-5307), on the API server's word
//     that it keeps them (rulesSupport finds out before pods are made);
//   - Supervisor: the pod's restartPolicy OnFailure restarts any failed container, and
//     zaya-supervisor in the worker container turns an exit the rule does not restart into
//     exit 0 plus an "exit-code=N" line (workers/supervisor), read back by supervisorExits.

// wantedMechanism is what the spec asks the gang to restart with.
func wantedMechanism(ft *trainingv1alpha1.FaultToleranceSpec) trainingv1alpha1.RestartMechanism {
	switch {
	case ft.RestartMode == trainingv1alpha1.RestartModeRecreate || len(restartRules(ft)) == 0:
		return trainingv1alpha1.RestartMechanismRecreate
	case ft.InPlaceMechanism == trainingv1alpha1.InPlaceMechanismSupervisor:
		return trainingv1alpha1.RestartMechanismSupervisor
	}
	return trainingv1alpha1.RestartMechanismRestartRules
}

// mechanismOf is what the job's new pods are set up with: what the spec asks, unless the pass
// found that the cluster drops restart rules (status.restartMechanism Recreate).
func mechanismOf(job *trainingv1alpha1.ZayaTrainingJob) trainingv1alpha1.RestartMechanism {
	m := wantedMechanism(&job.Spec.FaultTolerance)
	if m == trainingv1alpha1.RestartMechanismRestartRules && job.Status.RestartMechanism == trainingv1alpha1.RestartMechanismRecreate {
		return trainingv1alpha1.RestartMechanismRecreate
	}
	return m
}

// decideMechanism sets status.restartMechanism before this pass creates any pod, asking the
// API server (once in a while, for the whole operator) whether it keeps restart rules.
func (p *pass) decideMechanism(ctx context.Context) {
	st := &p.job.Status
	m := wantedMechanism(&p.job.Spec.FaultTolerance)
	if m == trainingv1alpha1.RestartMechanismRestartRules && !p.r.rules.kept(ctx, p.r, p.job.Namespace) {
		m = trainingv1alpha1.RestartMechanismRecreate
		if st.RestartMechanism != m {
			p.warning(trainingv1alpha1.ReasonInPlaceUnsupported, "Create",
				"the API server drops or refuses container restart rules (Kubernetes before 1.35, or the ContainerRestartRules feature gate is off): "+
					"this job restarts by recreating its pods; faultTolerance.inPlaceMechanism: Supervisor restarts in place on any version")
		}
	}
	st.RestartMechanism = m
}

// setInPlace sets a new pod up for the job's mechanism: the worker container's restart rules,
// or the supervisor's pod restartPolicy, rule annotation and variable.
func setInPlace(job *trainingv1alpha1.ZayaTrainingJob, pod *corev1.Pod, w *corev1.Container) {
	// The annotation is the operator's word on the pod, never the template's.
	delete(pod.Annotations, trainingv1alpha1.RestartExitCodesAnnotation)
	ft := &job.Spec.FaultTolerance
	switch mechanismOf(job) {
	case trainingv1alpha1.RestartMechanismRestartRules:
		setRestartRules(w, ft)
	case trainingv1alpha1.RestartMechanismSupervisor:
		rule := ruleOf(restartRules(ft)[0]).String()
		pod.Spec.RestartPolicy = corev1.RestartPolicyOnFailure
		if pod.Annotations == nil {
			pod.Annotations = map[string]string{}
		}
		pod.Annotations[trainingv1alpha1.RestartExitCodesAnnotation] = rule
		w.Env = append(w.Env, corev1.EnvVar{Name: trainingv1alpha1.EnvRestartExitCodes, Value: rule})
	}
}

// restartedBy is the mechanism of a restart in mode whose root cause is pod (nil: none).
func restartedBy(pod *corev1.Pod, mode trainingv1alpha1.RestartMode) trainingv1alpha1.RestartMechanism {
	if mode != trainingv1alpha1.RestartModeInPlace {
		return trainingv1alpha1.RestartMechanismRecreate
	}
	if pod != nil {
		if _, ok := supervisorRule(pod); ok {
			return trainingv1alpha1.RestartMechanismSupervisor
		}
	}
	return trainingv1alpha1.RestartMechanismRestartRules
}

// ruleOf is a container restart rule as the supervisor reads it.
func ruleOf(r corev1.ContainerRestartRule) contract.RestartRule {
	return contract.RestartRule{In: r.ExitCodes.Operator == corev1.ContainerRestartRuleOnExitCodesOpIn, Codes: r.ExitCodes.Values}
}

// podRestartRules are the rules that restart pod's worker in place: its container's, or the
// supervisor's rule of a supervised pod; nil when an exit fails the pod.
func podRestartRules(pod *corev1.Pod) []corev1.ContainerRestartRule {
	if rules := pod.Spec.Containers[workerpod.WorkerContainer(&pod.Spec)].RestartPolicyRules; len(rules) > 0 {
		return rules
	}
	if r, ok := supervisorRule(pod); ok {
		op := corev1.ContainerRestartRuleOnExitCodesOpNotIn
		if r.In {
			op = corev1.ContainerRestartRuleOnExitCodesOpIn
		}
		return []corev1.ContainerRestartRule{{Action: corev1.ContainerRestartRuleActionRestart,
			ExitCodes: &corev1.ContainerRestartRuleOnExitCodes{Operator: op, Values: r.Codes}}}
	}
	return nil
}

// supervisorRule is the rule of a pod the operator set up for the supervisor.
func supervisorRule(pod *corev1.Pod) (contract.RestartRule, bool) {
	s, ok := pod.Annotations[trainingv1alpha1.RestartExitCodesAnnotation]
	if !ok || pod.Spec.RestartPolicy != corev1.RestartPolicyOnFailure {
		return contract.RestartRule{}, false
	}
	r, err := contract.ParseRestartRule(s)
	return r, err == nil
}

// supervisorExits reads zaya-supervisor's word on the pods: a supervised worker container that
// ended with exit 0 and an "exit-code=N" line (N not 0) failed with N, and its pod failed, as
// it would have under restart rules. Changed pods are copies: the list shares the cache's.
func supervisorExits(pods []corev1.Pod) []corev1.Pod {
	for i := range pods {
		pod := &pods[i]
		if pod.Status.Phase == corev1.PodFailed {
			continue
		}
		if _, ok := supervisorRule(pod); !ok {
			continue
		}
		s := gang.WorkerStatus(pod)
		if s == nil || s.State.Terminated == nil || s.State.Terminated.ExitCode != 0 {
			continue
		}
		code, ok := reportedExitCode(s.State.Terminated.Message)
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

// reportedExitCode is the code of the last "exit-code=N" line of a termination message, when
// it is a failure.
func reportedExitCode(msg string) (int32, bool) {
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

// rulesSupport is the API server's answer on restart rules, shared by every job: whether a
// pod created with them comes back with them. It asks again after rulesRecheck (the cluster
// may be upgraded under the operator) and, after an error, assumes they are kept (an exit the
// kubelet did not restart is still caught: InPlaceUnsupported) and asks again sooner.
type rulesSupport struct {
	mu      sync.Mutex
	known   bool
	isKept  bool
	asked   time.Time
	checked time.Time
}

const (
	rulesRecheck = 10 * time.Minute
	rulesRetry   = time.Minute
)

// kept reports whether the API server keeps container restart rules, asking it with a
// dry-run pod in namespace when the last answer is stale.
func (s *rulesSupport) kept(ctx context.Context, r *ZayaTrainingJobReconciler, namespace string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := r.Clock.Now()
	if (s.known && now.Sub(s.checked) < rulesRecheck) || (!s.known && !s.asked.IsZero() && now.Sub(s.asked) < rulesRetry) {
		return !s.known || s.isKept
	}
	s.asked = now
	probe := rulesProbe(namespace)
	if err := r.Create(ctx, probe, client.DryRunAll); refusesRestartRules(err) {
		// Before 1.34 the API server knows restartPolicy on init containers (sidecars) only,
		// and refuses it on others: an answer, not an error.
		s.known, s.checked, s.isKept = true, now, false
		return false
	} else if err != nil {
		log.FromContext(ctx).Info("could not ask the API server whether it keeps container restart rules; assuming it does", "error", err.Error())
		s.known = false
		return true
	}
	s.known, s.checked = true, now
	s.isKept = len(probe.Spec.Containers[0].RestartPolicyRules) > 0
	return s.isKept
}

// refusesRestartRules says whether err is the API server refusing a container's restart
// policy or rules as fields it does not allow.
func refusesRestartRules(err error) bool {
	var status apierrors.APIStatus
	if !apierrors.IsInvalid(err) || !errors.As(err, &status) || status.Status().Details == nil {
		return false
	}
	for _, c := range status.Status().Details.Causes {
		if strings.HasPrefix(c.Field, "spec.containers[0].restartPolicy") {
			return true
		}
	}
	return false
}

// rulesProbe is the dry-run pod that asks: never stored, never scheduled. It passes the
// restricted Pod Security level so a namespace enforcing it does not refuse the question.
func rulesProbe(namespace string) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{GenerateName: "zaya-restart-rules-probe-", Namespace: namespace},
		Spec: corev1.PodSpec{
			RestartPolicy:                corev1.RestartPolicyNever,
			AutomountServiceAccountToken: ptr.To(false),
			SecurityContext: &corev1.PodSecurityContext{
				RunAsNonRoot:   ptr.To(true),
				SeccompProfile: &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault},
			},
			Containers: []corev1.Container{{
				Name: "probe", Image: "zaya.invalid/restart-rules-probe",
				RestartPolicy: ptr.To(corev1.ContainerRestartPolicyNever),
				RestartPolicyRules: []corev1.ContainerRestartRule{{Action: corev1.ContainerRestartRuleActionRestart,
					ExitCodes: &corev1.ContainerRestartRuleOnExitCodes{Operator: corev1.ContainerRestartRuleOnExitCodesOpIn, Values: []int32{75}}}},
				SecurityContext: &corev1.SecurityContext{
					AllowPrivilegeEscalation: ptr.To(false),
					Capabilities:             &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}},
				},
			}},
		},
	}
}
