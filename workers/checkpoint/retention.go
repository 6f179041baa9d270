package checkpoint

import (
	"cmp"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"
)

// Retention says which committed checkpoints a commit keeps.
type Retention struct {
	// Keep is how many of the newest valid committed checkpoints stay (at least 1).
	Keep int
	// Protect is a step that stays until a newer valid step of the committing attempt is
	// kept: the step the gang restored from (verified as it was read) stays until this
	// attempt has a newer one of its own.
	Protect int64
}

// MaxCorrupt is how many moved-aside steps (corrupt-step-*) retention keeps for a human to
// look at; older ones are deleted at the next commit, so corrupt data cannot fill the volume.
const MaxCorrupt = 3

// prune applies r after step newest was committed by attempt. Only a valid manifest counts
// as a kept checkpoint; a committed step whose manifest is no longer valid is moved aside,
// not deleted. Uncommitted steps older than newest (saves that died half way) are removed.
// A directory holding a file of a newer attempt, and any step newer than newest (a save in
// flight), are never touched.
func prune(dir string, attempt int, newest int64, r Retention) error {
	steps, err := listSteps(dir)
	if err != nil {
		return err
	}
	kept, keptNewerThanProtected := 0, false
	for _, s := range steps { // newest first
		ck, err := Open(dir, s)
		switch {
		case s > newest:
		case err == nil && (kept < max(r.Keep, 1) || (s == r.Protect && !keptNewerThanProtected)):
			kept++
			// Only a step this attempt wrote (checksummed from memory) replaces the
			// protected one; another attempt's newer step was never verified by this one.
			keptNewerThanProtected = keptNewerThanProtected || (s > r.Protect && ck.Manifest.Attempt == attempt)
		case hasNewerAttempt(stepDir(dir, s), attempt):
		case err != nil && !errors.Is(err, ErrNotCommitted):
			if _, err := MoveAside(dir, s, "retention found it invalid: "+err.Error()); err != nil {
				return err
			}
		default:
			if err := os.RemoveAll(stepDir(dir, s)); err != nil {
				return err
			}
		}
	}
	return pruneCorrupt(dir)
}

// pruneCorrupt deletes all but the newest MaxCorrupt moved-aside steps.
func pruneCorrupt(dir string) error {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return err
	}
	type moved struct {
		name  string
		nanos int64
	}
	var all []moved
	for _, e := range entries {
		rest, ok := strings.CutPrefix(e.Name(), CorruptPrefix)
		if !ok || !e.IsDir() {
			continue
		}
		if i := strings.LastIndexByte(rest, '-'); i > 0 {
			if n, err := strconv.ParseInt(rest[i+1:], 10, 64); err == nil {
				all = append(all, moved{e.Name(), n})
			}
		}
	}
	slices.SortFunc(all, func(a, b moved) int { return cmp.Compare(b.nanos, a.nanos) })
	for _, m := range all[min(len(all), MaxCorrupt):] {
		if err := os.RemoveAll(filepath.Join(dir, m.name)); err != nil {
			return err
		}
	}
	return nil
}

// hasNewerAttempt is whether sd holds a shard, list or manifest of an attempt after attempt.
func hasNewerAttempt(sd string, attempt int) bool {
	entries, err := os.ReadDir(sd)
	if err != nil {
		return true // unknown: leave it
	}
	for _, e := range entries {
		name := e.Name()
		if i := strings.Index(name, ".a"); i >= 0 {
			rest := name[i+2:]
			if j := strings.IndexByte(rest, '.'); j > 0 {
				if n, ok := parseNumber(rest[:j], "", ""); ok && n > attempt {
					return true
				}
			}
		}
	}
	return false
}

// CorruptPrefix starts the name of a step directory moved aside because it failed
// verification: corrupt-step-<step>-<unix nanos>.
const CorruptPrefix = "corrupt-step-"

// MoveAside renames step's directory to corrupt-step-<step>-<unix nanos> (kept for a human to
// look at, never read again) with the reason in its REASON file, so the step number can be
// saved again. It returns the new directory's path.
func MoveAside(dir string, step int64, reason string) (string, error) {
	to := filepath.Join(dir, fmt.Sprintf("%s%d-%d", CorruptPrefix, step, time.Now().UnixNano()))
	if err := os.Rename(stepDir(dir, step), to); err != nil {
		return "", err
	}
	if err := writeFileSync(filepath.Join(to, "REASON"), []byte(reason+"\n")); err != nil {
		return to, err
	}
	return to, syncDir(dir)
}
