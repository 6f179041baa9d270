// Package checkpoint is distributed checkpointing: every rank writes its own shard in parallel,
// then one coordinator commits a manifest — written to a unique temporary name, fsynced,
// linked into place, directories fsynced. The manifest is the commit marker: a checkpoint
// without one does not exist. It lists every tensor's dtype, global shape and shards (file, byte offset,
// element range, CRC32C), so a loader verifies what it reads and can reshard N ranks' state
// onto M ranks.
//
// Layout: <dir>/attempt-<N> (the fence of the newest gang attempt), <dir>/step-<step, 12
// digits>/rank-<rank>.a<attempt>.bin, rank-<rank>.a<attempt>.json (the rank's shard list,
// fsynced) and manifest.a<attempt>.json; docs/worker-contract.md has the protocol.
package checkpoint

import (
	"cmp"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"io/fs"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"

	"github.com/zaya-operator/zaya-operator/api/contract"
)

// FormatVersion is the manifest format this package writes and reads.
const FormatVersion = 1

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// Tensor is this rank's slice of a global tensor: elements [Start, Start+len(Data)) of the
// tensor flattened in row-major order.
type Tensor struct {
	Name  string
	Shape []int64 // global shape
	Start int64
	Data  []float32
}

// ShardMeta locates one rank's slice of one tensor.
type ShardMeta struct {
	Rank       int    `json:"rank"`
	File       string `json:"file"`
	FileOffset int64  `json:"fileOffset"` // bytes
	Start      int64  `json:"start"`      // elements
	Count      int64  `json:"count"`      // elements
	CRC32C     uint32 `json:"crc32c"`
}

// TensorMeta is one global tensor.
type TensorMeta struct {
	Name   string      `json:"name"`
	DType  string      `json:"dtype"`
	Shape  []int64     `json:"shape"`
	Shards []ShardMeta `json:"shards"`
}

// Manifest is a committed checkpoint.
type Manifest struct {
	FormatVersion int               `json:"formatVersion"`
	Step          int64             `json:"step"`
	World         int               `json:"world"`
	Attempt       int               `json:"attempt"` // the attempt number that wrote it (FenceNext's, or Fence's)
	Tensors       []TensorMeta      `json:"tensors"`
	State         map[string]string `json:"state,omitempty"` // RNG state, data position, ...
	Committed     time.Time         `json:"committed"`
}

// ErrFenced is a writer of an attempt older than the newest one that has started in the
// checkpoint directory: it may no longer write, publish or delete anything there.
var ErrFenced = errors.New("checkpoint: fenced")

// legacyAttempt is the attempt of checkpoints written before attempts were in file names
// (manifest.json, rank-R.bin): older than every attempt, still read.
const legacyAttempt = -1

func stepDir(dir string, step int64) string {
	return filepath.Join(dir, fmt.Sprintf("step-%012d", step))
}

// Names are per attempt, so writers of two attempts never touch the same file.
func shardName(rank, attempt int) string {
	if attempt == legacyAttempt {
		return fmt.Sprintf("rank-%05d.bin", rank)
	}
	return fmt.Sprintf("rank-%05d.a%d.bin", rank, attempt)
}

func listName(rank, attempt int) string { return fmt.Sprintf("rank-%05d.a%d.json", rank, attempt) }

func manifestName(attempt int) string {
	if attempt == legacyAttempt {
		return "manifest.json"
	}
	return fmt.Sprintf("manifest.a%d.json", attempt)
}

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

