package ring

import (
	"bytes"
	"encoding/binary"
	"math/rand/v2"
	"testing"

	"github.com/zaya-operator/zaya-operator/workers/attention"
)

func randomGrad(r *rand.Rand, rows, cols int) attention.Grad {
	g := attention.NewGrad(rows, cols)
	for i := range g.Data {
		g.Data[i] = r.NormFloat64()
	}
	return g
}

// garbage frames a worker can receive when something that is not its ring neighbour
// connects: a rendezvous hello, and headers whose sizes overflow.
func garbage() [][]byte {
	huge := binary.BigEndian.AppendUint32(binary.BigEndian.AppendUint32(nil, 0xffffffff), 0xffffffff)
	return [][]byte{
		[]byte(`{"rank":2,"addr":"127.0.0.1:40846"}`),
		huge,
		append(binary.BigEndian.AppendUint32(binary.BigEndian.AppendUint32(nil, 0), 0), huge...),
		binary.BigEndian.AppendUint32(binary.BigEndian.AppendUint32(nil, 0x40000000), 4),
		{},
	}
}

// FuzzDecodeKV: decoding any bytes returns an error or blocks that encode back to exactly
// those bytes, with every element accounted for.
func FuzzDecodeKV(f *testing.F) {
	r := rand.New(rand.NewPCG(1, 2))
	f.Add(encodeKV(randomMatrix(r, 3, 2), randomMatrix(r, 3, 2)))
	f.Add(encodeKV(randomMatrix(r, 0, 5), randomMatrix(r, 1, 0)))
	for _, g := range garbage() {
		f.Add(g)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		k, v, err := decodeKV(b)
		if err != nil {
			return
		}
		for _, m := range []attention.Matrix{k, v} {
			if m.Rows < 0 || m.Cols < 0 || len(m.Data) != m.Rows*m.Cols {
				t.Fatalf("decoded a %dx%d block with %d elements", m.Rows, m.Cols, len(m.Data))
			}
		}
		if again := encodeKV(k, v); !bytes.Equal(again, b) {
			t.Fatalf("decode then encode changed the message:\n%x\n%x", b, again)
		}
	})
}

// FuzzDecodeBlock: the same for the backward pass's blocks with their gradients.
func FuzzDecodeBlock(f *testing.F) {
	r := rand.New(rand.NewPCG(3, 4))
	f.Add(encodeBlock(Block{K: randomMatrix(r, 2, 3), V: randomMatrix(r, 2, 3), DK: randomGrad(r, 2, 3), DV: randomGrad(r, 2, 3)}))
	f.Add(encodeBlock(Block{K: randomMatrix(r, 1, 5), V: randomMatrix(r, 1, 5), DK: randomGrad(r, 1, 5), DV: randomGrad(r, 1, 5)}))
	f.Add(encodeBlock(Block{}))
	for _, g := range garbage() {
		f.Add(g)
		f.Add(append(encodeKV(randomMatrix(r, 1, 1), randomMatrix(r, 1, 1)), g...))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		blk, err := decodeBlock(b)
		if err != nil {
			return
		}
		for _, m := range []attention.Matrix{blk.K, blk.V} {
			if m.Rows < 0 || m.Cols < 0 || len(m.Data) != m.Rows*m.Cols {
				t.Fatalf("decoded a %dx%d block with %d elements", m.Rows, m.Cols, len(m.Data))
			}
		}
		for _, g := range []attention.Grad{blk.DK, blk.DV} {
			if g.Rows < 0 || g.Cols < 0 || len(g.Data) != g.Rows*g.Cols {
				t.Fatalf("decoded a %dx%d gradient with %d elements", g.Rows, g.Cols, len(g.Data))
			}
		}
		if again := encodeBlock(blk); !bytes.Equal(again, b) {
			t.Fatalf("decode then encode changed the message:\n%x\n%x", b, again)
		}
	})
}

// TestWireRoundTrip: blocks survive the wire bit for bit.
func TestWireRoundTrip(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 6))
	want := Block{K: randomMatrix(r, 4, 3), V: randomMatrix(r, 4, 3), DK: randomGrad(r, 4, 3), DV: randomGrad(r, 4, 3)}
	got, err := decodeBlock(encodeBlock(want))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(encodeBlock(got), encodeBlock(want)) || got.K.Rows != 4 || got.DV.Cols != 3 {
		t.Fatalf("round trip changed the block: %+v", got)
	}
	k, v, err := decodeKV(encodeKV(want.K, want.V))
	if err != nil || !bytes.Equal(encodeKV(k, v), encodeKV(want.K, want.V)) {
		t.Fatalf("key/value round trip: %v", err)
	}
}
