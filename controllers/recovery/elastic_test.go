package recovery

import (
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/zaya-operator/zaya-operator/api/contract"
	trainingv1alpha1 "github.com/zaya-operator/zaya-operator/api/v1alpha1"
	"github.com/zaya-operator/zaya-operator/controllers/gang"
	"github.com/zaya-operator/zaya-operator/controllers/liveprogress"
	"github.com/zaya-operator/zaya-operator/internal/testjob"
)

// waiting is a gang of width ranks of which the last unschedulable ones wait for a node
// since since.
func waiting(width, unschedulable int32, since time.Time) gang.Gang {
	return gang.Gang{Ranks: make([]*corev1.Pod, width), Unschedulable: unschedulable,
		FirstUnschedulable: width - unschedulable, UnschedulableSince: since}
}

func elasticJob(nodes, gpus, cp, minNodes int32) *trainingv1alpha1.ZayaTrainingJob {
	return testjob.MakeZayaTrainingJob("j", "ns").Nodes(nodes).GPUsPerNode(gpus).ContextParallel(cp).
		Elastic(minNodes, 2*time.Minute, 5*time.Minute).Defaulted().Obj()
}

func TestAGangShrinksToTheNodesItHasAfterShrinkAfter(t *testing.T) {
	// A pod for rank 3 with a message, for UnschedulableMessage.
	pending := &corev1.Pod{Status: corev1.PodStatus{Conditions: []corev1.PodCondition{{Type: corev1.PodScheduled, Status: corev1.ConditionFalse,
		Reason: corev1.PodReasonUnschedulable, Message: "0/3 nodes are available"}}}}
	cases := []struct {
		name                string
		nodes, gpus, cp, mn int32
		unschedulable       int32
		waited              time.Duration
		want                int32
		reason              string
	}{
		{"not yet", 4, 1, 1, 2, 1, time.Minute, 0, ""},
		{"one node lost", 4, 1, 1, 2, 1, 2 * time.Minute, 3, trainingv1alpha1.ReasonShrinking},
		{"two lost, down to minNodes", 4, 1, 1, 2, 2, 3 * time.Minute, 2, trainingv1alpha1.ReasonShrinking},
		{"below minNodes", 4, 1, 1, 3, 2, 3 * time.Minute, 0, trainingv1alpha1.ReasonCannotShrink},
		{"rings of 2 GPUs over nodes of 1: 3 placed keep 2", 4, 1, 2, 2, 1, 3 * time.Minute, 2, trainingv1alpha1.ReasonShrinking},
		{"rings of 4 over nodes of 2: 3 placed keep 2", 8, 2, 4, 2, 5, 3 * time.Minute, 2, trainingv1alpha1.ReasonShrinking},
		{"no whole ring at or above minNodes", 4, 1, 4, 4, 1, 3 * time.Minute, 0, trainingv1alpha1.ReasonCannotShrink},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			job := elasticJob(c.nodes, c.gpus, c.cp, c.mn)
			g := waiting(c.nodes, c.unschedulable, now.Add(-c.waited))
			g.Ranks[g.FirstUnschedulable] = pending
			r := Shrink(job, g, now)
			if r.Nodes != c.want || r.Reason != c.reason {
				t.Fatalf("Shrink = %d nodes, %q (%s); want %d, %q", r.Nodes, r.Reason, r.Message, c.want, c.reason)
			}
			if c.reason == "" && r.Wait != 2*time.Minute-c.waited {
				t.Errorf("wait %v, want the rest of shrinkAfter", r.Wait)
			}
			if c.reason == trainingv1alpha1.ReasonShrinking && !strings.Contains(r.Message, "0/3 nodes are available") {
				t.Errorf("message %q does not say why the rank waits", r.Message)
			}
		})
	}
	if r := Shrink(testjob.MakeZayaTrainingJob("j", "ns").Nodes(4).Defaulted().Obj(), waiting(4, 1, now.Add(-time.Hour)), now); r != (Resize{}) {
		t.Errorf("a job without elastic: %+v, want nothing", r)
	}
	// A shrunk gang that loses another node shrinks further, counting from its width.
	job := elasticJob(4, 1, 1, 2)
	job.Status.CurrentNodes = 3
	g := waiting(3, 1, now.Add(-time.Hour))
	g.Ranks[2] = pending
	if r := Shrink(job, g, now); r.Nodes != 2 {
		t.Errorf("3 nodes, one lost: %d, want 2", r.Nodes)
	}
}

