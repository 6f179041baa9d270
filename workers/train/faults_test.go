package train

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/zaya-operator/zaya-operator/api/contract"
	"github.com/zaya-operator/zaya-operator/internal/testnet"
	"github.com/zaya-operator/zaya-operator/workers/checkpoint"
	"github.com/zaya-operator/zaya-operator/workers/transport"
)

// faultArgs is the run of the fault tests; a first gang runs only its first 12 steps.
// The model is tiny (46 parameters) so that a shard and a rank's shard list fit under the
// full-disk test's limit and the manifest does not.
const faultArgs = "-steps=60 -seq=16 -vocab=8 -dim=2 -heads=1 -layers=1 -ffn=2 -log-every=1"

// firstGang runs j's first 12 steps to the end (checkpoints every 4 steps, keeping 2) and
// returns the newest and the previous committed checkpoint steps: 12 and 8. Both are steps
// the next gang saves again.
func firstGang(t *testing.T, j *job, out string) (newest, previous int64) {
	t.Helper()
	first := *j
	first.args = strings.Replace(j.args, "-steps=60", "-steps=12", 1)
	first.port = testnet.FreePort(t)
	logs := first.logs()
	waitAll(t, first.start(t, out, logs), logs)
	var committed []int64
	steps, err := checkpoint.Steps(filepath.Join(j.dir, "ckpt"))
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range steps {
		if _, err := checkpoint.Open(filepath.Join(j.dir, "ckpt"), s); err == nil {
			committed = append(committed, s)
		}
	}
	if len(committed) != 2 || committed[0] != 12 || committed[1] != 8 {
		t.Fatalf("committed steps %v, want [12 8]", committed)
	}
	_ = os.Remove(out)
	return committed[0], committed[1]
}

// shardFiles are the shard data files of step under dir.
func shardFiles(t *testing.T, dir string, step int64) []string {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(dir, fmt.Sprintf("step-%012d", step), "rank-*.bin"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no shards of step %d: %v", step, err)
	}
	return files
}

// TestDamagedNewestCheckpointResumesFromThePreviousOne damages the newest committed step in
// each way storage can, restarts the gang once, and checks that it resumes
// from the previous good step, reports what it restored and lost, saves the damaged step's
// number again (no crash loop) and ends bit-identical to a run that never stopped.
func TestDamagedNewestCheckpointResumesFromThePreviousOne(t *testing.T) {
	want := uninterrupted(t, faultArgs)
	faults := []struct {
		name    string
		corrupt bool // moved aside (else skipped as an unfinished save)
		damage  func(t *testing.T, sd string, shards []string)
	}{
		{"bit flip in a shard", true, func(t *testing.T, _ string, shards []string) {
			b, err := os.ReadFile(shards[1])
			if err != nil {
				t.Fatal(err)
			}
			b[len(b)/2] ^= 0x10
			if err := os.WriteFile(shards[1], b, 0o644); err != nil {
				t.Fatal(err)
			}
		}},
		{"truncated shard", true, func(t *testing.T, _ string, shards []string) {
			if err := os.Truncate(shards[2], 7); err != nil {
				t.Fatal(err)
			}
		}},
		{"missing shard", true, func(t *testing.T, _ string, shards []string) {
			if err := os.Remove(shards[3]); err != nil {
				t.Fatal(err)
			}
		}},
		{"torn manifest", true, func(t *testing.T, sd string, _ []string) {
			if err := os.Truncate(filepath.Join(sd, "manifest.a0.json"), 40); err != nil {
				t.Fatal(err)
			}
		}},
		{"missing manifest", false, func(t *testing.T, sd string, _ []string) {
			if err := os.Remove(filepath.Join(sd, "manifest.a0.json")); err != nil {
				t.Fatal(err)
			}
		}},
	}
	for _, f := range faults {
		t.Run(f.name, func(t *testing.T) {
			j := job{nodes: 2, gpus: 2, cp: 2, args: faultArgs, dir: t.TempDir()}
			ckpt, out := filepath.Join(j.dir, "ckpt"), filepath.Join(j.dir, "params")
			newest, previous := firstGang(t, &j, out)
			sd := filepath.Join(ckpt, fmt.Sprintf("step-%012d", newest))
			f.damage(t, sd, shardFiles(t, ckpt, newest))
			for node := range j.nodes {
				_ = os.Remove(filepath.Join(j.dir, fmt.Sprintf("termination-%d", node)))
			}

			j.port, j.attempt = testnet.FreePort(t), j.attempt+1
			logs := j.logs()
			waitAll(t, j.start(t, out, logs), logs) // one restart, and it finishes: no crash loop
			if p := ParseLog(logs[0].String()); p.Resumed != previous {
				t.Errorf("resumed from step %d, want the previous good step %d\n%s", p.Resumed, previous, logs[0])
			}
			got, err := os.ReadFile(out)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got, want) {
				t.Fatal("final parameters differ from the uninterrupted run")
			}
			term, _ := os.ReadFile(filepath.Join(j.dir, "termination-0"))
			if !strings.Contains(string(term), fmt.Sprintf("%s%d\n", contract.TerminationMessageRestoredPrefix, previous)) {
				t.Errorf("termination log %q does not report the restored step %d", term, previous)
			}
			moved, _ := filepath.Glob(filepath.Join(ckpt, fmt.Sprintf("%s%d-*", checkpoint.CorruptPrefix, newest)))
			corruptLine := fmt.Sprintf("%s step=%d moved to ", contract.TerminationMessageCorruptPrefix, newest)
			if !f.corrupt {
				if len(moved) != 0 || strings.Contains(string(term), contract.TerminationMessageCorruptPrefix) {
					t.Errorf("an unfinished save was reported corrupt: %v %q", moved, term)
				}
				return
			}
			if len(moved) != 1 {
				t.Fatalf("step %d moved aside to %v, want one directory", newest, moved)
			}
			reason, err := os.ReadFile(filepath.Join(moved[0], "REASON"))
			if err != nil || len(bytes.TrimSpace(reason)) == 0 {
				t.Errorf("REASON: %q %v", reason, err)
			}
			if !strings.Contains(string(term), corruptLine+filepath.Base(moved[0])+": ") {
				t.Errorf("termination log %q lacks %q", term, corruptLine)
			}
			// The other node says so too: the operator may see only its pod.
			term1, _ := os.ReadFile(filepath.Join(j.dir, "termination-1"))
			if want := fmt.Sprintf("%s step=%d moved aside", contract.TerminationMessageCorruptPrefix, newest); !strings.Contains(string(term1), want) {
				t.Errorf("node 1's termination log %q lacks %q", term1, want)
			}
		})
	}
}

