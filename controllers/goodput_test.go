package controllers

import (
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	trainingv1alpha1 "github.com/zaya-operator/zaya-operator/api/v1alpha1"
	"github.com/zaya-operator/zaya-operator/internal/testjob"
)

// A job's time, accounted from the pods alone (its workers report no progress): 20 s to
// start, a GPU fault at 100 s that had trained 15 steps of 0.5 s past its last checkpoint,
// every rank running again 30 s later.
func TestGoodputAccountsStartupDowntimeAndWorkTrainedAgain(t *testing.T) {
	job := testjob.MakeZayaTrainingJob("llm", "ns").Nodes(3).Generation(1).RestartMode(trainingv1alpha1.RestartModeRecreate).Defaulted().Obj()
	h := newHarness(t, interceptor.Funcs{}, job)
	at := func(s int) { h.r.Clock = clockAt(now.Add(time.Duration(s) * time.Second)) }
	at(0)
	h.mustReconcile(t, job)
	at(20)
	h.runAll(t)
	h.mustReconcile(t, job)
	g := h.get(t, job).Status.Goodput
	if g == nil || g.StartupMilliseconds != 20000 || g.WallMilliseconds != 20000 || g.EffectiveTrainingTime != "0.0%" {
		t.Fatalf("after the start: %+v, want 20 s of startup, nothing trained yet", g)
	}

	at(100)
	h.setPod(t, "llm-0-1", exitedSaying("n1", 134, now.Add(100*time.Second), "",
		gpuFaultLine+"\ncheckpoint-step=40\ntraining-step=55\nstep-seconds=0.5000\n"))
	h.mustReconcile(t, job)
	g = h.get(t, job).Status.Goodput
	want := []trainingv1alpha1.GoodputLoss{{Category: "GPUHardware", Failures: 1}}
	if diff := cmp.Diff(want, g.Lost); diff != "" || g.WallMilliseconds != 100000 {
		t.Fatalf("after the fault: wall %d, lost (-want +got):\n%s", g.WallMilliseconds, diff)
	}
	open := &trainingv1alpha1.GoodputOpen{Category: "GPUHardware", Since: metav1.NewMicroTime(now.Add(100 * time.Second)),
		ReachedStep: 55, CheckpointStep: 40, StepMicroseconds: 500000}
	if diff := cmp.Diff(open, g.Open); diff != "" {
		t.Fatalf("the loss under way (-want +got):\n%s", diff)
	}

	// The old gang goes, the new one runs at 130 s.
	for range 3 {
		h.mustReconcile(t, job)
	}
	at(130)
	h.runAll(t)
	h.mustReconcile(t, job)
	got := h.get(t, job)
	if c := condition(got, "Restarting"); c == nil || c.Reason != trainingv1alpha1.ReasonRecovered {
		t.Fatalf("Restarting %+v, want Recovered", c)
	}
	g = got.Status.Goodput
	want[0].DownMilliseconds, want[0].RecomputeMilliseconds = 30000, 7500
	if diff := cmp.Diff(want, g.Lost); diff != "" || g.Open != nil {
		t.Errorf("lost (-want +got):\n%s", diff)
	}
	// 130 s of wall: 20 starting, 37.5 lost, 72.5 training.
	if g.WallMilliseconds != 130000 || g.StartupMilliseconds != 20000 || g.LostMilliseconds != 37500 || g.TrainingMilliseconds != 72500 || g.EffectiveTrainingTime != "55.8%" {
		t.Errorf("goodput %+v: want wall 130 s, startup 20, lost 37.5, training 72.5 (55.8%%)", g)
	}
	// Nothing else happens: no status write for the time passing.
	at(500)
	h.expectQuiet(t, job, 2)
}

func TestASuspensionIsNoWallTime(t *testing.T) {
	h, job := inPlaceGang(t)
	h.r.Clock = clockAt(now.Add(60 * time.Second))
	h.suspend(t, job, true)
	h.mustReconcile(t, job)
	wall := h.get(t, job).Status.Goodput.WallMilliseconds
	if wall != 60000 {
		t.Fatalf("wall %d at the suspension, want 60", wall)
	}
	// An hour suspended, then resumed and running 10 s later.
	h.r.Clock = clockAt(now.Add(time.Hour + 60*time.Second))
	h.suspend(t, job, false)
	h.mustReconcile(t, job)
	h.r.Clock = clockAt(now.Add(time.Hour + 70*time.Second))
	h.runAll(t)
	h.mustReconcile(t, job)
	g := h.get(t, job).Status.Goodput
	if g.WallMilliseconds != 70000 || g.StartupMilliseconds != 10000 {
		t.Errorf("goodput %+v: want 70 s of wall (the hour suspended is none), 10 of it restarting", g)
	}
}

