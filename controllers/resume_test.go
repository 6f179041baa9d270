package controllers

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	trainingv1alpha1 "github.com/zaya-operator/zaya-operator/api/v1alpha1"
	"github.com/zaya-operator/zaya-operator/controllers/gang"
	"github.com/zaya-operator/zaya-operator/internal/testjob"
)

func withTermination(code int32, msg string) func(*corev1.Pod) {
	return func(p *corev1.Pod) {
		exited("n", code, now)(p)
		p.Status.ContainerStatuses[0].State.Terminated.Message = msg
	}
}

// An attempt that found its newest steps corrupt says so: status names the step restored,
// the steps moved aside and the steps lost, and one warning says why.
func TestAnAttemptsRestoredStepAndCorruptStepsAreShown(t *testing.T) {
	job := testjob.MakeZayaTrainingJob("llm", "ns").Nodes(2).Generation(1).Defaulted().Obj()
	h := newHarness(t, interceptor.Funcs{}, job)
	h.mustReconcile(t, job)
	h.setPod(t, "llm-0-1", running("n1"))
	// Rank 0 fails; its message says what the attempt restored. Rank 1 runs on, silent.
	h.setPod(t, "llm-0-0", withTermination(1, strings.Join([]string{
		"checkpoint-restored=1200",
		"zaya: checkpoint-corrupt: step=1400 moved to corrupt-step-1400-1: rank-1.a0.bin: crc32c mismatch",
		"zaya: checkpoint-corrupt: step=1300 moved to corrupt-step-1300-1: manifest.json: torn",
		"checkpoint-step=1200",
	}, "\n")))
	h.mustReconcile(t, job)
	got := h.get(t, job)
	rs := got.Status.LastResume
	if rs == nil || rs.Attempt != 0 || rs.Step != 1200 || !slices.Equal(rs.CorruptSteps, []int64{1400, 1300}) || rs.StepsLost != 200 {
		t.Fatalf("lastResume = %+v, want attempt 0 from 1200, corrupt [1400 1300], 200 steps lost", rs)
	}
	if got.Status.Restarts != 1 {
		t.Errorf("restarts = %d: the failure was not acted on in the same pass", got.Status.Restarts)
	}
	want := []trainingv1alpha1.CorruptCheckpoint{
		{Step: 1300, MovedTo: "corrupt-step-1300-1", Reason: "manifest.json: torn"},
		{Step: 1400, MovedTo: "corrupt-step-1400-1", Reason: "rank-1.a0.bin: crc32c mismatch"},
	}
	if diff := cmp.Diff(want, got.Status.CorruptCheckpoints, cmpopts.IgnoreFields(trainingv1alpha1.CorruptCheckpoint{}, "Time")); diff != "" {
		t.Errorf("corruptCheckpoints (-want +got):\n%s", diff)
	}
	var warnings, restored []string
	for _, e := range h.drainEvents() {
		switch {
		case strings.Contains(e, trainingv1alpha1.ReasonCheckpointCorrupt):
			warnings = append(warnings, e)
		case strings.Contains(e, trainingv1alpha1.ReasonCheckpointRestored):
			restored = append(restored, e)
		}
	}
	if len(warnings) != 1 || !strings.Contains(warnings[0], "crc32c mismatch") || !strings.Contains(warnings[0], "step 1300") {
		t.Errorf("CheckpointCorrupt events %q, want one naming both steps and their reasons", warnings)
	}
	if len(restored) != 1 || !strings.Contains(restored[0], "losing 200 steps") {
		t.Errorf("CheckpointRestored events %q, want one naming the loss", restored)
	}

	// The next attempt reports a clean resume from the same step.
	for range 3 {
		h.mustReconcile(t, job)
	}
	h.setPod(t, "llm-1-0", withTermination(0, "checkpoint-restored=1200\ncheckpoint-step=1500"))
	h.setPod(t, "llm-1-1", withTermination(0, "checkpoint-restored=1200\ncheckpoint-step=1500"))
	h.mustReconcile(t, job)
	if rs := h.get(t, job).Status.LastResume; rs == nil || rs.Attempt != 1 || rs.Step != 1200 || len(rs.CorruptSteps) != 0 || rs.StepsLost != 0 {
		t.Errorf("lastResume = %+v, want attempt 1 from 1200, nothing corrupt", rs)
	}
	if ev := h.drainEvents(); slices.ContainsFunc(ev, func(e string) bool { return strings.Contains(e, trainingv1alpha1.ReasonCheckpointCorrupt) }) {
		t.Errorf("events %q: the corrupt steps were reported again", ev)
	}
}