// failingGang runs j (a restarted gang) with env added to node's process and expects every
// node to fail, not to finish and not to hang; it returns their logs and exit codes.
func failingGang(t *testing.T, j *job, out string, node int, env string) ([]*syncBuffer, []int) {
	t.Helper()
	j.port, j.attempt = testnet.FreePort(t), j.attempt+1
	logs := j.logs()
	cmds := make([]*exec.Cmd, j.nodes)
	for n := range j.nodes {
		cmd := workerCommand(t)
		cmd.Env = j.env(n, out)
		if n == node && env != "" {
			cmd.Env = append(cmd.Env, env)
		}
		cmd.Stderr = logs[n]
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		cmds[n] = cmd
	}
	timer := time.AfterFunc(time.Minute, func() {
		for _, cmd := range cmds {
			_ = cmd.Process.Kill()
		}
	})
	defer timer.Stop()
	codes := make([]int, len(cmds))
	for n, cmd := range cmds {
		if err := cmd.Wait(); err == nil {
			t.Fatalf("node %d finished although the save failed\n%s", n, logs[n])
		}
		codes[n] = cmd.ProcessState.ExitCode()
	}
	return logs, codes
}

// TestFullDiskMidSave: a restarted gang's save fails because the disk is full (writes fail
// with EFBIG: RLIMIT_FSIZE on one node's process), once writing a shard and once writing the
// manifest. The gang fails at once (no hang, no exit 0): the full node exits 1, its own
// fault, and the other node, which only lost its peers, exits 75 and says so. The next gang,
// with space again, resumes from the newest good step and ends bit-identical.
func TestFullDiskMidSave(t *testing.T) {
	want := uninterrupted(t, faultArgs)
	for _, c := range []struct {
		name  string
		node  int
		limit int // bytes: a shard is 132-144, a rank's shard list about 470, the manifest about 2,200
		wants string
	}{
		{"writing a shard", 1, 64, fmt.Sprintf(".a%d.bin: file too large", 1<<contract.InPlaceAttemptBits)}, // generation 1's first start
		{"writing the manifest", 0, 1000, ".tmp: file too large"},
	} {
		t.Run(c.name, func(t *testing.T) {
			j := job{nodes: 2, gpus: 2, cp: 2, args: faultArgs, dir: t.TempDir()}
			ckpt, out := filepath.Join(j.dir, "ckpt"), filepath.Join(j.dir, "params")
			newest, _ := firstGang(t, &j, out)
			logs, codes := failingGang(t, &j, out, c.node, fmt.Sprintf("ZAYA_TEST_FSIZE=%d", c.limit))
			if !strings.Contains(logs[c.node].String(), c.wants) {
				t.Errorf("node %d did not fail on the full disk:\n%s", c.node, logs[c.node])
			}
			checkRootFailure(t, j.dir, c.node, codes, logs)
			if got := committedStep(t, ckpt); got != newest {
				t.Fatalf("after the failed save the newest good step is %d, want %d", got, newest)
			}

			nextGangResumes(t, &j, out, newest, want)
		})
	}
}

