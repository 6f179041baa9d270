package zayactl

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	trainingv1alpha1 "github.com/zaya-operator/zaya-operator/api/v1alpha1"
	"github.com/zaya-operator/zaya-operator/internal/testjob"
)

var t0 = time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)

func at(s int) time.Time        { return t0.Add(time.Duration(s) * time.Second) }
func mt(s int) metav1.MicroTime { return metav1.NewMicroTime(at(s)) }
func span(c string, from, to int) trainingv1alpha1.GoodputSpan {
	return trainingv1alpha1.GoodputSpan{Category: c, Since: mt(from), Until: mt(to)}
}

// job is a job created at t0 that started at 10 s and had a start and two losses.
func job() *trainingv1alpha1.ZayaTrainingJob {
	j := testjob.MakeZayaTrainingJob("llm", "team-a").Nodes(2).Defaulted().Obj()
	j.CreationTimestamp = metav1.NewTime(t0)
	j.Status.StartTime = &metav1.Time{Time: at(10)}
	gpu := span("GPUHardware", 100, 130)
	gpu.RecomputeMilliseconds = 5000
	j.Status.Goodput = &trainingv1alpha1.GoodputStatus{
		WallMilliseconds: 290000, StartupMilliseconds: 20000, LostMilliseconds: 55000, TrainingMilliseconds: 215000, EffectiveTrainingTime: "74.1%",
		History: []trainingv1alpha1.GoodputSpan{span("", 10, 30), gpu, span("NodeLost", 200, 220)},
		Lost:    []trainingv1alpha1.GoodputLoss{{Category: "GPUHardware", Failures: 1, DownMilliseconds: 30000, RecomputeMilliseconds: 5000}},
	}
	j.Status.RecentFailures = []trainingv1alpha1.JobFailure{
		{Time: metav1.NewTime(at(201)), Reason: "NodeLost", Category: "NodeLost", Node: "n1", Rank: ptr.To[int32](1), Action: trainingv1alpha1.FailureActionReplacedPods,
			Recovery: &trainingv1alpha1.RecoveryTimeline{LastStep: ptr.To(mt(200)), Detected: ptr.To(mt(205)), Decided: ptr.To(mt(205)),
				Running: ptr.To(mt(207)), Rendezvous: ptr.To(mt(209)), Training: ptr.To(mt(220))}},
		{Time: metav1.NewTime(at(101)), Reason: "ExitCode", Category: "GPUHardware", Node: "n0", Rank: ptr.To[int32](0), Cascaded: 1,
			Evidence: "HW Exception by GPU node-1", Rule: "gpu-hw-exception", Action: trainingv1alpha1.FailureActionRecreated},
	}
	j.Status.LastFailure = &j.Status.RecentFailures[0]
	j.Status.QuarantinedNodes = []trainingv1alpha1.QuarantinedNode{{Name: "n0", Reason: "GPUHardware", Since: metav1.NewTime(at(102))}}
	return j
}

// The timeline lays the history between the job's creation and now, the time between
// trained, and covers every second of it once.
func TestTheTimelineLaysTheHistoryBetweenCreationAndNow(t *testing.T) {
	tl := timelineOf(job(), at(300))
	var got []string
	var covered float64
	for i, s := range tl.Segments {
		got = append(got, s.Kind+":"+s.Category)
		covered += s.Seconds()
		if i > 0 && !s.Start.Equal(tl.Segments[i-1].End) {
			t.Errorf("segment %d starts at %v, the one before ends at %v", i, s.Start, tl.Segments[i-1].End)
		}
	}
	want := []string{"Queued:", "Startup:", "Training:", "Lost:GPUHardware", "Training:", "Lost:NodeLost", "Training:"}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("segments (-want +got):\n%s", diff)
	}
	if covered != 300 {
		t.Errorf("the segments cover %v s of 300", covered)
	}
	if tl.Segments[3].RecomputeSeconds != 5 || tl.TrainingMilliseconds != 215000 || tl.EffectiveTrainingTime != "74.1%" {
		t.Errorf("recompute %v, training %d ms, ratio %q: want status' figures", tl.Segments[3].RecomputeSeconds, tl.TrainingMilliseconds, tl.EffectiveTrainingTime)
	}
	var text bytes.Buffer
	if err := tl.text(&text, false); err != nil || !strings.Contains(text.String(), "|qqs") || strings.Contains(text.String(), "\x1b[") {
		t.Errorf("text off a terminal (%v):\n%s", err, text.String())
	}
	if svg := tl.svg(); !strings.HasPrefix(svg, "<svg") || strings.Count(svg, "<rect") != len(tl.Segments)+5 {
		t.Errorf("svg with %d rects for %d segments and 5 legend keys", strings.Count(svg, "<rect"), len(tl.Segments))
	}
}

// A loss open now runs to the end; a job never started was queued all along.
func TestAnOpenLossRunsToNowAndAQueuedJobIsQueued(t *testing.T) {
	j := job()
	j.Status.Goodput.Open = &trainingv1alpha1.GoodputOpen{Category: "Hang", Since: mt(250)}
	tl := timelineOf(j, at(300))
	last := tl.Segments[len(tl.Segments)-1]
	if last.Kind != "Lost" || last.Category != "Hang" || !last.Open || last.Seconds() != 50 {
		t.Errorf("last segment %+v: want the open Hang loss, 50 s", last)
	}
	j = testjob.MakeZayaTrainingJob("llm", "team-a").Obj()
	j.CreationTimestamp = metav1.NewTime(t0)
	if tl := timelineOf(j, at(60)); len(tl.Segments) != 1 || tl.Segments[0].Kind != "Queued" || tl.Segments[0].Seconds() != 60 {
		t.Errorf("a job never started: %+v", tl.Segments)
	}
}

