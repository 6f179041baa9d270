package train

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/zaya-operator/zaya-operator/api/contract"
	"github.com/zaya-operator/zaya-operator/internal/testnet"
	"github.com/zaya-operator/zaya-operator/workers/checkpoint"
	"github.com/zaya-operator/zaya-operator/workers/model"
	"github.com/zaya-operator/zaya-operator/workers/rocm"
)

// TestMain doubles as the zaya-worker command when ZAYA_TRAIN_CHILD is set, so tests run real
// worker processes that talk TCP, as pods would.
func TestMain(m *testing.M) {
	if os.Getenv("ZAYA_TRAIN_CHILD") != "" {
		if v := os.Getenv("ZAYA_TEST_FSIZE"); v != "" {
			// A full disk: writes past v bytes fail with EFBIG instead of killing the process.
			n, _ := strconv.ParseUint(v, 10, 64)
			signal.Ignore(syscall.SIGXFSZ)
			if err := syscall.Setrlimit(syscall.RLIMIT_FSIZE, &syscall.Rlimit{Cur: n, Max: n}); err != nil {
				panic(err)
			}
		}
		os.Exit(Main(strings.Fields(os.Getenv("ZAYA_ARGS")), os.Getenv, os.Stderr))
	}
	os.Exit(m.Run())
}

// job is a gang of worker processes sharing a checkpoint directory.
type job struct {
	nodes, gpus, cp int
	target          int    // ZAYA_TARGET_NODES (0: not set, not elastic)
	attempt         int    // ZAYA_RESTART_ATTEMPT: a test that restarts the gang counts it up, as the operator does
	uid             string // ZAYA_JOB_UID
	args            string
	nodeArgs        map[int]string // more arguments for one node
	metrics         string         // node 0's -metrics-addr (other nodes serve none)
	dir, port       string
}

func (j job) env(node int, out string) []string {
	metrics := ""
	if node == 0 {
		metrics = j.metrics
	}
	return append(os.Environ(), "ZAYA_TRAIN_CHILD=1", "ZAYA_ARGS="+j.args+" "+j.nodeArgs[node]+" -listen=127.0.0.1:0 -metrics-addr="+metrics+" -rendezvous-timeout=10s -params-out="+out+
		" -termination-log="+filepath.Join(j.dir, fmt.Sprintf("termination-%d", node)),
		"NODE_RANK="+strconv.Itoa(node), "NNODES="+strconv.Itoa(j.nodes), "GPUS_PER_NODE="+strconv.Itoa(j.gpus),
		"WORLD_SIZE="+strconv.Itoa(j.nodes*j.gpus), "ZAYA_CONTEXT_PARALLEL="+strconv.Itoa(j.cp),
		"MASTER_ADDR=127.0.0.1", "MASTER_PORT="+j.port, "ZAYA_RESTART_ATTEMPT="+strconv.Itoa(j.attempt), "ZAYA_JOB_UID="+j.uid,
		"ZAYA_CHECKPOINT_DIR="+filepath.Join(j.dir, "ckpt"), "ZAYA_CHECKPOINT_INTERVAL=4", "ZAYA_CHECKPOINT_KEEP=2",
		"ZAYA_HEARTBEAT_FILE="+filepath.Join(j.dir, fmt.Sprintf("heartbeat-%d", node)), "ZAYA_TARGET_NODES="+targetEnv(j.target))
}

func targetEnv(n int) string {
	if n == 0 {
		return ""
	}
	return strconv.Itoa(n)
}

// processDeadline bounds every worker process a test starts, whatever the test waits for.
const processDeadline = 3 * time.Minute

// workerCommand is one node's worker: this test binary run again as the worker. It is killed
// after processDeadline, so a hung gang fails its own test with its logs, not the whole
// package at go test's timeout with none.
func workerCommand(t *testing.T) *exec.Cmd {
	ctx, cancel := context.WithTimeout(context.Background(), processDeadline)
	t.Cleanup(cancel)
	cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^$")
	cmd.WaitDelay = 5 * time.Second
	return cmd
}

// start launches every node's process; their stderr goes to logs[node].
func (j job) start(t *testing.T, out string, logs []*syncBuffer) []*exec.Cmd {
	t.Helper()
	cmds := make([]*exec.Cmd, j.nodes)
	for node := range j.nodes {
		cmd := workerCommand(t)
		cmd.Env = j.env(node, out)
		cmd.Stderr = logs[node]
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		cmds[node] = cmd
	}
	return cmds
}

// syncBuffer is a process's stderr, safe to read while the process writes it.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// logs are one buffer per node of j.
func (j job) logs() []*syncBuffer {
	out := make([]*syncBuffer, j.nodes)
	for i := range out {
		out[i] = &syncBuffer{}
	}
	return out
}

