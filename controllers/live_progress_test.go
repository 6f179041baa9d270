package controllers

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	"github.com/zaya-operator/zaya-operator/api/contract"
	trainingv1alpha1 "github.com/zaya-operator/zaya-operator/api/v1alpha1"
	"github.com/zaya-operator/zaya-operator/controllers/liveprogress"
	"github.com/zaya-operator/zaya-operator/internal/testjob"
)

// fakeWorkers answers progress requests for pod addresses as their workers would; an
// address it does not know refuses the connection.
type fakeWorkers struct {
	mu     sync.Mutex
	byHost map[string]contract.Progress
}

func (f *fakeWorkers) set(podIP string, p contract.Progress) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.byHost == nil {
		f.byHost = map[string]contract.Progress{}
	}
	f.byHost[fmt.Sprintf("%s:%d", podIP, contract.ProgressPort)] = p
}

func (f *fakeWorkers) RoundTrip(req *http.Request) (*http.Response, error) {
	f.mu.Lock()
	p, ok := f.byHost[req.URL.Host]
	f.mu.Unlock()
	if !ok || req.URL.Path != contract.ProgressPath {
		return nil, errors.New("connection refused")
	}
	b, _ := json.Marshal(p)
	return &http.Response{StatusCode: http.StatusOK, Body: io.NopCloser(bytes.NewReader(b)), Header: http.Header{}, Request: req}, nil
}

// withWorkers gives h a poller that reaches workers through w, on h's clock.
func withWorkers(h *harness, w *fakeWorkers) *liveprogress.Poller {
	p := &liveprogress.Poller{HTTP: &http.Client{Transport: w}, Interval: 10 * time.Second, Now: func() time.Time { return h.r.Clock.Now() }}
	h.r.Progress, h.r.ProgressPollInterval = p, p.Interval
	return p
}

// runningAt runs pod on node at address ip.
func runningAt(node, ip string) func(*corev1.Pod) {
	return func(p *corev1.Pod) {
		running(node)(p)
		p.Status.PodIP = ip
	}
}

