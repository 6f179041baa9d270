package controllers

import (
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	trainingv1alpha1 "github.com/zaya-operator/zaya-operator/api/v1alpha1"
	"github.com/zaya-operator/zaya-operator/controllers/gang"
	"github.com/zaya-operator/zaya-operator/controllers/recovery"
	"github.com/zaya-operator/zaya-operator/internal/testjob"
)

func TestNoticeVanishedOnlyWhereEveryRankRan(t *testing.T) {
	now := time.Date(2026, 11, 26, 4, 0, 0, 0, time.UTC)
	rank0 := func(job *trainingv1alpha1.ZayaTrainingJob) corev1.Pod { return *newWorkerPod(job, nil, 0) }
	for _, tc := range []struct {
		name  string
		ready int32
		edit  func(*trainingv1alpha1.ZayaTrainingJob, *[]corev1.Pod)
		want  []string // names of the vanished stand-ins
	}{
		{name: "all ranks were ready, rank 1 gone", ready: 2, want: []string{"llm-0-1"}},
		{name: "the gang was still starting", ready: 1},
		{name: "a replacement under way", ready: 2, edit: func(j *trainingv1alpha1.ZayaTrainingJob, _ *[]corev1.Pod) {
			j.Status.Replacing = []trainingv1alpha1.ReplacedPod{{Rank: 1, UID: "u"}}
		}},
		{name: "rank 1 seen terminating", ready: 2, edit: func(j *trainingv1alpha1.ZayaTrainingJob, pods *[]corev1.Pod) {
			p := *newWorkerPod(j, nil, 1)
			p.DeletionTimestamp = &metav1.Time{Time: now}
			*pods = append(*pods, p)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			job := testjob.MakeZayaTrainingJob("llm", "ns").Nodes(2).Defaulted().Obj()
			job.Status.ReadyNodes = tc.ready
			pods := []corev1.Pod{rank0(job)}
			if tc.edit != nil {
				tc.edit(job, &pods)
			}
			g := gang.Of(job, pods)
			before := len(g.Disrupted)
			g.NoticeVanished(job, now)
			var got []string
			for _, p := range g.Disrupted[before:] {
				got = append(got, p.Name)
				v := recovery.Judge(&job.Spec, p, now, 0, nil)
				if v.Failure.Reason != trainingv1alpha1.FailureReasonPodDeleted || *v.Failure.Rank != 1 {
					t.Errorf("judged %s %v, want PodDeleted of rank 1", v.Failure.Reason, v.Failure.Rank)
				}
				if g.DisruptedPod(1) != p {
					t.Error("the stand-in is not found for its rank")
				}
			}
			if len(got) != len(tc.want) || (len(got) > 0 && got[0] != tc.want[0]) {
				t.Errorf("vanished %v, want %v", got, tc.want)
			}
		})
	}
}

// TestVanishedRankIsTimedFromItsPeersExit: the loss is as old as the first worker exit since
// the gang started (peers stop over the missing rank and restart in place before the operator
// notices), so an in-place restart counts them back.
func TestVanishedRankIsTimedFromItsPeersExit(t *testing.T) {
	now := time.Date(2026, 11, 26, 4, 0, 0, 0, time.UTC)
	job := testjob.MakeZayaTrainingJob("llm", "ns").Nodes(2).Defaulted().Obj()
	job.Status.ReadyNodes = 2
	job.Status.StartTime = &metav1.Time{Time: now.Add(-time.Hour)}
	peer := *newWorkerPod(job, nil, 0)
	exit := now.Add(-30 * time.Second)
	peer.Status.ContainerStatuses = []corev1.ContainerStatus{{Name: "worker", RestartCount: 1,
		LastTerminationState: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: 75, FinishedAt: metav1.Time{Time: exit}}}}}
	g := gang.Of(job, []corev1.Pod{peer})
	g.NoticeVanished(job, now)
	if len(g.Disrupted) != 1 || !g.Disrupted[0].DeletionTimestamp.Time.Equal(exit) {
		t.Fatalf("stand-ins %v, want one timed %s", g.Disrupted, exit)
	}
}
