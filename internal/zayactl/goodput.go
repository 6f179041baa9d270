package zayactl

import (
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/spf13/cobra"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	trainingv1alpha1 "github.com/zaya-operator/zaya-operator/api/v1alpha1"
)

// Timeline is a job's life: queued, starting, training, and each loss by category, with the
// figures of status.goodput.
type Timeline struct {
	Job      string    `json:"job"`
	From     time.Time `json:"from"`
	To       time.Time `json:"to"`
	Segments []Segment `json:"segments"`
	// Nodes is spec.nodes: a Training segment on fewer was an elastic job's, shrunk.
	Nodes int32 `json:"nodes,omitempty"`
	// The account as status.goodput keeps it (milliseconds), and its ratio.
	WallMilliseconds      int64                          `json:"wallMilliseconds"`
	TrainingMilliseconds  int64                          `json:"trainingMilliseconds"`
	StartupMilliseconds   int64                          `json:"startupMilliseconds"`
	LostMilliseconds      int64                          `json:"lostMilliseconds"`
	EffectiveTrainingTime string                         `json:"effectiveTrainingTime,omitempty"`
	Lost                  []trainingv1alpha1.GoodputLoss `json:"lost,omitempty"`
}

// Segment is one stretch of the timeline.
type Segment struct {
	// Kind is Queued, Startup, Training, Lost, or Earlier (before the oldest span kept).
	Kind     string    `json:"kind"`
	Category string    `json:"category,omitempty"` // a loss's
	Start    time.Time `json:"start"`
	End      time.Time `json:"end"`
	// RecomputeSeconds is what the steps trained again after a loss cost (within the
	// training that follows it).
	RecomputeSeconds float64 `json:"recomputeSeconds,omitempty"`
	Open             bool    `json:"open,omitempty"` // not over yet
	// Nodes is the gang's width while Training, where status says it (an elastic job's).
	Nodes int32 `json:"nodes,omitempty"`
}

// Seconds is the segment's length.
func (s Segment) Seconds() float64 { return s.End.Sub(s.Start).Seconds() }

func (s *session) goodputCmd() *cobra.Command {
	var out string
	cmd := &cobra.Command{
		Use:   "goodput JOB",
		Short: "The job's life as a timeline (queued, startup, training, each loss by category); --out FILE.svg draws it",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			job, _, err := s.job(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			t := timelineOf(job, time.Now())
			if out != "" {
				if !strings.HasSuffix(out, ".svg") {
					return fmt.Errorf("--out %q: only SVG is drawn (name the file .svg)", out)
				}
				if err := os.WriteFile(out, []byte(t.svg()), 0o644); err != nil {
					return err
				}
			}
			return s.print(t, func(w io.Writer) error { return t.text(w, terminal(w)) })
		},
	}
	cmd.Flags().StringVar(&out, "out", "", "also draw the timeline into this SVG file")
	return cmd
}