// holder is a grow holder ready since readyFor ago (not ready when readyFor < 0).
func holder(readyFor time.Duration) *corev1.Pod {
	status := corev1.ConditionTrue
	if readyFor < 0 {
		status = corev1.ConditionFalse
	}
	return &corev1.Pod{Status: corev1.PodStatus{Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: status,
		LastTransitionTime: metav1.NewTime(now.Add(-readyFor))}}}}
}

func TestAShrunkGangGrowsAtTheNextCheckpointOnceTheNodesStand(t *testing.T) {
	job := elasticJob(4, 1, 1, 2)
	job.Status.CurrentNodes = 2 // two nodes missing
	report := func(step, ckpt int64) *liveprogress.Report {
		return &liveprogress.Report{Progress: contract.Progress{Step: step, CheckpointStep: ckpt}}
	}
	if r := Grow(job, []*corev1.Pod{holder(10 * time.Minute)}, report(100, 90), now); r.Nodes != 0 || r.Mark != nil {
		t.Errorf("one of two holders: %+v, want nothing", r)
	}
	if r := Grow(job, []*corev1.Pod{holder(10 * time.Minute), holder(time.Minute)}, report(100, 90), now); r.Nodes != 0 || r.Mark != nil || r.Wait != 4*time.Minute {
		t.Errorf("a holder ready for 1m of 5m: %+v, want a wait of 4m", r)
	}
	if r := Grow(job, []*corev1.Pod{holder(time.Minute), holder(-1)}, report(100, 90), now); r.Wait != 0 || r.Nodes != 0 {
		t.Errorf("one holder ready, one pending: %+v, want no wait (the pending one's node is not there)", r)
	}
	// The nodes stood for growAfter: the step reached is noted, and nothing restarts yet.
	stood := []*corev1.Pod{holder(10 * time.Minute), holder(6 * time.Minute)}
	r := Grow(job, stood, report(100, 90), now)
	if r.Nodes != 0 || r.Mark == nil || *r.Mark != 101 || r.Reason != trainingv1alpha1.ReasonCapacityBack {
		t.Fatalf("holders stood: %+v, want step 101 noted", r)
	}
	job.Status.GrowAtStep = r.Mark
	if r := Grow(job, stood, report(130, 100), now); r.Nodes != 0 {
		t.Errorf("no checkpoint since: %+v, want nothing (no step in flight is killed)", r)
	}
	if r := Grow(job, stood, report(131, 101), now); r.Nodes != 4 || r.Reason != trainingv1alpha1.ReasonGrowing {
		t.Errorf("checkpoint 101 committed: %+v, want a grow to 4", r)
	}
	// A node that comes and goes: its holder's readiness starts again, the note goes.
	flapped := []*corev1.Pod{holder(10 * time.Minute), holder(30 * time.Second)}
	if r := Grow(job, flapped, report(131, 101), now); r.Nodes != 0 || !r.Unmark {
		t.Errorf("a holder ready again for 30s: %+v, want the note dropped", r)
	}
	if r := Grow(job, []*corev1.Pod{holder(10 * time.Minute), holder(-1)}, report(131, 101), now); r.Nodes != 0 || !r.Unmark {
		t.Errorf("a holder not ready: %+v, want the note dropped", r)
	}
	// Workers that report no progress: the gang grows once the nodes stood.
	job.Status.GrowAtStep = nil
	if r := Grow(job, stood, nil, now); r.Nodes != 4 {
		t.Errorf("no progress reports: %+v, want a grow", r)
	}
	// A whole gang has nothing to grow; a stale note goes.
	job.Status.CurrentNodes, job.Status.GrowAtStep = 4, ptr.To[int64](7)
	if r := Grow(job, stood, report(131, 101), now); r.Nodes != 0 || !r.Unmark {
		t.Errorf("a whole gang: %+v, want only the note dropped", r)
	}
}