// TestStaleGangOfThePreviousAttempt: the operator started attempt 1 while attempt 0's
// workers still run (a partitioned node, say) on the same volume. Attempt 1 fences the
// directory; attempt 0 is refused at its next save and fails instead of publishing or
// pruning; attempt 1 ends bit-identical, and every checkpoint left is its own.
func TestStaleGangOfThePreviousAttempt(t *testing.T) {
	const args = "-steps=60 -seq=16 -dim=6 -log-every=1 -pace=15ms"
	want := uninterrupted(t, args)
	ckptDir := t.TempDir()
	stale := job{nodes: 2, gpus: 2, cp: 2, args: args, dir: ckptDir, port: testnet.FreePort(t)}
	staleOut := filepath.Join(ckptDir, "stale-params")
	staleCmds, staleLogs := startKilledOnCleanup(t, stale, staleOut)
	ckpt := filepath.Join(ckptDir, "ckpt")
	waitFor(t, "attempt 0's checkpoint of step 8", staleLogs, func() bool { return committed(ckpt, 8) })

	// The new gang: same volume, its own termination logs and parameters file.
	fresh := stale
	fresh.attempt, fresh.port = 1, testnet.FreePort(t)
	out := filepath.Join(ckptDir, "params")
	cmds, logs := startBeside(t, fresh, out)
	waitAll(t, cmds, logs)
	for n, cmd := range staleCmds {
		if err := cmd.Wait(); err == nil {
			t.Errorf("stale node %d finished: it must have been fenced\n%s", n, staleLogs[n])
		}
	}
	fencedSeen := false
	for _, l := range staleLogs {
		fencedSeen = fencedSeen || strings.Contains(l.String(), "fenced")
	}
	if !fencedSeen {
		t.Errorf("no stale node was refused by the fence:\n%s\n%s", staleLogs[0], staleLogs[1])
	}
	if _, err := os.Stat(staleOut); err == nil {
		t.Error("the stale gang finished its run")
	}
	if got, _ := os.ReadFile(out); !bytes.Equal(got, want) {
		t.Fatal("the new attempt's final parameters differ from the uninterrupted run")
	}
	steps, _ := checkpoint.Steps(ckpt)
	for _, s := range steps {
		if ck, err := checkpoint.Open(ckpt, s); err == nil && ck.Manifest.Attempt != 1<<contract.InPlaceAttemptBits {
			t.Errorf("step %d left by attempt %d", s, ck.Manifest.Attempt)
		}
	}

	// A gang of attempt 0 starting now (or a new job reusing the volume from attempt 0) is
	// refused at once as a configuration error: restarting it cannot help.
	stale.port = testnet.FreePort(t)
	staleLogs = stale.logs()
	for n, cmd := range stale.start(t, staleOut, staleLogs) {
		var exit *exec.ExitError
		if err := cmd.Wait(); !errors.As(err, &exit) || exit.ExitCode() != contract.ExitConfig {
			t.Errorf("late stale node %d: %v, want exit %d\n%s", n, err, contract.ExitConfig, staleLogs[n])
		}
	}
	if want := fmt.Sprintf("ZAYA_RESTART_ATTEMPT=0: checkpoint: fenced: generation 1 (attempt %d) started after this generation 0", 1<<contract.InPlaceAttemptBits); !strings.Contains(staleLogs[0].String(), want) {
		t.Errorf("the refusal does not say why:\n%s", staleLogs[0])
	}
}