func TestResumeReportsIgnoreGarbageAndListingOrder(t *testing.T) {
	pod := func(msg string) *corev1.Pod {
		p := &corev1.Pod{Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "worker"}}}}
		withTermination(1, msg)(p)
		return p
	}
	for msg, want := range map[string]int64{
		"checkpoint-restored=42":                   42,
		"  checkpoint-restored=0 \nbye":            0,
		"checkpoint-restored=-3":                   -1,
		"checkpoint-restored=99999999999999999999": -1,
		"restored=5":                               -1,
	} {
		if got := gang.ReportedResume(pod(msg)).Step; got != want {
			t.Errorf("%q: step %d, want %d", msg, got, want)
		}
	}
	if c := gang.ReportedResume(pod("zaya: checkpoint-corrupt: step=x moved\nzaya: checkpoint-corrupt: oops")).Corrupt; len(c) != 0 {
		t.Errorf("malformed corrupt lines read as %+v", c)
	}
	many := strings.Repeat("zaya: checkpoint-corrupt: step=7 again\n", 100)
	if c := gang.ReportedResume(pod(many)).Corrupt; len(c) > gang.MaxCorruptReported {
		t.Errorf("%d corrupt lines kept, want at most %d", len(c), gang.MaxCorruptReported)
	}

	a := gang.ReportedResume(pod("checkpoint-restored=10\nzaya: checkpoint-corrupt: step=30 x\nzaya: checkpoint-corrupt: step=20 y"))
	b := gang.ReportedResume(pod("checkpoint-restored=10\nzaya: checkpoint-corrupt: step=20 y\nzaya: checkpoint-corrupt: step=40 z"))
	ab, ba := gang.ResumeReport{Step: -1}, gang.ResumeReport{Step: -1}
	ab.Merge(a)
	ab.Merge(b)
	ba.Merge(b)
	ba.Merge(a)
	if ab.Step != 10 || len(ab.Corrupt) != 3 || ab.Corrupt[0].Step != 40 || !slices.Equal(ab.Corrupt, ba.Corrupt) {
		t.Errorf("merged %+v and %+v: want step 10, steps 40, 30, 20 in either order", ab, ba)
	}

	// Rank 0 says where a step went and why, the others only that it moved: rank 0's account
	// wins in either order.
	short := gang.ReportedResume(pod("checkpoint-restored=10\nzaya: checkpoint-corrupt: step=20 moved aside by rank 0"))
	long := gang.ReportedResume(pod("checkpoint-restored=10\nzaya: checkpoint-corrupt: step=20 moved to corrupt-step-20-1: rank-00001.a0.bin: crc32c mismatch"))
	for _, order := range [][]gang.ResumeReport{{short, long}, {long, short}} {
		m := gang.ResumeReport{Step: -1}
		m.Merge(order[0])
		m.Merge(order[1])
		if len(m.Corrupt) != 1 || !strings.Contains(m.Corrupt[0].Detail, "crc32c") {
			t.Errorf("merged %+v, want rank 0's account of step 20", m.Corrupt)
		}
	}
}

