package supervisor_test

import (
	"errors"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/zaya-operator/zaya-operator/api/contract"
)

// bin is zaya-supervisor, built once: the tests run it as the container would, a process of
// its own with the worker below it.
var bin string

func TestMain(m *testing.M) {
	if os.Getenv(trainerEnv) != "" {
		os.Exit(trainer()) // the test binary as a supervised worker
	}
	dir, err := os.MkdirTemp("", "zaya-supervisor")
	if err != nil {
		panic(err)
	}
	bin = filepath.Join(dir, "zaya-supervisor")
	if out, err := exec.Command("go", "build", "-o", bin, "../cmd/zaya-supervisor").CombinedOutput(); err != nil {
		panic(string(out))
	}
	code := m.Run()
	_ = os.RemoveAll(dir)
	os.Exit(code)
}

// run is one supervised worker, a shell script: its exit code and termination message.
type run struct {
	cmd  *exec.Cmd
	term string
}

func start(t *testing.T, rule, script string) *run {
	t.Helper()
	term := filepath.Join(t.TempDir(), "termination-log")
	cmd := exec.Command(bin, "--", "sh", "-c", script)
	cmd.Env = append(os.Environ(), contract.EnvTerminationLog+"="+term)
	if rule != "" {
		cmd.Env = append(cmd.Env, contract.EnvRestartExitCodes+"="+rule)
	}
	cmd.Dir = t.TempDir()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	return &run{cmd: cmd, term: term}
}

func (r *run) wait(t *testing.T) (int, string) {
	t.Helper()
	err := r.cmd.Wait()
	code := 0
	var exit *exec.ExitError
	if errors.As(err, &exit) {
		code = exit.ExitCode()
	} else if err != nil {
		t.Fatal(err)
	}
	msg, err := os.ReadFile(r.term)
	if err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	return code, string(msg)
}

func TestAnExitTheRuleRestartsEndsTheContainerWithIt(t *testing.T) {
	code, msg := start(t, "NotIn:0,78", `echo "zaya: stopped: x" >> "$ZAYA_TERMINATION_LOG"; exit 3`).wait(t)
	if code != 3 || strings.Contains(msg, contract.TerminationMessageExitCodePrefix) {
		t.Fatalf("exit %d, termination message %q: want 3 and no exit-code line", code, msg)
	}
}

func TestAnExitTheRuleDoesNotRestartEndsTheContainerWith0AndTheCode(t *testing.T) {
	for _, c := range []struct{ rule, script, line string }{
		{"NotIn:0,78", `echo checkpoint-step=4 >> "$ZAYA_TERMINATION_LOG"; exit 78`, "exit-code=78"},
		{"In:75", `exit 1`, "exit-code=1"},
		{"In:75", `kill -9 $$`, "exit-code=137"}, // death by signal n is 128+n, as the kubelet says
	} {
		code, msg := start(t, c.rule, c.script).wait(t)
		if code != 0 || !strings.HasSuffix(msg, c.line+"\n") {
			t.Errorf("%s under %s: exit %d, termination message %q: want 0 and a last line %q", c.script, c.rule, code, msg, c.line)
		}
		if c.line == "exit-code=78" && !strings.HasPrefix(msg, "checkpoint-step=4\n") {
			t.Errorf("the worker's own lines were lost: %q", msg)
		}
	}
}

func TestSuccessAndEveryCodeWithoutARulePassThrough(t *testing.T) {
	if code, _ := start(t, "NotIn:0,78", `exit 0`).wait(t); code != 0 {
		t.Errorf("success: exit %d", code)
	}
	if code, msg := start(t, "", `exit 78`).wait(t); code != 78 || msg != "" {
		t.Errorf("no rule: exit %d, %q: want 78 and no line", code, msg)
	}
}

func TestAWorkerThatCannotStartIsAConfigurationError(t *testing.T) {
	term := filepath.Join(t.TempDir(), "termination-log")
	for _, env := range [][]string{
		{contract.EnvRestartExitCodes + "=NotIn:0,78"},  // no such command
		{contract.EnvRestartExitCodes + "=Sometimes:1"}, // a rule it cannot read
	} {
		_ = os.Remove(term)
		cmd := exec.Command(bin, "/no/such/worker")
		cmd.Env = append(slices.Clone(env), contract.EnvTerminationLog+"="+term)
		out, err := cmd.CombinedOutput()
		msg, _ := os.ReadFile(term)
		if err != nil || string(msg) != "exit-code=78\n" {
			t.Errorf("%v: %v, termination message %q, output %s: want exit 0 and exit-code=78", env, err, msg, out)
		}
	}
}