// WriteShard writes rank's tensors for step as one file plus its shard list, both fsynced,
// under names of attempt's own. Every rank calls it in parallel; nothing is visible to
// loaders until Commit.
func WriteShard(dir string, attempt int, step int64, rank int, tensors []Tensor) error {
	if err := fenced(dir, attempt); err != nil {
		return err
	}
	sd := stepDir(dir, step)
	if _, err := os.Stat(filepath.Join(sd, manifestName(attempt))); err == nil {
		return fmt.Errorf("checkpoint: step %d is already committed by attempt %d: rewriting its shards would corrupt it", step, attempt)
	}
	if err := os.MkdirAll(sd, 0o755); err != nil {
		return err
	}
	name := shardName(rank, attempt)
	f, err := os.OpenFile(filepath.Join(sd, name), os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o644)
	if err != nil {
		return err
	}
	var metas []TensorMeta
	var off int64
	for _, t := range tensors {
		b := littleEndianBytes(t.Data)
		if _, err := f.Write(b); err != nil {
			_ = f.Close()
			return err
		}
		metas = append(metas, TensorMeta{Name: t.Name, DType: "float32", Shape: t.Shape, Shards: []ShardMeta{{
			Rank: rank, File: name, FileOffset: off, Start: t.Start, Count: int64(len(t.Data)),
			CRC32C: crc32.Checksum(b, castagnoli),
		}}})
		off += int64(len(b))
	}
	if err := f.Sync(); err != nil {
		_ = f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	list, err := json.Marshal(metas)
	if err != nil {
		return err
	}
	return writeFileSync(filepath.Join(sd, listName(rank, attempt)), list)
}

// beforePublish runs just before Commit links the manifest into place (tests hold it there
// to interleave writers of two attempts).
var beforePublish = func(stepDir string) {}

// Commit is the coordinator's step once every rank's WriteShard returned (after a barrier):
// it gathers attempt's shard lists into the manifest and publishes it, then applies the
// retention (older checkpoints go only after this one is committed).
//
// Publishing: the manifest is written to a uniquely named temporary file and fsynced, the step
// directory is fsynced (every shard's name is durable before the manifest can be), the
// temporary file is hard-linked to manifest.a<attempt>.json (link never replaces a file, so a
// published manifest is never overwritten), and the step and parent directories are fsynced.
// A writer fenced by a newer attempt publishes nothing; one fenced while it published takes
// its manifest back and prunes nothing.
func Commit(dir string, attempt int, step int64, world int, state map[string]string, r Retention) (*Manifest, error) {
	if err := fenced(dir, attempt); err != nil {
		return nil, err
	}
	sd := stepDir(dir, step)
	m := &Manifest{FormatVersion: FormatVersion, Step: step, World: world, Attempt: attempt, State: state, Committed: time.Now().UTC()}
	byName := map[string]int{}
	for rank := range world {
		b, err := os.ReadFile(filepath.Join(sd, listName(rank, attempt)))
		if err != nil {
			return nil, fmt.Errorf("checkpoint: step %d: rank %d's shard list: %w", step, rank, err)
		}
		var metas []TensorMeta
		if err := json.Unmarshal(b, &metas); err != nil {
			return nil, fmt.Errorf("checkpoint: step %d: rank %d's shard list: %w", step, rank, err)
		}
		for _, t := range metas {
			i, ok := byName[t.Name]
			if !ok {
				i = len(m.Tensors)
				byName[t.Name] = i
				m.Tensors = append(m.Tensors, TensorMeta{Name: t.Name, DType: t.DType, Shape: t.Shape})
			}
			for _, sh := range t.Shards {
				if sh.Rank != rank || sh.File != shardName(rank, attempt) {
					return nil, fmt.Errorf("checkpoint: step %d: rank %d's shard list names %s of rank %d", step, rank, sh.File, sh.Rank)
				}
			}
			m.Tensors[i].Shards = append(m.Tensors[i].Shards, t.Shards...)
		}
	}
	if err := m.validate(fileSizes(sd)); err != nil {
		return nil, fmt.Errorf("checkpoint: step %d: %w", step, err)
	}
	b, err := json.MarshalIndent(m, "", " ")
	if err != nil {
		return nil, err
	}
	if err := syncDir(sd); err != nil {
		return nil, err
	}
	tmp, err := os.CreateTemp(sd, "."+manifestName(attempt)+".*.tmp")
	if err != nil {
		return nil, err
	}
	defer func() { _ = os.Remove(tmp.Name()) }()
	_, err = tmp.Write(b)
	if err == nil {
		err = tmp.Sync()
	}
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return nil, err
	}
	beforePublish(sd)
	final := filepath.Join(sd, manifestName(attempt))
	if err := publish(tmp.Name(), final); err != nil {
		return nil, fmt.Errorf("checkpoint: publishing step %d: %w", step, err)
	}
	if err := syncDir(sd); err != nil {
		return nil, err
	}
	if err := syncDir(dir); err != nil {
		return nil, err
	}
	if err := fenced(dir, attempt); err != nil {
		// A newer attempt started while this one published: take it back, so that a stale
		// writer's step is at most briefly visible (it is complete and consistent meanwhile).
		_ = os.Remove(final)
		_ = syncDir(sd)
		return nil, err
	}
	return m, prune(dir, attempt, step, r)
}

