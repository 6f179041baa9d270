package checkpoint

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
)

// model is the global state: two tensors of fixed shapes, values derived from the step.
func model(step int64) map[string][]float32 {
	out := map[string][]float32{"w": make([]float32, 6*7), "b": make([]float32, 13)}
	for name, v := range out {
		for i := range v {
			v[i] = float32(step)*1000 + float32(i) + float32(len(name))/10
		}
	}
	return out
}

var shapes = map[string][]int64{"w": {6, 7}, "b": {13}}

// split is rank's contiguous slice of n elements over world ranks.
func split(n int64, rank, world int) (int64, int64) {
	lo := n * int64(rank) / int64(world)
	hi := n * int64(rank+1) / int64(world)
	return lo, hi - lo
}

// save writes step from world ranks in parallel, then commits.
func save(t *testing.T, dir string, step int64, world, keep int, commit bool) {
	t.Helper()
	m := model(step)
	var wg sync.WaitGroup
	errs := make([]error, world)
	for rank := range world {
		wg.Go(func() {
			var ts []Tensor
			for _, name := range []string{"w", "b"} {
				lo, n := split(int64(len(m[name])), rank, world)
				ts = append(ts, Tensor{Name: name, Shape: shapes[name], Start: lo, Data: m[name][lo : lo+n]})
			}
			errs[rank] = WriteShard(dir, 0, step, rank, ts)
		})
	}
	wg.Wait()
	for rank, err := range errs {
		if err != nil {
			t.Fatalf("rank %d: %v", rank, err)
		}
	}
	if commit {
		if _, err := Commit(dir, 0, step, world, map[string]string{"rng": fmt.Sprint(step)}, Retention{Keep: keep}); err != nil {
			t.Fatal(err)
		}
	}
}

func TestSaveOnFourRanksLoadOnAnyNumber(t *testing.T) {
	dir := t.TempDir()
	save(t, dir, 100, 4, 3, true)
	ck, skipped, err := Latest(dir)
	if err != nil || ck == nil || len(skipped) != 0 {
		t.Fatalf("Latest = %v, skipped %v, err %v", ck, skipped, err)
	}
	if ck.Manifest.Step != 100 || ck.Manifest.World != 4 || ck.Manifest.State["rng"] != "100" {
		t.Errorf("manifest = %+v", ck.Manifest)
	}
	want := model(100)
	for _, world := range []int{1, 2, 4, 8} {
		for name, full := range want {
			var got []float32
			for rank := range world {
				lo, n := split(int64(len(full)), rank, world)
				part, err := ck.Read(name, lo, n)
				if err != nil {
					t.Fatalf("world %d rank %d %s: %v", world, rank, name, err)
				}
				got = append(got, part...)
			}
			if fmt.Sprint(got) != fmt.Sprint(full) {
				t.Errorf("world %d: %s differs after resharding", world, name)
			}
		}
	}
	if _, err := ck.Read("w", 40, 5); err == nil {
		t.Error("a read past the tensor's end was accepted")
	}
}

func TestCorruptAndUncommittedCheckpointsAreSkipped(t *testing.T) {
	dir := t.TempDir()
	save(t, dir, 100, 4, 3, true)
	save(t, dir, 200, 4, 3, true)
	save(t, dir, 300, 4, 3, false) // the job died before the manifest

	// Flip one byte in a shard of step 200.
	shard := filepath.Join(stepDir(dir, 200), "rank-00002.a0.bin")
	b, err := os.ReadFile(shard)
	if err != nil {
		t.Fatal(err)
	}
	b[5] ^= 0x40
	if err := os.WriteFile(shard, b, 0o644); err != nil {
		t.Fatal(err)
	}

	ck, skipped, err := Latest(dir)
	if err != nil || ck == nil {
		t.Fatalf("Latest: %v", err)
	}
	if ck.Manifest.Step != 100 {
		t.Fatalf("loaded step %d, want the previous good one, 100", ck.Manifest.Step)
	}
	if len(skipped) != 2 || !strings.Contains(skipped[0].Error(), "step 300: not committed") ||
		!strings.Contains(skipped[1].Error(), "step 200") || !strings.Contains(skipped[1].Error(), "CRC32C") {
		t.Errorf("skipped = %v", skipped)
	}
}

func TestRetentionKeepsTheNewestCommitted(t *testing.T) {
	dir := t.TempDir()
	save(t, dir, 100, 2, 2, true)
	save(t, dir, 150, 2, 2, false) // died half way
	save(t, dir, 200, 2, 2, true)
	save(t, dir, 300, 2, 2, true)
	steps, err := listSteps(dir)
	if err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(steps) != "[300 200]" {
		t.Errorf("steps on disk = %v, want [300 200] (keep 2; the dead save and step 100 removed)", steps)
	}
}

