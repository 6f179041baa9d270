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
	"fmt"
	"hash/crc32"
	"path/filepath"
	"time"
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