// publish makes tmp visible as final without ever replacing an existing final: link(2), or
// where the file system has no hard links a rename after checking final is absent (final's
// name is this attempt's own, and one coordinator per attempt commits).
func publish(tmp, final string) error {
	err := os.Link(tmp, final)
	if errors.Is(err, fs.ErrExist) {
		return fmt.Errorf("%s already exists: %w", filepath.Base(final), err)
	}
	if err != nil && (errors.Is(err, syscall.EPERM) || errors.Is(err, syscall.ENOTSUP) || errors.Is(err, syscall.ENOSYS)) {
		if _, serr := os.Lstat(final); serr == nil {
			return fmt.Errorf("%s already exists", filepath.Base(final))
		}
		return os.Rename(tmp, final)
	}
	return err
}

// fileSizes is the size of a file in sd, for validating a manifest against what exists:
// fs.ErrNotExist when there is none, errUnreadable when storage does not say.
func fileSizes(sd string) func(name string) (int64, error) {
	return func(name string) (int64, error) {
		fi, err := os.Stat(filepath.Join(sd, name))
		switch {
		case errors.Is(err, fs.ErrNotExist):
			return 0, err
		case err != nil:
			return 0, fmt.Errorf("%w: %w", errUnreadable, err)
		case !fi.Mode().IsRegular():
			return 0, fs.ErrNotExist
		}
		return fi.Size(), nil
	}
}

// ErrCorrupt is data that is wrong — a manifest that breaks a rule, a shard that is missing,
// short or changed — as opposed to storage that cannot be read right now (any other error):
// only the first justifies moving a step aside.
var ErrCorrupt = errors.New("checkpoint: corrupt")

type corruptError struct{ error }

func (e corruptError) Is(target error) bool { return target == ErrCorrupt }
func (e corruptError) Unwrap() error        { return e.error }

func corrupt(err error) error { return corruptError{err} }

// errUnreadable marks an I/O error met while validating a manifest: not corruption.
var errUnreadable = errors.New("unreadable")

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

// ErrNotCommitted is a step directory without a manifest: a save that has not finished (or
// died), never a checkpoint.
var ErrNotCommitted = errors.New("not committed")

// parseStepName is the step of a directory named exactly step-<12 digits>; nothing else is a
// step (step-5, step-000000000005.old and step--00000000001 are not).
func parseStepName(name string) (int64, bool) {
	digits, ok := strings.CutPrefix(name, "step-")
	if !ok || len(digits) != 12 {
		return 0, false
	}
	var s int64
	for _, c := range []byte(digits) {
		if c < '0' || c > '9' {
			return 0, false
		}
		s = s*10 + int64(c-'0')
	}
	return s, true
}

// Steps are the step directories under dir, newest first (committed or not).
func Steps(dir string) ([]int64, error) { return listSteps(dir) }

// listSteps are the step directories under dir, newest first.
func listSteps(dir string) ([]int64, error) {
	entries, err := os.ReadDir(dir)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var steps []int64
	for _, e := range entries {
		if s, ok := parseStepName(e.Name()); ok && e.IsDir() {
			steps = append(steps, s)
		}
	}
	slices.SortFunc(steps, func(a, b int64) int { return cmp.Compare(b, a) })
	return steps, nil
}

// Checkpoint is a committed checkpoint: its manifest is read and valid; its shards are
// verified as they are read (Read, Verify).
type Checkpoint struct {
	Dir      string
	Manifest Manifest
}

// Latest is the newest committed checkpoint whose shards all verify; corrupt or incomplete
// ones are skipped (and reported in skipped) for the previous good one. It returns nil when
// there is none: a fresh start. It reads every shard of the step it returns: a gang resumes
// with Open and a Read of each rank's own part instead, agreeing on the result.
func Latest(dir string) (ck *Checkpoint, skipped []error, err error) {
	steps, err := listSteps(dir)
	if err != nil {
		return nil, nil, err
	}
	for _, s := range steps {
		c, err := Open(dir, s)
		if err == nil {
			err = c.Verify()
		}
		if err != nil {
			skipped = append(skipped, fmt.Errorf("step %d: %w", s, err))
			continue
		}
		return c, skipped, nil
	}
	return nil, skipped, nil
}