func waitAll(t *testing.T, cmds []*exec.Cmd, logs []*syncBuffer) {
	t.Helper()
	for node, cmd := range cmds {
		if err := cmd.Wait(); err != nil {
			t.Fatalf("node %d: %v\n%s", node, err, logs[node])
		}
	}
}

// TestLossFalls: the default decoder, data and context parallel over 2 nodes x 2 GPUs,
// starts near ln(vocab) and learns the data's Markov chain: the last ten steps' mean loss is
// under 60% of the first step's.
func TestLossFalls(t *testing.T) {
	j := job{nodes: 2, gpus: 2, cp: 2, args: "-steps=80 -seq=16 -log-every=1", dir: t.TempDir(), port: testnet.FreePort(t)}
	logs := j.logs()
	waitAll(t, j.start(t, filepath.Join(j.dir, "params"), logs), logs)
	var losses []float64
	sc := bufio.NewScanner(strings.NewReader(logs[0].String()))
	for sc.Scan() {
		var step int
		var loss float64
		if n, _ := fmt.Sscanf(sc.Text(), "step %d loss %g", &step, &loss); n == 2 {
			losses = append(losses, loss)
		}
	}
	if len(losses) != 80 {
		t.Fatalf("want 80 progress lines, log:\n%s", logs[0])
	}
	if math.Abs(losses[0]-math.Log(32)) > 0.5 {
		t.Errorf("first loss %.3f, want about ln 32 = %.3f", losses[0], math.Log(32))
	}
	var last float64
	for _, l := range losses[70:] {
		last += l / 10
	}
	t.Logf("loss %.3f at step 1, %.3f over steps 71-80 (ln 32 = %.3f, the chain's floor %.3f)", losses[0], last, math.Log(32), model.Floor)
	if !(last < 0.6*losses[0]) {
		t.Errorf("loss did not fall: %.3f at step 1, %.3f over the last ten steps", losses[0], last)
	}
	if _, err := os.Stat(filepath.Join(j.dir, "heartbeat-1")); err != nil {
		t.Errorf("no heartbeat: %v", err)
	}
	b, _ := os.ReadFile(filepath.Join(j.dir, "termination-0"))
	if !strings.Contains(string(b), "checkpoint-step=80\n") || !strings.Contains(string(b), "training-step=80\n") {
		t.Errorf("termination log = %q, want checkpoint-step=80 and training-step=80", b)
	}
	// The run's pace, for the operator to price the steps a restart trains again.
	i := strings.Index(string(b), "step-seconds=")
	var secs float64
	if i < 0 {
		t.Fatalf("termination log = %q, want step-seconds=", b)
	}
	if _, err := fmt.Sscanf(string(b[i:]), "step-seconds=%g", &secs); err != nil || secs <= 0 || secs > 10 {
		t.Errorf("step-seconds %v (%v) in %q: want a positive pace", secs, err, b)
	}
}

// uninterrupted is the final parameters of a 2-node gang that runs args without a fault.
func uninterrupted(t *testing.T, args string) []byte {
	t.Helper()
	return finalParams(t, job{nodes: 2, gpus: 2, cp: 2, args: args, dir: t.TempDir()})
}

// TestKilledRunResumesBitIdentical kills one node's worker after a checkpoint is committed,
// restarts the whole gang (as the operator does) and checks that the final parameters equal,
// bit for bit, those of a run that never stopped.
func TestKilledRunResumesBitIdentical(t *testing.T) {
	const args = "-steps=24 -seq=16 -dim=6"
	want := uninterrupted(t, args)

	j := job{nodes: 2, gpus: 2, cp: 2, args: args, dir: t.TempDir(), port: testnet.FreePort(t)}
	out := filepath.Join(j.dir, "params")
	logs := j.logs()
	cmds := j.start(t, out, logs)
	deadline := time.Now().Add(60 * time.Second)
	for !committed(filepath.Join(j.dir, "ckpt"), 8) {
		if time.Now().After(deadline) {
			t.Fatalf("no checkpoint at step 8; logs:\n%s\n%s", logs[0], logs[1])
		}
		time.Sleep(time.Millisecond)
	}
	if err := cmds[1].Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	codes := make([]int, len(cmds))
	for node, cmd := range cmds {
		err := cmd.Wait()
		var exit *exec.ExitError
		if err == nil || !errors.As(err, &exit) {
			t.Fatalf("node %d after the kill: %v (want a failure: its peer is gone)", node, err)
		}
		codes[node] = exit.ExitCode()
	}
	checkRootFailure(t, j.dir, 1, codes, logs) // the killed node is the root failure, its peer stopped

	j.port, j.attempt = testnet.FreePort(t), j.attempt+1 // a new gang: new pods
	logs = j.logs()
	waitAll(t, j.start(t, out, logs), logs)
	if !strings.Contains(logs[0].String(), "resumed from step") {
		t.Errorf("the restarted gang did not resume from a checkpoint:\n%s", logs[0])
	}
	got, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Fatal("parameters after the kill and resume differ from the uninterrupted run")
	}
}

