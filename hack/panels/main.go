// Command panels draws the chart's Grafana dashboard's time-series panels as SVG, from a
// Prometheus that scraped a real operator: each panel's queries, as the dashboard writes them,
// are evaluated over a time range by Prometheus' own query_range API. No Grafana runs (its
// code is AGPL): the drawing is ours, plain lines with a legend, so docs/observability.md can
// show what the panels show on a real chaos run.
//
//	go run ./hack/panels -prometheus http://127.0.0.1:9090 -from 2026-11-29T19:00:00Z -to 2026-11-29T19:03:00Z -out docs/images/panels
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"time"

	"github.com/prometheus/client_golang/api"
	promv1 "github.com/prometheus/client_golang/api/prometheus/v1"
	"github.com/prometheus/common/model"
)

// dashboard is the part of Grafana's dashboard JSON a drawing reads.
type dashboard struct {
	Panels []panel `json:"panels"`
}

type panel struct {
	Type        string   `json:"type"`
	Title       string   `json:"title"`
	Description string   `json:"description"`
	Targets     []target `json:"targets"`
	FieldConfig struct {
		Defaults struct {
			Unit string `json:"unit"`
		} `json:"defaults"`
	} `json:"fieldConfig"`
}

type target struct {
	Expr         string `json:"expr"`
	LegendFormat string `json:"legendFormat"`
}

func main() {
	var (
		dash, promURL, out, from, to, only string
		step, rateInterval                 time.Duration
	)
	flag.StringVar(&dash, "dashboard", "charts/zaya-operator/files/dashboards/zaya-operator.json", "the dashboard's JSON")
	flag.StringVar(&promURL, "prometheus", "http://127.0.0.1:9090", "the Prometheus to query")
	flag.StringVar(&from, "from", "", "the range's start, RFC 3339")
	flag.StringVar(&to, "to", "", "the range's end, RFC 3339")
	flag.DurationVar(&step, "step", time.Second, "the query's resolution")
	flag.DurationVar(&rateInterval, "rate-interval", 15*time.Second, "what $__rate_interval stands for (Grafana: at least four scrape intervals)")
	flag.StringVar(&only, "panels", "", "a regular expression of the titles to draw (all by default)")
	flag.StringVar(&out, "out", "docs/images/panels", "the folder to write the SVGs into")
	flag.Parse()
	if err := run(dash, promURL, out, from, to, only, step, rateInterval); err != nil {
		fmt.Fprintln(os.Stderr, "panels:", err)
		os.Exit(1)
	}
}

func run(dash, promURL, out, from, to, only string, step, rateInterval time.Duration) error {
	start, err := time.Parse(time.RFC3339, from)
	if err != nil {
		return fmt.Errorf("-from: %w", err)
	}
	end, err := time.Parse(time.RFC3339, to)
	if err != nil {
		return fmt.Errorf("-to: %w", err)
	}
	pick, err := regexp.Compile(only)
	if err != nil {
		return fmt.Errorf("-panels: %w", err)
	}
	b, err := os.ReadFile(dash)
	if err != nil {
		return err
	}
	var d dashboard
	if err := json.Unmarshal(b, &d); err != nil {
		return fmt.Errorf("%s: %w", dash, err)
	}
	c, err := api.NewClient(api.Config{Address: promURL})
	if err != nil {
		return err
	}
	prom := promv1.NewAPI(c)
	if err := os.MkdirAll(out, 0o755); err != nil {
		return err
	}
	ctx := context.Background()
	var charts []chart
	for _, p := range d.Panels {
		if p.Type != "timeseries" || !pick.MatchString(p.Title) {
			continue
		}
		var lines []line
		for _, t := range p.Targets {
			expr := strings.NewReplacer("$__rate_interval", model.Duration(rateInterval).String(), "$namespace", ".*").Replace(t.Expr)
			v, warnings, _, err := prom.QueryRange(ctx, expr, promv1.Range{Start: start, End: end, Step: step})
			if err != nil {
				return fmt.Errorf("%s: %s: %w", p.Title, expr, err)
			}
			for _, w := range warnings {
				fmt.Fprintf(os.Stderr, "%s: %s: %s\n", p.Title, expr, w)
			}
			m, ok := v.(model.Matrix)
			if !ok {
				return fmt.Errorf("%s: %s: a %s, not a matrix", p.Title, expr, v.Type())
			}
			lines = append(lines, linesOf(m, t.LegendFormat, start)...)
		}
		charts = append(charts, chart{Title: p.Title, Unit: p.FieldConfig.Defaults.Unit, Lines: lines})
	}
	for _, c := range aligned(charts) {
		name := filepath.Join(out, slug(c.Title)+".svg")
		if err := os.WriteFile(name, []byte(c.svg()), 0o644); err != nil {
			return err
		}
		fmt.Printf("%s: %d series drawn, %d all zero\n", name, len(c.Lines), c.Zero)
	}
	return nil
}

