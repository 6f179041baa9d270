package supervisor

import (
	"strings"
	"testing"
	"time"
)

func TestParseReportReadsOnlyStepNumbers(t *testing.T) {
	for _, c := range []struct {
		in   string
		want report
	}{
		{"step=12\ncheckpoint=10\n", report{12, 10, -1}},
		{" step = 12 \r\ncheckpoint=10\nresumed=8", report{12, 10, 8}}, // spaces, CRLF, no last newline
		{"step=1\nstep=2\n", report{2, -1, -1}},
		{"step=-1\ncheckpoint=1e3\nresumed=0x10\nstep=\nstep\n=4\nStep=5\n", noReport},
		{"step=9007199254740992\ncheckpoint=1125899906842625\n", noReport}, // past contract.MaxStep
		{"\x00\xff\nstep=3\n", report{3, -1, -1}},
		{"checkpoint=7\n" + strings.Repeat("#", progressMaxBytes) + "\nstep=9\n", report{-1, 7, -1}}, // past the bound
		{"step=123" + strings.Repeat(" ", progressMaxBytes), noReport},                               // no whole line within it
	} {
		if got := parseReport([]byte(c.in)); got != c.want {
			t.Errorf("%.40q: %+v, want %+v", c.in, got, c.want)
		}
	}
}

// A trainer that says nothing of checkpoints is counted from its first step, and reports no
// restored step; its times come from the reports that showed a step higher than before.
func TestAStepOnlyTrainerIsCountedFromItsFirstStep(t *testing.T) {
	t0 := time.Date(2026, 11, 25, 18, 0, 0, 0, time.UTC)
	p := &progress{}
	for i, step := range []int64{7, 8, 8, 3, 10} {
		p.add(report{step, -1, -1}, t0.Add(time.Duration(i)*time.Second))
	}
	doc, _ := p.snapshot()
	if doc.Step != 10 || doc.ResumedFrom != 7 || doc.CheckpointStep != 0 || !doc.TrainingSince.Equal(t0.Add(time.Second)) ||
		!doc.LastStepAt.Equal(t0.Add(4*time.Second)) || doc.StepSeconds != 1.5 {
		t.Errorf("%+v", doc)
	}
	want := "training-step=10\nstep-seconds=1.500000\ntraining-since=2026-11-25T18:00:01Z\nlast-step-at=2026-11-25T18:00:04Z"
	if got := strings.Join(p.lines(), "\n"); got != want {
		t.Errorf("lines:\n%s\nwant:\n%s", got, want)
	}
	if lines := (&progress{}).lines(); lines != nil {
		t.Errorf("no report, lines %q", lines)
	}
}
