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
		if rows < 0 || cols < 0 || len(b) < 4*rows*cols {
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
