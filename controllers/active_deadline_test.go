package controllers

import (
	"math"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	"github.com/zaya-operator/zaya-operator/internal/testjob"
)

// TestHugeValuesStoredByOlderSchemasDoNotOverflow: a deadline beyond time.Duration is no
// deadline (not one in the past), a hang timeout beyond int32 seconds is the largest probe,
// and a negative restart counter is attempt 0, not an invalid label.
func TestHugeValuesStoredByOlderSchemasDoNotOverflow(t *testing.T) {
	job := testjob.MakeZayaTrainingJob("llm", "ns").Nodes(1).Generation(1).Defaulted().Obj()
	job.Spec.ActiveDeadlineSeconds = ptr.To[int64](math.MaxInt64)
	job.Spec.FaultTolerance.HangTimeout = &metav1.Duration{Duration: time.Duration(math.MaxInt64)}
	job.Status.StartTime = &metav1.Time{Time: now.Add(-time.Hour)}
	job.Status.Restarts = -3
	h := newHarness(t, interceptor.Funcs{}, job)
	h.mustReconcile(t, job)
	got := h.get(t, job)
	if c := condition(got, "Failed"); c != nil {
		t.Fatalf("Failed = %+v: the deadline overflowed", c)
	}
	pod, ok := h.pods(t)["llm-0-0"]
	if !ok {
		t.Fatalf("pods %v, want llm-0-0", keys(h.pods(t)))
	}
	if p := pod.Spec.Containers[0].LivenessProbe; p == nil || p.InitialDelaySeconds != math.MaxInt32 {
		t.Errorf("liveness probe %+v, want the largest delay", p)
	}
}