// Open reads step's manifest and checks it, reading no shard: ErrNotCommitted without one.
// Of several manifests (attempts that each committed the step) the newest attempt's is the
// step: an older attempt's can never stand for a newer one's.
func Open(dir string, step int64) (*Checkpoint, error) {
	sd := stepDir(dir, step)
	entries, err := os.ReadDir(sd)
	if errors.Is(err, os.ErrNotExist) {
		return nil, ErrNotCommitted
	}
	if err != nil {
		return nil, err
	}
	attempt, found := 0, false
	for _, e := range entries {
		if a, ok := manifestAttempt(e.Name()); ok && (!found || a > attempt) {
			attempt, found = a, true
		}
	}
	if !found {
		return nil, ErrNotCommitted
	}
	name := filepath.Join(filepath.Base(sd), manifestName(attempt)) // errors name the file
	f, err := os.Open(filepath.Join(sd, manifestName(attempt)))
	if errors.Is(err, os.ErrNotExist) {
		return nil, ErrNotCommitted // taken back by a fenced writer
	}
	if err != nil {
		return nil, err
	}
	b, err := io.ReadAll(io.LimitReader(f, maxManifestBytes+1))
	_ = f.Close()
	if err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	m, err := decodeManifest(b)
	if err != nil {
		return nil, corrupt(fmt.Errorf("%s: %w", name, err))
	}
	if attempt == legacyAttempt {
		m.Attempt = legacyAttempt
	}
	switch {
	case m.Step != step:
		return nil, corrupt(fmt.Errorf("%s: says step %d", name, m.Step))
	case m.Attempt != attempt:
		return nil, corrupt(fmt.Errorf("%s: says attempt %d", name, m.Attempt))
	}
	if err := m.validate(fileSizes(sd)); errors.Is(err, errUnreadable) {
		return nil, fmt.Errorf("%s: %w", name, err)
	} else if err != nil {
		return nil, corrupt(fmt.Errorf("%s: %w", name, err))
	}
	return &Checkpoint{Dir: sd, Manifest: *m}, nil
}

// Bounds of a manifest, checked before anything is allocated from its numbers.
const (
	maxManifestBytes = 64 << 20
	maxWorld         = 65536
	maxTensors       = 1 << 16
	maxShards        = 1 << 20 // over all tensors
	maxDims          = 32
	maxElements      = 1 << 48 // of one tensor
)

// decodeManifest parses a manifest of at most maxManifestBytes; validate checks it.
func decodeManifest(b []byte) (*Manifest, error) {
	if len(b) > maxManifestBytes {
		return nil, fmt.Errorf("manifest of %d bytes is over the %d-byte bound", len(b), maxManifestBytes)
	}
	var m Manifest
	if err := json.Unmarshal(b, &m); err != nil {
		return nil, fmt.Errorf("unreadable manifest: %w", err)
	}
	return &m, nil
}

// plainName is a file name inside the step directory: no path, no parent.
func plainName(name string) bool {
	return name != "" && name != "." && !strings.Contains(name, "..") && !strings.ContainsAny(name, "/\\\x00")
}

// validate checks the whole manifest before anything is read or allocated through it; size
// says how large a file of the step directory is (false: there is none). Every error names
// the rule it breaks.
func (m *Manifest) validate(size func(string) (int64, error)) error {
	switch {
	case m.FormatVersion != FormatVersion:
		return fmt.Errorf("format version %d, this worker reads %d", m.FormatVersion, FormatVersion)
	case m.World < 1 || m.World > maxWorld:
		return fmt.Errorf("world %d is outside 1..%d", m.World, maxWorld)
	case m.Step < 0:
		return fmt.Errorf("step %d is negative", m.Step)
	case m.Attempt < legacyAttempt:
		return fmt.Errorf("attempt %d is negative", m.Attempt)
	case len(m.Tensors) > maxTensors:
		return fmt.Errorf("%d tensors, over the bound of %d", len(m.Tensors), maxTensors)
	}
	names := make(map[string]bool, len(m.Tensors))
	shards := 0
	for i, t := range m.Tensors {
		if t.Name == "" {
			return fmt.Errorf("tensor %d: the name is empty", i)
		}
		if names[t.Name] {
			return fmt.Errorf("tensor %q: the name is not unique", t.Name)
		}
		names[t.Name] = true
		if t.DType != "float32" {
			return fmt.Errorf("tensor %q: dtype %q is not known (float32)", t.Name, t.DType)
		}
		if len(t.Shape) > maxDims {
			return fmt.Errorf("tensor %q: %d dimensions, over the bound of %d", t.Name, len(t.Shape), maxDims)
		}
		n := int64(1)
		for _, d := range t.Shape {
			if d < 1 {
				return fmt.Errorf("tensor %q: shape %v: a dimension is not positive", t.Name, t.Shape)
			}
			if n > maxElements/d {
				return fmt.Errorf("tensor %q: shape %v: over the bound of %d elements", t.Name, t.Shape, int64(maxElements))
			}
			n *= d
		}
		if shards += len(t.Shards); shards > maxShards {
			return fmt.Errorf("over the bound of %d shards", maxShards)
		}
		if err := m.validateShards(t, n, size); err != nil {
			return fmt.Errorf("tensor %q: %w", t.Name, err)
		}
	}
	return nil
}