func TestMetricsReportProgressAndSaves(t *testing.T) {
	reg := prometheus.NewRegistry()
	m := NewMetrics(reg)
	cfg := Config{NodeRank: 0, Nodes: 1, GPUsPerNode: 2, ContextParallel: 2, Master: "127.0.0.1:" + testnet.FreePort(t),
		Listen: "127.0.0.1:0", CheckpointDir: t.TempDir(), CheckpointEvery: 5, Keep: 2,
		Steps: 20, Seq: 8, Model: testShape(4), LR: 0.01, Seed: 3, Metrics: m}
	if _, err := Run(context.Background(), cfg); err != nil {
		t.Fatal(err)
	}
	if got := testutil.ToFloat64(m.Step); got != 20 {
		t.Errorf("zaya_worker_step = %v, want 20", got)
	}
	if got := testutil.ToFloat64(m.CheckpointStep); got != 20 {
		t.Errorf("zaya_worker_checkpoint_step = %v, want 20", got)
	}
	if n := testutil.CollectAndCount(m.SaveSeconds); n != 1 {
		t.Errorf("save histogram series = %d", n)
	}
	if testutil.ToFloat64(m.TokensPerSec) <= 0 || testutil.ToFloat64(m.Loss) <= 0 {
		t.Error("throughput and loss not reported")
	}
	addr, err := serveMetrics("127.0.0.1:0", reg, &board{})
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = resp.Body.Close() }()
	body, _ := io.ReadAll(resp.Body)
	if !strings.Contains(string(body), "zaya_worker_checkpoint_save_seconds_count 4") {
		t.Errorf("/metrics does not show 4 saves:\n%s", body)
	}
}

// TestRankZeroReportsLiveProgressAndTheStraggler runs two nodes, slows node 1 down mid-run
// and reads rank 0's progress endpoint: the run's steps and times, and node 1 as the one
// whose steps keep it busy longest. The stopped workers' termination logs carry the run's
// training-since and last-step-at times.
func TestRankZeroReportsLiveProgressAndTheStraggler(t *testing.T) {
	port := testnet.FreePort(t)
	dir := t.TempDir()
	fault := filepath.Join(dir, "fault-1")
	j := job{nodes: 2, gpus: 1, cp: 1, args: "-steps=100000 -seq=8 -dim=4 -pace=2ms", dir: dir, port: testnet.FreePort(t),
		metrics: "127.0.0.1:" + port, nodeArgs: map[int]string{1: "-fault-file=" + fault}}
	logs := j.logs()
	began := time.Now()
	cmds := j.start(t, filepath.Join(dir, "params"), logs)
	t.Cleanup(func() {
		for _, c := range cmds {
			_ = c.Process.Kill()
		}
	})
	get := func() (p contract.Progress, ok bool) {
		resp, err := http.Get("http://127.0.0.1:" + port + contract.ProgressPath)
		if err != nil {
			return p, false
		}
		defer func() { _ = resp.Body.Close() }()
		return p, resp.StatusCode == http.StatusOK && json.NewDecoder(resp.Body).Decode(&p) == nil
	}
	waitFor := func(what string, cond func(contract.Progress) bool) contract.Progress {
		t.Helper()
		deadline := time.Now().Add(time.Minute)
		for time.Now().Before(deadline) {
			if p, ok := get(); ok && cond(p) {
				return p
			}
			time.Sleep(20 * time.Millisecond)
		}
		p, _ := get()
		t.Fatalf("%s: last progress %+v\nnode 0:\n%s\nnode 1:\n%s", what, p, logs[0], logs[1])
		return p
	}
	p := waitFor("no even steps", func(p contract.Progress) bool { return p.Step >= 30 && len(p.NodeStepSeconds) == 2 })
	if p.TrainingSince.Before(began) || p.LastStepAt.Before(p.TrainingSince) || p.StepSeconds <= 0 || p.ResumedFrom != 0 {
		t.Errorf("progress %+v: times or pace wrong (started %v)", p, began)
	}
	if p.StartedAt.IsZero() || p.MetAt.Before(p.StartedAt) || p.TrainingSince.Before(p.MetAt) {
		t.Errorf("progress %+v: want the process's start, then its rendezvous, then training", p)
	}
	if err := os.WriteFile(fault, []byte("slow"), 0o644); err != nil {
		t.Fatal(err)
	}
	from := p.Step
	p = waitFor("node 1 never showed as the straggler", func(p contract.Progress) bool {
		return p.Step > from+30 && p.NodeStepSeconds[1] > 1.8*p.NodeStepSeconds[0]
	})
	if err := cmds[0].Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	for _, c := range cmds {
		_ = c.Wait()
	}
	b, err := os.ReadFile(filepath.Join(dir, "termination-0"))
	if err != nil {
		t.Fatal(err)
	}
	var since, last time.Time
	for line := range strings.Lines(string(b)) {
		line = strings.TrimSpace(line)
		if v, ok := strings.CutPrefix(line, contract.TerminationMessageTrainingSincePrefix); ok {
			since, _ = time.Parse(time.RFC3339Nano, v)
		}
		if v, ok := strings.CutPrefix(line, contract.TerminationMessageLastStepAtPrefix); ok {
			last, _ = time.Parse(time.RFC3339Nano, v)
		}
	}
	if !since.Equal(p.TrainingSince) || last.Before(p.LastStepAt) || time.Since(last) > time.Minute {
		t.Errorf("termination log says training since %v, last step at %v; progress said %v, %v\n%s", since, last, p.TrainingSince, p.LastStepAt, b)
	}
}

