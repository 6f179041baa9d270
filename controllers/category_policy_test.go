package controllers

import (
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	trainingv1alpha1 "github.com/zaya-operator/zaya-operator/api/v1alpha1"
	"github.com/zaya-operator/zaya-operator/controllers/workerpod"
)

func quarantinedNames(job *trainingv1alpha1.ZayaTrainingJob) []string {
	var out []string
	for _, q := range job.Status.QuarantinedNodes {
		out = append(out, q.Name+"/"+q.Reason)
	}
	return out
}

// A GPU fault the runtime printed, on a node whose health signals stay green: the node is
// quarantined for the job and the gang recreated away from it (the rank's process has already
// restarted in place there and rejoined its peers).
func TestAHardwareFaultInARanksOwnWordsMovesItOffItsNode(t *testing.T) {
	h, job := inPlaceGang(t)
	fault := now.Add(-3 * time.Second)
	h.setPod(t, "llm-0-1", func(p *corev1.Pod) {
		restartedInPlace("n1", 1, 134, fault, fault.Add(time.Second))(p)
		p.Status.ContainerStatuses[0].LastTerminationState.Terminated.Message = gpuFaultLine
	})
	h.mustReconcile(t, job)
	got := h.get(t, job)
	st := got.Status
	if q := quarantinedNames(got); len(q) != 1 || q[0] != "n1/GPUHardware" {
		t.Errorf("quarantined %v, want n1 for GPUHardware", q)
	}
	if st.Restarts != 1 || st.InPlaceRestarts != 0 || st.LastRestartMode != trainingv1alpha1.RestartModeRecreate || st.Attempt() != 1 {
		t.Errorf("restarts %d (in place %d, mode %q, attempt %d): want the gang recreated", st.Restarts, st.InPlaceRestarts, st.LastRestartMode, st.Attempt())
	}
}

// Only the root quarantines: the peer whose collective timed out first keeps its node.
func TestACascadeNeverQuarantinesItsNode(t *testing.T) {
	h, job := recreateGang(t)
	h.setPod(t, "llm-0-0", exitedSaying("n0", 1, now, "", watchdogLine))
	h.setPod(t, "llm-0-2", exitedSaying("n2", 134, now.Add(time.Second), "", gpuFaultLine))
	h.mustReconcile(t, job)
	if q := quarantinedNames(h.get(t, job)); len(q) != 1 || q[0] != "n2/GPUHardware" {
		t.Errorf("quarantined %v, want only n2, the root's node", q)
	}
}

// A bug in the program fails fast: one restart (userCodeRestarts 1), then the job fails with
// the line that shows it, instead of burning the restart budget.
func TestTheProgramsOwnErrorFailsTheJobAfterUserCodeRestarts(t *testing.T) {
	h, job := recreateGang(t)
	bug := "Traceback (most recent call last):\n  File \"/app/train.py\", line 3, in <module>\nModuleNotFoundError: No module named 'flash_attn'"
	h.setPod(t, "llm-0-1", exitedSaying("n1", 1, now, "", bug))
	h.mustReconcile(t, job)
	got := h.get(t, job)
	if got.Status.Restarts != 1 || condition(got, "Failed") != nil {
		t.Fatalf("restarts %d, Failed %+v: want one restart first", got.Status.Restarts, condition(got, "Failed"))
	}
	// Attempt 1 fails the same way.
	for range 3 {
		h.mustReconcile(t, job)
		h.runAll(t)
	}
	later := now.Add(time.Minute)
	h.r.Clock = clockAt(later)
	h.setPod(t, workerpod.PodName(job, 1, 1), exitedSaying("n1", 1, later, "", bug))
	h.mustReconcile(t, job)
	got = h.get(t, job)
	c := condition(got, "Failed")
	if c == nil || c.Status != metav1.ConditionTrue || c.Reason != trainingv1alpha1.ReasonUserCodeError ||
		!strings.Contains(c.Message, "ModuleNotFoundError: No module named 'flash_attn'") {
		t.Fatalf("Failed = %+v, want UserCodeError quoting the line", c)
	}
	if got.Status.Restarts != 1 {
		t.Errorf("restarts %d, want the one allowed", got.Status.Restarts)
	}
}

// The program's own bug follows its rank to any node: it never counts against the node.
func TestTheProgramsOwnErrorsNeverQuarantineANode(t *testing.T) {
	h, job := inPlaceGang(t, func(j *trainingv1alpha1.ZayaTrainingJob) { j.Spec.FaultTolerance.UserCodeRestarts = ptr.To[int32](7) })
	bug := "panic: runtime error: index out of range [3] with length 3\n"
	for i := range 3 {
		at := now.Add(time.Duration(i) * time.Minute)
		h.r.Clock = clockAt(at.Add(time.Second))
		h.setPod(t, "llm-0-1", func(p *corev1.Pod) {
			restartedInPlace("n1", int32(i+1), 2, at, at.Add(time.Second))(p)
			p.Status.ContainerStatuses[0].LastTerminationState.Terminated.Message = bug
		})
		h.mustReconcile(t, job)
		back := at.Add(2 * time.Second)
		h.r.Clock = clockAt(back)
		for _, r := range []string{"llm-0-0", "llm-0-2"} {
			h.setPod(t, r, restartedInPlace("n"+r[len(r)-1:], int32(i+1), trainingv1alpha1.ExitStopped, at.Add(time.Second), back))
		}
		h.mustReconcile(t, job)
	}
	got := h.get(t, job)
	if q := quarantinedNames(got); len(q) != 0 || got.Status.InPlaceRestarts != 3 {
		t.Errorf("quarantined %v, in place %d: want three in-place restarts and no node blamed", q, got.Status.InPlaceRestarts)
	}
}
