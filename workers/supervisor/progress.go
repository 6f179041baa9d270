package supervisor

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/zaya-operator/zaya-operator/api/contract"
)

// The progress report of a trainer that cannot make one (docs/worker-contract.md, "Progress"):
// the trainer overwrites the file ZAYA_PROGRESS_FILE names with a few key=value lines, and
// the supervisor makes of what it sees there the contract's progress document, served at
// contract.ProgressPath, and the termination message's progress lines when the trainer
// exits. Without them the operator knows only the pods' times: a loss ends when every rank
// runs again, and no step is priced as trained again.

const (
	// progressFileName is the file's name where the supervisor chooses its place.
	progressFileName = "zaya-progress"
	// progressMaxBytes bounds what is read of the file: it holds a few short lines.
	progressMaxBytes = 4 << 10
	// termLogMaxBytes bounds what is read of the termination log to find the trainer's own
	// lines (the kubelet keeps 4 KiB of it).
	termLogMaxBytes = 64 << 10
)

// report is one read of the progress file: each key's value, -1 where no line of it reads.
type report struct{ step, checkpoint, resumed int64 }

var noReport = report{-1, -1, -1}

// parseReport reads the file's "step=", "checkpoint=" and "resumed=" lines; anything else,
// and a value that is not a step number (contract.ParseStep), is ignored.
func parseReport(b []byte) report {
	if len(b) > progressMaxBytes {
		// Whole lines only: a number cut short reads as another.
		b = b[:progressMaxBytes]
		b = b[:bytes.LastIndexByte(b, '\n')+1]
	}
	r := noReport
	for line := range strings.Lines(string(b)) {
		k, v, ok := strings.Cut(line, "=")
		n, valid := contract.ParseStep(strings.TrimSpace(v))
		if !ok || !valid {
			continue
		}
		switch strings.TrimSpace(k) {
		case "step":
			r.step = n
		case "checkpoint":
			r.checkpoint = n
		case "resumed":
			r.resumed = n
		}
	}
	return r
}

// resumeSource is what the resumed step was taken from.
type resumeSource int

const (
	resumeUnknown    resumeSource = iota // no report yet
	resumeFirstStep                      // the first report's step: the trainer says nothing of checkpoints
	resumeCheckpoint                     // the first report's checkpoint
	resumeReported                       // the trainer's "resumed="
)

// progress is what the supervisor saw of the trainer's run.
type progress struct {
	path    string
	started time.Time // the trainer's start: no report is older
	now     func() time.Time

	mu   sync.Mutex
	seen bool
	// step and checkpoint are the highest reported: a read while the trainer rewrites the
	// file sees a prefix of it, whose number is never larger.
	step, checkpoint int64
	resumed          int64
	resumedBy        resumeSource
	// since is when a report first showed a step past the resume (sinceStep), last when one
	// last showed a step higher than before: the file's modification times, when the trainer
	// wrote them, not when they were read.
	since, last time.Time
	sinceStep   int64
	// met is when the first report was written: the trainer had met its peers and resumed.
	met time.Time
}

