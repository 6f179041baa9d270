// Package checkpoint is distributed checkpointing: every rank writes its own shard in parallel,
// then one coordinator commits a manifest — written to a temporary name, fsynced, renamed into
// place, directory fsynced. The manifest is the commit marker: a checkpoint without one does
// not exist. It lists every tensor's dtype, global shape and shards (file, byte offset,
// element range, CRC32C), so a loader verifies what it reads and can reshard N ranks' state
// onto M ranks.
//
// Layout: <dir>/step-<step, 12 digits>/rank-<rank>.bin, rank-<rank>.json (the rank's shard
// list, fsynced) and manifest.json.
package checkpoint

import (
	"cmp"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"hash/crc32"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"
	"unsafe"
)

// FormatVersion is the manifest format this package writes and reads.
const FormatVersion = 1

const manifestName = "manifest.json"

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
	Tensors       []TensorMeta      `json:"tensors"`
	State         map[string]string `json:"state,omitempty"` // RNG state, data position, ...
	Committed     time.Time         `json:"committed"`
}

func stepDir(dir string, step int64) string {
	return filepath.Join(dir, fmt.Sprintf("step-%012d", step))
}

// WriteShard writes rank's tensors for step as one file plus its shard list, both fsynced.
// Every rank calls it in parallel; nothing is visible to loaders until Commit.
func WriteShard(dir string, step int64, rank int, tensors []Tensor) error {
	sd := stepDir(dir, step)
	if _, err := os.Stat(filepath.Join(sd, manifestName)); err == nil {
		return fmt.Errorf("checkpoint: step %d is already committed: rewriting its shards would corrupt it", step)
	}
	if err := os.MkdirAll(sd, 0o755); err != nil {
		return err
	}
	name := fmt.Sprintf("rank-%05d.bin", rank)
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
	return writeFileSync(filepath.Join(sd, fmt.Sprintf("rank-%05d.json", rank)), list)
}

// Commit is the coordinator's step once every rank's WriteShard returned (after a barrier):
// it gathers the shard lists into the manifest and publishes it atomically, then keeps only
// the newest keep committed checkpoints (older ones go only after this one is committed).
func Commit(dir string, step int64, world int, state map[string]string, keep int) (*Manifest, error) {
	sd := stepDir(dir, step)
	m := &Manifest{FormatVersion: FormatVersion, Step: step, World: world, State: state, Committed: time.Now().UTC()}
	byName := map[string]int{}
	for rank := range world {
		b, err := os.ReadFile(filepath.Join(sd, fmt.Sprintf("rank-%05d.json", rank)))
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
			m.Tensors[i].Shards = append(m.Tensors[i].Shards, t.Shards...)
		}
	}
	b, err := json.MarshalIndent(m, "", " ")
	if err != nil {
		return nil, err
	}
	tmp := filepath.Join(sd, manifestName+".tmp")
	if err := writeFileSync(tmp, b); err != nil {
		return nil, err
	}
	if err := os.Rename(tmp, filepath.Join(sd, manifestName)); err != nil {
		return nil, err
	}
	if err := syncDir(sd); err != nil {
		return nil, err
	}
	return m, prune(dir, step, keep)
}

// prune removes committed checkpoints beyond the newest keep, and uncommitted ones older
// than the newest commit (saves that died half way).
func prune(dir string, newest int64, keep int) error {
	steps, err := listSteps(dir)
	if err != nil {
		return err
	}
	kept := 0
	for _, s := range steps { // newest first
		_, err := os.Stat(filepath.Join(stepDir(dir, s), manifestName))
		committed := err == nil
		switch {
		case s > newest:
		case committed && kept < keep:
			kept++
		default:
			if err := os.RemoveAll(stepDir(dir, s)); err != nil {
				return err
			}
		}
	}
	return nil
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
func Open(dir string, step int64) (*Checkpoint, error) {
	sd := stepDir(dir, step)
	b, err := os.ReadFile(filepath.Join(sd, manifestName))
	if errors.Is(err, os.ErrNotExist) {
		return nil, ErrNotCommitted
	}
	if err != nil {
		return nil, err
	}
	var m Manifest
	if err := json.Unmarshal(b, &m); err != nil {
		return nil, fmt.Errorf("unreadable manifest: %w", err)
	}
	if m.FormatVersion != FormatVersion {
		return nil, fmt.Errorf("format version %d, this worker reads %d", m.FormatVersion, FormatVersion)
	}
	if m.Step != step {
		return nil, fmt.Errorf("%s says step %d", manifestName, m.Step)
	}
	for _, t := range m.Tensors {
		if t.DType != "float32" {
			return nil, fmt.Errorf("tensor %s: dtype %s is not supported", t.Name, t.DType)
		}
		var total int64
		for _, sh := range t.Shards {
			total += sh.Count
		}
		if want := elements(t.Shape); total != want {
			return nil, fmt.Errorf("tensor %s: shards cover %d of %d elements", t.Name, total, want)
		}
	}
	return &Checkpoint{Dir: sd, Manifest: m}, nil
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

// readShard reads and verifies one shard.
func (c *Checkpoint) readShard(sh ShardMeta) ([]float32, error) {
	f, err := os.Open(filepath.Join(c.Dir, filepath.Base(sh.File)))
	if err != nil {
		return nil, err
	}
	defer func() { _ = f.Close() }()
	buf := make([]byte, 4*sh.Count)
	if _, err := f.ReadAt(buf, sh.FileOffset); err != nil {
		return nil, fmt.Errorf("rank %d's shard: %w", sh.Rank, err)
	}
	if got := crc32.Checksum(buf, castagnoli); got != sh.CRC32C {
		return nil, fmt.Errorf("rank %d's shard %s@%d: CRC32C %08x, manifest says %08x", sh.Rank, sh.File, sh.FileOffset, got, sh.CRC32C)
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
	if start < 0 || count < 0 || start+count > elements(t.Shape) {
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
