package checkpoint

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/zaya-operator/zaya-operator/api/contract"
)

// attemptValues is what attempt saves at step: distinct per attempt, so a reader can tell
// whose data it got.
func attemptValues(step int64, attempt int) []float32 {
	v := make([]float32, 64)
	for i := range v {
		v[i] = float32(step)*1000 + float32(attempt)*100000 + float32(i)
	}
	return v
}

// writeAttempt writes step from 2 ranks of attempt; commit publishes it.
func writeAttempt(dir string, attempt int, step int64, commit bool) error {
	v := attemptValues(step, attempt)
	for rank := range 2 {
		t := Tensor{Name: "v", Shape: []int64{64}, Start: int64(32 * rank), Data: v[32*rank : 32*(rank+1)]}
		if err := WriteShard(dir, attempt, step, rank, []Tensor{t}); err != nil {
			return err
		}
	}
	if commit {
		_, err := Commit(dir, attempt, step, 2, nil, Retention{Keep: 3})
		return err
	}
	return nil
}

// checkWhole fails unless step is committed by attempt and reads back as exactly its data.
func checkWhole(t *testing.T, dir string, step int64, attempt int) {
	t.Helper()
	ck, err := Open(dir, step)
	if err != nil {
		t.Fatalf("step %d: %v", step, err)
	}
	if ck.Manifest.Attempt != attempt {
		t.Fatalf("step %d is attempt %d's, want attempt %d's", step, ck.Manifest.Attempt, attempt)
	}
	got, err := ck.Read("v", 0, 64)
	if err != nil {
		t.Fatal(err)
	}
	want := attemptValues(step, attempt)
	for i := range got {
		if got[i] != want[i] {
			t.Fatalf("step %d element %d = %v, want attempt %d's %v", step, i, got[i], attempt, want[i])
		}
	}
}

func TestAStaleWriterIsFenced(t *testing.T) {
	dir := t.TempDir()
	if _, err := Fence(dir, "", 1); err != nil {
		t.Fatal(err)
	}
	if err := writeAttempt(dir, 1, 10, false); err != nil { // the old gang's save, in flight
		t.Fatal(err)
	}
	if _, err := Fence(dir, "", 2); err != nil { // the new gang starts
		t.Fatal(err)
	}
	if _, err := Commit(dir, 1, 10, 2, nil, Retention{Keep: 3}); !errors.Is(err, ErrFenced) {
		t.Errorf("the old attempt's commit: %v, want ErrFenced", err)
	}
	if err := writeAttempt(dir, 1, 11, false); !errors.Is(err, ErrFenced) {
		t.Errorf("the old attempt's next shard: %v, want ErrFenced", err)
	}
	if _, err := Fence(dir, "", 1); !errors.Is(err, ErrFenced) {
		t.Errorf("an old attempt starting late: %v, want ErrFenced", err)
	}
	if _, err := Open(dir, 10); !errors.Is(err, ErrNotCommitted) {
		t.Errorf("step 10 after the fenced commit: %v, want not committed", err)
	}
	if err := writeAttempt(dir, 2, 10, true); err != nil {
		t.Fatal(err)
	}
	checkWhole(t, dir, 10, 2)
}

func TestAnOlderAttemptsManifestNeverStandsForANewerOnes(t *testing.T) {
	dir := t.TempDir()
	if err := writeAttempt(dir, 1, 10, true); err != nil { // committed before the new gang began
		t.Fatal(err)
	}
	checkWhole(t, dir, 10, 1)
	if _, err := Fence(dir, "", 2); err != nil {
		t.Fatal(err)
	}
	if err := writeAttempt(dir, 2, 10, true); err != nil { // the same step number again
		t.Fatal(err)
	}
	checkWhole(t, dir, 10, 2)
	if _, err := os.Stat(filepath.Join(stepDir(dir, 10), manifestName(1))); err != nil {
		t.Errorf("the older attempt's files were touched: %v", err)
	}
	if err := writeAttempt(dir, 2, 10, true); err == nil {
		t.Error("an attempt committed the same step twice")
	}
	checkWhole(t, dir, 10, 2)
}

// TestFencedWhilePublishing: the old attempt passed its fence check and is about to publish
// when the new attempt starts and commits the same step; the old one must take its
// manifest back and the step must be wholly the new attempt's.
func TestFencedWhilePublishing(t *testing.T) {
	dir := t.TempDir()
	if err := writeAttempt(dir, 1, 10, false); err != nil {
		t.Fatal(err)
	}
	var newErr error
	beforePublish = func(string) {
		beforePublish = func(string) {}
		if _, newErr = Fence(dir, "", 2); newErr == nil {
			newErr = writeAttempt(dir, 2, 10, true)
		}
	}
	defer func() { beforePublish = func(string) {} }()
	if _, err := Commit(dir, 1, 10, 2, nil, Retention{Keep: 3}); !errors.Is(err, ErrFenced) {
		t.Errorf("the old attempt's commit: %v, want ErrFenced", err)
	}
	if newErr != nil {
		t.Fatal(newErr)
	}
	checkWhole(t, dir, 10, 2)
	if _, err := os.Stat(filepath.Join(stepDir(dir, 10), manifestName(1))); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the fenced manifest is still published: %v", err)
	}
}