// The kubelet's SIGTERM reaches the worker (and whatever it launched), and the worker's
// exit decides, here a retryable 75.
func TestSignalsReachTheWorkersProcessGroup(t *testing.T) {
	r := start(t, "NotIn:0,78", `sh -c 'trap "echo child > got; exit 0" TERM; touch ready2; while :; do sleep 0.05; done' &
trap 'echo worker > got1; wait; exit 75' TERM; touch ready; while :; do sleep 0.05; done`)
	waitFor(t, filepath.Join(r.cmd.Dir, "ready"))
	waitFor(t, filepath.Join(r.cmd.Dir, "ready2"))
	if err := r.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	code, _ := r.wait(t)
	if code != 75 {
		t.Fatalf("exit %d, want the worker's 75", code)
	}
	for _, f := range []string{"got", "got1"} {
		if _, err := os.Stat(filepath.Join(r.cmd.Dir, f)); err != nil {
			t.Errorf("the signal did not reach a process of the group: %v", err)
		}
	}
}

// A process the worker started must not outlive it into the next run of the container.
func TestNothingTheWorkerStartedOutlivesIt(t *testing.T) {
	r := start(t, "NotIn:0,78", `sleep 300 & echo $! > stray; exit 1`)
	code, _ := r.wait(t)
	if code != 1 {
		t.Fatalf("exit %d, want 1", code)
	}
	b, err := os.ReadFile(filepath.Join(r.cmd.Dir, "stray"))
	if err != nil {
		t.Fatal(err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for alive(pid) {
		if time.Now().After(deadline) {
			t.Fatalf("the worker's child %d outlived it", pid)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// alive reports whether pid runs (a zombie awaiting its new parent counts as gone).
func alive(pid int) bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return false
	}
	f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+1:]))
	return len(f) > 0 && f[0] != "Z"
}

func waitFor(t *testing.T, path string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		if _, err := os.Stat(path); err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s never appeared", path)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// The gang watch: two supervisors as ranks 0 and 1 of one gang on loopback. Rank 1's worker
// starts only once rank 0's hub has it. Rank 0's worker fails; rank 1's, which would never stop by itself (torchrun in its exit barrier), is
// stopped and its container exits 75 with the reason, to restart in place with rank 0.
func TestAFailedRankStopsItsPeerThroughTheGangWatch(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	listen := ln.Addr().String()
	_ = ln.Close()
	rank := func(r int, script string) *run {
		term := filepath.Join(t.TempDir(), "termination-log")
		cmd := exec.Command(bin, "--gang-listen="+listen, "--", "sh", "-c", script)
		cmd.Env = append(os.Environ(), contract.EnvTerminationLog+"="+term, "NNODES=2", "NODE_RANK="+strconv.Itoa(r),
			"MASTER_ADDR=127.0.0.1", "GPUS_PER_NODE=1", "ZAYA_JOB_UID=uid", "ZAYA_RESTART_ATTEMPT=0")
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		return &run{cmd: cmd, term: term}
	}
	// Rank 1 first, alone: its worker waits for the gang's hub, rank 0's (after an in-place
	// restart, the last run's rank 0 may still be stopping with its rendezvous store up).
	marker := filepath.Join(t.TempDir(), "started")
	peer := rank(1, "touch "+marker+"; sleep 60")
	time.Sleep(time.Second)
	if _, err := os.Stat(marker); err == nil {
		t.Fatal("rank 1's worker started before there was a gang to join")
	}
	root := rank(0, "sleep 2; exit 1")
	start := time.Now()
	if code, _ := root.wait(t); code != 1 {
		t.Errorf("rank 0 exited %d, want its worker's 1", code)
	}
	code, msg := peer.wait(t)
	if code != contract.ExitStopped || !strings.Contains(msg, "zaya: stopped: gang watch: node rank 0's worker failed: exit 1") {
		t.Errorf("rank 1 exited %d with %q; want 75 and the gang watch's reason", code, msg)
	}
	if took := time.Since(start); took > 20*time.Second {
		t.Errorf("rank 1 stopped after %v: the gang watch did not stop it", took)
	}
}
