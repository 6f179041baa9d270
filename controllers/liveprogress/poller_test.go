package liveprogress

import (
	"context"
	"encoding/json"
	"math"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/types"

	"github.com/zaya-operator/zaya-operator/api/contract"
)

func TestStraggling(t *testing.T) {
	cases := []struct {
		name    string
		seconds []float64
		nodes   int
		margin  int
		rank    int
	}{
		{"even", []float64{1, 1.05, 0.97, 1.02}, 4, 25, -1},
		{"one slow", []float64{1, 1, 1.5, 1}, 4, 25, 2},
		{"just within the margin", []float64{1, 1, 1.24, 1}, 4, 25, -1},
		{"two nodes", []float64{0.03, 0.06}, 2, 25, 1},
		{"the others' median, not the mean", []float64{1, 1, 1, 3, 9}, 5, 25, 4},
		{"a report of another length", []float64{1, 3}, 4, 25, -1},
		{"one node", []float64{1}, 1, 25, -1},
		{"nothing measured yet", []float64{0, 0, 0}, 3, 25, -1},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			rank, _, _, ok := Straggling(c.seconds, c.nodes, c.margin)
			if !ok {
				rank = -1
			}
			if rank != c.rank {
				t.Errorf("Straggling(%v) = rank %d, want %d", c.seconds, rank, c.rank)
			}
		})
	}
}

// serve answers the progress path with h and returns the server's host:port.
func serve(t *testing.T, h http.HandlerFunc) string {
	t.Helper()
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	return strings.TrimPrefix(srv.URL, "http://")
}

func TestFetchRefusesWhatNoWorkerWouldSend(t *testing.T) {
	now := time.Now()
	good := contract.Progress{Step: 40, ResumedFrom: 20, CheckpointStep: 20, StepSeconds: 0.5,
		TrainingSince: now.Add(-time.Minute), LastStepAt: now, NodeStepSeconds: []float64{0.4, 0.5}}
	other := serve(t, func(w http.ResponseWriter, _ *http.Request) { _ = json.NewEncoder(w).Encode(good) })
	cases := []struct {
		name  string
		h     http.HandlerFunc
		fails string
	}{
		{"too large", func(w http.ResponseWriter, _ *http.Request) {
			_, _ = w.Write([]byte(`{"step":1,"nodeStepSeconds":[` + strings.Repeat("1,", contract.ProgressMaxBytes) + `1]}`))
		}, "size limit"},
		{"a redirect elsewhere", func(w http.ResponseWriter, r *http.Request) {
			http.Redirect(w, r, "http://"+other+contract.ProgressPath, http.StatusFound)
		}, "status 302"},
		{"an error", func(w http.ResponseWriter, _ *http.Request) { http.Error(w, "no", http.StatusInternalServerError) }, "status 500"},
		{"not JSON", func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("<html>")) }, "invalid character"},
		{"too slow", func(w http.ResponseWriter, r *http.Request) {
			select {
			case <-r.Context().Done():
			case <-time.After(10 * time.Second):
			}
		}, "Timeout"},
	}
	c := NewClient(nil)
	c.Timeout = 500 * time.Millisecond
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Fetch(context.Background(), c, serve(t, tc.h), now)
			if err == nil || !strings.Contains(err.Error(), tc.fails) {
				t.Errorf("Fetch: %v, want an error with %q", err, tc.fails)
			}
		})
	}
	got, err := Fetch(context.Background(), c, other, now)
	if err != nil || got.Step != 40 || !got.LastStepAt.Equal(now) || len(got.NodeStepSeconds) != 2 {
		t.Errorf("a good report: %+v, %v", got, err)
	}
}

