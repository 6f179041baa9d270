package zayactl

import (
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	trainingv1alpha1 "github.com/zaya-operator/zaya-operator/api/v1alpha1"
)

// Why is every failure the job still remembers (status.recentFailures), newest first, and how
// the job ended if it failed.
type Why struct {
	Job      string    `json:"job"`
	Failed   string    `json:"failed,omitempty"` // the Failed condition's reason and message
	Failures []Failure `json:"failures"`
}

// Failure is one root failure: where, what, the evidence, the cascade, what the operator did
// and what it cost.
type Failure struct {
	Time        time.Time `json:"time"`
	Attempt     int32     `json:"attempt"`
	Rank        *int32    `json:"rank,omitempty"`
	Node        string    `json:"node,omitempty"`
	Reason      string    `json:"reason"`
	Category    string    `json:"category,omitempty"`
	Rule        string    `json:"rule,omitempty"`
	Evidence    string    `json:"evidence,omitempty"`
	Message     string    `json:"message,omitempty"`
	Cascaded    int32     `json:"cascaded"`
	Action      string    `json:"action,omitempty"`
	Quarantined bool      `json:"quarantined,omitempty"` // its node is on the job's quarantine list for it
	// LostSeconds is what it cost: the time until the job trained again plus the steps trained
	// again (status.goodput.history); nil when that is not known (yet, or any more).
	LostSeconds *float64 `json:"lostSeconds,omitempty"`
	// Open says the job has not trained since it.
	Open bool `json:"open,omitempty"`
	// Recovery is the way back from it, stage by stage, as the operator recorded it
	// (status: recovery); empty where it recorded none.
	Recovery []Stage `json:"recovery,omitempty"`
}

// Stage is one stage of a recovery: when it was reached, and the seconds since the first
// stage known (the gang's last step).
type Stage struct {
	Stage   string    `json:"stage"`
	At      time.Time `json:"at"`
	Seconds float64   `json:"seconds"`
}

// stagesOf lays a recovery's timeline out in the order of the way back.
func stagesOf(r *trainingv1alpha1.RecoveryTimeline) []Stage {
	if r == nil {
		return nil
	}
	var out []Stage
	for _, s := range []struct {
		name string
		at   *metav1.MicroTime
	}{
		{"last step", r.LastStep}, {"detected", r.Detected}, {"decided", r.Decided}, {"ranks running", r.Running},
		{"worker started", r.WorkerStarted}, {"rendezvous", r.Rendezvous}, {"training", r.Training},
	} {
		if s.at == nil {
			continue
		}
		st := Stage{Stage: s.name, At: s.at.Time}
		if len(out) > 0 {
			st.Seconds = s.at.Sub(out[0].At).Seconds()
		}
		out = append(out, st)
	}
	return out
}

func (s *session) whyCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "why JOB",
		Short: "Every restart's root cause and the failure that ended the job: rank, node, category, rule, evidence, cascade, what the operator did, time lost",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			job, _, err := s.job(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			w := whyOf(job)
			return s.print(w, w.text)
		},
	}
}

// whyOf reads the job's failures from its status.
func whyOf(job *trainingv1alpha1.ZayaTrainingJob) Why {
	st := &job.Status
	out := Why{Job: job.Namespace + "/" + job.Name, Failures: []Failure{}}
	if c := meta.FindStatusCondition(st.Conditions, trainingv1alpha1.ConditionFailed); c != nil && meta.IsStatusConditionTrue(st.Conditions, c.Type) {
		out.Failed = c.Reason + ": " + c.Message
	}
	for i, f := range st.RecentFailures {
		x := Failure{Time: f.Time.Time, Attempt: f.Attempt, Rank: f.Rank, Node: f.Node, Reason: f.Reason, Category: f.Category, Rule: f.Rule,
			Evidence: f.Evidence, Message: f.Message, Cascaded: f.Cascaded, Action: string(f.Action)}
		x.Quarantined = quarantinedFor(st, i)
		x.LostSeconds, x.Open = lostTo(st.Goodput, f)
		x.Recovery = stagesOf(f.Recovery)
		out.Failures = append(out.Failures, x)
	}
	return out
}

