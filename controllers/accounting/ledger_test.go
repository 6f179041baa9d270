package accounting

import (
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/zaya-operator/zaya-operator/api/contract"
	trainingv1alpha1 "github.com/zaya-operator/zaya-operator/api/v1alpha1"
	"github.com/zaya-operator/zaya-operator/controllers/liveprogress"
	"github.com/zaya-operator/zaya-operator/internal/testjob"
)

var now = time.Date(2026, 11, 29, 8, 0, 0, 0, time.UTC)

// A gang that trained again before the restart under way was done, and that the operator then
// breaks (a laggard replaced, an escalation), loses time from now, at the pace rank 0 last
// reported, in the restart's category, without a failure counted; an open loss stays as it is.
func TestAGangBrokenAgainAfterItTrainedOpensALoss(t *testing.T) {
	trained := now.Add(100 * time.Second)
	job := testjob.MakeZayaTrainingJob("llm", "ns").Obj()
	job.Status.StartTime = &metav1.Time{Time: now}
	job.Status.LastFailure = &trainingv1alpha1.JobFailure{Category: "NodeLost"}
	at := micro(trained)
	job.Status.Goodput = &trainingv1alpha1.GoodputStatus{AsOf: micro(trained), TrainingSince: &at,
		Lost: []trainingv1alpha1.GoodputLoss{{Category: "NodeLost", Failures: 1, DownMilliseconds: 5000}}}
	l := &Ledger{Job: job, Now: trained.Add(3 * time.Second), Report: &liveprogress.Report{Progress: contract.Progress{
		Step: 50, CheckpointStep: 40, StepSeconds: 0.5, TrainingSince: trained, LastStepAt: trained.Add(2 * time.Second)}}}
	l.Broken()
	g := job.Status.Goodput
	want := &trainingv1alpha1.GoodputOpen{Category: "NodeLost", Since: micro(l.Now), ReachedStep: 52, CheckpointStep: 40, StepMicroseconds: 500000}
	if diff := cmp.Diff(want, g.Open); diff != "" {
		t.Errorf("the loss opened (-want +got):\n%s", diff)
	}
	if g.Lost[0].Failures != 1 {
		t.Errorf("failures %d: breaking the gang again is no new failure", g.Lost[0].Failures)
	}
	l.Now = l.Now.Add(time.Second)
	l.Broken()
	if !g.Open.Since.Time.Equal(want.Since.Time) {
		t.Errorf("an open loss moved to %v", g.Open.Since)
	}
}

// A report whose step is at the bound, read a poll ago at the fastest pace the sanitizer
// lets through, gives a reached step that neither wraps nor passes what the schema takes.
func TestStepsAfterAReportNeverWrap(t *testing.T) {
	rep := liveprogress.Report{Progress: contract.Progress{Step: contract.MaxStep, StepSeconds: 1e-300, LastStepAt: now.Add(-time.Hour)}}
	if n := rep.Step + stepsAfter(rep, now); n < rep.Step || n > 2*contract.MaxStep {
		t.Errorf("reached %d from a report at step %d", n, rep.Step)
	}
}

// Each start and loss that closes joins the history, with what its steps trained again cost;
// the oldest go past the bound.
func TestClosedLossesJoinTheBoundedHistory(t *testing.T) {
	job := testjob.MakeZayaTrainingJob("llm", "ns").Obj()
	job.Status.StartTime = &metav1.Time{Time: now}
	at := micro(now)
	job.Status.Goodput = &trainingv1alpha1.GoodputStatus{AsOf: at, TrainingSince: &at,
		Open: &trainingv1alpha1.GoodputOpen{Category: "GPUHardware", Since: micro(now.Add(time.Minute)), ReachedStep: 50, CheckpointStep: 40, StepMicroseconds: 500000}}
	for i := range trainingv1alpha1.MaxGoodputHistory - 1 {
		job.Status.Goodput.History = append(job.Status.Goodput.History, trainingv1alpha1.GoodputSpan{Category: "Old", Since: micro(now.Add(time.Duration(i) * time.Millisecond))})
	}
	ran := micro(now.Add(90 * time.Second))
	job.Status.Goodput.Open.RanAt = &ran
	l := &Ledger{Job: job, Now: now.Add(2 * time.Minute)}
	l.Settle(nil)
	h := job.Status.Goodput.History
	want := trainingv1alpha1.GoodputSpan{Category: "GPUHardware", Since: micro(now.Add(time.Minute)), Until: ran, RecomputeMilliseconds: 5000, Nodes: 2}
	if len(h) != trainingv1alpha1.MaxGoodputHistory || !cmp.Equal(h[len(h)-1], want) {
		t.Fatalf("history of %d, last %+v; want %d, last %+v", len(h), h[len(h)-1], trainingv1alpha1.MaxGoodputHistory, want)
	}
	ran = micro(l.Now.Add(time.Second))
	job.Status.Goodput.Open = &trainingv1alpha1.GoodputOpen{Since: micro(l.Now), RanAt: &ran} // a start (a resume)
	l.Now = l.Now.Add(time.Minute)
	l.Settle(nil)
	h = job.Status.Goodput.History
	if len(h) != trainingv1alpha1.MaxGoodputHistory || !h[0].Since.Time.Equal(now.Add(time.Millisecond)) || h[len(h)-1].Category != "" {
		t.Fatalf("history of %d from %v ending %+v: want the oldest gone and the start last", len(h), h[0].Since, h[len(h)-1])
	}
}