func TestSanitizeDropsImpossibleValues(t *testing.T) {
	now := time.Now()
	p := sanitize(contract.Progress{Step: -4, ResumedFrom: 9, CheckpointStep: -1, StepSeconds: 1e9,
		TrainingSince: now.AddDate(-3, 0, 0), LastStepAt: now.Add(48 * time.Hour), NodeStepSeconds: []float64{1, -2}}, now)
	if p.Step != 0 || p.ResumedFrom != 0 || p.CheckpointStep != 0 || p.StepSeconds != 0 ||
		!p.TrainingSince.IsZero() || !p.LastStepAt.IsZero() || p.NodeStepSeconds != nil {
		t.Errorf("sanitize kept %+v", p)
	}
	// A step past contract.MaxStep is no worker's: dropped, so the operator's step arithmetic
	// (a step plus the steps since at the reported pace) cannot wrap.
	p = sanitize(contract.Progress{Step: math.MaxInt64, ResumedFrom: contract.MaxStep + 1, CheckpointStep: math.MaxInt64}, now)
	if p.Step != 0 || p.ResumedFrom != 0 || p.CheckpointStep != 0 {
		t.Errorf("sanitize kept steps past the bound: %+v", p)
	}
	// A worker's start and rendezvous: far off, or met before it started, are dropped (a
	// year past 9999 is a status nobody can store).
	p = sanitize(contract.Progress{StartedAt: time.Date(12000, 1, 1, 0, 0, 0, 0, time.UTC), MetAt: now}, now)
	if !p.StartedAt.IsZero() || !p.MetAt.Equal(now) {
		t.Errorf("sanitize kept a start in year 12000: %+v", p)
	}
	p = sanitize(contract.Progress{StartedAt: now, MetAt: now.Add(-time.Second)}, now)
	if !p.StartedAt.Equal(now) || !p.MetAt.IsZero() {
		t.Errorf("sanitize kept a rendezvous before the start: %+v", p)
	}
}

// TestAStragglerTakesSeveralReportsToComeAndToGo feeds the poller reports as a worker would
// serve them and checks when it names a straggler, when it stops, and when it wakes the
// reconciler.
func TestAStragglerTakesSeveralReportsToComeAndToGo(t *testing.T) {
	var mu sync.Mutex
	prog := contract.Progress{TrainingSince: time.Now(), NodeStepSeconds: []float64{1, 1, 1, 1}}
	addr := serve(t, func(w http.ResponseWriter, _ *http.Request) {
		mu.Lock()
		defer mu.Unlock()
		prog.Step++
		prog.LastStepAt = time.Now()
		_ = json.NewEncoder(w).Encode(prog)
	})
	set := func(f func(*contract.Progress)) {
		mu.Lock()
		defer mu.Unlock()
		f(&prog)
	}
	key := types.NamespacedName{Namespace: "ns", Name: "job"}
	notified := 0
	p := &Poller{HTTP: NewClient(nil), Now: time.Now, Notify: func(types.NamespacedName) { notified++ }}
	p.Watch(key, Target{UID: "u1", Addr: addr, Nodes: 4, MarginPercent: 25})
	round := func() *Straggler {
		p.Poll(context.Background())
		r, ok := p.Latest(key, "u1")
		if !ok {
			t.Fatal("no report")
		}
		return r.Straggler
	}
	if s := round(); s != nil || notified != 1 {
		t.Fatalf("even ranks: straggler %+v, notified %d (want the first report's)", s, notified)
	}
	set(func(p *contract.Progress) { p.NodeStepSeconds = []float64{1, 1, 1, 2} })
	for i := range StragglerReports - 1 {
		if s := round(); s != nil {
			t.Fatalf("report %d of a slow rank 3 already named it: %+v", i+1, s)
		}
	}
	s := round()
	if s == nil || s.Rank != 3 || s.Seconds != 2 || s.Others != 1 || notified != 2 {
		t.Fatalf("after %d reports: straggler %+v, notified %d", StragglerReports, s, notified)
	}
	set(func(p *contract.Progress) { p.CheckpointStep = 20 })
	if round() == nil || notified != 3 {
		t.Fatalf("a checkpoint while a rank straggles woke the reconciler %d times, want 3", notified)
	}
	set(func(p *contract.Progress) { p.NodeStepSeconds = []float64{1, 1, 1, 1} })
	for i := range StragglerReports - 1 {
		if round() == nil {
			t.Fatalf("one even report (%d) cleared the straggler", i+1)
		}
	}
	if s := round(); s != nil || notified != 4 {
		t.Fatalf("after %d even reports: straggler %+v, notified %d", StragglerReports, s, notified)
	}
	set(func(p *contract.Progress) { p.TrainingSince = time.Now() })
	round()
	if notified != 5 {
		t.Errorf("a new run's report woke the reconciler %d times, want 5", notified)
	}
	if _, ok := p.Latest(key, "other-uid"); ok {
		t.Error("a report served for another job's UID")
	}
	p.Watch(key, Target{UID: "u1", Addr: "127.0.0.1:1", Nodes: 4, MarginPercent: 25})
	if _, ok := p.Latest(key, "u1"); ok {
		t.Error("rank 0 moved, and the old run's report stayed")
	}
	p.Forget(key)
	if p.Watching(key, "u1") {
		t.Error("a forgotten job is still watched")
	}
}