// TestTwoLiveWritersAndAReader races an old attempt saving steps 1..40 against a new attempt
// that starts at a random moment and saves the same steps, while a reader keeps loading the
// newest checkpoint: every checkpoint it ever sees is wholly one attempt's and verifies, the
// new attempt is never refused or pruned, and in the end every step it saved is its own.
func TestTwoLiveWritersAndAReader(t *testing.T) {
	for round := range 5 {
		dir := t.TempDir()
		r := rand.New(rand.NewPCG(uint64(round), 7))
		var wg sync.WaitGroup
		var stop atomic.Bool
		var readErr atomic.Value
		wg.Go(func() { // the stale gang
			for step := int64(1); step <= 40; step++ {
				if err := writeAttempt(dir, 1, step, true); err != nil {
					if !errors.Is(err, ErrFenced) {
						readErr.Store(err)
					}
					return
				}
			}
		})
		wg.Go(func() { // a reader
			for !stop.Load() {
				ck, _, err := Latest(dir)
				if err != nil || ck == nil {
					continue
				}
				got, err := ck.Read("v", 0, 64)
				if err != nil {
					continue // pruned under it: the next round reads a newer one
				}
				want := attemptValues(ck.Manifest.Step, ck.Manifest.Attempt)
				for i := range got {
					if got[i] != want[i] {
						readErr.Store(errors.New("a reader saw a step mixing attempts"))
					}
				}
			}
		})
		time.Sleep(time.Duration(r.IntN(3000)) * time.Microsecond)
		if _, err := Fence(dir, "", 2); err != nil {
			t.Fatal(err)
		}
		for step := int64(1); step <= 40; step++ {
			if err := writeAttempt(dir, 2, step, true); err != nil {
				t.Fatalf("round %d: the new attempt at step %d: %v", round, step, err)
			}
		}
		stop.Store(true)
		wg.Wait()
		if err, _ := readErr.Load().(error); err != nil {
			t.Fatalf("round %d: %v", round, err)
		}
		steps, _ := Steps(dir)
		if len(steps) == 0 || steps[0] != 40 {
			t.Fatalf("round %d: steps %v", round, steps)
		}
		for _, s := range steps {
			if s >= 38 {
				checkWhole(t, dir, s, 2)
			}
		}
	}
}

// A job recreated on a kept volume counts its attempts past the deleted job's, so the old
// job's writers are fenced by number; a garbage owner file is taken over, not fatal.
func TestANewJobTakesTheDirectoryOver(t *testing.T) {
	dir := t.TempDir()
	if a, err := Fence(dir, "job-a", 2); err != nil || a != 2 {
		t.Fatalf("first owner: attempt %d, %v; want 2", a, err)
	}
	if a, err := Fence(dir, "job-b", 0); err != nil || a != 3 {
		t.Fatalf("new job: attempt %d, %v; want 3", a, err)
	}
	if err := fenced(dir, 2); !errors.Is(err, ErrFenced) {
		t.Errorf("the old job's writer: %v, want ErrFenced", err)
	}
	if a, err := Fence(dir, "job-b", 1); err != nil || a != 4 {
		t.Errorf("the new job's next attempt: %d, %v; want 4", a, err)
	}
	if err := os.WriteFile(filepath.Join(dir, ownerName), []byte("\x00garbage"), 0o644); err != nil {
		t.Fatal(err)
	}
	if a, err := Fence(dir, "job-c", 0); err != nil || a != 5 {
		t.Errorf("over a garbage owner file: attempt %d, %v; want 5", a, err)
	}
}

// gen is generation g's first attempt number (base 0).
func gen(g int) int { return g << contract.InPlaceAttemptBits }

