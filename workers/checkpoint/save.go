package checkpoint

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"hash/crc32"
	"io/fs"
	"math"
	"os"
	"path/filepath"
	"syscall"
	"time"
	"unsafe"
)

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