func TestConfigurationErrorsExit78(t *testing.T) {
	base := map[string]string{
		"NODE_RANK": "0", "NNODES": "1", "GPUS_PER_NODE": "2", "WORLD_SIZE": "2", "ZAYA_CONTEXT_PARALLEL": "2", "ZAYA_RESTART_ATTEMPT": "0",
		"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "1",
	}
	cases := []struct {
		name  string
		env   map[string]string
		args  string
		wants string
	}{
		{"missing rank", map[string]string{"NODE_RANK": ""}, "", "NODE_RANK is not set"},
		{"missing attempt", map[string]string{"ZAYA_RESTART_ATTEMPT": ""}, "", "ZAYA_RESTART_ATTEMPT is not set"},
		{"garbage attempt", map[string]string{"ZAYA_RESTART_ATTEMPT": "two"}, "", `ZAYA_RESTART_ATTEMPT="two" must be an integer >= 0`},
		{"negative attempt", map[string]string{"ZAYA_RESTART_ATTEMPT": "-1"}, "", `ZAYA_RESTART_ATTEMPT="-1" must be an integer >= 0`},
		{"world mismatch", map[string]string{"WORLD_SIZE": "3"}, "", "WORLD_SIZE=3 is not NNODES x GPUS_PER_NODE = 2"},
		{"no master", map[string]string{"MASTER_PORT": ""}, "", "MASTER_ADDR and MASTER_PORT"},
		{"cp does not divide", map[string]string{"ZAYA_CONTEXT_PARALLEL": "3"}, "", "must divide the world size"},
		{"sequence not zigzag", nil, "-seq=6", "multiple of 2 x context parallel"},
		{"bad interval", map[string]string{"ZAYA_CHECKPOINT_DIR": "/tmp/x", "ZAYA_CHECKPOINT_INTERVAL": "-5"}, "", "positive number of steps (500) or a duration"},
		{"bad collective timeout", map[string]string{"ZAYA_COLLECTIVE_TIMEOUT": "soon"}, "", `ZAYA_COLLECTIVE_TIMEOUT="soon" must be a positive number of seconds or a duration`},
		{"interval without dir", map[string]string{"ZAYA_CHECKPOINT_INTERVAL": "30m"}, "", "without ZAYA_CHECKPOINT_DIR"},
		{"unknown transport", nil, "-transport=mpi", "-transport=\"mpi\" must be tcp or rccl"},
		{"unknown backend", nil, "-backend=cuda", "-backend=\"cuda\" must be cpu or hip"},
		{"bad flag", nil, "-nope", "flag provided but not defined"},
		{"garbage peer timeout", map[string]string{"ZAYA_PEER_TIMEOUT": "soon"}, "", `ZAYA_PEER_TIMEOUT="soon" must be a duration`},
		{"peer timeout too short", map[string]string{"ZAYA_PEER_TIMEOUT": "10ms"}, "", "ZAYA_PEER_TIMEOUT (-peer-timeout) 10ms is below 100ms"},
		{"peer timeout flag too short", map[string]string{"ZAYA_PEER_TIMEOUT": "5s"}, "-peer-timeout=20ms", "(-peer-timeout) 20ms is below 100ms"},
		{"heads do not divide dim", nil, "-dim=6 -heads=4", "dim 6 is not a multiple of heads 4"},
		{"one-token vocabulary", nil, "-vocab=1", "vocabulary 1: want at least 2 tokens"},
		{"no layers", nil, "-layers=0", "layers 0"},
		{"learning rate of SGD", nil, "-lr=1.5", "0 < lr < 1"},
		{"garbage target", map[string]string{"ZAYA_TARGET_NODES": "0"}, "", `ZAYA_TARGET_NODES="0" must be an integer >= 1`},
		{"target below the width", map[string]string{"NNODES": "2", "WORLD_SIZE": "4", "ZAYA_TARGET_NODES": "1"}, "", "ZAYA_TARGET_NODES=1 is below NNODES=2"},
		{"target splits a ring", map[string]string{"NNODES": "2", "GPUS_PER_NODE": "1", "WORLD_SIZE": "2", "ZAYA_TARGET_NODES": "3"}, "", "ZAYA_TARGET_NODES=3: 3 GPUs are not whole rings of ZAYA_CONTEXT_PARALLEL=2"},
		{"target past an exact sum", map[string]string{"ZAYA_TARGET_NODES": "1000000"}, "", "1000000 nodes of 2 GPUs: this worker sums at most 1048576"},
		{"target that would wrap a product", map[string]string{"ZAYA_TARGET_NODES": "4611686018427387904"}, "", "ZAYA_TARGET_NODES=4611686018427387904, GPUS_PER_NODE=2: this worker sums at most 1048576"},
	}
	if !rocm.Built {
		cases = append(cases, struct {
			name  string
			env   map[string]string
			args  string
			wants string
		}{"rccl without rocm", nil, "-transport=rccl", "built without ROCm support"})
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			env := func(k string) string {
				if v, ok := c.env[k]; ok {
					return v
				}
				return base[k]
			}
			var stderr bytes.Buffer
			if code := Main(strings.Fields(c.args), env, &stderr); code != ExitConfig {
				t.Errorf("exit %d, want %d; stderr: %s", code, ExitConfig, &stderr)
			}
			if !strings.Contains(stderr.String(), c.wants) {
				t.Errorf("stderr %q does not say %q", &stderr, c.wants)
			}
		})
	}
}