// checkRootFailure: the node that failed by itself exits neither 0 nor 75 and writes no
// stopped line; every other node lost a peer, exits 75 and says which rank it lost.
func checkRootFailure(t *testing.T, dir string, root int, codes []int, logs []*syncBuffer) {
	t.Helper()
	for n, code := range codes {
		stopped := stoppedLine(dir, n)
		switch {
		case n == root && (code == 0 || code == contract.ExitStopped || stopped != ""):
			t.Errorf("node %d, the root failure, exited %d with stopped line %q\n%s", n, code, stopped, logs[n])
		case n != root && (code != contract.ExitStopped || !strings.HasPrefix(stopped, "lost rank ")):
			t.Errorf("node %d, stopped by its peers, exited %d with stopped line %q; want %d, \"lost rank ...\"\n%s", n, code, stopped, contract.ExitStopped, logs[n])
		}
	}
}

// stoppedLine is the last stopped reason in node's termination log ("": none, or no log).
func stoppedLine(dir string, node int) string {
	b, _ := os.ReadFile(filepath.Join(dir, fmt.Sprintf("termination-%d", node)))
	stopped := ""
	for line := range strings.Lines(string(b)) {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), contract.TerminationMessageStoppedPrefix+" "); ok {
			stopped = v
		}
	}
	return stopped
}

// TestUnreadableStepIsNotMovedAside: storage that fails to read (here the manifest's name is
// a directory: EISDIR) is not corruption. The gang fails and keeps the step; once storage
// reads again the next gang resumes from it.
func TestUnreadableStepIsNotMovedAside(t *testing.T) {
	want := uninterrupted(t, faultArgs)
	j := job{nodes: 2, gpus: 2, cp: 2, args: faultArgs, dir: t.TempDir()}
	ckpt, out := filepath.Join(j.dir, "ckpt"), filepath.Join(j.dir, "params")
	newest, _ := firstGang(t, &j, out)
	manifest := filepath.Join(ckpt, fmt.Sprintf("step-%012d", newest), "manifest.a0.json")
	if err := os.Rename(manifest, manifest+".away"); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(manifest, 0o755); err != nil {
		t.Fatal(err)
	}
	logs, _ := failingGang(t, &j, out, 0, "")
	if !strings.Contains(logs[0].String(), "is a directory") {
		t.Errorf("rank 0 did not fail on the unreadable step:\n%s", logs[0])
	}
	if moved, _ := filepath.Glob(filepath.Join(ckpt, checkpoint.CorruptPrefix+"*")); len(moved) != 0 {
		t.Fatalf("an unreadable step was moved aside: %v", moved)
	}
	if err := os.Remove(manifest); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(manifest+".away", manifest); err != nil {
		t.Fatal(err)
	}
	nextGangResumes(t, &j, out, newest, want)
}

// TestANewJobTakesOverAKeptVolume: a job recreated on its kept volume (a new UID, attempts
// from 0 again) while a gang of the deleted job, at attempt 2, still runs (a partitioned
// node): the new job takes the directory over instead of finding itself fenced, resumes from
// the deleted job's checkpoints and ends bit-identical; the old gang is fenced at its next save.
func TestANewJobTakesOverAKeptVolume(t *testing.T) {
	const args = "-steps=60 -seq=16 -dim=6 -log-every=1 -pace=15ms"
	want := uninterrupted(t, args)
	dir := t.TempDir()
	old := job{nodes: 2, gpus: 2, cp: 2, args: args, dir: dir, port: testnet.FreePort(t), attempt: 2, uid: "job-a"}
	oldCmds, oldLogs := startKilledOnCleanup(t, old, filepath.Join(dir, "old-params"))
	ckpt := filepath.Join(dir, "ckpt")
	waitFor(t, "the old job's checkpoint of step 8", oldLogs, func() bool { return committed(ckpt, 8) })

	fresh := old
	fresh.uid, fresh.attempt, fresh.port = "job-b", 0, testnet.FreePort(t)
	out := filepath.Join(dir, "params")
	cmds, logs := startBeside(t, fresh, out)
	waitAll(t, cmds, logs)
	if p := ParseLog(logs[0].String()); p.Resumed < 8 {
		t.Errorf("the new job resumed from step %d, want the old job's checkpoints (8 or later)", p.Resumed)
	}
	if got, _ := os.ReadFile(out); !bytes.Equal(got, want) {
		t.Fatal("final parameters differ from the uninterrupted run")
	}
	// The old job fenced with generation 2's first number; the new job counts from one past it.
	if b, want := readOwnerFile(t, ckpt), fmt.Sprintf("job-b %d\n", 2<<contract.InPlaceAttemptBits+1); b != want {
		t.Errorf("owner file %q, want %q: the new job counting its attempts from one past the old job's", b, want)
	}
	for n, cmd := range oldCmds {
		if err := cmd.Wait(); err == nil {
			t.Errorf("the old job's node %d finished: it must have been fenced\n%s", n, oldLogs[n])
		}
	}
	if _, err := os.Stat(filepath.Join(dir, "old-params")); err == nil {
		t.Error("the old job finished its run")
	}
}