// quarantinedFor reports whether recent failure i is the one its node is quarantined for: the
// newest failure on the node at or before the quarantine.
func quarantinedFor(st *trainingv1alpha1.ZayaTrainingJobStatus, i int) bool {
	f := st.RecentFailures[i]
	for _, q := range st.QuarantinedNodes {
		if q.Name != f.Node || f.Node == "" || q.Since.Add(time.Second).Before(f.Time.Time) {
			continue
		}
		for _, newer := range st.RecentFailures[:i] { // newest first
			if newer.Node == f.Node && !q.Since.Add(time.Second).Before(newer.Time.Time) {
				return false // a later failure there is the one
			}
		}
		return true
	}
	return false
}

// lostTo is what failure f cost: the closed loss of its category that spans its time, or the
// open one that began before it. A failure's time keeps whole seconds, cut down, and its loss
// begins at the gang's last step, which the ranks' exits may place a moment after that: hence
// the slack. A loss of another category is another failure's (seen on a chaos run: a user's
// bug found the hang's loss still open a second before its own began).
func lostTo(g *trainingv1alpha1.GoodputStatus, f trainingv1alpha1.JobFailure) (*float64, bool) {
	if g == nil {
		return nil, false
	}
	const slack = 2 * time.Second
	at := f.Time.Time
	for i := len(g.History) - 1; i >= 0; i-- {
		h := g.History[i]
		if h.Category == "" || h.Category != f.Category || h.Since.Add(-slack).After(at) || h.Until.Time.Before(at.Add(-slack)) {
			continue
		}
		return ptr.To(h.Until.Sub(h.Since.Time).Seconds() + float64(h.RecomputeMilliseconds)/1000), false
	}
	if o := g.Open; o != nil && o.Category == f.Category && !o.Since.Add(-slack).After(at) {
		return nil, true
	}
	return nil, false
}

func (w Why) text(out io.Writer) error {
	p := func(format string, args ...any) { _, _ = fmt.Fprintf(out, format, args...) }
	p("Job: %s\n", shown(w.Job))
	if w.Failed != "" {
		p("Failed: %s\n", shown(w.Failed))
	}
	if len(w.Failures) == 0 {
		p("No failures recorded.\n")
		return nil
	}
	for _, f := range w.Failures {
		p("\n%s  attempt %d: %s\n", f.Time.UTC().Format(time.RFC3339), f.Attempt, shown(orDash(f.Category, f.Reason)))
		if f.Rank != nil {
			p("  root:      rank %d on %s (%s)\n", *f.Rank, shown(orDash(f.Node, "-")), shown(f.Reason))
		} else {
			p("  root:      node %s (%s)\n", shown(orDash(f.Node, "-")), shown(f.Reason))
		}
		if f.Rule != "" {
			p("  rule:      %s\n", shown(f.Rule))
		}
		if f.Evidence != "" {
			p("  evidence:  %s\n", shown(f.Evidence))
		}
		if f.Message != "" {
			p("  message:   %s\n", shown(f.Message))
		}
		p("  cascade:   %d other ranks failed with it\n", f.Cascaded)
		did := actionWords(f.Action)
		if f.Quarantined {
			did += "; node " + shown(f.Node) + " quarantined"
		}
		p("  operator:  %s\n", did)
		switch {
		case f.LostSeconds != nil:
			p("  lost:      %s\n", (time.Duration(*f.LostSeconds * float64(time.Second))).Round(100*time.Millisecond))
		case f.Open:
			p("  lost:      still losing: the job has not trained since\n")
		}
		if len(f.Recovery) > 0 {
			parts := []string{fmt.Sprintf("%s %s", f.Recovery[0].Stage, f.Recovery[0].At.UTC().Format("15:04:05.000"))}
			for _, s := range f.Recovery[1:] {
				parts = append(parts, fmt.Sprintf("%s %+.2fs", s.Stage, s.Seconds))
			}
			p("  recovery:  %s\n", strings.Join(parts, ", "))
		}
	}
	return nil
}

func actionWords(a string) string {
	switch trainingv1alpha1.FailureAction(a) {
	case trainingv1alpha1.FailureActionInPlace:
		return "restarted the gang in place"
	case trainingv1alpha1.FailureActionReplacedPods:
		return "replaced the failed ranks' pods, the others restarted in place"
	case trainingv1alpha1.FailureActionRecreated:
		return "recreated the whole gang"
	case trainingv1alpha1.FailureActionFailedJob:
		return "failed the job"
	}
	return "not recorded (an operator before this field)"
}

func orDash(s, alt string) string {
	if s == "" {
		return alt
	}
	return s
}