// A checkpoint volume mounted read-only (or not writable by the worker's user) can never take
// a save: the worker says so and exits 78 at start, rather than exit 1 at its first save,
// restart after restart.
func TestAReadOnlyCheckpointVolumeExits78(t *testing.T) {
	dir := readOnlyDir(t)
	env := map[string]string{
		"NODE_RANK": "0", "NNODES": "1", "GPUS_PER_NODE": "1", "WORLD_SIZE": "1", "ZAYA_CONTEXT_PARALLEL": "1", "ZAYA_RESTART_ATTEMPT": "0",
		"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "1", "ZAYA_CHECKPOINT_DIR": filepath.Join(dir, "ckpt"), "ZAYA_CHECKPOINT_INTERVAL": "5",
	}
	var stderr bytes.Buffer
	if code := Main([]string{"-steps=4", "-seq=8", "-dim=4", "-metrics-addr="}, func(k string) string { return env[k] }, &stderr); code != ExitConfig {
		t.Errorf("exit %d, want %d; stderr: %s", code, ExitConfig, &stderr)
	}
	for _, want := range []string{"ZAYA_CHECKPOINT_DIR " + env["ZAYA_CHECKPOINT_DIR"], "the checkpoint directory cannot be written", "mount the checkpoint volume read-write"} {
		if !strings.Contains(stderr.String(), want) {
			t.Errorf("stderr %q does not say %q", &stderr, want)
		}
	}
}

// readOnlyDir is a directory the test's user cannot write: a read-only tmpfs for root (which
// file modes do not stop), a mode-0555 directory for anyone else.
func readOnlyDir(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	if os.Geteuid() != 0 {
		if err := os.Chmod(dir, 0o555); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = os.Chmod(dir, 0o755) })
		return dir
	}
	if err := syscall.Mount("tmpfs", dir, "tmpfs", syscall.MS_RDONLY, "size=64k"); err != nil {
		t.Fatalf("root without a read-only mount (%v): nothing here could show the check", err)
	}
	t.Cleanup(func() { _ = syscall.Unmount(dir, 0) })
	return dir
}

