package zayactl

import (
	"fmt"
	"io"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	trainingv1alpha1 "github.com/zaya-operator/zaya-operator/api/v1alpha1"
	"github.com/zaya-operator/zaya-operator/controllers/gang"
	"github.com/zaya-operator/zaya-operator/controllers/recovery"
)

// Status is a job's gang at a glance.
type Status struct {
	Job             string       `json:"job"`
	State           string       `json:"state"`
	Attempt         int32        `json:"attempt"`
	Restarts        int32        `json:"restarts"`
	InPlaceRestarts int32        `json:"inPlaceRestarts"`
	PodsReplaced    int32        `json:"podsReplaced"`
	Nodes           int32        `json:"nodes"`
	GPUsPerNode     int32        `json:"gpusPerNode"`
	ReadyNodes      int32        `json:"readyNodes"`
	Goodput         string       `json:"goodput,omitempty"`
	Step            *int64       `json:"checkpointStep,omitempty"`
	Waiting         string       `json:"waiting,omitempty"`
	Ranks           []RankState  `json:"ranks"`
	Spares          []SpareState `json:"spares,omitempty"`
	Quarantined     []Quarantine `json:"quarantined,omitempty"`
}

// RankState is one rank of the current attempt.
type RankState struct {
	Rank     int32  `json:"rank"`
	Pod      string `json:"pod,omitempty"`
	Node     string `json:"node,omitempty"`
	State    string `json:"state"`
	Ready    bool   `json:"ready"`
	Restarts int32  `json:"restarts"`
}

// SpareState is one warm spare.
type SpareState struct {
	Pod   string `json:"pod"`
	Node  string `json:"node,omitempty"`
	Ready bool   `json:"ready"`
}

// Quarantine is a node the job keeps off.
type Quarantine struct {
	Node   string    `json:"node"`
	Reason string    `json:"reason"`
	Since  time.Time `json:"since"`
	Until  time.Time `json:"until"`
}

func (s *session) statusCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "status JOB",
		Short: "The gang at a glance: each rank's state and node, restarts, spares, quarantined nodes, goodput, what it waits for",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			job, pods, err := s.job(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			st := statusOf(job, pods)
			return s.print(st, st.text)
		},
	}
}

// statusOf reads the gang of the job's current attempt from its status and pods.
func statusOf(job *trainingv1alpha1.ZayaTrainingJob, pods []corev1.Pod) Status {
	st := &job.Status
	out := Status{
		Job: job.Namespace + "/" + job.Name, State: stateOf(st), Attempt: st.Attempt(), Restarts: st.Restarts,
		InPlaceRestarts: st.InPlaceRestarts, PodsReplaced: st.PodsReplaced, Nodes: job.Spec.Nodes, GPUsPerNode: job.Spec.GPUsPerNode,
		ReadyNodes: st.ReadyNodes, Waiting: waitingFor(st),
	}
	if st.Goodput != nil {
		out.Goodput = st.Goodput.EffectiveTrainingTime
	}
	if st.LastCheckpoint != nil {
		out.Step = &st.LastCheckpoint.Step
	}
	ranks, spares := recovery.SplitSpares(job, pods)
	g := gang.Of(job, ranks)
	for r, pod := range g.Ranks {
		row := RankState{Rank: int32(r), State: "Missing"}
		if pod != nil {
			row.Pod, row.Node, row.State, row.Ready = pod.Name, pod.Spec.NodeName, podState(pod), gang.Ready(pod)
			if w := gang.WorkerStatus(pod); w != nil {
				row.Restarts = w.RestartCount
			}
		}
		out.Ranks = append(out.Ranks, row)
	}
	for _, pod := range spares {
		out.Spares = append(out.Spares, SpareState{Pod: pod.Name, Node: pod.Spec.NodeName, Ready: gang.Ready(pod)})
	}
	slices.SortFunc(out.Spares, func(a, b SpareState) int { return strings.Compare(a.Pod, b.Pod) })
	expire := job.Spec.FaultTolerance.Quarantine.ExpireAfter.Duration
	for _, q := range st.QuarantinedNodes {
		out.Quarantined = append(out.Quarantined, Quarantine{Node: q.Name, Reason: q.Reason, Since: q.Since.Time, Until: q.Since.Add(expire)})
	}
	return out
}