// An elastic job's training after a shrink is shown at its width, and at full width after
// the grow.
func TestTrainingShrunkShowsItsWidth(t *testing.T) {
	j := job()
	j.Spec.Nodes = 4
	lost, grow := span("NodeLost", 200, 220), span("Resize", 260, 262)
	lost.Nodes, grow.Nodes = 3, 4
	j.Status.Goodput.History = []trainingv1alpha1.GoodputSpan{span("", 10, 30), lost, grow}
	tl := timelineOf(j, at(300))
	var widths []int32
	for _, s := range tl.Segments {
		if s.Kind == "Training" {
			widths = append(widths, s.Nodes)
		}
	}
	if diff := cmp.Diff([]int32{0, 3, 4}, widths); diff != "" {
		t.Errorf("training widths (-want +got):\n%s", diff)
	}
	var text bytes.Buffer
	if err := tl.text(&text, false); err != nil || strings.Count(text.String(), "Training on 3 of 4 nodes") != 1 {
		t.Errorf("text (%v) does not show the shrunk training once:\n%s", err, text.String())
	}
}

// why names each failure's root, what the operator did, the quarantine it caused and what it
// cost.
func TestWhyTellsEachFailureAndWhatItCost(t *testing.T) {
	w := whyOf(job())
	if len(w.Failures) != 2 {
		t.Fatalf("%d failures", len(w.Failures))
	}
	node, gpu := w.Failures[0], w.Failures[1]
	if *gpu.Rank != 0 || gpu.Category != "GPUHardware" || gpu.Action != "Recreated" || !gpu.Quarantined || gpu.LostSeconds == nil || *gpu.LostSeconds != 35 {
		t.Errorf("the GPU fault: %+v (lost %v)", gpu, gpu.LostSeconds)
	}
	if node.Quarantined || node.LostSeconds == nil || *node.LostSeconds != 20 || node.Action != "ReplacedPods" {
		t.Errorf("the lost node: %+v (lost %v)", node, node.LostSeconds)
	}
	// The lost node's way back, stage by stage from its last step; a stage not known (the
	// worker's start) is left out. The GPU fault's, recorded by an older operator, is none.
	want := []Stage{{"last step", at(200), 0}, {"detected", at(205), 5}, {"decided", at(205), 5}, {"ranks running", at(207), 7},
		{"rendezvous", at(209), 9}, {"training", at(220), 20}}
	if diff := cmp.Diff(want, node.Recovery); diff != "" || gpu.Recovery != nil {
		t.Errorf("the lost node's recovery (-want +got):\n%s\nthe GPU fault's: %v", diff, gpu.Recovery)
	}
	var text bytes.Buffer
	if err := w.text(&text); err != nil || !strings.Contains(text.String(), "rank 0 on n0") || !strings.Contains(text.String(), "node n0 quarantined") ||
		!strings.Contains(text.String(), "recovery:  last step 12:03:20.000, detected +5.00s, decided +5.00s, ranks running +7.00s, rendezvous +9.00s, training +20.00s\n") {
		t.Errorf("text (%v):\n%s", err, text.String())
	}
}

// status shows each rank of the current attempt, its node and state, and the spares apart.
func TestStatusShowsTheCurrentAttemptsRanksAndSpares(t *testing.T) {
	j := job()
	j.Status.Restarts = 1
	pod := func(name, rank, attempt, node string, running bool) corev1.Pod {
		p := corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "team-a", Labels: map[string]string{
			trainingv1alpha1.JobNameLabel: "llm", trainingv1alpha1.RankLabel: rank, trainingv1alpha1.AttemptLabel: attempt}},
			Spec: corev1.PodSpec{NodeName: node, Containers: []corev1.Container{{Name: "worker"}}}}
		if running {
			p.Status = corev1.PodStatus{Phase: corev1.PodRunning, ContainerStatuses: []corev1.ContainerStatus{{Name: "worker", RestartCount: 2,
				State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{}}}}}
		}
		return p
	}
	st := statusOf(j, []corev1.Pod{pod("llm-0-0", "0", "0", "n0", false), pod("llm-1-0", "0", "1", "n2", true), pod("llm-1-1", "1", "1", "", false)})
	if len(st.Ranks) != 2 || st.Ranks[0].Pod != "llm-1-0" || st.Ranks[0].State != "Running" || st.Ranks[0].Restarts != 2 || st.Ranks[1].State != "Pending" {
		t.Errorf("ranks %+v", st.Ranks)
	}
	if len(st.Quarantined) != 1 || st.Quarantined[0].Node != "n0" || st.Attempt != 1 {
		t.Errorf("quarantined %+v, attempt %d", st.Quarantined, st.Attempt)
	}
}

// A failure's cost is its own category's loss, not a neighbour's still open around its time.
func TestAFailureCostsItsOwnLossNotANeighbours(t *testing.T) {
	j := job()
	j.Status.Goodput.History = []trainingv1alpha1.GoodputSpan{span("Hang", 100, 113), span("UserCode", 114, 116)}
	j.Status.RecentFailures = []trainingv1alpha1.JobFailure{{Time: metav1.NewTime(at(112)), Reason: "ExitCode", Category: "UserCode", Rank: ptr.To[int32](7)}}
	if f := whyOf(j).Failures[0]; f.LostSeconds == nil || *f.LostSeconds != 2 {
		t.Errorf("the user's bug at 112 s cost %v: want its own loss's 2 s, not the hang's 13", f.LostSeconds)
	}
}
