package supervisor_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/zaya-operator/zaya-operator/api/contract"
)

// trainerEnv makes the test binary a trainer that serves the progress port itself, at the
// address it names (TestMain).
const trainerEnv = "ZAYA_SUPERVISOR_TEST_SERVE"

// trainer listens on the progress address before it reports to the progress file, as a
// trainer with a progress endpoint of its own would, and ends once a file "done" appears.
func trainer() int {
	ln, err := net.Listen("tcp", os.Getenv(trainerEnv))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 9
	}
	go func() {
		_ = http.Serve(ln, http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
			w.Header().Set("Content-Type", "application/json")
			_, _ = w.Write([]byte(`{"step":777}`))
		}))
	}()
	if err := os.WriteFile(os.Getenv(contract.EnvProgressFile), []byte("step=5\ncheckpoint=4\n"), 0o644); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 9
	}
	for {
		if _, err := os.Stat("done"); err == nil {
			return 0
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// supervise runs the supervisor with flags over command, in a directory of its own.
func supervise(t *testing.T, flags, env []string, command ...string) *run {
	t.Helper()
	term := filepath.Join(t.TempDir(), "termination-log")
	cmd := exec.Command(bin, append(append(flags, "--"), command...)...)
	cmd.Env = append(append(os.Environ(), contract.EnvTerminationLog+"="+term), env...)
	cmd.Dir = t.TempDir()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	return &run{cmd: cmd, term: term}
}

func freeAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = ln.Close() }()
	return ln.Addr().String()
}