// A run restarted in place says what it restored only as it ends, when the next fault ends it:
// the kubelet has restarted it by then, so its words are in lastState, and the operator may
// have counted that fault already. The chaos soak's in-place run lost a corrupt checkpoint's
// report this way (no CheckpointCorrupt event).
func TestAnInPlaceRestartsResumeIsReportedWhenItsRunsEnd(t *testing.T) {
	corrupt := "checkpoint-restored=160\nzaya: checkpoint-corrupt: step=180 moved to corrupt-step-180-1: manifest.json: crc32c mismatch\ncheckpoint-step=200\nzaya: stopped: lost rank 2 at step 203: EOF\n"
	saying := func(msg string, f func(*corev1.Pod)) func(*corev1.Pod) {
		return func(p *corev1.Pod) {
			f(p)
			p.Status.ContainerStatuses[0].LastTerminationState.Terminated.Message = msg
		}
	}
	for _, tc := range []struct {
		name string
		// whether the peers' exits are seen before the operator counts the killed rank's
		peersFirst bool
	}{{"seen before the next fault is counted", true}, {"seen once it is counted", false}} {
		t.Run(tc.name, func(t *testing.T) {
			h, job := inPlaceGang(t)
			// Fault 1: rank 1 killed; its peers stop and every rank comes back.
			f1 := now.Add(-time.Minute)
			h.setPod(t, "llm-0-1", saying("", restartedInPlace("node-llm-0-1", 1, 137, f1, f1.Add(time.Second))))
			h.mustReconcile(t, job)
			h.setPod(t, "llm-0-0", saying("checkpoint-restored=0\n", restartedInPlace("node-llm-0-0", 1, trainingv1alpha1.ExitStopped, f1, f1.Add(time.Second))))
			h.setPod(t, "llm-0-2", saying("checkpoint-restored=0\n", restartedInPlace("node-llm-0-2", 1, trainingv1alpha1.ExitStopped, f1, f1.Add(time.Second))))
			h.mustReconcile(t, job)
			if st := h.get(t, job).Status; st.Restarts != 1 || meta.FindStatusCondition(st.Conditions, trainingv1alpha1.ConditionRestarting).Reason != trainingv1alpha1.ReasonRecovered {
				t.Fatalf("after fault 1: restarts %d, conditions %+v", st.Restarts, st.Conditions)
			}
			h.drainEvents()

			// The runs of restart 1 found step 180 corrupt and resumed from 160. Fault 2 (rank
			// 2 killed) ends them: their words come now.
			f2 := now.Add(-5 * time.Second)
			peers := func() {
				h.setPod(t, "llm-0-0", saying(corrupt, restartedInPlace("node-llm-0-0", 2, trainingv1alpha1.ExitStopped, f2, f2.Add(time.Second))))
				h.setPod(t, "llm-0-1", saying(corrupt, restartedInPlace("node-llm-0-1", 2, trainingv1alpha1.ExitStopped, f2, f2.Add(time.Second))))
			}
			if tc.peersFirst {
				peers()
			}
			h.setPod(t, "llm-0-2", saying("", restartedInPlace("node-llm-0-2", 2, 137, f2.Add(-time.Second), f2)))
			h.mustReconcile(t, job)
			if !tc.peersFirst {
				if rs := h.get(t, job).Status.LastResume; rs != nil && rs.Attempt == 1 {
					t.Fatalf("lastResume %+v for restart 1 before its runs said anything", rs)
				}
				peers()
				h.mustReconcile(t, job)
			}
			st := h.get(t, job).Status
			if st.Restarts != 2 {
				t.Fatalf("restarts %d, want 2", st.Restarts)
			}
			if rs := st.LastResume; rs == nil || rs.Attempt != 1 || rs.Step != 160 || !slices.Equal(rs.CorruptSteps, []int64{180}) || rs.StepsLost != 20 {
				t.Fatalf("lastResume = %+v, want restart 1's: from 160, step 180 corrupt, 20 steps lost", rs)
			}
			if ev := h.drainEvents(); !slices.ContainsFunc(ev, func(e string) bool {
				return strings.Contains(e, trainingv1alpha1.ReasonCheckpointCorrupt) && strings.Contains(e, "crc32c mismatch")
			}) {
				t.Errorf("events %q, want a CheckpointCorrupt warning", ev)
			}
		})
	}
}

// A device's health takes the gang away: no rank exited before the recreate was decided, and
// the old ranks say what they restored only as they stop under it (the chaos soak's Recreate
// run lost a corrupt checkpoint's report this way, seed 3016121566).
func TestARecreatedAttemptsResumeIsReportedAsItsPodsStop(t *testing.T) {
	job := testjob.MakeZayaTrainingJob("llm", "ns").Nodes(2).Generation(1).RestartMode(trainingv1alpha1.RestartModeRecreate).Defaulted().Obj()
	h := newHarness(t, interceptor.Funcs{}, job)
	h.mustReconcile(t, job)
	for r := range 2 {
		h.setPod(t, fmt.Sprintf("llm-0-%d", r), func(p *corev1.Pod) {
			running(fmt.Sprintf("n%d", r))(p)
			p.Finalizers = []string{"test/keep"} // a kubelet takes its time: the pod stays Terminating
		})
	}
	h.mustReconcile(t, job)
	h.setNode(t, "n1", func(n *corev1.Node) { n.Status.Allocatable["amd.com/gpu"] = resource.MustParse("7") })
	h.mustReconcile(t, job) // the recreate decided
	h.mustReconcile(t, job) // the old gang deleted
	if st := h.get(t, job).Status; st.Restarts != 1 || st.LastResume != nil {
		t.Fatalf("restarts %d, lastResume %+v: want the recreate counted, nothing reported yet", st.Restarts, st.LastResume)
	}
	h.drainEvents()
	report := "checkpoint-restored=160\nzaya: checkpoint-corrupt: step=180 moved to corrupt-step-180-1: manifest.json: crc32c mismatch\ncheckpoint-step=200\n"
	for r := range 2 {
		h.setPod(t, fmt.Sprintf("llm-0-%d", r), withTermination(143, report))
	}
	h.mustReconcile(t, job)
	if rs := h.get(t, job).Status.LastResume; rs == nil || rs.Attempt != 0 || rs.Step != 160 || !slices.Equal(rs.CorruptSteps, []int64{180}) {
		t.Fatalf("lastResume = %+v, want attempt 0's: from 160, step 180 corrupt", rs)
	}
	if ev := h.drainEvents(); !slices.ContainsFunc(ev, func(e string) bool { return strings.Contains(e, trainingv1alpha1.ReasonCheckpointCorrupt) }) {
		t.Errorf("events %q, want a CheckpointCorrupt warning", ev)
	}
}