// validateShards checks that t's shards lie within their files and cover its n elements
// exactly once.
func (m *Manifest) validateShards(t TensorMeta, n int64, size func(string) (int64, error)) error {
	for _, sh := range t.Shards {
		where := fmt.Sprintf("shard %s@%d", sh.File, sh.FileOffset)
		switch {
		case sh.Count <= 0:
			return fmt.Errorf("%s: count %d is not positive", where, sh.Count)
		case sh.Start < 0 || sh.Start >= n || sh.Count > n-sh.Start:
			return fmt.Errorf("%s: elements [%d, +%d) are outside the tensor's %d", where, sh.Start, sh.Count, n)
		case sh.Rank < 0 || sh.Rank >= m.World:
			return fmt.Errorf("%s: rank %d is outside [0, %d)", where, sh.Rank, m.World)
		case !plainName(sh.File):
			return fmt.Errorf("shard file %q is not a plain name inside the step directory", sh.File)
		case sh.File != shardName(sh.Rank, m.Attempt):
			return fmt.Errorf("shard file %q is not rank %d's of attempt %d", sh.File, sh.Rank, m.Attempt)
		case sh.FileOffset < 0:
			return fmt.Errorf("%s: the file offset is negative", where)
		}
		sz, err := size(sh.File)
		if errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("%s: the file is missing", where)
		}
		if err != nil {
			return fmt.Errorf("%s: %w", where, err)
		}
		if sh.FileOffset > sz || 4*sh.Count > sz-sh.FileOffset {
			return fmt.Errorf("%s: %d elements run past the end of the %d-byte file", where, sh.Count, sz)
		}
	}
	order := make([]int, len(t.Shards))
	for i := range order {
		order[i] = i
	}
	slices.SortFunc(order, func(a, b int) int { return cmp.Compare(t.Shards[a].Start, t.Shards[b].Start) })
	next := int64(0)
	for _, i := range order {
		sh := t.Shards[i]
		if sh.Start < next {
			return fmt.Errorf("shards overlap at element %d", sh.Start)
		}
		if sh.Start > next {
			return fmt.Errorf("no shard holds elements [%d, %d)", next, sh.Start)
		}
		next = sh.Start + sh.Count
	}
	if next != n {
		return fmt.Errorf("no shard holds elements [%d, %d)", next, n)
	}
	return nil
}

// Verify reads every shard of the checkpoint and checks its CRC32C.
func (c *Checkpoint) Verify() error {
	for _, t := range c.Manifest.Tensors {
		for _, sh := range t.Shards {
			if _, err := c.readShard(sh); err != nil {
				return fmt.Errorf("tensor %s: %w", t.Name, err)
			}
		}
	}
	return nil
}