// timelineOf lays the job's starts and losses (status.goodput.history, and the loss open
// now) between its creation and its end (or now): the time between them trained.
func timelineOf(job *trainingv1alpha1.ZayaTrainingJob, now time.Time) Timeline {
	st := &job.Status
	t := Timeline{Job: job.Namespace + "/" + job.Name, From: job.CreationTimestamp.Time, To: now, Segments: []Segment{}, Nodes: job.Spec.Nodes}
	if st.CompletionTime != nil {
		t.To = st.CompletionTime.Time
	}
	g := st.Goodput
	if g != nil {
		t.WallMilliseconds, t.TrainingMilliseconds, t.StartupMilliseconds, t.LostMilliseconds = g.WallMilliseconds, g.TrainingMilliseconds, g.StartupMilliseconds, g.LostMilliseconds
		t.EffectiveTrainingTime, t.Lost = g.EffectiveTrainingTime, g.Lost
	}
	if st.StartTime == nil {
		t.Segments = append(t.Segments, Segment{Kind: "Queued", Start: t.From, End: t.To, Open: st.CompletionTime == nil})
		return t
	}
	start := clampT(st.StartTime.Time, t.From, t.To)
	if g != nil && len(g.History) > 0 && g.History[0].Category == "" && !g.History[0].Since.Before(&metav1.MicroTime{Time: start}) &&
		g.History[0].Since.Sub(start) < time.Second {
		start = g.History[0].Since.Time // the start, to the microsecond (startTime keeps seconds)
	}
	cursor := t.From
	add := func(s Segment) {
		s.Start, s.End = clampT(s.Start, cursor, t.To), clampT(s.End, cursor, t.To)
		if s.End.After(s.Start) || s.Open {
			t.Segments = append(t.Segments, s)
		}
		cursor = maxT(cursor, s.End)
	}
	add(Segment{Kind: "Queued", Start: t.From, End: start})
	var spans []trainingv1alpha1.GoodputSpan
	if g != nil {
		spans = slices.Clone(g.History)
	}
	if len(spans) == trainingv1alpha1.MaxGoodputHistory && spans[0].Since.After(cursor) {
		add(Segment{Kind: "Earlier", Start: cursor, End: spans[0].Since.Time}) // what the history no longer keeps
	}
	var width int32 // the width the gang trained at since the last span
	for _, h := range spans {
		if h.Since.After(cursor) {
			add(Segment{Kind: "Training", Start: cursor, End: h.Since.Time, Nodes: width})
		}
		width = h.Nodes
		kind := "Lost"
		if h.Category == "" {
			kind = "Startup"
		}
		add(Segment{Kind: kind, Category: h.Category, Start: h.Since.Time, End: h.Until.Time, RecomputeSeconds: float64(h.RecomputeMilliseconds) / 1000})
	}
	var open *Segment
	if g != nil && g.Open != nil {
		kind := "Lost"
		if g.Open.Category == "" {
			kind = "Startup"
		}
		open = &Segment{Kind: kind, Category: g.Open.Category, Start: g.Open.Since.Time, End: t.To, Open: st.CompletionTime == nil}
	}
	if open != nil && open.Start.After(cursor) {
		add(Segment{Kind: "Training", Start: cursor, End: open.Start, Nodes: width})
	}
	if open != nil {
		add(*open)
	} else if t.To.After(cursor) {
		add(Segment{Kind: "Training", Start: cursor, End: t.To, Nodes: width})
	}
	return t
}

func clampT(x, lo, hi time.Time) time.Time {
	if x.Before(lo) {
		return lo
	}
	if x.After(hi) {
		return hi
	}
	return x
}

