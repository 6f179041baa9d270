package scrape

import (
	"fmt"
	"math"
	"net/http"
	"net/http/httptest"
	"os"
	"testing"
)

const exposition = `# TYPE rest_client_requests_total counter
rest_client_requests_total{code="200",host="h",method="GET"} 40
rest_client_requests_total{code="201",host="h",method="POST"} 7
rest_client_requests_total{code="409",host="h",method="POST"} 1
rest_client_requests_total{code="200",host="h",method="PUT"} 2
rest_client_requests_total{code="200",host="h",method="DELETE"} 3
# TYPE controller_runtime_reconcile_time_seconds histogram
controller_runtime_reconcile_time_seconds_bucket{controller="a",le="0.1"} 5
controller_runtime_reconcile_time_seconds_bucket{controller="a",le="0.2"} 8
controller_runtime_reconcile_time_seconds_bucket{controller="a",le="+Inf"} 10
controller_runtime_reconcile_time_seconds_sum{controller="a"} 2
controller_runtime_reconcile_time_seconds_count{controller="a"} 10
controller_runtime_reconcile_time_seconds_bucket{controller="b",le="0.1"} 100
controller_runtime_reconcile_time_seconds_bucket{controller="b",le="0.2"} 100
controller_runtime_reconcile_time_seconds_bucket{controller="b",le="+Inf"} 100
controller_runtime_reconcile_time_seconds_sum{controller="b"} 1
controller_runtime_reconcile_time_seconds_count{controller="b"} 100
`

func TestGetSumsAndHistograms(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		_, _ = fmt.Fprint(w, exposition)
	}))
	defer srv.Close()
	m, err := Get(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	if got := m.Requests(); got != 53 {
		t.Errorf("requests = %v, want 53", got)
	}
	if got := m.Writes(); got != 13 {
		t.Errorf("writes = %v, want 13", got)
	}
	if got := m.Requests("POST"); got != 8 {
		t.Errorf("POSTs = %v, want 8", got)
	}
	h := m.Histogram("controller_runtime_reconcile_time_seconds", map[string]string{"controller": "a"})
	if h.Count() != 10 {
		t.Fatalf("count = %v, want 10 (controller b left out): %+v", h.Count(), h)
	}
	// 5 of 10 at or below 0.1 s: the median is the bucket's top; 0.65 lies 1.5/3 into (0.1, 0.2].
	for q, want := range map[float64]float64{0.5: 0.1, 0.65: 0.15, 0.8: 0.2, 0.99: 0.2} {
		if got := h.Quantile(q); math.Abs(got-want) > 1e-9 {
			t.Errorf("q%v = %v, want %v", q, got, want)
		}
	}
	if got := m.Histogram("controller_runtime_reconcile_time_seconds", nil).Count(); got != 110 {
		t.Errorf("merged count = %v, want 110", got)
	}
}

func TestHistogramSince(t *testing.T) {
	before := Histogram{Bounds: []float64{1, math.Inf(1)}, Counts: []float64{4, 4}}
	after := Histogram{Bounds: []float64{1, 2, math.Inf(1)}, Counts: []float64{6, 9, 10}}
	d := after.Since(before)
	if d.Count() != 6 || d.Counts[0] != 2 || d.Counts[1] != 9 {
		t.Errorf("since = %+v", d)
	}
	if q := (Histogram{}).Quantile(0.5); !math.IsNaN(q) {
		t.Errorf("empty histogram's median = %v, want NaN", q)
	}
}

func TestEmptyURLAndBadStatus(t *testing.T) {
	m, err := Get("")
	if err != nil || m.Requests() != 0 {
		t.Errorf("Get(\"\") = %v, %v", m, err)
	}
	srv := httptest.NewServer(http.NotFoundHandler())
	defer srv.Close()
	if _, err := Get(srv.URL); err == nil {
		t.Error("a 404 scraped without error")
	}
}

func TestProcessStats(t *testing.T) {
	if _, err := os.Stat("/proc/self/stat"); err != nil {
		t.Skip("no /proc")
	}
	cpu, err := CPUSeconds(os.Getpid())
	if err != nil || cpu < 0 {
		t.Errorf("cpu = %v, %v", cpu, err)
	}
	rss, peak, err := Memory(os.Getpid())
	if err != nil || rss <= 0 || peak < rss {
		t.Errorf("rss %v peak %v err %v", rss, peak, err)
	}
}