// A grow never waits for a checkpoint that will not come: the job names none and its workers
// committed none, or two intervals of steps have passed since the mark without one.
func TestAGrowWaitsOnlyForACheckpointThatWillCome(t *testing.T) {
	job := elasticJob(4, 1, 1, 2)
	job.Status.CurrentNodes = 3
	stood := []*corev1.Pod{holder(10 * time.Minute)}
	report := func(step, ckpt int64) *liveprogress.Report {
		return &liveprogress.Report{Progress: contract.Progress{Step: step, CheckpointStep: ckpt}}
	}
	if r := Grow(job, stood, report(100, 0), now); r.Nodes != 4 || !strings.Contains(r.Message, "keeps no checkpoint") {
		t.Errorf("no spec.checkpoint, none committed: %+v, want a grow now", r)
	}
	if r := Grow(job, stood, report(100, 80), now); r.Nodes != 0 || r.Mark == nil {
		t.Errorf("no spec.checkpoint, but the trainer commits its own: %+v, want the step noted", r)
	}

	job.Spec.Checkpoint = &trainingv1alpha1.CheckpointSpec{Interval: &trainingv1alpha1.CheckpointInterval{Steps: ptr.To[int32](20)}}
	if r := Grow(job, stood, report(100, 0), now); r.Mark == nil || *r.Mark != 101 {
		t.Fatalf("checkpoints every 20 steps, none yet: %+v, want step 101 noted", r)
	}
	job.Status.GrowAtStep = ptr.To[int64](101)
	if r := Grow(job, stood, report(140, 100), now); r.Nodes != 0 {
		t.Errorf("39 steps past the mark: %+v, want a wait for the checkpoint", r)
	}
	if r := Grow(job, stood, report(141, 100), now); r.Nodes != 4 || !strings.Contains(r.Message, "no checkpoint was committed in the 40 steps since step 101") {
		t.Errorf("two intervals past the mark, no checkpoint: %+v, want a grow", r)
	}
	// A growAtStep written by hand is bounded before arithmetic: no wrap into an early grow.
	job.Status.GrowAtStep = ptr.To[int64](1<<63 - 1)
	if r := Grow(job, stood, report(contract.MaxStep, 100), now); r.Nodes != 0 {
		t.Errorf("growAtStep MaxInt64: %+v, want a wait", r)
	}
}

// Warm spares are not grow holders: a job with spares grows only when a holder stands.
func TestHoldersArePastTheWarmSpares(t *testing.T) {
	job := elasticJob(4, 1, 1, 2)
	job.Spec.FaultTolerance.Spares = 2
	var spares []*corev1.Pod
	for _, name := range []string{"j-spare-0", "j-spare-1", "j-spare-2", "j-3", "j-spare-x"} {
		spares = append(spares, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name}})
	}
	got := HoldersOf(job, spares)
	if len(got) != 1 || got[0].Name != "j-spare-2" {
		t.Errorf("holders of 2 warm spares: %v, want j-spare-2", got)
	}
}

// A status written by hand cannot make a gang of a size the spec does not allow.
func TestWidthReadsCurrentNodesOnlyWithinTheElasticRange(t *testing.T) {
	job := elasticJob(4, 1, 1, 2)
	for cur, want := range map[int32]int32{0: 4, 1: 4, 2: 2, 3: 3, 4: 4, 9: 4, -3: 4} {
		job.Status.CurrentNodes = cur
		if got := job.Width(); got != want {
			t.Errorf("currentNodes %d: width %d, want %d", cur, got, want)
		}
	}
	rings := elasticJob(8, 2, 8, 4) // rings of 4 nodes
	for cur, want := range map[int32]int32{4: 4, 6: 8, 5: 8} {
		rings.Status.CurrentNodes = cur
		if got := rings.Width(); got != want {
			t.Errorf("rings of 8 GPUs on 2 a node, currentNodes %d: width %d, want %d", cur, got, want)
		}
	}
	plain := testjob.MakeZayaTrainingJob("j", "ns").Nodes(4).Defaulted().Obj()
	plain.Status.CurrentNodes = 2
	if plain.Width() != 4 {
		t.Error("a job without elastic trains on spec.nodes whatever status says")
	}
}
