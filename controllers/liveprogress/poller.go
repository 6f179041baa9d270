// Package liveprogress polls rank 0 of each running job for its live progress
// (contract.Progress at contract.ProgressPath) and keeps, for each job, the latest report and
// the rank that straggles, if one does. The reconciler names what to poll (Watch, Forget: only
// it knows which pod is rank 0) and reads what was found (Latest); the poller wakes it
// (Notify) when something it acts on changed.
//
// A tenant's worker answers these requests, so everything read is bounded and checked: one
// GET to the pod's own address, no redirects, no proxy but the one configured, a deadline,
// a size limit, and values outside their range are dropped. A lie moves only its own job's
// figures.
package liveprogress

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"slices"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/zaya-operator/zaya-operator/api/contract"
)

// Target is what to poll for one job.
type Target struct {
	UID types.UID
	// Addr is rank 0's pod address and progress port (host:port).
	Addr string
	// Nodes is the job's NODE_RANK count: a report of another length names no straggler.
	Nodes int
	// MarginPercent is faultTolerance.stragglers.marginPercent.
	MarginPercent int
}

// Report is the latest progress read for a job.
type Report struct {
	contract.Progress
	// At is when it was read.
	At time.Time
	// Straggler is the rank that straggles, nil if none does.
	Straggler *Straggler
}

// Straggler is a rank whose steps keep it busy longer than the others' by the margin, in
// StragglerReports reports in a row.
type Straggler struct {
	Rank int
	// Seconds is its busy seconds per step, Others the other ranks' median.
	Seconds, Others float64
	// Since is when the first of those reports was read, Step the step it reported.
	Since time.Time
	Step  int64
}

// StragglerReports is how many reports in a row (each with steps trained since the one
// before) must single a rank out before it is a straggler, and must not before it no longer is.
const StragglerReports = 3

// Poller polls the watched jobs every Interval. It is a manager.Runnable.
type Poller struct {
	// HTTP is the client the polls use; nil: NewClient(nil).
	HTTP *http.Client
	// Interval is the time between two polls of a job.
	Interval time.Duration
	// Parallel bounds the polls in flight (default 16).
	Parallel int
	// Notify is called with a job whose report changed in a way the reconciler acts on: a new
	// run began training, the straggler changed, or a checkpoint landed while one straggles.
	Notify func(types.NamespacedName)
	// Now is the clock (default time.Now).
	Now func() time.Time

	mu   sync.Mutex
	jobs map[types.NamespacedName]*entry
}

type entry struct {
	target Target
	report *Report
	// candidate is the rank the last reports singled out (-1: none), for streak reports.
	candidate, streak int
	// quiet counts reports in a row that did not single the straggler out.
	quiet int
}

// NewClient is an HTTP client for polling workers: short deadlines, no redirects, no
// compression (a small document; and no bomb to inflate), through proxy if not nil.
func NewClient(proxy *url.URL) *http.Client {
	tr := &http.Transport{
		DialContext:           (&net.Dialer{Timeout: time.Second}).DialContext,
		ResponseHeaderTimeout: 2 * time.Second,
		MaxIdleConns:          64,
		MaxIdleConnsPerHost:   1,
		IdleConnTimeout:       30 * time.Second,
		DisableCompression:    true,
	}
	if proxy != nil {
		tr.Proxy = http.ProxyURL(proxy)
	}
	return &http.Client{
		Transport:     tr,
		Timeout:       3 * time.Second,
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}
}

// Client is the HTTP client the polls use.
func (p *Poller) Client() *http.Client {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.HTTP == nil {
		p.HTTP = NewClient(nil)
	}
	if p.Now == nil {
		p.Now = time.Now
	}
	return p.HTTP
}

// NeedLeaderElection is true: only the leader acts on reports.
func (p *Poller) NeedLeaderElection() bool { return true }

// Watch polls t for key from the next round on. A new UID or address is a new run to
// learn about: what was known of the old one is dropped.
func (p *Poller) Watch(key types.NamespacedName, t Target) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.jobs == nil {
		p.jobs = map[types.NamespacedName]*entry{}
	}
	e, ok := p.jobs[key]
	if !ok || e.target.UID != t.UID || e.target.Addr != t.Addr {
		p.jobs[key] = &entry{target: t, candidate: -1}
		return
	}
	e.target = t
}

