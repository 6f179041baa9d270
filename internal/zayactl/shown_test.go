package zayactl

import (
	"bytes"
	"encoding/xml"
	"errors"
	"io"
	"strings"
	"testing"
	"time"

	"k8s.io/utils/ptr"

	trainingv1alpha1 "github.com/zaya-operator/zaya-operator/api/v1alpha1"
)

// What others write, as a hostile tenant would: terminal control sequences (a clipboard write,
// a window title, a screen clear), a line laid out like the plugin's own, markup, a
// right-to-left override, bytes that are not UTF-8.
var hostile = []string{
	"\x1b]52;c;Y3VybCBldmlsLnNoIHwgc2g=\x07",
	"\x1b]0;owned\x07",
	"\x1b[2J\x1b[H",
	"exit 1\n  root:      rank 0 on other-tenants-node (NodeLost)",
	"<script>alert(1)</script> & </text>",
	"GPU\u202eUH\u2066\u200b",
	"\xff\xfe\x9b31m",
	"\u2028\x00\x7f\x85",
}

func TestShownLeavesNothingThatActsOnATerminal(t *testing.T) {
	for _, s := range hostile {
		got := shown(s)
		for _, r := range got {
			if r < 0x20 || r == 0x7f || (r >= 0x80 && r < 0xa0) || r == '\u202e' || r == '\u2066' || r == '\u200b' || r == '\u2028' || r == '\ufffd' {
				t.Errorf("shown(%q) = %q keeps %U", s, got, r)
			}
		}
	}
	for in, want := range map[string]string{
		"rank 1 exited 137": "rank 1 exited 137",
		"Grüße, 東京":         "Grüße, 東京",
		"a\nb":              "a ⏎ b",
		"\x1b[2J":           `\x1b[2J`,
		"\xff":              `\xff`,
		"GPU\u202eUH":       `GPU\u202eUH`,
		"tab\there":         "tab here",
	} {
		if got := shown(in); got != want {
			t.Errorf("shown(%q) = %q, want %q", in, got, want)
		}
	}
}

// controlled reports the first byte of out that is a control character other than a line
// break (and the plugin's own tab-free output has none), or -1.
func controlled(out string) int {
	for i := 0; i < len(out); i++ {
		if c := out[i]; (c < 0x20 && c != '\n') || c == 0x7f {
			return i
		}
	}
	return -1
}

// Every report of the plugin prints what others wrote inert and on its own line: the report's
// lines are the plugin's, however many lines the values held.
func TestReportsPrintWhatOthersWroteInert(t *testing.T) {
	at := time.Date(2026, 12, 7, 4, 0, 0, 0, time.UTC)
	for i, bad := range hostile {
		why := Why{Job: "ns/llm", Failed: bad, Failures: []Failure{{Time: at, Rank: ptr.To[int32](1), Node: bad, Reason: bad, Category: bad,
			Rule: bad, Evidence: bad, Message: bad, Action: bad, Quarantined: true}}}
		st := Status{Job: "ns/llm", State: bad, Goodput: bad, Waiting: bad, Ranks: []RankState{{Pod: bad, Node: bad, State: bad}},
			Spares: []SpareState{{Pod: bad, Node: bad}}, Quarantined: []Quarantine{{Node: bad, Reason: bad}}}
		tl := Timeline{Job: "ns/llm", From: at, To: at.Add(time.Minute), EffectiveTrainingTime: "50%",
			Segments: []Segment{{Kind: "Lost", Category: bad, Start: at, End: at.Add(time.Minute)}},
			Lost:     []trainingv1alpha1.GoodputLoss{{Category: bad, Failures: 1}}}
		pf := Preflight{Namespace: "ns", Checks: []Check{{Name: "Operator", Result: warn, Detail: bad, Fix: bad}}}
		for name, render := range map[string]func(io.Writer) error{
			"why": why.text, "status": st.text, "goodput": func(w io.Writer) error { return tl.text(w, false) }, "preflight": pf.text,
		} {
			var b bytes.Buffer
			if err := render(&b); err != nil {
				t.Fatal(err)
			}
			out := b.String()
			if j := controlled(out); j >= 0 {
				t.Errorf("%s, value %d: a control byte %q at %d:\n%s", name, i, out[j], j, out)
			}
			roots := 0
			for line := range strings.Lines(out) {
				if strings.HasPrefix(line, "  root:") {
					roots++
				}
			}
			if name == "why" && roots != 1 {
				t.Errorf("why, value %d: a forged root line:\n%s", i, out)
			}
		}
		// The timeline as SVG stays a well-formed document.
		d := xml.NewDecoder(strings.NewReader(tl.svg()))
		for {
			_, err := d.Token()
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				t.Errorf("svg, value %d (%q): not well-formed: %v", i, bad, err)
				break
			}
		}
	}
}
