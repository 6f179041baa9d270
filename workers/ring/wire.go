package ring

import (
	"encoding/binary"
	"fmt"
	"math"

	"github.com/zaya-operator/zaya-operator/workers/attention"
)

// ByteExchanger passes a message to the next rank and returns the previous rank's, as the
// TCP and RCCL transports do.
type ByteExchanger interface {
	Exchange(b []byte) ([]byte, error)
}

// Over adapts a byte transport to Exchange: a key/value block travels as rows, cols and the
// float32 bits of k then v.
func Over(x ByteExchanger) Exchange {
	return func(k, v attention.Matrix) (attention.Matrix, attention.Matrix, error) {
		got, err := x.Exchange(encodeKV(k, v))
		if err != nil {
			return attention.Matrix{}, attention.Matrix{}, err
		}
		return decodeKV(got)
	}
}

func encodeKV(k, v attention.Matrix) []byte {
	b := make([]byte, 0, 16+4*(len(k.Data)+len(v.Data)))
	for _, m := range []attention.Matrix{k, v} {
		b = binary.BigEndian.AppendUint32(b, uint32(m.Rows))
		b = binary.BigEndian.AppendUint32(b, uint32(m.Cols))
		for _, x := range m.Data {
			b = binary.BigEndian.AppendUint32(b, math.Float32bits(x))
		}
	}
	return b
}

func decodeKV(b []byte) (attention.Matrix, attention.Matrix, error) {
	var out [2]attention.Matrix
	for i := range out {
		if len(b) < 8 {
			return attention.Matrix{}, attention.Matrix{}, fmt.Errorf("ring: truncated block header")
		}
		rows, cols := int(binary.BigEndian.Uint32(b)), int(binary.BigEndian.Uint32(b[4:]))
		b = b[8:]
		if !fits(rows, cols, 4, len(b)) {
			return attention.Matrix{}, attention.Matrix{}, fmt.Errorf("ring: block of %dx%d does not fit %d bytes", rows, cols, len(b))
		}
		m := attention.NewMatrix(rows, cols)
		for j := range m.Data {
			m.Data[j] = math.Float32frombits(binary.BigEndian.Uint32(b[4*j:]))
		}
		out[i], b = m, b[4*rows*cols:]
	}
	if len(b) != 0 {
		return attention.Matrix{}, attention.Matrix{}, fmt.Errorf("ring: %d stray bytes after a block", len(b))
	}
	return out[0], out[1], nil
}

// OverBlocks adapts a byte transport to BlockExchange for the backward pass: the key/value
// block as in Over, then its gradients as rows, cols and float64 bits.
func OverBlocks(x ByteExchanger) BlockExchange {
	return func(b Block) (Block, error) {
		got, err := x.Exchange(encodeBlock(b))
		if err != nil {
			return Block{}, err
		}
		return decodeBlock(got)
	}
}

func encodeBlock(b Block) []byte {
	msg := encodeKV(b.K, b.V)
	for _, g := range []attention.Grad{b.DK, b.DV} {
		msg = binary.BigEndian.AppendUint32(msg, uint32(g.Rows))
		msg = binary.BigEndian.AppendUint32(msg, uint32(g.Cols))
		for _, x := range g.Data {
			msg = binary.BigEndian.AppendUint64(msg, math.Float64bits(x))
		}
	}
	return msg
}

func decodeBlock(b []byte) (Block, error) {
	// The key/value part has the same layout as encodeKV; find where it ends.
	kvLen := 0
	for range 2 {
		if len(b) < kvLen+8 {
			return Block{}, fmt.Errorf("ring: truncated block")
		}
		rows, cols := int(binary.BigEndian.Uint32(b[kvLen:])), int(binary.BigEndian.Uint32(b[kvLen+4:]))
		if !fits(rows, cols, 4, len(b)-kvLen-8) {
			return Block{}, fmt.Errorf("ring: truncated block")
		}
		kvLen += 8 + 4*rows*cols
	}
	k, v, err := decodeKV(b[:kvLen])
	if err != nil {
		return Block{}, err
	}
	rest := b[kvLen:]
	var grads [2]attention.Grad
	for i := range grads {
		if len(rest) < 8 {
			return Block{}, fmt.Errorf("ring: truncated gradient header")
		}
		rows, cols := int(binary.BigEndian.Uint32(rest)), int(binary.BigEndian.Uint32(rest[4:]))
		rest = rest[8:]
		if !fits(rows, cols, 8, len(rest)) {
			return Block{}, fmt.Errorf("ring: gradient of %dx%d does not fit %d bytes", rows, cols, len(rest))
		}
		g := attention.NewGrad(rows, cols)
		for j := range g.Data {
			g.Data[j] = math.Float64frombits(binary.BigEndian.Uint64(rest[8*j:]))
		}
		grads[i], rest = g, rest[8*rows*cols:]
	}
	if len(rest) != 0 {
		return Block{}, fmt.Errorf("ring: %d stray bytes after a block", len(rest))
	}
	return Block{K: k, V: v, DK: grads[0], DV: grads[1]}, nil
}

// fits reports whether rows×cols elements of size bytes fit in n bytes, without the
// overflow of multiplying sizes read off the wire (a stray peer's bytes must give an error,
// not a panic).
func fits(rows, cols, size, n int) bool {
	if rows < 0 || cols < 0 || n < 0 {
		return false
	}
	return cols == 0 || rows <= n/size/cols
}