func readOwnerFile(t *testing.T, dir string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dir, "owner"))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// startKilledOnCleanup starts j's gang, killed when the test ends if it still runs.
func startKilledOnCleanup(t *testing.T, j job, out string) ([]*exec.Cmd, []*syncBuffer) {
	t.Helper()
	logs := j.logs()
	cmds := j.start(t, out, logs)
	t.Cleanup(func() {
		for _, cmd := range cmds {
			_ = cmd.Process.Kill()
		}
	})
	return cmds, logs
}

// startBeside starts j's gang next to another on the same volume, with termination logs of
// its own.
func startBeside(t *testing.T, j job, out string) ([]*exec.Cmd, []*syncBuffer) {
	t.Helper()
	logs := j.logs()
	cmds := make([]*exec.Cmd, j.nodes)
	for n := range j.nodes {
		cmd := workerCommand(t)
		cmd.Env = append(j.env(n, out), "ZAYA_ARGS="+j.args+" -listen=127.0.0.1:0 -metrics-addr= -rendezvous-timeout=10s -params-out="+out+
			" -termination-log="+filepath.Join(j.dir, fmt.Sprintf("termination-new-%d", n)))
		cmd.Stderr = logs[n]
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		cmds[n] = cmd
	}
	return cmds, logs
}

// nextGangResumes runs j's next attempt to the end and checks it resumed from step and ended
// with the uninterrupted run's parameters.
func nextGangResumes(t *testing.T, j *job, out string, step int64, want []byte) {
	t.Helper()
	j.port, j.attempt = testnet.FreePort(t), j.attempt+1
	logs := j.logs()
	waitAll(t, j.start(t, out, logs), logs)
	if p := ParseLog(logs[0].String()); p.Resumed != step {
		t.Errorf("resumed from step %d, want %d", p.Resumed, step)
	}
	if got, _ := os.ReadFile(out); !bytes.Equal(got, want) {
		t.Fatal("final parameters differ from the uninterrupted run")
	}
}

// TestOwnFaultsAndPeerStopsExitApart: the process's exit code from its local ranks' errors.
// A rank that only lost a peer (or a rendezvous short of ranks) stops: 75, with a reason
// naming what it lost and where. A fault of the rank's own beside it (an error, a bad
// configuration) is the root failure and wins: 1 or 78, and nothing says "stopped".
func TestOwnFaultsAndPeerStopsExitApart(t *testing.T) {
	lost := func(rank int, op string) error {
		return fmt.Errorf("rank 1 step 120: %s: %w", op, &transport.PeerError{Rank: rank, Op: op, Err: io.EOF})
	}
	short := &transport.PeerError{Rank: -1, Op: transport.OpRendezvous, Err: fmt.Errorf("7 of 8 ranks joined: %w", context.DeadlineExceeded)}
	agreed := &StoppedError{Step: 16, Why: "peer rank 1 was stopped at step 16"}
	at120 := []Result{{Step: 120}, {Step: 120}}
	cases := []struct {
		name    string
		errs    []error
		results []Result
		code    int
		why     string // the stopped line's reason, for exit 75
	}{
		{"done", []error{nil, nil}, at120, 0, ""},
		{"lost a peer in the all-reduce", []error{nil, lost(3, "all-reduce")}, at120, contract.ExitStopped,
			"lost rank 3 during the all-reduce at step 120: EOF"},
		{"lost a peer while resuming", []error{lost(0, "barrier")}, []Result{{before: "resuming"}}, contract.ExitStopped,
			"lost rank 0 during the barrier while resuming: EOF"},
		{"a peer failed in RCCL", []error{&transport.PeerError{Rank: -1, Op: "exchange", Err: errors.New("remote error")}}, at120, contract.ExitStopped,
			"a peer failed during the exchange at step 120: remote error"},
		{"the rendezvous short of ranks", []error{fmt.Errorf("rank 0: %w", short)}, []Result{{before: "joining"}}, contract.ExitStopped,
			"rendezvous: 7 of 8 ranks joined: context deadline exceeded"},
		{"an agreed stop beside a lost peer", []error{lost(0, "barrier"), agreed}, at120, contract.ExitStopped, agreed.Why},
		{"its own fault beside a lost peer", []error{lost(2, "all-reduce"), errors.New("writing its shard: file too large")}, at120, 1, ""},
		{"its own fault beside an agreed stop", []error{agreed, errors.New("writing its shard: file too large")}, at120, 1, ""},
		{"a configuration error beside a lost peer", []error{&ConfigError{"checkpoint does not fit"}, lost(0, "all-reduce")}, at120, ExitConfig, ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			err := outcome(c.errs, c.results)
			if code := exitCode(err); code != c.code {
				t.Fatalf("exit %d (%v), want %d", code, err, c.code)
			}
			var stopped *StoppedError
			switch {
			case c.code == contract.ExitStopped && (!errors.As(err, &stopped) || stopped.Why != c.why):
				t.Errorf("stopped: %v, want the reason %q", err, c.why)
			case c.code != contract.ExitStopped && c.code != 0 && (errors.As(err, &stopped) || strings.Contains(err.Error(), "EOF")):
				t.Errorf("a root failure reported as %q: only its own fault belongs there", err)
			}
		})
	}
}