// TestACheckpointOfAnotherModelExits78: a gang started with another model size on a job's
// checkpoints (a changed -dim, or the old model's checkpoints) stops with a configuration
// error naming the tensor and both sizes, on every node, and deletes nothing.
func TestACheckpointOfAnotherModelExits78(t *testing.T) {
	j := job{nodes: 2, gpus: 1, cp: 1, args: "-steps=8 -seq=8 -dim=4", dir: t.TempDir(), port: testnet.FreePort(t)}
	out := filepath.Join(j.dir, "params")
	logs := j.logs()
	waitAll(t, j.start(t, out, logs), logs)
	before, err := checkpoint.Steps(filepath.Join(j.dir, "ckpt"))
	if err != nil || len(before) == 0 {
		t.Fatalf("no checkpoint after the first run: %v %v", before, err)
	}
	// restart starts the gang with args and wants every node to exit 78; node 0's log.
	restart := func(args string) *syncBuffer {
		j.args, j.attempt, j.port = args, j.attempt+1, testnet.FreePort(t)
		logs := j.logs()
		for node, cmd := range j.start(t, out, logs) {
			err := cmd.Wait()
			if code := cmd.ProcessState.ExitCode(); code != ExitConfig {
				t.Errorf("%s: node %d: exit %d (%v), want %d\n%s", args, node, code, err, ExitConfig, logs[node])
			}
		}
		return logs[0]
	}
	logs = []*syncBuffer{restart("-steps=16 -seq=8 -dim=6")}
	if want := `checkpoint at step 8 does not fit this model: it was saved by a model of vocab 32, dim 4`; !strings.Contains(logs[0].String(), want) ||
		!strings.Contains(logs[0].String(), "this one has vocab 32, dim 6") {
		t.Errorf("node 0 does not say which shapes (want %q):\n%s", want, logs[0])
	}
	after, _ := checkpoint.Steps(filepath.Join(j.dir, "ckpt"))
	if !slices.Equal(before, after) {
		t.Errorf("checkpoint steps %v became %v", before, after)
	}

	// Another head count has the same number of parameters: the shape, not the count, tells.
	if log := restart("-steps=16 -seq=8 -dim=4 -heads=4"); !strings.Contains(log.String(), "heads 2") || !strings.Contains(log.String(), "heads 4") {
		t.Errorf("-heads=4: node 0 does not name both head counts:\n%s", log)
	}
}

// TestSIGTERMSavesAFinalCheckpoint: when the gang is deleted every worker gets SIGTERM; the
// ranks agree on a step through their all-reduce, save it, and exit 75: not done.
func TestSIGTERMSavesAFinalCheckpoint(t *testing.T) {
	j := job{nodes: 2, gpus: 1, cp: 1, args: "-steps=100000 -seq=8 -dim=4", dir: t.TempDir(), port: testnet.FreePort(t)}
	logs := j.logs()
	cmds := j.start(t, filepath.Join(j.dir, "params"), logs)
	waitStep(t, 10, logs)
	for _, cmd := range cmds {
		if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
			t.Fatal(err)
		}
	}
	steps := map[int64]bool{}
	for node, cmd := range cmds {
		err := cmd.Wait()
		var exit *exec.ExitError
		if !errors.As(err, &exit) || exit.ExitCode() != contract.ExitStopped {
			t.Fatalf("node %d: %v, want exit %d\n%s", node, err, contract.ExitStopped, logs[node])
		}
		step, stopped := terminationLines(t, j.dir, node)
		if want := fmt.Sprintf("rank %d was signalled at step %d", node, step); stopped != want {
			t.Errorf("node %d: stopped line %q, want %q", node, stopped, want)
		}
		steps[step] = true
	}
	if len(steps) != 1 {
		t.Fatalf("nodes disagree on the final checkpoint: %v", steps)
	}
	for step := range steps {
		if step < 10 {
			t.Fatalf("final checkpoint at step %d, want >= 10", step)
		}
		if !committed(filepath.Join(j.dir, "ckpt"), step) {
			t.Errorf("the final checkpoint %d is not committed", step)
		}
	}
}

// TestAPeerStoppedRankIsNotDone: only node 1 gets SIGTERM; node 0 stops with it at the agreed
// step, and must not exit 0 (done) in the middle of the run: it exits 75 and says why.
func TestAPeerStoppedRankIsNotDone(t *testing.T) {
	j := job{nodes: 2, gpus: 1, cp: 1, args: "-steps=100000 -seq=8 -dim=4", dir: t.TempDir(), port: testnet.FreePort(t)}
	logs := j.logs()
	cmds := j.start(t, filepath.Join(j.dir, "params"), logs)
	waitStep(t, 10, logs)
	if err := cmds[1].Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	var steps [2]int64
	for node, cmd := range cmds {
		err := cmd.Wait()
		var exit *exec.ExitError
		if !errors.As(err, &exit) || exit.ExitCode() != contract.ExitStopped {
			t.Fatalf("node %d: %v, want exit %d (stopped, not done)\n%s", node, err, contract.ExitStopped, logs[node])
		}
		steps[node], _ = terminationLines(t, j.dir, node)
	}
	if steps[0] != steps[1] || steps[0] < 10 {
		t.Fatalf("checkpoint steps %v, want one agreed step >= 10", steps)
	}
	if _, stopped := terminationLines(t, j.dir, 0); stopped != fmt.Sprintf("peer rank 1 was stopped at step %d", steps[0]) {
		t.Errorf("node 0's stopped line %q", stopped)
	}
	if _, err := os.Stat(filepath.Join(j.dir, "params")); err == nil {
		t.Error("a stopped run wrote its final parameters")
	}
}

