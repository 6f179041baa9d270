package train

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/zaya-operator/zaya-operator/api/contract"
	"github.com/zaya-operator/zaya-operator/internal/testnet"
	"github.com/zaya-operator/zaya-operator/workers/checkpoint"
)

// faultArgs is the run of the fault tests; a first gang runs only its first 12 steps.
const faultArgs = "-steps=60 -seq=16 -dim=6 -log-every=1"

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
		})
	}
}