// progressAt reads the progress document at addr, waiting for it to be served.
func progressAt(t *testing.T, addr string) contract.Progress {
	t.Helper()
	client := &http.Client{Timeout: 2 * time.Second}
	deadline := time.Now().Add(10 * time.Second)
	for {
		resp, err := client.Get("http://" + addr + contract.ProgressPath)
		if err == nil {
			body, rerr := io.ReadAll(resp.Body)
			_ = resp.Body.Close()
			if rerr != nil || resp.StatusCode != http.StatusOK || resp.Header.Get("Content-Type") != "application/json" {
				t.Fatalf("GET %s: %s, %q, %v", contract.ProgressPath, resp.Status, body, rerr)
			}
			var p contract.Progress
			if err := json.Unmarshal(body, &p); err != nil {
				t.Fatalf("%q: %v", body, err)
			}
			return p
		}
		if time.Now().After(deadline) {
			t.Fatalf("no progress served at %s: %v", addr, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// A trainer that only writes the progress file: the supervisor serves what it wrote while it
// trains, and reports it in the termination message when it fails. The trainer waits at each
// report for the test to have read it.
func TestTheSupervisorServesAndReportsTheTrainersProgressFile(t *testing.T) {
	addr := freeAddr(t)
	script := `p="$ZAYA_PROGRESS_FILE"; [ -n "$p" ] || exit 9
report() { printf "$1" > "$p"; touch "$2"; while [ ! -e "go$2" ]; do sleep 0.02; done; sleep 0.05; }
report 'step=10\ncheckpoint=10\n' 1
report 'step=11\ncheckpoint=10\n' 2
report 'garbage\nstep=-4\nstep=99999999999999999999\ncheckpoint=x\nresumed=\n=3\n' 3
report 'step=5\ncheckpoint=2\n' 4
report 'step=13\ncheckpoint=12\nnoise=1\n' 5
exit 1`
	began := time.Now()
	r := supervise(t, []string{"--progress-listen=" + addr}, []string{contract.EnvRestartExitCodes + "=In:75"}, "sh", "-c", script)
	reported := func(n int) contract.Progress {
		t.Helper()
		waitFor(t, filepath.Join(r.cmd.Dir, strconv.Itoa(n)))
		p := progressAt(t, addr)
		if err := os.WriteFile(filepath.Join(r.cmd.Dir, "go"+strconv.Itoa(n)), nil, 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}

	// Resumed from checkpoint 10, no step trained yet; the trainer started, then met its
	// peers when it wrote its first report.
	first := reported(1)
	if !equalProgress(first, contract.Progress{Step: 10, ResumedFrom: 10, CheckpointStep: 10}) || first.NodeStepSeconds != nil {
		t.Errorf("before training: %+v", first)
	}
	if first.StartedAt.Before(began) || first.MetAt.Before(first.StartedAt) || first.MetAt.After(time.Now()) {
		t.Errorf("before training: started %v, met %v; want began %v <= started <= met <= now", first.StartedAt, first.MetAt, began)
	}
	// Its first step: training since the report's write.
	trained := reported(2)
	if trained.Step != 11 || trained.ResumedFrom != 10 || trained.CheckpointStep != 10 || trained.StepSeconds != 0 ||
		trained.TrainingSince.Before(began) || trained.TrainingSince.After(time.Now()) || !trained.LastStepAt.Equal(trained.TrainingSince) {
		t.Errorf("after the first step: %+v", trained)
	}
	// Garbage, and lower numbers than seen (a read of a file half rewritten), change nothing.
	for n := 3; n <= 4; n++ {
		if p := reported(n); !equalProgress(p, trained) {
			t.Errorf("report %d: %+v, want %+v still", n, p, trained)
		}
	}
	last := reported(5)
	pace := last.LastStepAt.Sub(last.TrainingSince).Seconds() / 2
	if last.Step != 13 || last.ResumedFrom != 10 || last.CheckpointStep != 12 || !last.TrainingSince.Equal(trained.TrainingSince) ||
		!last.LastStepAt.After(last.TrainingSince) || last.StepSeconds != pace {
		t.Errorf("after step 13: %+v (want the mean of steps 12 and 13, %g s)", last, pace)
	}
	if !last.StartedAt.Equal(first.StartedAt) || !last.MetAt.Equal(first.MetAt) || last.TrainingSince.Before(last.MetAt) {
		t.Errorf("after step 13: started %v, met %v, training since %v; want the first report's start and rendezvous, before training",
			last.StartedAt, last.MetAt, last.TrainingSince)
	}

	code, msg := r.wait(t)
	want := strings.Join([]string{
		"checkpoint-step=12",
		"checkpoint-restored=10",
		"training-step=13",
		"step-seconds=" + strconv.FormatFloat(pace, 'f', 6, 64),
		"training-since=" + last.TrainingSince.UTC().Format(time.RFC3339Nano),
		"last-step-at=" + last.LastStepAt.UTC().Format(time.RFC3339Nano),
		"exit-code=1", // the rule's line stays the last
	}, "\n") + "\n"
	if code != 0 || msg != want {
		t.Errorf("exit %d, termination message:\n%s\nwant exit 0 and:\n%s", code, msg, want)
	}
	if resp, err := http.Get("http://" + addr + contract.ProgressPath); err == nil {
		_ = resp.Body.Close()
		t.Error("the progress is still served after the supervisor ended")
	}
}

func equalProgress(a, b contract.Progress) bool {
	return a.Step == b.Step && a.ResumedFrom == b.ResumedFrom && a.CheckpointStep == b.CheckpointStep &&
		a.StepSeconds == b.StepSeconds && a.TrainingSince.Equal(b.TrainingSince) && a.LastStepAt.Equal(b.LastStepAt)
}

// Only GET of the progress path is served.
func TestTheProgressEndpointServesNothingElse(t *testing.T) {
	addr := freeAddr(t)
	r := supervise(t, []string{"--progress-listen=" + addr}, nil, "sh", "-c",
		`printf 'step=3\n' > "$ZAYA_PROGRESS_FILE"; while [ ! -e done ]; do sleep 0.02; done`)
	defer func() {
		_ = os.WriteFile(filepath.Join(r.cmd.Dir, "done"), nil, 0o644)
		_, _ = r.wait(t)
	}()
	if p := progressAt(t, addr); p.Step != 3 || p.ResumedFrom != 3 || !p.TrainingSince.IsZero() {
		t.Errorf("%+v: want step 3, counted from, not trained", p)
	}
	client := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	for _, c := range []struct{ method, path string }{
		{http.MethodPost, contract.ProgressPath},
		{http.MethodGet, contract.ProgressPath + "/"},
		{http.MethodGet, "/zaya/v1//progress"},
		{http.MethodGet, "/metrics"},
		{http.MethodGet, "/"},
	} {
		req, _ := http.NewRequest(c.method, "http://"+addr+c.path, nil)
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		_ = resp.Body.Close()
		if resp.StatusCode != http.StatusNotFound {
			t.Errorf("%s %s: %s, want 404", c.method, c.path, resp.Status)
		}
	}
}

// A trainer killed after it reported still has its report in the termination message, but
// for the lines it wrote there itself.
func TestAKilledTrainersReportKeepsTheLinesItWrote(t *testing.T) {
	began := time.Now()
	r := supervise(t, []string{"--progress-listen="}, nil, "sh", "-c",
		`printf 'training-step=40\ncheckpoint-step=40\n' >> "$ZAYA_TERMINATION_LOG"
printf 'resumed=40\nstep=41\n' > "$ZAYA_PROGRESS_FILE"
kill -9 $$`)
	code, msg := r.wait(t)
	if code != 137 {
		t.Errorf("exit %d, want 137", code)
	}
	lines := strings.Split(strings.TrimSuffix(msg, "\n"), "\n")
	if len(lines) != 5 || lines[0] != "training-step=40" || lines[1] != "checkpoint-step=40" || lines[2] != "checkpoint-restored=40" {
		t.Fatalf("termination message %q: want the trainer's two lines, checkpoint-restored=40 and the times", msg)
	}
	since, err1 := time.Parse(time.RFC3339Nano, strings.TrimPrefix(lines[3], "training-since="))
	at, err2 := time.Parse(time.RFC3339Nano, strings.TrimPrefix(lines[4], "last-step-at="))
	if err1 != nil || err2 != nil || since.Before(began) || since.After(time.Now()) || !at.Equal(since) {
		t.Errorf("times %q, %q: want one instant of the run (one step seen, so no step-seconds)", lines[3], lines[4])
	}
}

// A trainer that serves the progress port itself keeps it: the supervisor, which binds it
// only once the trainer reported, says so once and still writes the termination lines.
func TestATrainerThatServesTheProgressPortKeepsIt(t *testing.T) {
	addr := freeAddr(t)
	var stderr lockedBuffer
	term := filepath.Join(t.TempDir(), "termination-log")
	cmd := exec.Command(bin, "--progress-listen="+addr, "--", os.Args[0])
	cmd.Env = append(os.Environ(), contract.EnvTerminationLog+"="+term, trainerEnv+"="+addr)
	cmd.Dir, cmd.Stderr = t.TempDir(), &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for !strings.Contains(stderr.String(), "serving no progress") {
		if time.Now().After(deadline) {
			t.Fatalf("the supervisor never tried the port: %s", stderr.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
	if p := progressAt(t, addr); p.Step != 777 {
		t.Errorf("the port answered %+v: want the trainer's own step 777", p)
	}
	time.Sleep(1500 * time.Millisecond) // a poll or two more: it does not try again
	if err := os.WriteFile(filepath.Join(cmd.Dir, "done"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	code, msg := (&run{cmd: cmd, term: term}).wait(t)
	if code != 0 {
		t.Errorf("exit %d, output %s: want the trainer's 0", code, stderr.String())
	}
	if n := strings.Count(stderr.String(), "serving no progress"); n != 1 {
		t.Errorf("said %d times that it serves no progress: %s", n, stderr.String())
	}
	if !strings.HasPrefix(msg, "checkpoint-step=4\ncheckpoint-restored=4\ntraining-step=5\ntraining-since=") {
		t.Errorf("termination message %q: want the trainer's report", msg)
	}
}

// The progress file is this run's: one the image names is emptied of an earlier report, one
// the supervisor chooses is beside the heartbeat file (the pod's /dev/shm), else in a
// directory of its own under TMPDIR that it removes.
func TestTheProgressFileIsTheRunsOwn(t *testing.T) {
	dir := t.TempDir()
	named := filepath.Join(dir, "named")
	if err := os.WriteFile(named, []byte("step=999\ncheckpoint=999\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	tmp := t.TempDir()
	for _, c := range []struct {
		env  []string
		want string // a pattern
	}{
		{[]string{contract.EnvProgressFile + "=" + named}, named},
		{[]string{contract.EnvHeartbeatFile + "=" + filepath.Join(dir, "heartbeat")}, filepath.Join(dir, "zaya-progress")},
		{[]string{"TMPDIR=" + tmp}, filepath.Join(tmp, "zaya-progress-*", "zaya-progress")},
	} {
		r := supervise(t, []string{"--progress-listen="}, c.env, "sh", "-c",
			`p="$ZAYA_PROGRESS_FILE"; [ -f "$p" ] && [ ! -s "$p" ] || exit 9; echo "$p" > used`)
		code, msg := r.wait(t)
		used, _ := os.ReadFile(filepath.Join(r.cmd.Dir, "used"))
		path := strings.TrimSpace(string(used))
		if ok, _ := filepath.Match(c.want, path); code != 0 || msg != "" || !ok {
			t.Errorf("%v: exit %d, termination message %q, file %q: want an empty file %s and nothing reported", c.env, code, msg, path, c.want)
		}
		if strings.HasPrefix(path, tmp) {
			if _, err := os.Stat(filepath.Dir(path)); err == nil {
				t.Errorf("%s outlived the supervisor", filepath.Dir(path))
			}
		}
	}
}

// lockedBuffer is a process's stderr, read while it runs.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}