// terminationLines reads node's termination log: the checkpoint step and the stopped reason.
func terminationLines(t *testing.T, dir string, node int) (step int64, stopped string) {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dir, fmt.Sprintf("termination-%d", node)))
	if err != nil {
		t.Fatal(err)
	}
	step = -1
	for line := range strings.Lines(string(b)) {
		line = strings.TrimSpace(line)
		if v, ok := strings.CutPrefix(line, "checkpoint-step="); ok {
			step, _ = strconv.ParseInt(v, 10, 64)
		}
		if v, ok := strings.CutPrefix(line, contract.TerminationMessageStoppedPrefix+" "); ok {
			stopped = v
		}
	}
	if step < 0 {
		t.Fatalf("node %d's termination log has no checkpoint step: %q", node, b)
	}
	return step, stopped
}

// TestRandomKillsIncludingMidSave kills a random node's worker at a random step — once right
// in the middle of a save — restarting the gang each time, and still ends bit-identical.
// Each killed gang is held on a save that cannot finish (one rank's shard file is a FIFO
// nobody reads), so no gang can finish before its kill, however fast or slow the machine.
func TestRandomKillsIncludingMidSave(t *testing.T) {
	const steps, interval = 160, 4 // interval: ZAYA_CHECKPOINT_INTERVAL in job.env
	args := fmt.Sprintf("-steps=%d -seq=16 -dim=6 -log-every=1", steps)
	want := uninterrupted(t, args)

	r := rand.New(rand.NewPCG(42, 42))
	j := job{nodes: 2, gpus: 2, cp: 2, args: args, dir: t.TempDir()}
	ckpt := filepath.Join(j.dir, "ckpt")
	out := filepath.Join(j.dir, "params")
	for round := range 4 {
		from := committedStep(t, ckpt)
		gate := from + interval*int64(1+r.IntN(6)) // a checkpoint step this gang cannot commit
		if gate >= steps {
			t.Fatalf("round %d: gate step %d is past the end of the job", round, gate)
		}
		gateRank := r.IntN(j.nodes * j.gpus)
		j.port, j.attempt = testnet.FreePort(t), round
		fifo := holdSave(t, ckpt, gate, gateRank, j.attempt<<contract.InPlaceAttemptBits) // the generation's first start

		logs := j.logs()
		cmds := j.start(t, out, logs)
		t.Cleanup(func() { // a held gang never ends by itself if the test stops early
			for _, cmd := range cmds {
				_ = cmd.Process.Kill()
			}
		})
		at := "mid-save"
		if round == 1 {
			waitSaveBegun(t, ckpt, gate, logs)
		} else {
			k := from + 1 + r.Int64N(gate-from)
			waitStep(t, k, logs)
			at = fmt.Sprintf("step >= %d", k)
		}
		victim := r.IntN(len(cmds))
		if err := cmds[victim].Process.Signal(syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		// Only now may the held rank's write go on (and fail): its node must not hang.
		reader, err := os.OpenFile(fifo, os.O_RDONLY|syscall.O_NONBLOCK, 0)
		if err != nil {
			t.Fatal(err)
		}
		for node, cmd := range cmds {
			err := cmd.Wait()
			var exit *exec.ExitError
			switch {
			case node == victim && (!errors.As(err, &exit) || exit.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL):
				t.Fatalf("round %d: node %d was not ended by the kill: %v\n%s", round, node, err, logs[node])
			case node != victim && err == nil:
				t.Fatalf("round %d: node %d finished although its gang was held and its peer killed\n%s", round, node, logs[node])
			}
		}
		_ = reader.Close()
		if err := os.Remove(fifo); err != nil {
			t.Fatal(err)
		}
		if committed(ckpt, gate) {
			t.Fatalf("round %d: the held save of step %d was committed", round, gate)
		}
		t.Logf("round %d: resumed from step %d, save of step %d held on rank %d, node %d killed at %s", round, from, gate, gateRank, victim, at)
	}

	j.port, j.attempt = testnet.FreePort(t), j.attempt+1
	logs := j.logs()
	waitAll(t, j.start(t, out, logs), logs)
	if ParseLog(logs[0].String()).Resumed == 0 {
		t.Errorf("the last gang did not resume from a checkpoint:\n%s", logs[0])
	}
	got, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Fatal("after 4 kills the parameters differ from the uninterrupted run")
	}
}