// TestARendezvousShortOfRanksExits75: a node whose peers never come (or whose rank 0 never
// does) stops when the rendezvous times out: exit 75, and the termination log says why.
func TestARendezvousShortOfRanksExits75(t *testing.T) {
	port := testnet.FreePort(t)
	// Node 1 alone reaches no master; under a loaded test run the free port may meanwhile be
	// another test's, which hangs up on it: either way the rendezvous with rank 0 failed.
	for node, want := range []string{"rendezvous: 1 of 2 ranks joined", "rendezvous with rank 0: "} {
		dir := t.TempDir()
		env := map[string]string{
			"NODE_RANK": strconv.Itoa(node), "NNODES": "2", "GPUS_PER_NODE": "1", "WORLD_SIZE": "2", "ZAYA_CONTEXT_PARALLEL": "1",
			"ZAYA_RESTART_ATTEMPT": "0", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port,
		}
		var stderr bytes.Buffer
		args := []string{"-seq=8", "-dim=4", "-listen=127.0.0.1:0", "-metrics-addr=", "-rendezvous-timeout=300ms", "-termination-log=" + filepath.Join(dir, "termination-0")}
		if code := Main(args, func(k string) string { return env[k] }, &stderr); code != contract.ExitStopped {
			t.Errorf("node %d alone: exit %d, want %d\n%s", node, code, contract.ExitStopped, &stderr)
		}
		if got := stoppedLine(dir, 0); !strings.HasPrefix(got, want) {
			t.Errorf("node %d alone: stopped line %q, want %q...", node, got, want)
		}
	}
}

// cancelAt is a run's log that cancels the run once a line containing at is written.
type cancelAt struct {
	syncBuffer
	at     string
	cancel context.CancelFunc
}

func (c *cancelAt) Write(p []byte) (int, error) {
	n, err := c.syncBuffer.Write(p)
	if strings.Contains(string(p), c.at) {
		c.cancel()
	}
	return n, err
}