// stateOf names where the job stands, from its conditions.
func stateOf(st *trainingv1alpha1.ZayaTrainingJobStatus) string {
	for _, c := range []string{trainingv1alpha1.ConditionSucceeded, trainingv1alpha1.ConditionFailed, trainingv1alpha1.ConditionSuspended,
		trainingv1alpha1.ConditionQueued, trainingv1alpha1.ConditionRestarting, trainingv1alpha1.ConditionWaitingForCapacity, trainingv1alpha1.ConditionRunning} {
		if meta.IsStatusConditionTrue(st.Conditions, c) {
			return c
		}
	}
	return "Starting"
}

// waitingFor says what a job that does not train waits for: its condition's words.
func waitingFor(st *trainingv1alpha1.ZayaTrainingJobStatus) string {
	for _, c := range []string{trainingv1alpha1.ConditionQueued, trainingv1alpha1.ConditionSuspended, trainingv1alpha1.ConditionRestarting,
		trainingv1alpha1.ConditionWaitingForCapacity} {
		if x := meta.FindStatusCondition(st.Conditions, c); x != nil && x.Status == metav1.ConditionTrue {
			return x.Type + ": " + x.Message
		}
	}
	if x := meta.FindStatusCondition(st.Conditions, trainingv1alpha1.ConditionRunning); x != nil && x.Status == metav1.ConditionFalse &&
		!meta.IsStatusConditionTrue(st.Conditions, trainingv1alpha1.ConditionSucceeded) && !meta.IsStatusConditionTrue(st.Conditions, trainingv1alpha1.ConditionFailed) {
		return x.Reason + ": " + x.Message
	}
	return ""
}

// podState is a rank pod's state as kubectl get pods would say it, from its worker container.
func podState(pod *corev1.Pod) string {
	switch {
	case !pod.DeletionTimestamp.IsZero():
		return "Terminating"
	case pod.Spec.NodeName == "":
		return "Pending"
	}
	if w := gang.WorkerStatus(pod); w != nil {
		switch {
		case w.State.Waiting != nil:
			return w.State.Waiting.Reason
		case w.State.Terminated != nil:
			return fmt.Sprintf("Exited(%d)", w.State.Terminated.ExitCode)
		case w.State.Running != nil:
			return "Running"
		}
	}
	return string(pod.Status.Phase)
}

func (st Status) text(w io.Writer) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "Job:\t%s\n", shown(st.Job))
	fmt.Fprintf(tw, "State:\t%s\n", shown(st.State))
	fmt.Fprintf(tw, "Gang:\t%d ranks × %d GPUs, %d ready\n", st.Nodes, st.GPUsPerNode, st.ReadyNodes)
	fmt.Fprintf(tw, "Attempt:\t%d (restarts %d: %d in place; %d pods replaced)\n", st.Attempt, st.Restarts, st.InPlaceRestarts, st.PodsReplaced)
	if st.Goodput != "" {
		fmt.Fprintf(tw, "Goodput:\t%s of its started time trained\n", shown(st.Goodput))
	}
	if st.Step != nil {
		fmt.Fprintf(tw, "Checkpoint:\tstep %d\n", *st.Step)
	}
	if st.Waiting != "" {
		fmt.Fprintf(tw, "Waiting:\t%s\n", shown(st.Waiting))
	}
	fmt.Fprintln(tw)
	fmt.Fprintln(tw, "RANK\tPOD\tNODE\tSTATE\tREADY\tRESTARTS")
	for _, r := range st.Ranks {
		fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%v\t%d\n", r.Rank, shown(dash(r.Pod)), shown(dash(r.Node)), shown(r.State), r.Ready, r.Restarts)
	}
	if len(st.Spares) > 0 {
		fmt.Fprintln(tw)
		fmt.Fprintln(tw, "SPARE\tNODE\tREADY")
		for _, s := range st.Spares {
			fmt.Fprintf(tw, "%s\t%s\t%v\n", shown(s.Pod), shown(dash(s.Node)), s.Ready)
		}
	}
	if len(st.Quarantined) > 0 {
		fmt.Fprintln(tw)
		fmt.Fprintln(tw, "QUARANTINED\tREASON\tSINCE\tUNTIL")
		for _, q := range st.Quarantined {
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", shown(q.Node), shown(q.Reason), q.Since.UTC().Format(time.RFC3339), q.Until.UTC().Format(time.RFC3339))
		}
	}
	return tw.Flush()
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
