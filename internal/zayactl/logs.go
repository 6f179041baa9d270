package zayactl

import (
	"context"
	"fmt"
	"io"
	"slices"
	"time"

	"github.com/spf13/cobra"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/kubernetes"

	trainingv1alpha1 "github.com/zaya-operator/zaya-operator/api/v1alpha1"
	"github.com/zaya-operator/zaya-operator/controllers/gang"
	"github.com/zaya-operator/zaya-operator/controllers/recovery"
	"github.com/zaya-operator/zaya-operator/controllers/workerpod"
)

func (s *session) logsCmd() *cobra.Command {
	var rank int32
	var root, previous bool
	var tail int64
	cmd := &cobra.Command{
		Use:   "logs JOB [--rank N | --root]",
		Short: "A rank's worker log (rank 0 by default), or the root cause's of the last failure; --previous for the container before the last restart",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			job, pods, err := s.job(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			pick := logPick{Rank: rank, Previous: previous}
			if root {
				if pick, err = rootPick(job); err != nil {
					return err
				}
			}
			pod, prev, err := logPod(job, pods, pick)
			if err != nil {
				return err
			}
			return s.streamLogs(cmd.Context(), pod, prev, tail)
		},
	}
	cmd.Flags().Int32Var(&rank, "rank", 0, "the rank whose log to show")
	cmd.Flags().BoolVar(&root, "root", false, "the log of the last failure's root rank, as it failed")
	cmd.Flags().BoolVarP(&previous, "previous", "p", false, "the worker container before its last restart")
	cmd.Flags().Int64Var(&tail, "tail", -1, "lines from the end (-1: all)")
	cmd.MarkFlagsMutuallyExclusive("rank", "root")
	return cmd
}

// logPick is whose log to show.
type logPick struct {
	Rank     int32
	Node     string // the failure's node, for --root: its pod there, if any is left
	Previous bool
	Failure  *trainingv1alpha1.JobFailure
}

// rootPick is the last failure's root rank.
func rootPick(job *trainingv1alpha1.ZayaTrainingJob) (logPick, error) {
	f := job.Status.LastFailure
	if f == nil || f.Rank == nil {
		return logPick{}, fmt.Errorf("job %s/%s has no failure of a rank recorded (status.lastFailure)", job.Namespace, job.Name)
	}
	return logPick{Rank: *f.Rank, Node: f.Node, Failure: f}, nil
}

// logPod picks the pod of the rank (for a failure: the one on its node, the newest else) and
// whether to read its previous container: a root whose container restarted since the failure.
func logPod(job *trainingv1alpha1.ZayaTrainingJob, pods []corev1.Pod, pick logPick) (*corev1.Pod, bool, error) {
	ranks, _ := recovery.SplitSpares(job, pods)
	var found []*corev1.Pod
	for i := range ranks {
		if r, ok := gang.Rank(&ranks[i]); ok && r == pick.Rank {
			found = append(found, &ranks[i])
		}
	}
	if len(found) == 0 {
		return nil, false, fmt.Errorf("no pod of rank %d of job %s/%s is left", pick.Rank, job.Namespace, job.Name)
	}
	slices.SortFunc(found, func(a, b *corev1.Pod) int { return b.CreationTimestamp.Compare(a.CreationTimestamp.Time) }) // newest first
	pod := found[0]
	if pick.Node != "" {
		if i := slices.IndexFunc(found, func(p *corev1.Pod) bool { return p.Spec.NodeName == pick.Node }); i >= 0 {
			pod = found[i]
		}
	}
	prev := pick.Previous
	if f := pick.Failure; f != nil {
		prev = prev || failedRunIsPrevious(gang.WorkerStatus(pod), f.Time.Time)
	}
	return pod, prev, nil
}

// failedRunIsPrevious says the run that failed at failed (when the operator recorded it) is
// the worker's previous container: the kubelet restarted it since, or is about to. A real
// kubelet restarts a container by its restart rules as soon as it exits, often before the
// operator's pass records the failure: the current run may start before failed, and it is
// the previous run that ended just before (recordedWithin; a second's slack: both times are
// kept in seconds). A previous run that ended long before was not the failure: the current
// run was running when it was recorded (a hang, a lost GPU).
func failedRunIsPrevious(w *corev1.ContainerStatus, failed time.Time) bool {
	if w == nil || w.RestartCount == 0 {
		return false
	}
	if w.State.Waiting != nil {
		return true // the failed run ended; the next one has not started
	}
	if w.State.Running == nil {
		return false // the current run is the one that ended
	}
	if !w.State.Running.StartedAt.Time.Before(failed) {
		return true
	}
	last := w.LastTerminationState.Terminated
	return last != nil && !last.FinishedAt.After(failed.Add(time.Second)) && last.FinishedAt.After(failed.Add(-recordedWithin))
}

// recordedWithin bounds how long after a worker's exit the operator records it: a pass or a
// few (its resync is far shorter), and a restart's back-off.
const recordedWithin = time.Minute

func (s *session) streamLogs(ctx context.Context, pod *corev1.Pod, previous bool, tail int64) error {
	cfg, err := s.rest()
	if err != nil {
		return err
	}
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return err
	}
	opts := &corev1.PodLogOptions{Container: pod.Spec.Containers[workerpod.WorkerContainer(&pod.Spec)].Name, Previous: previous}
	if tail >= 0 {
		opts.TailLines = &tail
	}
	which := "current"
	if previous {
		which = "previous"
	}
	_, _ = fmt.Fprintf(s.errs, "# pod %s on %s, rank %s, %s container\n", pod.Name, pod.Spec.NodeName, pod.Labels[trainingv1alpha1.RankLabel], which)
	r, err := cs.CoreV1().Pods(pod.Namespace).GetLogs(pod.Name, opts).Stream(ctx)
	if err != nil {
		return fmt.Errorf("reading pod %s's log: %w", pod.Name, err)
	}
	defer func() { _ = r.Close() }()
	_, err = io.Copy(s.out, r)
	return err
}
