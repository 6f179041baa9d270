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
	"strings"
	"sync/atomic"
)

// ErrCorrupt is data that is wrong — a manifest that breaks a rule, a shard that is missing,
// short or changed — as opposed to storage that cannot be read right now (any other error):
// only the first justifies moving a step aside.
var ErrCorrupt = errors.New("checkpoint: corrupt")

type corruptError struct{ error }

func (e corruptError) Is(target error) bool { return target == ErrCorrupt }

func (e corruptError) Unwrap() error { return e.error }

func corrupt(err error) error { return corruptError{err} }

// errUnreadable marks an I/O error met while validating a manifest: not corruption.
var errUnreadable = errors.New("unreadable")

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