// Each start of one generation (an in-place restart keeps ZAYA_RESTART_ATTEMPT) fences with
// the next number, so the previous run's writer is refused; a newer generation fences every
// start of an older one, and an older generation starting after a newer one is a stale pod.
func TestEveryStartOfAGenerationFencesThePreviousRun(t *testing.T) {
	dir := t.TempDir()
	next := func(generation, want int) {
		t.Helper()
		if a, err := FenceNext(dir, "", generation); err != nil || a != want {
			t.Fatalf("FenceNext(generation %d) = %d, %v; want %d", generation, a, err, want)
		}
	}
	next(0, 0)
	if err := writeAttempt(dir, 0, 10, false); err != nil { // the first run's save, in flight
		t.Fatal(err)
	}
	next(0, 1) // restarted in place
	if _, err := Commit(dir, 0, 10, 2, nil, Retention{Keep: 3}); !errors.Is(err, ErrFenced) {
		t.Errorf("the first run's commit: %v, want ErrFenced", err)
	}
	if err := writeAttempt(dir, 0, 11, false); !errors.Is(err, ErrFenced) {
		t.Errorf("the first run's next shard: %v, want ErrFenced", err)
	}
	if err := writeAttempt(dir, 1, 10, true); err != nil {
		t.Fatal(err)
	}
	checkWhole(t, dir, 10, 1)
	next(0, 2)
	if err := writeAttempt(dir, 1, 12, false); !errors.Is(err, ErrFenced) {
		t.Errorf("the second run's shard after the third start: %v, want ErrFenced", err)
	}

	next(1, gen(1)) // the operator recreated the pods
	if err := writeAttempt(dir, 2, 12, false); !errors.Is(err, ErrFenced) {
		t.Errorf("generation 0's writer: %v, want ErrFenced", err)
	}
	if _, err := FenceNext(dir, "", 0); !errors.Is(err, ErrFenced) {
		t.Errorf("generation 0 starting after generation 1: %v, want ErrFenced", err)
	}
	next(1, gen(1)+1)
	next(3, gen(3)) // generations may be skipped
	if _, err := FenceNext(dir, "", 2); !errors.Is(err, ErrFenced) {
		t.Errorf("generation 2 starting after generation 3: %v, want ErrFenced", err)
	}
	if err := writeAttempt(dir, gen(3), 20, true); err != nil {
		t.Fatal(err)
	}
	checkWhole(t, dir, 20, gen(3))
	if n, err := newestFence(dir); err != nil || n != gen(3) {
		t.Errorf("newest fence %d, %v; want %d (older markers removed, the newest kept)", n, err, gen(3))
	}
}

// A job recreated on a kept volume counts its generations from one past every number the
// deleted job fenced with, in-place starts included.
func TestFenceNextTakesTheDirectoryOver(t *testing.T) {
	dir := t.TempDir()
	for k := range 3 {
		if a, err := FenceNext(dir, "job-a", 2); err != nil || a != gen(2)+k {
			t.Fatalf("job-a generation 2, start %d: %d, %v; want %d", k, a, err, gen(2)+k)
		}
	}
	base := gen(2) + 3
	if a, err := FenceNext(dir, "job-b", 0); err != nil || a != base {
		t.Fatalf("job-b generation 0: %d, %v; want %d", a, err, base)
	}
	if err := fenced(dir, gen(2)+2); !errors.Is(err, ErrFenced) {
		t.Errorf("job-a's last writer: %v, want ErrFenced", err)
	}
	if a, err := FenceNext(dir, "job-b", 0); err != nil || a != base+1 {
		t.Errorf("job-b restarted in place: %d, %v; want %d", a, err, base+1)
	}
	if a, err := FenceNext(dir, "job-b", 1); err != nil || a != base+gen(1) {
		t.Errorf("job-b generation 1: %d, %v; want %d", a, err, base+gen(1))
	}
	if _, err := FenceNext(dir, "job-b", 0); !errors.Is(err, ErrFenced) {
		t.Errorf("job-b generation 0 after its generation 1: %v, want ErrFenced", err)
	}
}

// Attempt numbers stay exact in the worker's float64 all-reduce: up to 2^53, and no further.
// A generation's numbers never run into the next generation's.
func TestAttemptNumbersStayExactAndWithinTheirGeneration(t *testing.T) {
	dir := t.TempDir()
	top := 1 << 53
	if a, err := FenceNext(dir, "", top>>contract.InPlaceAttemptBits); err != nil || a != top {
		t.Fatalf("the last generation: %d, %v; want 2^53", a, err)
	}
	if n, err := newestFence(dir); err != nil || n != top {
		t.Fatalf("the 16-digit marker reads back as %d, %v", n, err)
	}
	if err := writeAttempt(dir, top, 1, true); err != nil { // 16-digit file names parse too
		t.Fatal(err)
	}
	checkWhole(t, dir, 1, top)
	for _, g := range []int{top >> contract.InPlaceAttemptBits, top>>contract.InPlaceAttemptBits + 1} {
		if _, err := FenceNext(dir, "", g); err == nil || errors.Is(err, ErrFenced) {
			t.Errorf("generation %d past 2^53: %v, want a plain error", g, err)
		}
	}
	if _, err := Fence(dir, "", top+1); err == nil || errors.Is(err, ErrFenced) {
		t.Errorf("Fence past 2^53: %v, want a plain error", err)
	}
	for _, name := range []string{"attempt-9007199254740993", "attempt-99999999999999999"} {
		if n, ok := parseNumber(name, fencePrefix, ""); ok {
			t.Errorf("%s parsed as %d: past 2^53", name, n)
		}
	}

	dir = t.TempDir()
	last := gen(1) - 1 // generation 0's last start
	if err := os.WriteFile(filepath.Join(dir, fmt.Sprintf("%s%d", fencePrefix, last)), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if a, err := FenceNext(dir, "", 0); err == nil || errors.Is(err, ErrFenced) {
		t.Errorf("generation 0 out of numbers: %d, %v; want a plain error, not generation 1's number", a, err)
	}
	if a, err := FenceNext(dir, "", 1); err != nil || a != gen(1) {
		t.Errorf("generation 1: %d, %v; want %d", a, err, gen(1))
	}
}
