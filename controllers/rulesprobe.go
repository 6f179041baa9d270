package controllers

import (
	"context"
	"errors"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"
)

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

// kept reports whether the API server keeps container restart rules, asking it through c with
// a dry-run pod in namespace when the last answer (as of now) is stale.
func (s *rulesSupport) kept(ctx context.Context, c client.Writer, now time.Time, namespace string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if (s.known && now.Sub(s.checked) < rulesRecheck) || (!s.known && !s.asked.IsZero() && now.Sub(s.asked) < rulesRetry) {
		return !s.known || s.isKept
	}
	s.asked = now
	probe := rulesProbe(namespace)
	if err := c.Create(ctx, probe, client.DryRunAll); refusesRestartRules(err) {
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