// read reads the file and takes in what it says.
func (p *progress) read() {
	b, mtime, err := readRegular(p.path, progressMaxBytes+1)
	if err != nil {
		return
	}
	r := parseReport(b)
	if r == noReport {
		return
	}
	// The file's time, within the run: a clock's step or a copied file moves no report
	// out of it.
	at := mtime
	if at.Before(p.started) {
		at = p.started
	}
	if now := p.now(); at.After(now) {
		at = now
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.add(r, at)
}

func (p *progress) add(r report, at time.Time) {
	first := !p.seen
	p.seen = true
	if first {
		p.met = at
	}
	if r.checkpoint >= 0 {
		p.checkpoint = max(p.checkpoint, r.checkpoint)
	}
	switch {
	case r.resumed >= 0 && (p.resumedBy != resumeReported || r.resumed > p.resumed):
		p.resumed, p.resumedBy = r.resumed, resumeReported
	case first && r.checkpoint >= 0:
		// A run resumes from its newest checkpoint, the one its first report names.
		p.resumed, p.resumedBy = r.checkpoint, resumeCheckpoint
	case first && r.step >= 0:
		// Nothing said of checkpoints: the run is counted from the first step seen.
		p.resumed, p.resumedBy = r.step, resumeFirstStep
	}
	if r.step < 0 || (r.step <= p.step && !first) {
		return
	}
	p.step = max(p.step, r.step)
	if p.step <= p.resumed {
		return // resuming yet
	}
	if p.since.IsZero() {
		p.since, p.sinceStep = at, p.step
	}
	p.last = at
	if at.Before(p.since) {
		p.last = p.since
	}
}

// snapshot is the contract's progress document of what was seen; false before any report.
func (p *progress) snapshot() (contract.Progress, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.document(), p.seen
}

func (p *progress) document() contract.Progress {
	committed := p.checkpoint
	if p.resumedBy >= resumeCheckpoint {
		committed = max(committed, p.resumed) // a run resumes from a committed checkpoint
	}
	var pace float64
	if p.step > p.sinceStep && p.last.After(p.since) {
		// The steps after the first one seen trained: their mean, not the first's, which
		// holds the warm-up.
		pace = p.last.Sub(p.since).Seconds() / float64(p.step-p.sinceStep)
	}
	return contract.Progress{
		Step: max(p.step, p.resumed), ResumedFrom: p.resumed, CheckpointStep: committed, StepSeconds: pace,
		TrainingSince: p.since, LastStepAt: p.last, StartedAt: p.started, MetAt: p.met,
	}
}

// lines are the termination message's progress lines of what was seen, those the worker
// contract defines for a worker that reports: none before any report, no restored step where
// the trainer said nothing of checkpoints, and no times before it trained a step.
func (p *progress) lines() []string {
	p.mu.Lock()
	pr, seen, resumeKnown := p.document(), p.seen, p.resumedBy >= resumeCheckpoint
	p.mu.Unlock()
	if !seen {
		return nil
	}
	var out []string
	if pr.CheckpointStep > 0 {
		out = append(out, contract.TerminationMessageCheckpointPrefix+strconv.FormatInt(pr.CheckpointStep, 10))
	}
	if resumeKnown {
		out = append(out, contract.TerminationMessageRestoredPrefix+strconv.FormatInt(pr.ResumedFrom, 10))
	}
	if !pr.TrainingSince.IsZero() {
		out = append(out, contract.TerminationMessageTrainingStepPrefix+strconv.FormatInt(pr.Step, 10))
		if pr.StepSeconds > 0 {
			out = append(out, contract.TerminationMessageStepSecondsPrefix+strconv.FormatFloat(pr.StepSeconds, 'f', 6, 64))
		}
		out = append(out, contract.TerminationMessageTrainingSincePrefix+pr.TrainingSince.UTC().Format(time.RFC3339Nano),
			contract.TerminationMessageLastStepAtPrefix+pr.LastStepAt.UTC().Format(time.RFC3339Nano))
	}
	return out
}

// ServeHTTP answers GET contract.ProgressPath with the progress document, read afresh: the
// operator's read when it decides a failure wants the last step. Nothing else is served.
func (p *progress) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodGet || r.URL.Path != contract.ProgressPath {
		http.NotFound(w, r)
		return
	}
	p.read()
	pr, _ := p.snapshot()
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	_ = json.NewEncoder(w).Encode(pr)
}

// progressWatch watches the file while the trainer runs.
type progressWatch struct {
	*progress
	listen string
	every  time.Duration
	log    io.Writer

	tmp        string // the directory the supervisor made for the file, removed at the end
	quit, done chan struct{}
	srv        *http.Server // set once serving
}

// run reads the file until quit: every w.every once the run trained, ten times as often
// before, where the first report (the checkpoint resumed from) and the first step trained
// (when training began) are read as they come. At the first report it serves the document
// at listen: not before, so a trainer that serves the port itself (the reference worker)
// finds it free, and one that binds it anyway wins.
func (w *progressWatch) run() {
	defer close(w.done)
	t := time.NewTimer(w.every / 10)
	defer t.Stop()
	tried := w.listen == ""
	for {
		select {
		case <-w.quit:
			return
		case <-t.C:
		}
		w.read()
		pr, seen := w.snapshot()
		if pr.TrainingSince.IsZero() {
			t.Reset(w.every / 10)
		} else {
			t.Reset(w.every)
		}
		if tried || !seen {
			continue
		}
		tried = true
		ln, err := net.Listen("tcp", w.listen)
		if err != nil {
			fmt.Fprintf(w.log, "zaya-supervisor: serving no progress: %v (the worker serves %s itself?)\n", err, contract.ProgressPath)
			continue
		}
		w.srv = &http.Server{
			Handler:           w.progress,
			ReadHeaderTimeout: 2 * time.Second,
			ReadTimeout:       5 * time.Second,
			WriteTimeout:      5 * time.Second,
			IdleTimeout:       30 * time.Second,
			MaxHeaderBytes:    8 << 10,
		}
		go func() { _ = w.srv.Serve(ln) }()
	}
}