// TestAnInPlaceRestartFencesThePreviousRun: a gang stops and is restarted in place (a new
// process, the same ZAYA_RESTART_ATTEMPT, address and volume). The new run resumes from the
// committed step under the next attempt number of its generation, ends bit-identical to a
// run that never stopped, and a writer still holding the previous run's number is fenced.
func TestAnInPlaceRestartFencesThePreviousRun(t *testing.T) {
	const generation = 5
	cfg := Config{NodeRank: 0, Nodes: 1, GPUsPerNode: 2, ContextParallel: 1, Master: "127.0.0.1:" + testnet.FreePort(t),
		Listen: "127.0.0.1:0", RendezvousTimeout: 10 * time.Second, CheckpointEvery: 4, Keep: 2,
		Steps: 24, Seq: 8, Model: testShape(4), LR: 0.01, Seed: 3, Attempt: generation, JobUID: "job-a"}
	ref := cfg
	ref.CheckpointDir, ref.ParamsOut = t.TempDir(), filepath.Join(t.TempDir(), "params")
	if _, err := Run(context.Background(), ref); err != nil {
		t.Fatal(err)
	}
	want, err := os.ReadFile(ref.ParamsOut)
	if err != nil {
		t.Fatal(err)
	}

	dir := t.TempDir()
	cfg.CheckpointDir, cfg.ParamsOut = filepath.Join(dir, "ckpt"), filepath.Join(dir, "params")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	first := cfg
	first.Log = &cancelAt{at: "checkpoint step 8 committed", cancel: cancel}
	res, err := Run(ctx, first)
	if code := exitCode(err); code != contract.ExitStopped {
		t.Fatalf("the first run: exit %d (%v), want %d", code, err, contract.ExitStopped)
	}
	stoppedAt := res.CheckpointStep
	firstAttempt := generation << contract.InPlaceAttemptBits
	if ck, err := checkpoint.Open(cfg.CheckpointDir, stoppedAt); err != nil || ck.Manifest.Attempt != firstAttempt {
		t.Fatalf("the first run's last checkpoint %d: %v; want it committed by attempt %d", stoppedAt, err, firstAttempt)
	}

	second := cfg // restarted in place: the same configuration
	log := &syncBuffer{}
	second.Log = log
	if _, err := Run(context.Background(), second); err != nil {
		t.Fatalf("the restarted run: %v\n%s", err, log)
	}
	if p := ParseLog(log.String()); p.Resumed != stoppedAt {
		t.Errorf("the restarted run resumed from step %d, want %d", p.Resumed, stoppedAt)
	}
	ck, err := checkpoint.Open(cfg.CheckpointDir, int64(cfg.Steps))
	if err != nil || ck.Manifest.Attempt != firstAttempt+1 {
		t.Fatalf("the final checkpoint: %v; want it committed by attempt %d, the generation's next", err, firstAttempt+1)
	}
	if got, _ := os.ReadFile(cfg.ParamsOut); !bytes.Equal(got, want) {
		t.Error("final parameters differ from the run that never stopped")
	}
	stale := checkpoint.Tensor{Name: "params", Shape: []int64{1}, Data: []float32{1}}
	if err := checkpoint.WriteShard(cfg.CheckpointDir, firstAttempt, 100, 0, []checkpoint.Tensor{stale}); !errors.Is(err, checkpoint.ErrFenced) {
		t.Errorf("a writer of the first run: %v, want ErrFenced", err)
	}
	if _, err := checkpoint.Commit(cfg.CheckpointDir, firstAttempt, stoppedAt, 2, nil, checkpoint.Retention{Keep: 2}); !errors.Is(err, checkpoint.ErrFenced) {
		t.Errorf("a commit of the first run: %v, want ErrFenced", err)
	}
}