// committed is whether step is a committed checkpoint in dir.
func committed(dir string, step int64) bool {
	_, err := checkpoint.Open(dir, step)
	return err == nil
}

// committedStep is the step of the newest checkpoint a gang would resume from (0: none).
func committedStep(t *testing.T, dir string) int64 {
	t.Helper()
	ck, _, err := checkpoint.Latest(dir)
	if err != nil {
		t.Fatal(err)
	}
	if ck == nil {
		return 0
	}
	return ck.Manifest.Step
}

// holdSave makes rank's shard of step a FIFO: the rank's save blocks opening it until a
// reader comes, so the checkpoint cannot commit and the gang stops at its next save.
func holdSave(t *testing.T, dir string, step int64, rank, attempt int) string {
	t.Helper()
	// step is past the last commit: anything there is a killed gang's unfinished save.
	sd := filepath.Join(dir, fmt.Sprintf("step-%012d", step))
	if err := os.RemoveAll(sd); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(sd, 0o755); err != nil {
		t.Fatal(err)
	}
	fifo := filepath.Join(sd, fmt.Sprintf("rank-%05d.a%d.bin", rank, attempt))
	if err := syscall.Mkfifo(fifo, 0o644); err != nil {
		t.Fatal(err)
	}
	return fifo
}

// waitFor polls until done, failing with the gang's logs after a minute.
func waitFor(t *testing.T, what string, logs []*syncBuffer, done func() bool) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for !done() {
		if time.Now().After(deadline) {
			t.Fatalf("%s never happened; logs:\n%s\n%s", what, logs[0], logs[1])
		}
		time.Sleep(time.Millisecond)
	}
}

// waitStep returns once rank 0 has logged step k.
func waitStep(t *testing.T, k int64, logs []*syncBuffer) {
	t.Helper()
	waitFor(t, fmt.Sprintf("step %d", k), logs, func() bool { return ParseLog(logs[0].String()).Last >= k })
}

// waitSaveBegun returns once some rank has written its shard of step: the save is under way.
func waitSaveBegun(t *testing.T, dir string, step int64, logs []*syncBuffer) {
	t.Helper()
	waitFor(t, fmt.Sprintf("a shard of step %d", step), logs, func() bool {
		lists, _ := filepath.Glob(filepath.Join(dir, fmt.Sprintf("step-%012d", step), "rank-*.json"))
		return len(lists) > 0
	})
}

// TestDurationIntervalCheckpointsByRankZerosClock: with ZAYA_CHECKPOINT_INTERVAL a duration,
// rank 0's clock decides and the step's all-reduce tells every rank, so all ranks save the
// same steps and the checkpoints commit.
func TestDurationIntervalCheckpointsByRankZerosClock(t *testing.T) {
	env := map[string]string{
		"NODE_RANK": "0", "NNODES": "1", "GPUS_PER_NODE": "2", "WORLD_SIZE": "2", "ZAYA_CONTEXT_PARALLEL": "2", "ZAYA_RESTART_ATTEMPT": "0",
		"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": testnet.FreePort(t), "ZAYA_CHECKPOINT_INTERVAL": "1ns",
		"ZAYA_CHECKPOINT_DIR": t.TempDir(), "ZAYA_CHECKPOINT_KEEP": "100",
	}
	cfg, err := FromEnv(Config{Steps: 6, Seq: 8, Model: testShape(4), LR: 0.01, Seed: 1, Listen: "127.0.0.1:0", RendezvousTimeout: 10 * time.Second},
		func(k string) string { return env[k] })
	if err != nil {
		t.Fatal(err)
	}
	if cfg.CheckpointPeriod != time.Nanosecond || cfg.CheckpointEvery != 0 {
		t.Fatalf("interval parsed as every %d steps / period %v", cfg.CheckpointEvery, cfg.CheckpointPeriod)
	}
	res, err := Run(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	if res.CheckpointStep != 6 {
		t.Errorf("last checkpoint step %d, want 6", res.CheckpointStep)
	}
	dirs, err := filepath.Glob(filepath.Join(env["ZAYA_CHECKPOINT_DIR"], "step-*"))
	if err != nil {
		t.Fatal(err)
	}
	if len(dirs) != 6 {
		t.Errorf("checkpoints %v, want one per step (1ns interval)", dirs)
	}
}

// testShape is a model small enough for tests that run many processes.
func testShape(dim int) model.Shape {
	return model.Shape{Vocab: 16, Dim: dim, Layers: 1, Heads: 2, FFN: 2 * dim}
}