// startProgress picks the progress file, empties it of an earlier run's report, and watches
// it; it returns the variable to add to the trainer's environment ("": none) and the
// watch (nil: no report). The file is, in this order: ZAYA_PROGRESS_FILE if the image sets
// it; "zaya-progress" beside ZAYA_HEARTBEAT_FILE, in the pod's /dev/shm, which every pod
// mounts writable, read-only root filesystem or not; or a directory of its own under
// os.TempDir(), removed at exit, outside a pod.
func (cfg Config) startProgress(started time.Time) (env string, w *progressWatch) {
	path, own, tmp := os.Getenv(contract.EnvProgressFile), false, ""
	var err error
	if path != "" {
		err = resetFile(path)
	} else {
		own = true
		if hb := os.Getenv(contract.EnvHeartbeatFile); hb != "" {
			path = filepath.Join(filepath.Dir(hb), progressFileName)
			err = resetFile(path)
		}
		if path == "" || err != nil {
			if tmp, err = os.MkdirTemp("", "zaya-progress-"); err == nil {
				path = filepath.Join(tmp, progressFileName)
				err = resetFile(path)
			}
		}
	}
	if err != nil {
		// A trainer that writes where it cannot would fail: it gets no file instead.
		fmt.Fprintf(cfg.Log, "zaya-supervisor: no progress file: %v\n", err)
		if tmp != "" {
			_ = os.RemoveAll(tmp)
		}
		return "", nil
	}
	if own {
		env = contract.EnvProgressFile + "=" + path
	}
	every := cfg.ProgressPoll
	if every <= 0 {
		every = time.Second
	}
	w = &progressWatch{
		progress: &progress{path: path, started: started, now: time.Now},
		listen:   cfg.ProgressListen, every: every, log: cfg.Log, tmp: tmp,
		quit: make(chan struct{}), done: make(chan struct{}),
	}
	go w.run()
	return env, w
}

// finish stops the watch, takes in the trainer's last word and appends the progress lines
// to the termination log, but for those the trainer wrote there itself.
func (w *progressWatch) finish(termLog string) {
	close(w.quit)
	<-w.done
	if w.srv != nil {
		_ = w.srv.Close()
	}
	w.read()
	if err := appendProgress(termLog, w.lines()); err != nil {
		fmt.Fprintf(w.log, "zaya-supervisor: progress: %v\n", err)
	}
	if w.tmp != "" {
		_ = os.RemoveAll(w.tmp)
	}
}

// appendProgress appends lines to the termination log but for the keys already in it: a
// trainer that reports for itself knows better.
func appendProgress(path string, lines []string) error {
	if len(lines) == 0 {
		return nil
	}
	if path == "" {
		return errors.New("no termination log")
	}
	old, _, err := readRegular(path, termLogMaxBytes)
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	written := map[string]bool{}
	for line := range strings.Lines(string(old)) {
		if k, _, ok := strings.Cut(strings.TrimSpace(line), "="); ok {
			written[k] = true
		}
	}
	var b strings.Builder
	for _, line := range lines {
		if k, _, _ := strings.Cut(line, "="); !written[k] {
			b.WriteString(line + "\n")
		}
	}
	if b.Len() == 0 {
		return nil
	}
	return appendLine(path, strings.TrimSuffix(b.String(), "\n"))
}

// readRegular reads at most limit bytes of a regular file, and its modification time. It never
// blocks on a FIFO or a device put in the file's place.
func readRegular(path string, limit int64) ([]byte, time.Time, error) {
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NONBLOCK, 0)
	if err != nil {
		return nil, time.Time{}, err
	}
	defer func() { _ = f.Close() }()
	st, err := f.Stat()
	if err != nil {
		return nil, time.Time{}, err
	}
	if !st.Mode().IsRegular() {
		return nil, time.Time{}, fmt.Errorf("%s is not a regular file", path)
	}
	b, err := io.ReadAll(io.LimitReader(f, limit))
	return b, st.ModTime(), err
}

// resetFile makes path an empty regular file: an earlier run's report (/dev/shm outlives an
// in-place restart) is not this run's.
func resetFile(path string) error {
	if st, err := os.Lstat(path); err == nil && !st.Mode().IsRegular() {
		return fmt.Errorf("%s is not a regular file", path)
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_TRUNC|syscall.O_NONBLOCK, 0o644)
	if err != nil {
		return err
	}
	return f.Close()
}