// A job whose rank 0 reports its progress: startup ends when it first trains, a failure's
// loss runs from the gang's last step (rank 0, read as the failure stops the gang) to the new
// run's first, and the steps past the checkpoint it resumed from count too.
func TestGoodputEndsWhenRankZeroSaysItTrains(t *testing.T) {
	job := testjob.MakeZayaTrainingJob("llm", "ns").Nodes(3).Generation(1).RestartMode(trainingv1alpha1.RestartModeRecreate).Defaulted().Obj()
	h := newHarness(t, interceptor.Funcs{}, job)
	workers := &fakeWorkers{}
	poller := withWorkers(h, workers)
	at := func(ms int) time.Time {
		t := now.Add(time.Duration(ms) * time.Millisecond)
		h.r.Clock = clockAt(t)
		return t
	}
	at(0)
	h.mustReconcile(t, job)
	at(20000)
	for r := range 3 {
		h.setPod(t, fmt.Sprintf("llm-0-%d", r), runningAt(fmt.Sprintf("n%d", r), fmt.Sprintf("10.0.0.%d", r)))
	}
	res := h.mustReconcile(t, job)
	g := h.get(t, job).Status.Goodput
	if g.Open == nil || g.Open.RanAt == nil || g.StartupMilliseconds != 0 {
		t.Fatalf("every rank runs, rank 0 has not said it trains: goodput %+v, want the start still open", g)
	}
	if res.RequeueAfter <= 0 || res.RequeueAfter > h.r.progressGrace() {
		t.Errorf("requeue %v: the open start must be looked at again within %v", res.RequeueAfter, h.r.progressGrace())
	}

	trained := at(22500)
	workers.set("10.0.0.0", contract.Progress{Step: 5, StepSeconds: 0.5, TrainingSince: trained, LastStepAt: trained.Add(2500 * time.Millisecond)})
	at(25000)
	poller.Poll(t.Context())
	h.mustReconcile(t, job)
	g = h.get(t, job).Status.Goodput
	if g.Open != nil || g.StartupMilliseconds != 22500 || g.TrainingSince == nil || !g.TrainingSince.Time.Equal(trained) {
		t.Fatalf("after rank 0 trained: %+v, want 22.5 s of startup", g)
	}

	// Rank 1 dies of a GPU fault; rank 0, stuck in the collective, last finished step 55 at
	// 99.4 s, 15 steps past checkpoint 40.
	workers.set("10.0.0.0", contract.Progress{Step: 55, CheckpointStep: 40, StepSeconds: 0.5, TrainingSince: trained, LastStepAt: now.Add(99400 * time.Millisecond)})
	at(100300)
	h.setPod(t, "llm-0-1", exitedSaying("n1", 134, now.Add(100*time.Second), "", gpuFaultLine))
	h.mustReconcile(t, job)
	g = h.get(t, job).Status.Goodput
	open := &trainingv1alpha1.GoodputOpen{Category: "GPUHardware", Since: metav1.NewMicroTime(now.Add(99400 * time.Millisecond)),
		ReachedStep: 55, CheckpointStep: 40, StepMicroseconds: 500000}
	if diff := cmp.Diff(open, g.Open); diff != "" {
		t.Fatalf("the loss under way (-want +got):\n%s", diff)
	}

	for range 3 {
		h.mustReconcile(t, job)
	}
	at(130000)
	for r := range 3 {
		h.setPod(t, fmt.Sprintf("llm-1-%d", r), runningAt(fmt.Sprintf("m%d", r), fmt.Sprintf("10.0.1.%d", r)))
	}
	h.mustReconcile(t, job)
	again := at(131500)
	workers.set("10.0.1.0", contract.Progress{Step: 41, ResumedFrom: 40, CheckpointStep: 40, StepSeconds: 0.5, TrainingSince: again, LastStepAt: again.Add(500 * time.Millisecond),
		StartedAt: now.Add(130500 * time.Millisecond), MetAt: now.Add(131200 * time.Millisecond)})
	at(132000)
	poller.Poll(t.Context())
	h.mustReconcile(t, job)
	got := h.get(t, job)
	g = got.Status.Goodput
	want := []trainingv1alpha1.GoodputLoss{{Category: "GPUHardware", Failures: 1, DownMilliseconds: 32100, RecomputeMilliseconds: 7500}}
	if diff := cmp.Diff(want, g.Lost); diff != "" || g.Open != nil {
		t.Fatalf("lost (-want +got):\n%s\nopen %+v", diff, g.Open)
	}
	// The way back, stage by stage, each from its own clock: rank 0's last step, the
	// operator's pass that saw the failure and restarted, the new gang's pods running, and
	// rank 0's new process, its rendezvous and its first step.
	ms := func(ms int) *metav1.MicroTime {
		return trainingv1alpha1.Stamp(now.Add(time.Duration(ms) * time.Millisecond))
	}
	timeline := &trainingv1alpha1.RecoveryTimeline{LastStep: ms(99400), Detected: ms(100300), Decided: ms(100300), Running: ms(130000),
		WorkerStarted: ms(130500), Rendezvous: ms(131200), Training: ms(131500)}
	if diff := cmp.Diff(timeline, got.Status.LastFailure.Recovery); diff != "" {
		t.Errorf("lastFailure's timeline (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff(timeline, got.Status.RecentFailures[0].Recovery); diff != "" {
		t.Errorf("the newest recent failure's timeline (-want +got):\n%s", diff)
	}
	// 132 s of wall: 22.5 starting, 39.6 lost, 69.9 training.
	if g.WallMilliseconds != 132000 || g.TrainingMilliseconds != 69900 || g.EffectiveTrainingTime != "53.0%" {
		t.Errorf("goodput %+v: want wall 132 s, training 69.9 s (53.0%%)", g)
	}
}

// Where rank 0 is polled but never answers, a loss ends as of every rank running, once it
// had the grace to answer.
func TestAWorkerThatNeverReportsFallsBackToTheRanksRunning(t *testing.T) {
	job := testjob.MakeZayaTrainingJob("llm", "ns").Nodes(2).Generation(1).Defaulted().Obj()
	h := newHarness(t, interceptor.Funcs{}, job)
	withWorkers(h, &fakeWorkers{})
	h.mustReconcile(t, job)
	h.r.Clock = clockAt(now.Add(20 * time.Second))
	for r := range 2 {
		h.setPod(t, fmt.Sprintf("llm-0-%d", r), runningAt(fmt.Sprintf("n%d", r), fmt.Sprintf("10.0.0.%d", r)))
	}
	h.mustReconcile(t, job)
	if g := h.get(t, job).Status.Goodput; g.Open == nil {
		t.Fatalf("closed at once: %+v", g)
	}
	h.r.Clock = clockAt(now.Add(20*time.Second + h.r.progressGrace()))
	h.mustReconcile(t, job)
	if g := h.get(t, job).Status.Goodput; g.Open != nil || g.StartupMilliseconds != 20000 {
		t.Fatalf("after the grace: %+v, want 20 s of startup (to the ranks running)", g)
	}
}

// stragglerGang is an in-place gang of 4 whose rank 0 reports rank 2 twice as busy per step as
// the others, three reports in a row.
func stragglerGang(t *testing.T, action trainingv1alpha1.StragglerAction) (*harness, *trainingv1alpha1.ZayaTrainingJob, *fakeWorkers, *liveprogress.Poller, contract.Progress) {
	t.Helper()
	job := testjob.MakeZayaTrainingJob("llm", "ns").Nodes(4).Generation(1).Defaulted().Obj()
	job.Spec.FaultTolerance.Stragglers.Action = action
	h := newHarness(t, interceptor.Funcs{}, job)
	workers := &fakeWorkers{}
	poller := withWorkers(h, workers)
	h.mustReconcile(t, job)
	for r := range 4 {
		h.setPod(t, fmt.Sprintf("llm-0-%d", r), runningAt(fmt.Sprintf("node-%d", r), fmt.Sprintf("10.0.0.%d", r)))
	}
	h.mustReconcile(t, job)
	prog := contract.Progress{Step: 100, CheckpointStep: 80, StepSeconds: 0.5, TrainingSince: now.Add(time.Second), LastStepAt: now.Add(50 * time.Second),
		NodeStepSeconds: []float64{0.4, 0.4, 0.8, 0.4}}
	for range liveprogress.StragglerReports {
		prog.Step++
		workers.set("10.0.0.0", prog)
		poller.Poll(t.Context())
	}
	h.drainEvents()
	h.mustReconcile(t, job) // the job trains: the start's time ends
	h.mustReconcile(t, job) // the status write's pass
	return h, job, workers, poller, prog
}

func TestAStragglerIsReportedWithItsNode(t *testing.T) {
	h, job, workers, poller, prog := stragglerGang(t, trainingv1alpha1.StragglerActionReport)
	got := h.get(t, job)
	c := meta.FindStatusCondition(got.Status.Conditions, trainingv1alpha1.ConditionStraggling)
	if c == nil || c.Status != metav1.ConditionTrue || !strings.Contains(c.Message, "rank 2 (pod llm-0-2 on node node-2)") {
		t.Fatalf("Straggling = %+v, want True naming rank 2 and node-2", c)
	}
	if ev := h.drainEvents(); len(ev) != 1 || !strings.HasPrefix(ev[0], "Warning StragglerDetected straggler: rank 2 (pod llm-0-2) on node node-2 is busy 0.800s per step, the other ranks 0.400s") {
		t.Errorf("events %q", ev)
	}
	// Report only: a checkpoint past it replaces nothing.
	prog.Step++
	prog.CheckpointStep = 120
	workers.set("10.0.0.0", prog)
	poller.Poll(t.Context())
	h.mustReconcile(t, job)
	if st := h.get(t, job).Status; st.Restarts != 0 || len(st.Replacing) != 0 {
		t.Fatalf("action Report replaced the straggler: restarts %d, replacing %+v", st.Restarts, st.Replacing)
	}
	// The rank catches up: the condition goes, after as many reports as it took to come.
	prog.NodeStepSeconds = []float64{0.4, 0.4, 0.42, 0.4}
	for range liveprogress.StragglerReports {
		prog.Step++
		workers.set("10.0.0.0", prog)
		poller.Poll(t.Context())
	}
	h.mustReconcile(t, job)
	if c := meta.FindStatusCondition(h.get(t, job).Status.Conditions, trainingv1alpha1.ConditionStraggling); c == nil || c.Status != metav1.ConditionFalse {
		t.Errorf("Straggling = %+v after the rank caught up, want False", c)
	}
}

func TestAStragglerIsReplacedAtTheNextCheckpoint(t *testing.T) {
	h, job, workers, poller, prog := stragglerGang(t, trainingv1alpha1.StragglerActionReplace)
	if st := h.get(t, job).Status; st.Restarts != 0 || len(st.Replacing) != 0 {
		t.Fatalf("replaced before a checkpoint past it: restarts %d, replacing %+v", st.Restarts, st.Replacing)
	}
	prog.Step++
	prog.CheckpointStep = prog.Step
	workers.set("10.0.0.0", prog)
	poller.Poll(t.Context())
	h.mustReconcile(t, job)
	st := h.get(t, job).Status
	if len(st.Replacing) != 1 || st.Replacing[0].Rank != 2 || st.Replacing[0].Reason != trainingv1alpha1.FailureReasonStraggler {
		t.Fatalf("replacing %+v, want rank 2 for Straggler", st.Replacing)
	}
	if f := st.LastFailure; f == nil || f.Category != "Straggler" || f.Node != "node-2" || st.Restarts != 1 {
		t.Errorf("lastFailure %+v, restarts %d: want one Straggler restart on node-2", f, st.Restarts)
	}
	if len(st.QuarantinedNodes) != 1 || st.QuarantinedNodes[0].Name != "node-2" {
		t.Errorf("quarantined %+v, want node-2", st.QuarantinedNodes)
	}
}

// A recreate decided before the other ranks' exits were seen takes where training stopped
// from those exits once they show, on the old attempt's pods.
func TestALossStartsWhereTheStoppedRanksSayTheyStopped(t *testing.T) {
	job := testjob.MakeZayaTrainingJob("llm", "ns").Nodes(3).Generation(1).RestartMode(trainingv1alpha1.RestartModeRecreate).Defaulted().Obj()
	h := newHarness(t, interceptor.Funcs{}, job)
	h.mustReconcile(t, job)
	h.runAll(t)
	h.mustReconcile(t, job)
	h.r.Clock = clockAt(now.Add(100 * time.Second))
	h.setPod(t, "llm-0-1", exitedSaying("n1", 134, now.Add(100*time.Second), "", gpuFaultLine))
	h.mustReconcile(t, job)
	if o := h.get(t, job).Status.Goodput.Open; o == nil || !o.Since.Time.Equal(now.Add(100*time.Second)) {
		t.Fatalf("open %+v, want a loss since the failure (nothing better known yet)", o)
	}
	stopped := now.Add(99*time.Second + 412*time.Millisecond)
	h.setPod(t, "llm-0-0", exitedSaying("n0", 75, now.Add(100*time.Second), "",
		"zaya: stopped: lost rank 1 during the all-reduce at step 57: EOF\ncheckpoint-step=40\ntraining-step=57\nstep-seconds=0.5000\n"+
			"training-since="+now.Add(20*time.Second).Format(time.RFC3339Nano)+"\nlast-step-at="+stopped.Format(time.RFC3339Nano)+"\n"))
	h.mustReconcile(t, job)
	o := h.get(t, job).Status.Goodput.Open
	if o == nil || !o.Since.Time.Equal(stopped) || o.ReachedStep != 57 || o.CheckpointStep != 40 {
		t.Fatalf("open %+v, want since %v (rank 0's last step), reached 57, checkpoint 40", o, stopped)
	}
}

// A new run trains for a moment before rank 0's progress shows it, and a fault stops it: the
// first loss ends as that run began training (its ranks' exits say when), not where it
// stopped; the second loss starts where it stopped.
func TestARunThatTrainedBeforeItWasPolledEndsTheLoss(t *testing.T) {
	job := testjob.MakeZayaTrainingJob("llm", "ns").Nodes(3).Generation(1).RestartMode(trainingv1alpha1.RestartModeRecreate).Defaulted().Obj()
	h := newHarness(t, interceptor.Funcs{}, job)
	withWorkers(h, &fakeWorkers{}) // polled, never answering: the exits say it all
	at := func(ms int) { h.r.Clock = clockAt(now.Add(time.Duration(ms) * time.Millisecond)) }
	exits := func(since, last time.Time, step int) string {
		return fmt.Sprintf("zaya: stopped: lost a peer during the all-reduce at step %d: EOF\ncheckpoint-step=40\ntraining-step=%d\nstep-seconds=0.5000\n"+
			"training-since=%s\nlast-step-at=%s\n", step, step, since.Format(time.RFC3339Nano), last.Format(time.RFC3339Nano))
	}
	at(0)
	h.mustReconcile(t, job)
	h.runAll(t)
	h.mustReconcile(t, job)

	at(100000)
	stopped := now.Add(99400 * time.Millisecond)
	h.setPod(t, "llm-0-1", exitedSaying("n1", 134, now.Add(100*time.Second), "", gpuFaultLine))
	h.setPod(t, "llm-0-0", exitedSaying("n0", 75, now.Add(100*time.Second), "", exits(now.Add(20*time.Second), stopped, 57)))
	h.mustReconcile(t, job)
	for range 3 {
		h.mustReconcile(t, job)
	}
	at(110000)
	for r := range 3 {
		h.setPod(t, fmt.Sprintf("llm-1-%d", r), runningAt(fmt.Sprintf("m%d", r), fmt.Sprintf("10.0.1.%d", r)))
	}
	h.mustReconcile(t, job)
	if o := h.get(t, job).Status.Goodput.Open; o == nil || !o.Since.Time.Equal(stopped) {
		t.Fatalf("open %+v: want the GPU fault's loss since %v, still open (rank 0 never reported)", o, stopped)
	}

	// Attempt 1 trains from 112 s; at 113.5 s rank 2 is killed, rank 0 stops over it.
	trained, last := now.Add(112*time.Second), now.Add(113400*time.Millisecond)
	at(113500)
	h.setPod(t, "llm-1-0", exitedSaying("n0", 75, now.Add(113*time.Second), "", exits(trained, last, 45)))
	h.mustReconcile(t, job) // the stop over a peer alone waits for its cause
	h.setPod(t, "llm-1-2", exited("n2", 137, now.Add(113*time.Second)))
	for range 2 {
		h.mustReconcile(t, job)
	}
	g := h.get(t, job).Status.Goodput
	gpu := slices.IndexFunc(g.Lost, func(l trainingv1alpha1.GoodputLoss) bool { return l.Category == "GPUHardware" })
	if gpu < 0 || g.Lost[gpu].DownMilliseconds != 12600 || g.Lost[gpu].RecomputeMilliseconds != 8500 {
		t.Errorf("GPU fault's loss %+v: want 12.6 s down (99.4 s to 112 s) and 8.5 s trained again (57 to 40 at 0.5 s)", g.Lost)
	}
	if o := g.Open; o == nil || !o.Since.Time.Equal(last) || o.ReachedStep != 45 || g.TrainingSince == nil || !g.TrainingSince.Time.Equal(trained) {
		t.Errorf("open %+v, training since %v: want the kill's loss since %v at step 45, attempt 1 training since %v", o, g.TrainingSince, last, trained)
	}
}

// A rank's GPU fault recreates the gang, but its kubelet had restarted the ranks in place first
// and rank 0's new run said it trained before the old gang was stopped. That run is over: the
// loss ends when the new attempt's rank 0 trains (the chaos soak undercounted each such fault
// by the recreate's own seconds).
func TestARunTheRecreateStoppedDoesNotEndTheLoss(t *testing.T) {
	job := testjob.MakeZayaTrainingJob("llm", "ns").Nodes(3).Generation(1).RestartMode(trainingv1alpha1.RestartModeRecreate).Defaulted().Obj()
	h := newHarness(t, interceptor.Funcs{}, job)
	workers := &fakeWorkers{}
	poller := withWorkers(h, workers)
	at := func(ms int) time.Time {
		t := now.Add(time.Duration(ms) * time.Millisecond)
		h.r.Clock = clockAt(t)
		return t
	}
	at(0)
	h.mustReconcile(t, job)
	at(20000)
	for r := range 3 {
		h.setPod(t, fmt.Sprintf("llm-0-%d", r), runningAt(fmt.Sprintf("n%d", r), fmt.Sprintf("10.0.0.%d", r)))
	}
	h.mustReconcile(t, job)
	trained := at(22000)
	workers.set("10.0.0.0", contract.Progress{Step: 55, CheckpointStep: 40, StepSeconds: 0.5, TrainingSince: trained, LastStepAt: now.Add(99400 * time.Millisecond)})
	at(100300)
	poller.Poll(t.Context())
	h.setPod(t, "llm-0-1", exitedSaying("n1", 134, now.Add(100*time.Second), "", gpuFaultLine))
	h.mustReconcile(t, job)
	if g := h.get(t, job).Status.Goodput; g.Open == nil || h.get(t, job).Status.Restarts != 1 {
		t.Fatalf("no loss opened for the GPU fault: %+v", g)
	}

	// The old rank 0, restarted in place a moment before, trains again and says so.
	early := at(100800)
	workers.set("10.0.0.0", contract.Progress{Step: 42, ResumedFrom: 40, CheckpointStep: 40, StepSeconds: 0.5, TrainingSince: early, LastStepAt: early.Add(time.Second)})
	at(102000)
	poller.Poll(t.Context())
	for range 4 { // the old gang deleted, the new one created, not running yet
		h.mustReconcile(t, job)
	}
	if g := h.get(t, job).Status.Goodput; g.Open == nil {
		t.Fatalf("the loss ended by the old gang's run: %+v", g)
	}

	at(110000)
	for r := range 3 {
		h.setPod(t, fmt.Sprintf("llm-1-%d", r), runningAt(fmt.Sprintf("m%d", r), fmt.Sprintf("10.0.1.%d", r)))
	}
	h.mustReconcile(t, job)
	again := at(111000)
	workers.set("10.0.1.0", contract.Progress{Step: 41, ResumedFrom: 40, CheckpointStep: 40, StepSeconds: 0.5, TrainingSince: again, LastStepAt: again.Add(500 * time.Millisecond)})
	at(112000)
	poller.Poll(t.Context())
	h.mustReconcile(t, job)
	g := h.get(t, job).Status.Goodput
	if g.Open != nil || len(g.Lost) != 1 || g.Lost[0].DownMilliseconds != 11600 {
		t.Fatalf("goodput %+v, want one loss of 11.6 s (99.4 s to 111 s)", g)
	}
}
