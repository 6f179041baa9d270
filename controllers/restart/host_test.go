package restart

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	trainingv1alpha1 "github.com/zaya-operator/zaya-operator/api/v1alpha1"
)

// host is a pass reduced to what the executor asks of it: it records events and runs
// WhenStored's records at once.
type host struct {
	job     *trainingv1alpha1.ZayaTrainingJob
	events  []string
	failed  string
	refuse  error // of every CreateSpare
	creates int
}

func (h *host) SetCondition(condType string, status metav1.ConditionStatus, reason, message string) bool {
	return h.job != nil && meta.SetStatusCondition(&h.job.Status.Conditions, metav1.Condition{Type: condType, Status: status, Reason: reason, Message: message})
}

func (h *host) Fail(reason, message string) { h.failed = reason + ": " + message }

func (h *host) Normal(reason, action, format string, args ...any) {
	h.events = append(h.events, "Normal "+reason+" "+fmt.Sprintf(format, args...))
}

func (h *host) Warning(reason, action, format string, args ...any) {
	h.events = append(h.events, "Warning "+reason+" "+fmt.Sprintf(format, args...))
}

func (h *host) Acted(eventType, reason, action, format string, args ...any) {
	h.events = append(h.events, eventType+" "+reason+" "+fmt.Sprintf(format, args...))
}

func (h *host) WhenStored(record func()) { record() }

func (h *host) Loss() Loss { return noLoss{} }

func (h *host) DeletePods(context.Context, []*corev1.Pod, *int64) error { return nil }

func (h *host) Spares(want int32) int32 { return want }

func (h *host) CreateSpare(_ context.Context, i int32) (string, error) {
	h.creates++
	return fmt.Sprintf("spare-%d", i), h.refuse
}

func (h *host) NamespaceGoing(context.Context) bool { return false }

type noLoss struct{}

func (noLoss) Failed(context.Context, trainingv1alpha1.JobFailure, []string) {}
func (noLoss) Broken()                                                       {}
func (noLoss) Reroot(trainingv1alpha1.JobFailure)                            {}
