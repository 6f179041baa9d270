package checkpoint

import (
	"bytes"
	"encoding/json"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// fuzzSizes are the files the fuzzed manifests' step directory holds: 4 ranks' shards of
// attempt 0, 256 bytes each.
func fuzzSizes(name string) (int64, error) {
	for r := range 4 {
		if name == shardName(r, 0) {
			return 256, nil
		}
	}
	return 0, fs.ErrNotExist
}

// goodManifest is a valid manifest over fuzzSizes' files: "w" 8x8 in 4 shards, "b" 16 in 1.
func goodManifest() Manifest {
	m := Manifest{FormatVersion: FormatVersion, Step: 12, World: 4, Attempt: 0}
	w := TensorMeta{Name: "w", DType: "float32", Shape: []int64{8, 8}}
	for r := range 4 {
		w.Shards = append(w.Shards, ShardMeta{Rank: r, File: shardName(r, 0), Start: int64(16 * r), Count: 16})
	}
	b := TensorMeta{Name: "b", DType: "float32", Shape: []int64{16}, Shards: []ShardMeta{{Rank: 0, File: shardName(0, 0), FileOffset: 64, Count: 16}}}
	m.Tensors = []TensorMeta{w, b}
	return m
}

func TestManifestValidation(t *testing.T) {
	if m := goodManifest(); m.validate(fuzzSizes) != nil {
		t.Fatalf("the good manifest is invalid: %v", m.validate(fuzzSizes))
	}
	cases := []struct {
		name, wants string
		edit        func(m *Manifest)
	}{
		{"format", "format version 2", func(m *Manifest) { m.FormatVersion = 2 }},
		{"world 0", "world 0 is outside 1..65536", func(m *Manifest) { m.World = 0 }},
		{"world too big", "world 65537 is outside", func(m *Manifest) { m.World = 65537 }},
		{"empty name", "tensor 1: the name is empty", func(m *Manifest) { m.Tensors[1].Name = "" }},
		{"duplicate name", `tensor "w": the name is not unique`, func(m *Manifest) { m.Tensors[1].Name = "w" }},
		{"dtype", `dtype "float16" is not known`, func(m *Manifest) { m.Tensors[0].DType = "float16" }},
		{"zero dim", "a dimension is not positive", func(m *Manifest) { m.Tensors[0].Shape = []int64{8, 0} }},
		{"negative dim", "a dimension is not positive", func(m *Manifest) { m.Tensors[0].Shape = []int64{-8, -8} }},
		{"overflowing shape", "over the bound of", func(m *Manifest) { m.Tensors[0].Shape = []int64{1 << 40, 1 << 40} }},
		{"negative count", "count -16 is not positive", func(m *Manifest) { m.Tensors[0].Shards[1].Count = -16 }},
		{"zero count", "count 0 is not positive", func(m *Manifest) { m.Tensors[0].Shards[1].Count = 0 }},
		{"negative start", "outside the tensor's 64", func(m *Manifest) { m.Tensors[0].Shards[0].Start = -1 }},
		{"gap", "no shard holds elements [32, 48)", func(m *Manifest) { m.Tensors[0].Shards = slices3(m.Tensors[0].Shards) }},
		{"overlap", "shards overlap at element 16", func(m *Manifest) { m.Tensors[0].Shards[1].Start = 16; m.Tensors[0].Shards[0].Count = 17 }},
		{"short cover", "no shard holds elements [60, 64)", func(m *Manifest) { m.Tensors[0].Shards[3].Count = 12 }},
		{"past the end", "outside the tensor's 64", func(m *Manifest) { m.Tensors[0].Shards[3].Count = 17 }},
		{"negative offset", "the file offset is negative", func(m *Manifest) { m.Tensors[1].Shards[0].FileOffset = -4 }},
		{"past the file", "run past the end of the 256-byte file", func(m *Manifest) { m.Tensors[1].Shards[0].FileOffset = 250 }},
		{"huge offset", "run past the end", func(m *Manifest) { m.Tensors[1].Shards[0].FileOffset = 1<<63 - 1 }},
		{"path", `"../rank-00000.a0.bin" is not a plain name`, func(m *Manifest) { m.Tensors[1].Shards[0].File = "../rank-00000.a0.bin" }},
		{"slash", "is not a plain name", func(m *Manifest) { m.Tensors[1].Shards[0].File = "x/rank-00000.a0.bin" }},
		{"other attempt's file", "is not rank 0's of attempt 0", func(m *Manifest) { m.Tensors[1].Shards[0].File = shardName(0, 1) }},
		{"missing file", "the file is missing", func(m *Manifest) {
			m.World = 5
			m.Tensors[1].Shards[0].Rank, m.Tensors[1].Shards[0].File = 4, shardName(4, 0)
		}},
		{"rank outside world", "rank 4 is outside [0, 4)", func(m *Manifest) { m.Tensors[1].Shards[0].Rank = 4 }},
		{"negative rank", "rank -1 is outside", func(m *Manifest) { m.Tensors[1].Shards[0].Rank = -1 }},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			m := goodManifest()
			c.edit(&m)
			if err := m.validate(fuzzSizes); err == nil || !strings.Contains(err.Error(), c.wants) {
				t.Errorf("err = %v, want %q", err, c.wants)
			}
		})
	}
}