// Forget stops polling key.
func (p *Poller) Forget(key types.NamespacedName) {
	p.mu.Lock()
	defer p.mu.Unlock()
	delete(p.jobs, key)
}

// Watching says whether key's job uid is polled: its reports, if none came yet, are on the way.
func (p *Poller) Watching(key types.NamespacedName, uid types.UID) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	e, ok := p.jobs[key]
	return ok && e.target.UID == uid
}

// Latest is the latest report read for key's job uid.
func (p *Poller) Latest(key types.NamespacedName, uid types.UID) (Report, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	e, ok := p.jobs[key]
	if !ok || e.target.UID != uid || e.report == nil {
		return Report{}, false
	}
	r := *e.report
	r.NodeStepSeconds = slices.Clone(r.NodeStepSeconds)
	if r.Straggler != nil {
		s := *r.Straggler
		r.Straggler = &s
	}
	return r, true
}

// Start polls every Interval until ctx ends.
func (p *Poller) Start(ctx context.Context) error {
	wait.UntilWithContext(ctx, p.Poll, p.Interval)
	return nil
}

// Poll polls every watched job once, Parallel at a time.
func (p *Poller) Poll(ctx context.Context) {
	client := p.Client()
	parallel := p.Parallel
	if parallel <= 0 {
		parallel = 16
	}
	p.mu.Lock()
	targets := make(map[types.NamespacedName]Target, len(p.jobs))
	for k, e := range p.jobs {
		targets[k] = e.target
	}
	p.mu.Unlock()
	sem := make(chan struct{}, parallel)
	var wg sync.WaitGroup
	for key, t := range targets {
		select {
		case sem <- struct{}{}:
		case <-ctx.Done():
			wg.Wait()
			return
		}
		wg.Go(func() {
			defer func() { <-sem }()
			prog, err := Fetch(ctx, client, t.Addr, p.Now())
			if err != nil {
				log.FromContext(ctx).V(2).Info("no progress from rank 0", "job", key, "addr", t.Addr, "error", err.Error())
				return
			}
			if p.record(key, t, prog) && p.Notify != nil {
				p.Notify(key)
			}
		})
	}
	wg.Wait()
}

// record keeps prog as key's latest report, if key is still watched at t, and says whether
// the reconciler should hear of it.
func (p *Poller) record(key types.NamespacedName, t Target, prog contract.Progress) bool {
	now := p.Now()
	p.mu.Lock()
	defer p.mu.Unlock()
	e, ok := p.jobs[key]
	if !ok || e.target.UID != t.UID || e.target.Addr != t.Addr {
		return false // forgotten, or rank 0 moved, while the request was out
	}
	prev := e.report
	r := &Report{Progress: prog, At: now}
	if prev != nil && !prog.TrainingSince.Equal(prev.TrainingSince) {
		// A new run: new ranks, perhaps on new nodes, to time afresh.
		e.candidate, e.streak, e.quiet = -1, 0, 0
		e.report = nil
	} else if prev != nil {
		r.Straggler = prev.Straggler
	}
	fresh := prev == nil || prog.Step > prev.Step || !prog.TrainingSince.Equal(prev.TrainingSince)
	if fresh {
		r.Straggler = e.judge(prog, now)
	}
	e.report = r
	switch {
	case prev == nil:
		return true
	case !prog.TrainingSince.Equal(prev.TrainingSince):
		return true // a new run trains: the time a failure cost ends
	case (r.Straggler == nil) != (prev.Straggler == nil), r.Straggler != nil && prev.Straggler != nil && r.Straggler.Rank != prev.Straggler.Rank:
		return true
	case r.Straggler != nil && prog.CheckpointStep != prev.CheckpointStep:
		return true // a straggler waits for a checkpoint to be replaced at
	}
	return false
}