func TestACommittedStepIsNeverRewritten(t *testing.T) {
	dir := t.TempDir()
	save(t, dir, 100, 1, 3, true)
	err := WriteShard(dir, 0, 100, 0, []Tensor{{Name: "b", Shape: []int64{13}, Data: make([]float32, 13)}})
	if err == nil || !strings.Contains(err.Error(), "already committed") {
		t.Errorf("err = %v", err)
	}
	if ck, _, _ := Latest(dir); ck == nil || ck.Manifest.Step != 100 {
		t.Error("the committed checkpoint was damaged")
	}
}

func TestCommitNeedsEveryRank(t *testing.T) {
	dir := t.TempDir()
	if err := WriteShard(dir, 0, 5, 0, []Tensor{{Name: "b", Shape: []int64{2}, Data: []float32{1}}}); err != nil {
		t.Fatal(err)
	}
	if _, err := Commit(dir, 0, 5, 2, nil, Retention{Keep: 3}); err == nil || !strings.Contains(err.Error(), "rank 1") {
		t.Errorf("err = %v, want a commit refused for the missing rank 1", err)
	}
	if ck, _, _ := Latest(dir); ck != nil {
		t.Error("an uncommitted checkpoint was loadable")
	}
}

func TestEmptyDirectoryIsAFreshStart(t *testing.T) {
	ck, skipped, err := Latest(filepath.Join(t.TempDir(), "none"))
	if ck != nil || len(skipped) != 0 || err != nil {
		t.Errorf("Latest = %v %v %v, want nothing", ck, skipped, err)
	}
}

