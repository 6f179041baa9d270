package main

import (
	"encoding/xml"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/common/model"
)

func TestLinesAreNamedByTheLegendFormatAndSkipWhatCannotBeDrawn(t *testing.T) {
	start := time.Unix(1000, 0)
	at := func(s int64) model.Time { return model.TimeFromUnix(1000 + s) }
	m := model.Matrix{
		{Metric: model.Metric{"category": "NodeLost", "kind": "down"}, Values: []model.SamplePair{{Timestamp: at(0), Value: 1}, {Timestamp: at(1), Value: model.SampleValue(math.NaN())}, {Timestamp: at(2), Value: 3}}},
		{Metric: model.Metric{"category": "Hang", "kind": "down"}, Values: []model.SamplePair{{Timestamp: at(5), Value: model.SampleValue(math.Inf(1))}}},
	}
	lines := linesOf(m, "{{category}} ({{ kind }})", start)
	if len(lines) != 2 || lines[0].Legend != "Hang (down)" || lines[1].Legend != "NodeLost (down)" {
		t.Fatalf("legends: %+v", lines)
	}
	if len(lines[0].X) != 0 || len(lines[1].X) != 2 || lines[1].X[1] != 2 || lines[1].Y[1] != 3 {
		t.Errorf("points: %+v", lines)
	}
	if got := linesOf(m[:1], "", start)[0].Legend; got != `{category="NodeLost", kind="down"}` {
		t.Errorf("no legend format: %q", got)
	}
}

func TestAChartIsWellFormedSVG(t *testing.T) {
	c := chart{Title: `Effective <training> & "time"`, Unit: "percentunit", Span: 2 * time.Minute, Zero: 3, Lines: []line{
		{Legend: "ns/job <1>", X: []float64{0, 1, 2, 30, 31}, Y: []float64{0, 0.5, 0.6, 0.7, 0.8}},
	}}
	s := c.svg()
	d := xml.NewDecoder(strings.NewReader(s))
	var texts []string
	paths := 0
	for {
		tok, err := d.Token()
		if err != nil {
			if err.Error() != "EOF" {
				t.Fatalf("not XML: %v\n%s", err, s)
			}
			break
		}
		switch e := tok.(type) {
		case xml.StartElement:
			if e.Name.Local == "path" {
				paths++
				for _, a := range e.Attr {
					// The line breaks over the absent 28 s: two pieces.
					if a.Name.Local == "d" && strings.Count(a.Value, "M") != 2 {
						t.Errorf("path %q: want two pieces", a.Value)
					}
				}
			}
		case xml.CharData:
			texts = append(texts, string(e))
		}
	}
	all := strings.Join(texts, "|")
	for _, want := range []string{`Effective <training> & "time"`, "ns/job <1>", "100%", "0%", "2m", "1m30s", "and 3 series at 0"} {
		if !strings.Contains(all, want) {
			t.Errorf("the chart lacks %q: %s", want, all)
		}
	}
	if paths != 1 {
		t.Errorf("%d paths, want 1", paths)
	}
	if empty := (chart{Title: "x", Span: time.Minute}).svg(); !strings.Contains(empty, "No data") {
		t.Error("an empty panel does not say No data")
	}
}

func TestTheYAxisCoversEveryValue(t *testing.T) {
	for _, c := range []struct {
		chart  chart
		lo, hi float64
	}{
		{chart{}, 0, 1},
		{chart{Lines: []line{{Y: []float64{3, 3}}}}, 0, 5},
		{chart{Lines: []line{{Y: []float64{-2, 5}}}}, -2, 5},
		{chart{Unit: "s", Lines: []line{{Y: []float64{15.07}}}}, 0, 20},
		{chart{Lines: []line{{Y: []float64{0.22}}}}, 0, 0.25},
		{chart{Unit: "percentunit", Lines: []line{{Y: []float64{0.4}}}}, 0, 1},
	} {
		if lo, hi := c.chart.yRange(); lo != c.lo || hi != c.hi {
			t.Errorf("%+v: %v..%v, want %v..%v", c.chart.Lines, lo, hi, c.lo, c.hi)
		}
	}
}

func TestPanelsShareTheSpanOfTheirPoints(t *testing.T) {
	charts := []chart{
		{Lines: []line{{X: []float64{180, 200}, Y: []float64{0, 0}}}},
		{Lines: []line{{X: []float64{190, 300}, Y: []float64{1, 2}}, {}}},
	}
	first, last := span(charts)
	if first != 180 || last != 300 {
		t.Fatalf("span %v..%v, want 180..300", first, last)
	}
	if got := charts[1].shifted(first)[0].X; got[0] != 10 || got[1] != 120 {
		t.Errorf("shifted to %v", got)
	}
	if !charts[0].Lines[0].allZero() || charts[1].Lines[0].allZero() {
		t.Error("allZero")
	}
	got := aligned(charts)
	if len(got) != 2 || got[0].Span != 120*time.Second || len(got[0].Lines) != 0 || got[0].Zero != 1 ||
		len(got[1].Lines) != 1 || got[1].Lines[0].X[0] != 10 || got[1].Zero != 1 {
		t.Errorf("aligned: %+v", got)
	}
	if first, last := span(nil); first != 0 || last != 0 {
		t.Errorf("no points: %v..%v", first, last)
	}
}