func maxT(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

// barWidth is how many characters the terminal's bar takes.
const barWidth = 72

// mark is how a segment kind looks in the bar: a letter off a terminal, a colour on one.
func mark(kind string, colour bool) string {
	letters := map[string]string{"Queued": "q", "Startup": "s", "Training": "=", "Lost": "x", "Earlier": "."}
	if !colour {
		return letters[kind]
	}
	colours := map[string]string{"Queued": "90", "Startup": "33", "Training": "32", "Lost": "31", "Earlier": "90"}
	return "\x1b[" + colours[kind] + "m█\x1b[0m"
}

func (t Timeline) text(w io.Writer, colour bool) error {
	p := func(format string, args ...any) { _, _ = fmt.Fprintf(w, format, args...) }
	p("Job: %s\n", shown(t.Job))
	total := t.To.Sub(t.From)
	p("%s → %s (%s)\n", t.From.UTC().Format(time.RFC3339), t.To.UTC().Format(time.RFC3339), total.Round(time.Second))
	if total > 0 {
		var bar strings.Builder
		for i := range barWidth {
			at := t.From.Add(time.Duration(float64(total) * (float64(i) + 0.5) / barWidth))
			kind := "Training"
			for _, s := range t.Segments {
				if !at.Before(s.Start) && at.Before(s.End) {
					kind = s.Kind
				}
			}
			bar.WriteString(mark(kind, colour))
		}
		p("|%s|\n", bar.String())
		p("%s queued  %s startup  %s training  %s lost  %s earlier\n", mark("Queued", colour), mark("Startup", colour), mark("Training", colour), mark("Lost", colour), mark("Earlier", colour))
	}
	p("\nSTART                 LENGTH     WHAT\n")
	for _, s := range t.Segments {
		what := s.Kind
		if s.Category != "" {
			what += " (" + shown(s.Category) + ")"
		}
		if s.Nodes > 0 && s.Nodes < t.Nodes {
			what += fmt.Sprintf(" on %d of %d nodes", s.Nodes, t.Nodes)
		}
		if s.RecomputeSeconds > 0 {
			what += fmt.Sprintf(", then %s of steps trained again", (time.Duration(s.RecomputeSeconds * float64(time.Second))).Round(100*time.Millisecond))
		}
		if s.Open {
			what += ", under way"
		}
		p("%-21s %-10s %s\n", s.Start.UTC().Format(time.RFC3339), time.Duration(s.Seconds()*float64(time.Second)).Round(100*time.Millisecond), what)
	}
	if t.EffectiveTrainingTime != "" {
		p("\nEffective training time %s: of %s started, %s trained, %s starting, %s lost to failures\n", t.EffectiveTrainingTime,
			ms(t.WallMilliseconds), ms(t.TrainingMilliseconds), ms(t.StartupMilliseconds), ms(t.LostMilliseconds))
		for _, l := range t.Lost {
			p("  %-18s %d failure(s), %s down, %s trained again\n", shown(l.Category), l.Failures, ms(l.DownMilliseconds), ms(l.RecomputeMilliseconds))
		}
	}
	return nil
}

func ms(n int64) time.Duration {
	return (time.Duration(n) * time.Millisecond).Round(100 * time.Millisecond)
}

// svg draws the timeline: one row of segments over time, a legend and the account.
func (t Timeline) svg() string {
	const width, left, right, top, rowH = 960.0, 20.0, 20.0, 40.0, 36.0
	total := t.To.Sub(t.From).Seconds()
	x := func(at time.Time) float64 {
		if total <= 0 {
			return left
		}
		return left + (width-left-right)*at.Sub(t.From).Seconds()/total
	}
	fill := map[string]string{"Queued": "#9e9e9e", "Startup": "#f0b400", "Training": "#2e9d4f", "Lost": "#d62728", "Earlier": "#d0d0d0"}
	var b strings.Builder
	height := top + rowH + 80 + 16*float64(len(t.Lost))
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%.0f" height="%.0f" font-family="sans-serif" font-size="12">`+"\n", width, height)
	fmt.Fprintf(&b, `<text x="%.0f" y="20" font-size="14">%s: %s effective training time</text>`+"\n", left, xmlText(t.Job), xmlText(orDash(t.EffectiveTrainingTime, "?")))
	for _, s := range t.Segments {
		title := s.Kind
		if s.Category != "" {
			title += " " + s.Category
		}
		title += fmt.Sprintf(" %s, from %s", time.Duration(s.Seconds()*float64(time.Second)).Round(100*time.Millisecond), s.Start.UTC().Format(time.RFC3339))
		fmt.Fprintf(&b, `<rect x="%.2f" y="%.0f" width="%.2f" height="%.0f" fill="%s"><title>%s</title></rect>`+"\n",
			x(s.Start), top, max(x(s.End)-x(s.Start), 0.5), rowH, fill[s.Kind], xmlText(title))
		if s.Kind == "Lost" && x(s.End)-x(s.Start) > 40 {
			fmt.Fprintf(&b, `<text x="%.2f" y="%.0f" fill="white">%s</text>`+"\n", x(s.Start)+3, top+rowH/2+4, xmlText(s.Category))
		}
	}
	for i := 0; i <= 4; i++ { // the time axis
		at := t.From.Add(time.Duration(float64(t.To.Sub(t.From)) * float64(i) / 4))
		fmt.Fprintf(&b, `<text x="%.2f" y="%.0f" text-anchor="middle">%s</text>`+"\n", x(at), top+rowH+16, at.Sub(t.From).Round(time.Second))
	}
	lx := left
	for _, k := range []string{"Queued", "Startup", "Training", "Lost", "Earlier"} {
		fmt.Fprintf(&b, `<rect x="%.0f" y="%.0f" width="12" height="12" fill="%s"/><text x="%.0f" y="%.0f">%s</text>`+"\n", lx, top+rowH+32, fill[k], lx+16, top+rowH+42, k)
		lx += 100
	}
	y := top + rowH + 66
	for _, l := range t.Lost {
		fmt.Fprintf(&b, `<text x="%.0f" y="%.0f">%s: %d failure(s), %s down, %s trained again</text>`+"\n", left, y, xmlText(l.Category), l.Failures, ms(l.DownMilliseconds), ms(l.RecomputeMilliseconds))
		y += 16
	}
	b.WriteString("</svg>\n")
	return b.String()
}