func TestStepNamesAreStrict(t *testing.T) {
	dir := t.TempDir()
	save(t, dir, 7, 1, 3, true)
	for _, name := range []string{"step-7", "step-000000000008.old", "step--00000000009", "step-00000000001x", "step-0000000000010", "xstep-000000000011"} {
		if err := os.Mkdir(filepath.Join(dir, name), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(dir, "step-000000000012"), nil, 0o644); err != nil { // a file, not a step
		t.Fatal(err)
	}
	steps, err := Steps(dir)
	if err != nil || fmt.Sprint(steps) != "[7]" {
		t.Errorf("Steps = %v, %v; want only [7]", steps, err)
	}
}

func TestMoveAsideKeepsTheDataAndTheReason(t *testing.T) {
	dir := t.TempDir()
	save(t, dir, 100, 2, 3, true)
	if _, err := Open(dir, 200); !errors.Is(err, ErrNotCommitted) {
		t.Errorf("Open of a missing step: %v, want ErrNotCommitted", err)
	}
	to, err := MoveAside(dir, 100, "rank 1's shard: CRC32C mismatch")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(filepath.Base(to), "corrupt-step-100-") {
		t.Errorf("moved to %s", to)
	}
	if b, _ := os.ReadFile(filepath.Join(to, "REASON")); string(b) != "rank 1's shard: CRC32C mismatch\n" {
		t.Errorf("REASON = %q", b)
	}
	if _, err := os.Stat(filepath.Join(to, "manifest.a0.json")); err != nil {
		t.Errorf("the moved step lost its files: %v", err)
	}
	if steps, _ := Steps(dir); len(steps) != 0 {
		t.Errorf("a moved step is still a step: %v", steps)
	}
	save(t, dir, 100, 2, 3, true) // the step number can be saved again
	if ck, _, _ := Latest(dir); ck == nil || ck.Manifest.Step != 100 {
		t.Error("step 100 was not saved again after being moved aside")
	}
}

// truncateShard damages step's rank 0 shard so that its manifest no longer validates.
func truncateShard(t *testing.T, dir string, step int64) {
	t.Helper()
	if err := os.Truncate(filepath.Join(stepDir(dir, step), shardName(0, 0)), 3); err != nil {
		t.Fatal(err)
	}
}

// TestRetentionNeverDeletesTheOnlyGoodStep: the newest step is damaged by the time retention
// runs (keep 1); counting it as kept would delete the only good step. It is moved aside
// instead, and the restored, verified step stays.
func TestRetentionNeverDeletesTheOnlyGoodStep(t *testing.T) {
	dir := t.TempDir()
	save(t, dir, 100, 2, 5, true)
	save(t, dir, 200, 2, 5, true)
	truncateShard(t, dir, 200)
	if err := prune(dir, 0, 200, Retention{Keep: 1, Protect: 100}); err != nil {
		t.Fatal(err)
	}
	if ck, _, _ := Latest(dir); ck == nil || ck.Manifest.Step != 100 {
		t.Fatalf("the only good step was deleted: %v", ck)
	}
	moved, _ := filepath.Glob(filepath.Join(dir, CorruptPrefix+"200-*"))
	if len(moved) != 1 {
		t.Errorf("the damaged step was not moved aside: %v", moved)
	}
	if b, _ := os.ReadFile(filepath.Join(moved[0], "REASON")); !strings.Contains(string(b), "run past the end") {
		t.Errorf("REASON = %q", b)
	}
}

// TestRetentionKeepsTheRestoredStepUntilANewerOneIsKept: attempt 2 restored step 100; step
// 150 is an older attempt's, never verified by this one; attempt 2's own step 200 is damaged
// by the time retention runs (keep 1). Step 150 counts as kept, but the restored step must
// stay too: only a newer step of attempt 2's own replaces it.
func TestRetentionKeepsTheRestoredStepUntilANewerOneIsKept(t *testing.T) {
	dir := t.TempDir()
	for _, step := range []int64{100, 150} {
		if err := writeAttempt(dir, 1, step, true); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := Fence(dir, "", 2); err != nil {
		t.Fatal(err)
	}
	if err := writeAttempt(dir, 2, 200, true); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(filepath.Join(stepDir(dir, 200), shardName(0, 2)), 3); err != nil {
		t.Fatal(err)
	}
	if err := prune(dir, 2, 200, Retention{Keep: 1, Protect: 100}); err != nil {
		t.Fatal(err)
	}
	if steps, _ := Steps(dir); fmt.Sprint(steps) != "[150 100]" {
		t.Errorf("steps %v, want [150 100]: the restored step stays until attempt 2 has a good newer one", steps)
	}
	if err := writeAttempt(dir, 2, 300, true); err != nil { // Commit prunes with keep 3
		t.Fatal(err)
	}
	if err := prune(dir, 2, 300, Retention{Keep: 1, Protect: 100}); err != nil {
		t.Fatal(err)
	}
	if steps, _ := Steps(dir); fmt.Sprint(steps) != "[300]" {
		t.Errorf("steps %v, want [300] once attempt 2's step 300 is kept", steps)
	}
}

func TestRetentionBoundsTheCorruptSteps(t *testing.T) {
	dir := t.TempDir()
	for step := int64(1); step <= MaxCorrupt+2; step++ {
		save(t, dir, step, 1, 10, true)
		if _, err := MoveAside(dir, step, "test"); err != nil {
			t.Fatal(err)
		}
	}
	save(t, dir, 50, 1, 2, true)
	moved, _ := filepath.Glob(filepath.Join(dir, CorruptPrefix+"*"))
	if len(moved) != MaxCorrupt {
		t.Fatalf("%d corrupt steps kept, want %d: %v", len(moved), MaxCorrupt, moved)
	}
	for _, m := range moved {
		if strings.HasPrefix(filepath.Base(m), CorruptPrefix+"1-") || strings.HasPrefix(filepath.Base(m), CorruptPrefix+"2-") {
			t.Errorf("an old corrupt step was kept over a newer one: %v", moved)
		}
	}
}

// TestCheckpointsOfEarlierWorkersAreStillRead: a step written before attempts were in file
// names (manifest.json, rank-R.bin, no attempt field) loads as the oldest attempt.
func TestCheckpointsOfEarlierWorkersAreStillRead(t *testing.T) {
	dir := t.TempDir()
	save(t, dir, 100, 2, 3, true)
	sd := stepDir(dir, 100)
	b, err := os.ReadFile(filepath.Join(sd, manifestName(0)))
	if err != nil {
		t.Fatal(err)
	}
	legacy := strings.ReplaceAll(strings.ReplaceAll(string(b), ".a0.bin", ".bin"), `"attempt": 0,`, "")
	for r := range 2 {
		if err := os.Rename(filepath.Join(sd, shardName(r, 0)), filepath.Join(sd, fmt.Sprintf("rank-%05d.bin", r))); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Remove(filepath.Join(sd, manifestName(0))); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(sd, "manifest.json"), []byte(legacy), 0o644); err != nil {
		t.Fatal(err)
	}
	ck, skipped, err := Latest(dir)
	if err != nil || ck == nil || ck.Manifest.Attempt != legacyAttempt {
		t.Fatalf("Latest = %+v, skipped %v, %v", ck, skipped, err)
	}
	if got, err := ck.Read("b", 0, 13); err != nil || fmt.Sprint(got) != fmt.Sprint(model(100)["b"]) {
		t.Errorf("read %v, %v", got, err)
	}
}