func slices3(s []ShardMeta) []ShardMeta { return []ShardMeta{s[0], s[1], s[3]} }

// TestOpenNamesTheFileAndNeverPanics: a committed manifest edited on disk (a negative shard
// count used to panic the loader) is refused with the file's name and the rule.
func TestOpenNamesTheFileAndNeverPanics(t *testing.T) {
	dir := t.TempDir()
	save(t, dir, 100, 2, 3, true)
	path := filepath.Join(stepDir(dir, 100), manifestName(0))
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var m Manifest
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatal(err)
	}
	m.Tensors[0].Shards[0].Count = -3
	b, _ = json.Marshal(m)
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
	_, err = Open(dir, 100)
	if err == nil || !strings.Contains(err.Error(), "step-000000000100/manifest.a0.json") || !strings.Contains(err.Error(), "count -3 is not positive") {
		t.Errorf("Open = %v", err)
	}
	if !errors.Is(err, ErrCorrupt) {
		t.Errorf("an invalid manifest is not ErrCorrupt: %v", err)
	}
	if ck, _, _ := Latest(dir); ck != nil {
		t.Error("an invalid manifest was loaded")
	}
}

// FuzzManifest: whatever the manifest bytes, decoding and validation never panic, what they
// accept reads without panicking or allocating more than the files hold, and it round-trips.
func FuzzManifest(f *testing.F) {
	good, _ := json.Marshal(goodManifest())
	f.Add(good)
	for _, edit := range []func(m *Manifest){
		func(m *Manifest) { m.Tensors[0].Shards[1].Count = -16 },
		func(m *Manifest) { m.Tensors[0].Shape = []int64{1 << 40, 1 << 40} },
		func(m *Manifest) { m.Tensors[1].Shards[0].File = "../../etc/passwd" },
		func(m *Manifest) { m.Tensors[0].Shards[1].Start = 16; m.Tensors[0].Shards[0].Count = 17 },
		func(m *Manifest) { m.Tensors[1].Shards[0].FileOffset = 1<<63 - 1 },
		func(m *Manifest) { m.World = 0 },
	} {
		m := goodManifest()
		edit(&m)
		b, _ := json.Marshal(m)
		f.Add(b)
	}
	f.Add([]byte(`{"formatVersion":1,"world":1,"tensors":[{"name":"x","dtype":"float32","shape":[4611686018427387904],"shards":[{"rank":0,"file":"rank-00000.a0.bin","count":4611686018427387904}]}]}`))
	f.Add([]byte(`{"formatVersion":1`))
	f.Add([]byte(`null`))

	dir := f.TempDir()
	sd := stepDir(dir, 12)
	if err := os.MkdirAll(sd, 0o755); err != nil {
		f.Fatal(err)
	}
	for r := range 4 {
		if err := os.WriteFile(filepath.Join(sd, shardName(r, 0)), bytes.Repeat([]byte{byte(r)}, 256), 0o644); err != nil {
			f.Fatal(err)
		}
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := decodeManifest(b)
		if err != nil {
			return
		}
		if err := m.validate(fuzzSizes); err != nil {
			return
		}
		c := &Checkpoint{Dir: sd, Manifest: *m}
		for _, tm := range m.Tensors {
			n := c.Elements(tm.Name)
			if n > 64*int64(len(tm.Shards)) { // a shard holds at most its file's 64 elements
				t.Fatalf("tensor %s: %d elements accepted from at most %d shards of 256 bytes", tm.Name, n, len(tm.Shards))
			}
			_, _ = c.Read(tm.Name, 0, n) // CRCs mostly fail; it must not panic
		}
		again, err := json.Marshal(m)
		if err != nil {
			t.Fatal(err)
		}
		m2, err := decodeManifest(again)
		if err != nil {
			t.Fatalf("round trip: %v", err)
		}
		if err := m2.validate(fuzzSizes); err != nil {
			t.Fatalf("round trip: %v", err)
		}
		if again2, _ := json.Marshal(m2); !bytes.Equal(again, again2) {
			t.Fatalf("round trip changed the manifest:\n%s\n%s", again, again2)
		}
	})
}