// The soak's last lost report (seed 2585465317, in place): a restart's runs found a step
// corrupt; the next fault's in-place restart was escalated to a recreate before rank 0's run
// ended, and its kubelet restarted it in the old pod, so its words sat in that pod's lastState.
// A corrupt step is reported whichever restart its run followed, and once.
func TestACorruptStepIsReportedWhicheverRestartItsRunFollowed(t *testing.T) {
	h, job := inPlaceGang(t)
	for r := range 3 {
		h.setPod(t, fmt.Sprintf("llm-0-%d", r), func(p *corev1.Pod) { p.Finalizers = []string{"test/keep"} })
	}
	// Fault 1: rank 1 killed, every rank back in place.
	f1 := now.Add(-time.Minute)
	for r, code := range []int32{trainingv1alpha1.ExitStopped, 137, trainingv1alpha1.ExitStopped} {
		h.setPod(t, fmt.Sprintf("llm-0-%d", r), restartedInPlace(fmt.Sprintf("node-llm-0-%d", r), 1, code, f1, f1.Add(time.Second)))
	}
	h.mustReconcile(t, job)
	h.mustReconcile(t, job)
	if st := h.get(t, job).Status; st.Restarts != 1 {
		t.Fatalf("after fault 1: restarts %d, want 1", st.Restarts)
	}
	// Fault 2: a GPU fault ends rank 1's run (no words: the process died of it) and its
	// kubelet restarts it; the operator counts restart 2, in place.
	f2 := now.Add(-5 * time.Second)
	h.setPod(t, "llm-0-1", restartedInPlace("node-llm-0-1", 2, 134, f2, f2.Add(time.Second)))
	h.mustReconcile(t, job)
	if st := h.get(t, job).Status; st.Restarts != 2 {
		t.Fatalf("after fault 2: restarts %d, want 2", st.Restarts)
	}
	// Rank 2's pod fails outright during that restart: the gang is recreated.
	h.setPod(t, "llm-0-2", func(p *corev1.Pod) {
		exited("node-llm-0-2", 1, f2.Add(2*time.Second))(p)
		p.Finalizers = []string{"test/keep"}
	})
	h.mustReconcile(t, job)
	h.mustReconcile(t, job)
	if st := h.get(t, job).Status; st.Restarts != 2 || st.LastRestartMode != trainingv1alpha1.RestartModeRecreate {
		t.Fatalf("restarts %d by %q, want restart 2 escalated to a recreate", st.Restarts, st.LastRestartMode)
	}
	h.drainEvents()
	// Only now does rank 0 notice its peer gone: restart 1's run ends, saying what it found,
	// and its kubelet restarts it in the pod being deleted. Its words are in lastState.
	corrupt := "checkpoint-restored=160\nzaya: checkpoint-corrupt: step=180 moved to corrupt-step-180-7: manifest.json: crc32c mismatch\ncheckpoint-step=200\n"
	h.setPod(t, "llm-0-0", func(p *corev1.Pod) {
		restartedInPlace("node-llm-0-0", 2, trainingv1alpha1.ExitStopped, f2.Add(3*time.Second), f2.Add(4*time.Second))(p)
		p.Status.ContainerStatuses[0].LastTerminationState.Terminated.Message = corrupt
	})
	h.mustReconcile(t, job)
	st := h.get(t, job).Status
	if len(st.CorruptCheckpoints) != 1 || st.CorruptCheckpoints[0].Step != 180 || st.CorruptCheckpoints[0].MovedTo != "corrupt-step-180-7" {
		t.Fatalf("corruptCheckpoints %+v, want step 180 moved to corrupt-step-180-7", st.CorruptCheckpoints)
	}
	if ev := h.drainEvents(); !slices.ContainsFunc(ev, func(e string) bool {
		return strings.Contains(e, trainingv1alpha1.ReasonCheckpointCorrupt) && strings.Contains(e, "crc32c mismatch")
	}) {
		t.Errorf("events %q, want a CheckpointCorrupt warning", ev)
	}
	// The old pods stop; their words stay in lastState for a while: no second report.
	for range 2 {
		h.mustReconcile(t, job)
	}
	if ev := h.drainEvents(); slices.ContainsFunc(ev, func(e string) bool { return strings.Contains(e, trainingv1alpha1.ReasonCheckpointCorrupt) }) {
		t.Errorf("events %q: step 180 was reported again", ev)
	}
}
