package recovery

import (
	"errors"
	"strings"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
)

// RefusesRestartRules says whether err is the API server refusing a container's restart
// policy or rules as fields it does not allow.
func RefusesRestartRules(err error) bool {
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

// RulesProbe is the dry-run pod that asks the API server whether it keeps container restart
// rules (RulesKept of what a dry-run create returns; RefusesRestartRules of its error): never
// stored, never scheduled. It passes the restricted Pod Security level so a namespace
// enforcing it does not refuse the question.
func RulesProbe(namespace string) *corev1.Pod {
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

// RulesKept reports whether the API server kept the probe's restart rules.
func RulesKept(probe *corev1.Pod) bool { return len(probe.Spec.Containers[0].RestartPolicyRules) > 0 }