func TestTheGaugeCarriesARunningJobsGoodputToTheScrape(t *testing.T) {
	obj := map[string]any{"status": map[string]any{"goodput": map[string]any{
		"asOf": now.Format(time.RFC3339), "wallMilliseconds": int64(100000), "trainingMilliseconds": int64(50000)}}}
	if r, ok := goodputRatio(obj, false, now.Add(100*time.Second)); !ok || r != 0.5 {
		t.Errorf("stopped: %v %v, want 0.5 as stored", r, ok)
	}
	if r, ok := goodputRatio(obj, true, now.Add(100*time.Second)); !ok || r != 0.75 {
		t.Errorf("running 100 s since: %v %v, want 150/200", r, ok)
	}
	if _, ok := goodputRatio(map[string]any{}, true, now); ok {
		t.Error("a job without goodput has a ratio")
	}
}

// A restart opened on a bystander's stop (75, Unknown) and found a hang later moves its
// failure and open loss to Hang, as status.lastFailure names it: Hang is no category of a
// reason alone, and the loss stayed Unknown (seen in the chaos e2e).
func TestAHangFoundAfterABystanderOpenedTheRestartMovesItsLoss(t *testing.T) {
	job := testjob.MakeZayaTrainingJob("llm", "ns").Obj()
	job.Status.StartTime = &metav1.Time{Time: now}
	job.Status.LastFailure = &trainingv1alpha1.JobFailure{Reason: trainingv1alpha1.FailureReasonExitCode,
		ExitCode: ptr.To(int32(trainingv1alpha1.ExitStopped)), Category: "Unknown", Rank: ptr.To[int32](1)}
	job.Status.Goodput = &trainingv1alpha1.GoodputStatus{AsOf: metav1.NewMicroTime(now),
		Lost: []trainingv1alpha1.GoodputLoss{{Category: "Unknown", Failures: 1}},
		Open: &trainingv1alpha1.GoodputOpen{Category: "Unknown", Since: metav1.NewMicroTime(now)}}
	p := &pass{r: &ZayaTrainingJobReconciler{}, job: job, now: now.Add(time.Second)}
	p.ledger().Reroot(trainingv1alpha1.JobFailure{Reason: trainingv1alpha1.FailureReasonHang, Rank: ptr.To[int32](5)})
	g := job.Status.Goodput
	if diff := cmp.Diff([]trainingv1alpha1.GoodputLoss{{Category: "Hang", Failures: 1}}, g.Lost); diff != "" {
		t.Errorf("failures by category (-want +got):\n%s", diff)
	}
	if g.Open == nil || g.Open.Category != "Hang" {
		t.Errorf("the open loss is %+v, want Hang's", g.Open)
	}
}

// A worker's last words claim a step reached far past the checkpoint at the slowest pace:
// the recompute it would cost is bounded by how long the job has run, not a year.
func TestAWorkersClaimedStepsCostNoMoreThanTheJobRan(t *testing.T) {
	h, job := recreateGang(t)
	clock := h.r.Clock.(interface{ SetTime(time.Time) })
	fault := now.Add(time.Minute)
	clock.SetTime(fault)
	claim := "training-step=1125899906842624\ncheckpoint-step=0\nstep-seconds=86399\nlast-step-at=" + fault.Format(time.RFC3339Nano)
	h.setPod(t, "llm-0-1", exitedSaying("n1", 1, fault, "", claim))
	h.mustReconcile(t, job)
	for i := range 4 {
		clock.SetTime(fault.Add(time.Duration(i+1) * 5 * time.Second))
		h.mustReconcile(t, job)
		h.runAll(t)
	}
	g := h.get(t, job).Status.Goodput
	if g == nil {
		t.Fatal("no goodput")
	}
	for _, l := range g.Lost {
		if l.RecomputeMilliseconds > (2 * time.Minute).Milliseconds() {
			t.Errorf("%s: %v of recompute charged one minute into the job", l.Category, time.Duration(l.RecomputeMilliseconds)*time.Millisecond)
		}
	}
}
