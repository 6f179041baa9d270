// Package scrape reads what the benchmarks report about the operator process: its
// Prometheus metrics (API requests by verb, reconcile-time histograms) and its CPU time and
// peak memory from /proc.
package scrape

import (
	"fmt"
	"math"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// Metrics is one scrape of a /metrics endpoint.
type Metrics map[string]*dto.MetricFamily

// Get scrapes url; an empty url gives empty Metrics (every sum reads 0).
func Get(url string) (Metrics, error) {
	if url == "" {
		return Metrics{}, nil
	}
	resp, err := http.Get(url)
	if err != nil {
		return nil, err
	}
	defer func() { _ = resp.Body.Close() }()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(resp.Body)
	return Metrics(fams), err
}

func matches(m *dto.Metric, labels map[string]string) bool {
	for k, v := range labels {
		found := false
		for _, l := range m.GetLabel() {
			if l.GetName() == k && l.GetValue() == v {
				found = true
			}
		}
		if !found {
			return false
		}
	}
	return true
}

// Sum adds up the counters or gauges of family name whose labels include labels.
func (m Metrics) Sum(name string, labels map[string]string) float64 {
	total := 0.0
	for _, s := range m[name].GetMetric() {
		if matches(s, labels) {
			total += s.GetCounter().GetValue() + s.GetGauge().GetValue() + s.GetUntyped().GetValue()
		}
	}
	return total
}

// Requests counts the client's API requests (client-go's rest_client_requests_total); with
// verbs, only those HTTP methods.
func (m Metrics) Requests(verbs ...string) float64 {
	if len(verbs) == 0 {
		return m.Sum("rest_client_requests_total", nil)
	}
	total := 0.0
	for _, v := range verbs {
		total += m.Sum("rest_client_requests_total", map[string]string{"method": v})
	}
	return total
}

// Writes counts the client's mutating API requests.
func (m Metrics) Writes() float64 { return m.Requests("POST", "PUT", "PATCH", "DELETE") }

// Histogram is cumulative bucket counts by upper bound, as Prometheus keeps them.
type Histogram struct {
	Bounds []float64 // ascending, +Inf last
	Counts []float64 // cumulative
}

// Histogram merges the histograms of family name whose labels include labels.
func (m Metrics) Histogram(name string, labels map[string]string) Histogram {
	byBound := map[float64]float64{}
	for _, s := range m[name].GetMetric() {
		if !matches(s, labels) || s.GetHistogram() == nil {
			continue
		}
		for _, b := range s.GetHistogram().GetBucket() {
			if !math.IsInf(b.GetUpperBound(), 1) { // the sample count below stands for it
				byBound[b.GetUpperBound()] += float64(b.GetCumulativeCount())
			}
		}
		byBound[math.Inf(1)] += float64(s.GetHistogram().GetSampleCount())
	}
	var h Histogram
	for b := range byBound {
		h.Bounds = append(h.Bounds, b)
	}
	slices.Sort(h.Bounds)
	for _, b := range h.Bounds {
		h.Counts = append(h.Counts, byBound[b])
	}
	return h
}

// Since is what h counted after before (the same histogram scraped earlier).
func (h Histogram) Since(before Histogram) Histogram {
	prev := map[float64]float64{}
	for i, b := range before.Bounds {
		prev[b] = before.Counts[i]
	}
	out := Histogram{Bounds: slices.Clone(h.Bounds), Counts: make([]float64, len(h.Counts))}
	for i, b := range h.Bounds {
		out.Counts[i] = h.Counts[i] - prev[b]
	}
	return out
}

// Count is how many observations h holds.
func (h Histogram) Count() float64 {
	if len(h.Counts) == 0 {
		return 0
	}
	return h.Counts[len(h.Counts)-1]
}

// Quantile estimates the q-quantile by linear interpolation inside the bucket that holds it,
// as PromQL's histogram_quantile does; NaN when h is empty. Past the last finite bound it
// reports that bound.
func (h Histogram) Quantile(q float64) float64 {
	total := h.Count()
	if total == 0 {
		return math.NaN()
	}
	rank := q * total
	lower, below := 0.0, 0.0
	for i, b := range h.Bounds {
		if h.Counts[i] >= rank {
			if math.IsInf(b, 1) {
				return lower
			}
			in := h.Counts[i] - below
			if in == 0 {
				return b
			}
			return lower + (b-lower)*(rank-below)/in
		}
		lower, below = b, h.Counts[i]
	}
	return lower
}

// CPUSeconds is process pid's user+system CPU time (Linux /proc).
func CPUSeconds(pid int) (float64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	s := string(b)
	// Fields after the parenthesised command name; utime and stime are the 14th and 15th.
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+2:])
	if len(f) < 13 {
		return 0, fmt.Errorf("/proc/%d/stat: %d fields", pid, len(f))
	}
	utime, err := strconv.ParseFloat(f[11], 64)
	if err != nil {
		return 0, err
	}
	stime, err := strconv.ParseFloat(f[12], 64)
	if err != nil {
		return 0, err
	}
	return (utime + stime) / 100, nil // USER_HZ
}

// Memory is a process's resident set now and at its peak, in bytes (Linux /proc).
func Memory(pid int) (rss, peak float64, err error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, 0, err
	}
	for line := range strings.Lines(string(b)) {
		f := strings.Fields(line)
		if len(f) != 3 || f[2] != "kB" {
			continue
		}
		v, err := strconv.ParseFloat(f[1], 64)
		if err != nil {
			return 0, 0, err
		}
		switch f[0] {
		case "VmRSS:":
			rss = v * 1024
		case "VmHWM:":
			peak = v * 1024
		}
	}
	if peak == 0 {
		return 0, 0, fmt.Errorf("/proc/%d/status: no VmHWM", pid)
	}
	return rss, peak, nil
}