// aligned gives every chart one span: from the first point any chart has to the last, so
// the minutes before the operator was first scraped are not drawn. Lines at 0 throughout are
// counted, not drawn.
func aligned(charts []chart) []chart {
	first, last := span(charts)
	out := make([]chart, 0, len(charts))
	for _, c := range charts {
		a := chart{Title: c.Title, Unit: c.Unit, Span: time.Duration((last - first) * float64(time.Second))}
		for _, l := range c.shifted(first) {
			if l.allZero() {
				a.Zero++
				continue
			}
			a.Lines = append(a.Lines, l)
		}
		out = append(out, a)
	}
	return out
}

// span is the first and last point of any line of the charts, in seconds.
func span(charts []chart) (first, last float64) {
	first, last = math.Inf(1), math.Inf(-1)
	for _, c := range charts {
		for _, l := range c.Lines {
			if len(l.X) > 0 {
				first, last = math.Min(first, l.X[0]), math.Max(last, l.X[len(l.X)-1])
			}
		}
	}
	if first > last {
		return 0, 0
	}
	return first, last
}

// shifted is the chart's lines with first as their time 0.
func (c chart) shifted(first float64) []line {
	out := make([]line, len(c.Lines))
	for i, l := range c.Lines {
		out[i] = line{Legend: l.Legend, Y: l.Y, X: make([]float64, len(l.X))}
		for j, x := range l.X {
			out[i].X[j] = x - first
		}
	}
	return out
}

// allZero says a line never left 0: the operator exports every reason and category from 0,
// and a legend of thirty zeros hides the lines that matter.
func (l line) allZero() bool {
	for _, y := range l.Y {
		if y != 0 {
			return false
		}
	}
	return true
}

// line is one series, its points as seconds from the range's start.
type line struct {
	Legend string
	X, Y   []float64
}

var legendLabel = regexp.MustCompile(`\{\{\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*\}\}`)

// linesOf turns a matrix into lines, each named by the target's legend format ({{label}}
// is the series' label, as Grafana writes it); NaN and infinite points are left out.
func linesOf(m model.Matrix, legend string, start time.Time) []line {
	var out []line
	for _, s := range m {
		name := legendLabel.ReplaceAllStringFunc(legend, func(x string) string {
			return string(s.Metric[model.LabelName(legendLabel.FindStringSubmatch(x)[1])])
		})
		if name == "" {
			name = s.Metric.String()
		}
		l := line{Legend: name}
		for _, p := range s.Values {
			v := float64(p.Value)
			if v != v || v > 1e300 || v < -1e300 {
				continue
			}
			l.X = append(l.X, p.Timestamp.Time().Sub(start).Seconds())
			l.Y = append(l.Y, v)
		}
		out = append(out, l)
	}
	sort.SliceStable(out, func(i, j int) bool { return out[i].Legend < out[j].Legend })
	return out
}

var notSlug = regexp.MustCompile(`[^a-z0-9]+`)

func slug(title string) string {
	return strings.Trim(notSlug.ReplaceAllString(strings.ToLower(title), "-"), "-")
}
