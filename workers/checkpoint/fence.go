package checkpoint

import (
	"errors"
	"fmt"
	"io/fs"
	"math"
	"os"
	"path/filepath"
	"strings"

	"github.com/zaya-operator/zaya-operator/api/contract"
)

// ErrFenced is a writer of an attempt older than the newest one that has started in the
// checkpoint directory: it may no longer write, publish or delete anything there.
var ErrFenced = errors.New("checkpoint: fenced")

const fencePrefix = "attempt-"

// maxAttempt bounds attempt numbers: the worker shares them through a float64 all-reduce,
// exact up to 2^53 (and an int must hold them).
const maxAttempt = min(1<<53, math.MaxInt)

// parseNumber is the attempt in name = prefix + decimal digits (no sign, no leading zero,
// at most maxAttempt) + suffix.
func parseNumber(name, prefix, suffix string) (int, bool) {
	digits, ok := strings.CutPrefix(name, prefix)
	if !ok {
		return 0, false
	}
	if digits, ok = strings.CutSuffix(digits, suffix); !ok || digits == "" || len(digits) > 16 || (digits[0] == '0' && len(digits) > 1) {
		return 0, false
	}
	n := 0
	for _, c := range []byte(digits) {
		d := int(c - '0')
		if c < '0' || c > '9' || n > (maxAttempt-d)/10 {
			return 0, false
		}
		n = n*10 + d
	}
	return n, true
}

// manifestAttempt is the attempt of a manifest file name.
func manifestAttempt(name string) (int, bool) {
	if name == manifestName(legacyAttempt) {
		return legacyAttempt, true
	}
	return parseNumber(name, "manifest.a", ".json")
}

// newestFence is the newest attempt whose fence marker is in dir (-1: none).
func newestFence(dir string) (int, error) {
	entries, err := os.ReadDir(dir)
	if errors.Is(err, os.ErrNotExist) {
		return -1, nil
	}
	if err != nil {
		return -1, err
	}
	newest := -1
	for _, e := range entries {
		if n, ok := parseNumber(e.Name(), fencePrefix, ""); ok {
			newest = max(newest, n)
		}
	}
	return newest, nil
}

// fenced is ErrFenced when an attempt newer than attempt has started in dir.
func fenced(dir string, attempt int) error {
	newest, err := newestFence(dir)
	if err != nil {
		return err
	}
	if newest > attempt {
		return fmt.Errorf("%w: attempt %d started after this attempt %d", ErrFenced, newest, attempt)
	}
	return nil
}

// ownerName holds the job that owns dir and the base of its attempt numbers: "<uid> <base>".
const ownerName = "owner"

// readOwner is dir's owner and base; ok is false when there is none or it is unreadable (a
// torn or garbage file is taken over, not a reason to fail every start).
func readOwner(dir string) (owner string, base int, ok bool, err error) {
	b, err := os.ReadFile(filepath.Join(dir, ownerName))
	if errors.Is(err, os.ErrNotExist) {
		return "", 0, false, nil
	}
	if err != nil {
		return "", 0, false, err
	}
	uid, num, found := strings.Cut(strings.TrimSuffix(string(b), "\n"), " ")
	n, valid := parseNumber(num, "", "")
	if !found || !valid || len(uid) > 128 {
		return "", 0, false, nil
	}
	return uid, n, true, nil
}

// takeOver makes job the owner of dir: its attempts count from one past every attempt that
// fenced dir before, so each writer of the earlier job is fenced by number. A job recreated on
// a kept volume restarts its attempts at 0; without this its first gang would find itself
// older than the deleted job's last one.
func takeOver(dir, job string) (int, error) {
	newest, err := newestFence(dir)
	if err != nil {
		return 0, err
	}
	base := newest + 1
	tmp, err := os.CreateTemp(dir, ".owner-*")
	if err != nil {
		return 0, err
	}
	_, werr := fmt.Fprintf(tmp, "%s %d\n", job, base)
	if werr == nil {
		werr = tmp.Sync()
	}
	if cerr := tmp.Close(); werr == nil {
		werr = cerr
	}
	if werr == nil {
		werr = os.Rename(tmp.Name(), filepath.Join(dir, ownerName))
	}
	if werr != nil {
		_ = os.Remove(tmp.Name())
		return 0, werr
	}
	return base, syncDir(dir)
}