// Elements is the number of elements of tensor name (-1: the checkpoint has no such tensor).
func (c *Checkpoint) Elements(name string) int64 {
	i := slices.IndexFunc(c.Manifest.Tensors, func(t TensorMeta) bool { return t.Name == name })
	if i < 0 {
		return -1
	}
	return elements(c.Manifest.Tensors[i].Shape)
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

func elements(shape []int64) int64 {
	n := int64(1)
	for _, d := range shape {
		n *= d
	}
	return n
}

// shardBytesRead counts the bytes readShard has read, for ShardBytesRead.
var shardBytesRead atomic.Int64

// ShardBytesRead is how many bytes of shard data this process has read from checkpoints
// (benchmarks compare loaders by it: on shared storage it is the load a resume puts there).
func ShardBytesRead() int64 { return shardBytesRead.Load() }

// readShard reads and verifies one shard.
func (c *Checkpoint) readShard(sh ShardMeta) ([]float32, error) {
	f, err := os.Open(filepath.Join(c.Dir, filepath.Base(sh.File)))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, corrupt(err)
	}
	if err != nil {
		return nil, err
	}
	defer func() { _ = f.Close() }()
	buf := make([]byte, 4*sh.Count)
	n, err := f.ReadAt(buf, sh.FileOffset)
	shardBytesRead.Add(int64(n))
	if errors.Is(err, io.EOF) {
		return nil, corrupt(fmt.Errorf("rank %d's shard %s@%d: %d of %d bytes: %w", sh.Rank, sh.File, sh.FileOffset, n, len(buf), err))
	}
	if err != nil {
		return nil, fmt.Errorf("rank %d's shard: %w", sh.Rank, err)
	}
	if got := crc32.Checksum(buf, castagnoli); got != sh.CRC32C {
		return nil, corrupt(fmt.Errorf("rank %d's shard %s@%d: CRC32C %08x, manifest says %08x", sh.Rank, sh.File, sh.FileOffset, got, sh.CRC32C))
	}
	out := make([]float32, sh.Count)
	for i := range out {
		out[i] = math.Float32frombits(binary.LittleEndian.Uint32(buf[4*i:]))
	}
	return out, nil
}

// Read returns elements [start, start+count) of a tensor from whichever shards hold them, so
// a checkpoint written by N ranks loads onto any number of ranks.
func (c *Checkpoint) Read(name string, start, count int64) ([]float32, error) {
	i := slices.IndexFunc(c.Manifest.Tensors, func(t TensorMeta) bool { return t.Name == name })
	if i < 0 {
		return nil, fmt.Errorf("checkpoint: no tensor %q at step %d", name, c.Manifest.Step)
	}
	t := c.Manifest.Tensors[i]
	if start < 0 || count < 0 || start > elements(t.Shape) || count > elements(t.Shape)-start {
		return nil, fmt.Errorf("checkpoint: %s[%d:%d] is outside its %d elements", name, start, start+count, elements(t.Shape))
	}
	out := make([]float32, count)
	covered := int64(0)
	for _, sh := range t.Shards {
		lo, hi := max(start, sh.Start), min(start+count, sh.Start+sh.Count)
		if lo >= hi {
			continue
		}
		data, err := c.readShard(sh)
		if err != nil {
			return nil, err
		}
		copy(out[lo-start:hi-start], data[lo-sh.Start:hi-sh.Start])
		covered += hi - lo
	}
	if covered != count {
		return nil, fmt.Errorf("checkpoint: %s[%d:%d]: shards cover %d of %d elements", name, start, start+count, covered, count)
	}
	return out, nil
}

// littleEndianBytes is data in the file format (float32, little endian): the same memory on
// little-endian machines (every MI300X host), so saving copies nothing; an encoded copy
// elsewhere.
func littleEndianBytes(data []float32) []byte {
	if len(data) == 0 {
		return nil
	}
	if nativeLittleEndian {
		return unsafe.Slice((*byte)(unsafe.Pointer(&data[0])), 4*len(data))
	}
	b := make([]byte, 4*len(data))
	for i, x := range data {
		binary.LittleEndian.PutUint32(b[4*i:], math.Float32bits(x))
	}
	return b
}

var nativeLittleEndian = binary.NativeEndian.Uint16([]byte{1, 0}) == 1

func writeFileSync(path string, b []byte) error {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o644)
	if err != nil {
		return err
	}
	if _, err := f.Write(b); err != nil {
		_ = f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		_ = f.Close()
		return err
	}
	return f.Close()
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer func() { _ = d.Close() }()
	return d.Sync()
}

// ErrNotWritable is Writable's error when no save could ever succeed in dir: a read-only
// volume, or one this user may not write. A restart cannot fix it.
var ErrNotWritable = errors.New("the checkpoint directory cannot be written")

// Writable checks that files can be created in dir (made if missing), so that a gang whose
// volume is mounted read-only stops at once with the reason rather than at its first save,
// again on every restart.
func Writable(dir string) error {
	err := os.MkdirAll(dir, 0o755)
	if err == nil {
		var f *os.File
		if f, err = os.CreateTemp(dir, ".zaya-writable-*"); err == nil {
			_ = f.Close()
			return os.Remove(f.Name())
		}
	}
	if errors.Is(err, syscall.EROFS) || errors.Is(err, fs.ErrPermission) {
		return fmt.Errorf("%w: %w", ErrNotWritable, err)
	}
	return err
}