// TestAFrozenNodeIsLost freezes one node's worker mid-training (SIGSTOP: its sockets stay
// open, so TCP reports nothing, and the rank would block its peers' collectives forever).
// With ZAYA_PEER_TIMEOUT=1s its peers find it silent, or lose the rank that did, and stop
// within a bounded time: exit 75, "lost rank N" in the termination log.
func TestAFrozenNodeIsLost(t *testing.T) {
	for _, frozen := range []int{0, 1} {
		t.Run(fmt.Sprintf("node %d", frozen), func(t *testing.T) {
			j := job{nodes: 3, gpus: 1, cp: 1, args: "-steps=100000 -seq=8 -dim=4 -log-every=1 -pace=10ms", dir: t.TempDir(), port: testnet.FreePort(t)}
			logs := j.logs()
			cmds := make([]*exec.Cmd, j.nodes)
			for n := range j.nodes {
				cmd := workerCommand(t)
				cmd.Env = append(j.env(n, filepath.Join(j.dir, "params")), contract.EnvPeerTimeout+"=1s")
				cmd.Stderr = logs[n]
				if err := cmd.Start(); err != nil {
					t.Fatal(err)
				}
				cmds[n] = cmd
				t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
			}
			waitStep(t, 10, logs)
			if err := cmds[frozen].Process.Signal(syscall.SIGSTOP); err != nil {
				t.Fatal(err)
			}
			timer := time.AfterFunc(30*time.Second, func() {
				for n, cmd := range cmds {
					if n != frozen {
						_ = cmd.Process.Kill()
					}
				}
			})
			defer timer.Stop()
			for n, cmd := range cmds {
				if n == frozen {
					continue
				}
				err := cmd.Wait()
				var exit *exec.ExitError
				if !errors.As(err, &exit) || exit.ExitCode() != contract.ExitStopped {
					t.Errorf("node %d with node %d frozen: %v, want exit %d within 30s\n%s", n, frozen, err, contract.ExitStopped, logs[n])
					continue
				}
				stopped := stoppedLine(j.dir, n)
				// Rank 0 (node 0) or, with rank 0 frozen, every rank talks to the frozen one;
				// the others lose rank 0 when it stops.
				if n == 0 || frozen == 0 {
					if want := fmt.Sprintf("lost rank %d ", frozen); !strings.HasPrefix(stopped, want) || !strings.Contains(stopped, fmt.Sprintf("no heartbeat from rank %d for 1s", frozen)) {
						t.Errorf("node %d's stopped line %q, want %q... no heartbeat from rank %d for 1s", n, stopped, want, frozen)
					}
				} else if !strings.HasPrefix(stopped, "lost rank ") {
					t.Errorf("node %d's stopped line %q, want \"lost rank ...\"", n, stopped)
				}
			}
			if cmds[frozen].ProcessState != nil {
				t.Errorf("node %d exited while frozen", frozen)
			}
			if err := cmds[frozen].Process.Signal(syscall.SIGKILL); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// TestAnInjectedFaultEndsTheProcessAsTheRealOne: a GPU fault played through -fault-file ends
// node 1's process with ROCm's message and exit 134, and leaves its termination log empty, so
// the kubelet (FallbackToLogsOnError) hands the operator the log's last words; node 0 stops
// with exit 75 and its report, written only now at exit.
func TestAnInjectedFaultEndsTheProcessAsTheRealOne(t *testing.T) {
	j := job{nodes: 2, gpus: 1, cp: 1, args: "-steps=100000 -seq=8 -dim=4 -pace=5ms -log-every=1", dir: t.TempDir(), port: testnet.FreePort(t), uid: "u"}
	logs := j.logs()
	out := filepath.Join(j.dir, "params")
	fault := filepath.Join(j.dir, "fault-1")
	cmds := make([]*exec.Cmd, j.nodes)
	for node := range j.nodes {
		cmd := workerCommand(t)
		cmd.Env = j.env(node, out)
		if node == 1 {
			for i, e := range cmd.Env {
				if strings.HasPrefix(e, "ZAYA_ARGS=") {
					cmd.Env[i] = e + " -fault-file=" + fault
				}
			}
		}
		cmd.Stderr = logs[node]
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		cmds[node] = cmd
	}
	deadline := time.Now().Add(time.Minute)
	for !strings.Contains(logs[0].String(), "step 20 ") { // rank 0 logs the progress
		if time.Now().After(deadline) {
			t.Fatalf("no progress:\n%s\nnode 0:\n%s", logs[1], logs[0])
		}
		time.Sleep(10 * time.Millisecond)
	}
	if err := os.WriteFile(fault, []byte("gpu\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	codes := make([]int, j.nodes)
	for node, cmd := range cmds {
		_ = cmd.Wait()
		codes[node] = cmd.ProcessState.ExitCode()
	}
	if codes[1] != 134 || codes[0] != contract.ExitStopped {
		t.Fatalf("exits %v, want node 1 134 (its GPU) and node 0 75 (its peer)\n%s\n%s", codes, logs[0], logs[1])
	}
	if !strings.Contains(logs[1].String(), "Memory access fault by GPU node-3") {
		t.Errorf("node 1's log lacks ROCm's message:\n%s", logs[1])
	}
	if b, _ := os.ReadFile(filepath.Join(j.dir, "termination-1")); len(b) != 0 {
		t.Errorf("node 1's termination log %q: a crash leaves it empty for the log fallback", b)
	}
	b, _ := os.ReadFile(filepath.Join(j.dir, "termination-0"))
	for _, want := range []string{"checkpoint-restored=0\n", "checkpoint-step=", "training-step=", contract.TerminationMessageStoppedPrefix} {
		if !strings.Contains(string(b), want) {
			t.Errorf("node 0's termination log %q lacks %q", b, want)
		}
	}
}

// A fault file read between its writer's truncate and its write is empty: it is left for the
// next step, not consumed (the chaos soak lost a fault this way: no restart followed it).
func TestAFaultFileNotYetWrittenIsLeftForTheNextStep(t *testing.T) {
	path := filepath.Join(t.TempDir(), "zaya-fault")
	if err := os.WriteFile(path, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	var log bytes.Buffer
	if injectFault(path, &log, 0, 7) {
		t.Fatal("an empty file slowed the node")
	}
	if _, err := os.Stat(path); err != nil {
		t.Fatalf("the empty file was consumed: %v", err)
	}
	if err := os.WriteFile(path, []byte("slow\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if !injectFault(path, &log, 0, 8) {
		t.Fatal("the written fault was not played")
	}
	if _, err := os.Stat(path); !os.IsNotExist(err) {
		t.Errorf("the played fault's file is still there: %v", err)
	}
}