// ownBase makes sure dir exists and belongs to job, and returns the base of job's attempt
// numbers there (see takeOver). An empty job is the unnamed owner of a directory nobody took
// over.
func ownBase(dir, job string) (int, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return 0, err
	}
	owner, base, ok, err := readOwner(dir)
	if err != nil {
		return 0, err
	}
	if !ok && job == "" {
		return 0, nil // nobody took the directory over: the attempts are the gang's own
	}
	if !ok || owner != job {
		return takeOver(dir, job)
	}
	return base, nil
}

// Fence marks dir as owned by job's attempt (a durable attempt-<N> file) before the attempt
// reads or writes anything there: from then on writers of older attempts are refused
// (ErrFenced). It returns the attempt number to write under in dir: attempt itself, offset
// past the attempts of an earlier job that used dir (see takeOver). An empty job is the
// unnamed owner of a directory nobody took over. It fails with ErrFenced when a newer
// attempt has already started. Fence is for a caller that numbers its attempts itself; the
// worker fences with FenceNext, which numbers every start.
func Fence(dir, job string, attempt int) (int, error) {
	if attempt < 0 {
		return 0, fmt.Errorf("checkpoint: attempt %d is negative", attempt)
	}
	base, err := ownBase(dir, job)
	if err != nil {
		return 0, err
	}
	if attempt > maxAttempt-base {
		return 0, fmt.Errorf("checkpoint: attempt %d past base %d is over 2^53, the most an attempt can be", attempt, base)
	}
	attempt += base
	if err := fenced(dir, attempt); err != nil {
		return 0, err
	}
	marker := filepath.Join(dir, fmt.Sprintf("%s%d", fencePrefix, attempt))
	if _, err := os.Stat(marker); err == nil {
		return attempt, nil // this attempt fenced already (another local rank, an earlier try)
	}
	if err := writeFileSync(marker, nil); err != nil {
		return 0, err
	}
	return attempt, markerWritten(dir, attempt)
}

// FenceNext fences dir, like Fence, for one start of job's gang of generation (the
// ZAYA_RESTART_ATTEMPT, which stays the same when the gang is restarted in place) and returns
// the attempt number this start writes under: base + generation<<contract.InPlaceAttemptBits
// + k, with k one past the newest start of the same generation that fenced dir (0 for its
// first). So every start fences out every writer of the run before it, the same generation's
// too, while a newer generation still fences older ones. It fails with ErrFenced when a newer
// generation has started (this is a stale pod), and with a plain error when the numbers run
// out (past 2^53, or 2^InPlaceAttemptBits starts of one generation).
func FenceNext(dir, job string, generation int) (int, error) {
	const bits = contract.InPlaceAttemptBits
	if generation < 0 {
		return 0, fmt.Errorf("checkpoint: generation %d is negative", generation)
	}
	base, err := ownBase(dir, job)
	if err != nil {
		return 0, err
	}
	if generation > (maxAttempt-base)>>bits {
		return 0, fmt.Errorf("checkpoint: generation %d past base %d: its attempt numbers would be over 2^53, the most an attempt can be", generation, base)
	}
	first := base + generation<<bits
	for {
		newest, err := newestFence(dir)
		if err != nil {
			return 0, err
		}
		attempt := first
		if newest >= first {
			if k := newest - first; k>>bits > 0 {
				return 0, fmt.Errorf("%w: generation %d (attempt %d) started after this generation %d", ErrFenced, (newest-base)>>bits, newest, generation)
			} else if (k+1)>>bits > 0 || newest >= maxAttempt {
				return 0, fmt.Errorf("checkpoint: generation %d has started %d times: no attempt number is left for another start", generation, k+1)
			}
			attempt = newest + 1
		}
		// Exclusive: two starts never share a number (one that lost the race takes the next).
		f, err := os.OpenFile(filepath.Join(dir, fmt.Sprintf("%s%d", fencePrefix, attempt)), os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o644)
		if errors.Is(err, fs.ErrExist) {
			continue
		}
		if err != nil {
			return 0, err
		}
		err = f.Sync()
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return 0, err
		}
		return attempt, markerWritten(dir, attempt)
	}
}

// markerWritten makes attempt's new fence marker durable and removes the older ones, which
// say nothing it does not; a marker of a newer attempt that came meanwhile fences this one.
func markerWritten(dir string, attempt int) error {
	if err := syncDir(dir); err != nil {
		return err
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		return err
	}
	for _, e := range entries {
		if n, ok := parseNumber(e.Name(), fencePrefix, ""); ok && n < attempt {
			_ = os.Remove(filepath.Join(dir, e.Name()))
		}
	}
	return fenced(dir, attempt)
}