// judge updates the straggler streaks with one fresh report and returns the straggler.
func (e *entry) judge(prog contract.Progress, now time.Time) *Straggler {
	var cur *Straggler
	if e.report != nil {
		cur = e.report.Straggler
	}
	rank, secs, others, ok := Straggling(prog.NodeStepSeconds, e.target.Nodes, e.target.MarginPercent)
	if !ok {
		rank = -1
	}
	if rank >= 0 && rank == e.candidate {
		e.streak++
	} else {
		e.candidate, e.streak = rank, 1
	}
	if cur != nil {
		if rank == cur.Rank {
			e.quiet = 0
			s := *cur
			s.Seconds, s.Others = secs, others
			return &s
		}
		if e.quiet++; e.quiet < StragglerReports {
			return cur
		}
	}
	e.quiet = 0
	if rank >= 0 && e.streak >= StragglerReports {
		return &Straggler{Rank: rank, Seconds: secs, Others: others, Since: now, Step: prog.Step}
	}
	return nil
}

// Straggling finds the rank whose busy seconds per step exceed the other ranks' median by
// more than marginPercent: the slowest, if it does. It needs every one of nodes ranks' figure.
func Straggling(seconds []float64, nodes, marginPercent int) (rank int, secs, others float64, ok bool) {
	if nodes < 2 || len(seconds) != nodes || marginPercent <= 0 {
		return -1, 0, 0, false
	}
	rank = 0
	for i, v := range seconds {
		if v > seconds[rank] {
			rank = i
		}
	}
	rest := slices.Concat(seconds[:rank], seconds[rank+1:])
	slices.Sort(rest)
	others = rest[len(rest)/2]
	if len(rest)%2 == 0 {
		others = (rest[len(rest)/2-1] + rest[len(rest)/2]) / 2
	}
	secs = seconds[rank]
	if others <= 0 || secs <= others*(1+float64(marginPercent)/100) {
		return -1, 0, 0, false
	}
	return rank, secs, others, true
}

// Fetch reads and checks the progress document at addr.
func Fetch(ctx context.Context, c *http.Client, addr string, now time.Time) (contract.Progress, error) {
	var prog contract.Progress
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, (&url.URL{Scheme: "http", Host: addr, Path: contract.ProgressPath}).String(), nil)
	if err != nil {
		return prog, err
	}
	resp, err := c.Do(req)
	if err != nil {
		return prog, err
	}
	defer func() { _ = resp.Body.Close() }()
	if resp.StatusCode != http.StatusOK {
		return prog, fmt.Errorf("status %d", resp.StatusCode)
	}
	body, err := io.ReadAll(io.LimitReader(resp.Body, contract.ProgressMaxBytes+1))
	if err != nil {
		return prog, err
	}
	if len(body) > contract.ProgressMaxBytes {
		return prog, errors.New("progress document over the size limit")
	}
	if err := json.Unmarshal(body, &prog); err != nil {
		return prog, err
	}
	return sanitize(prog, now), nil
}

// sanitize drops what no worker could truthfully report.
func sanitize(p contract.Progress, now time.Time) contract.Progress {
	step := func(n int64) int64 {
		if n < 0 || n > contract.MaxStep {
			return 0 // no worker's: unreadable
		}
		return n
	}
	p.Step, p.ResumedFrom, p.CheckpointStep = step(p.Step), step(p.ResumedFrom), step(p.CheckpointStep)
	p.ResumedFrom = min(p.ResumedFrom, p.Step)
	if !(p.StepSeconds > 0 && p.StepSeconds < 86400) {
		p.StepSeconds = 0
	}
	plausible := func(t time.Time) time.Time {
		if t.Before(now.AddDate(-1, 0, 0)) || t.After(now.Add(time.Hour)) {
			return time.Time{}
		}
		return t
	}
	p.TrainingSince, p.LastStepAt = plausible(p.TrainingSince), plausible(p.LastStepAt)
	if p.LastStepAt.Before(p.TrainingSince) {
		p.LastStepAt = time.Time{}
	}
	p.StartedAt, p.MetAt = plausible(p.StartedAt), plausible(p.MetAt)
	if p.MetAt.Before(p.StartedAt) {
		p.MetAt = time.Time{}
	}
	for _, v := range p.NodeStepSeconds {
		if !(v >= 0 && v < 86400) { // NaN too
			p.NodeStepSeconds = nil
			break
		}
	}
	return p
}
