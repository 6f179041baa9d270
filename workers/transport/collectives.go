package transport

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"sync"
	"unsafe"
)

// Exchange sends b to the next rank and returns what the previous rank sent. Sending and
// receiving run at once, so a full ring never deadlocks.
func (t *TCP) Exchange(b []byte) ([]byte, error) {
	return exchange(link{next: t.next, prev: t.prev, nextRank: t.nextRank, prevRank: t.prevRank}, "exchange", b)
}

// exchange sends b to l's next rank and returns what its previous rank sent; op names it in
// a PeerError.
func exchange(l link, op string, b []byte) ([]byte, error) {
	sent := make(chan error, 1)
	go func() { sent <- l.next.send(b) }()
	got, rerr := l.prev.recv()
	if err := <-sent; err != nil {
		return nil, &PeerError{Rank: l.nextRank, Op: op, Err: fmt.Errorf("sending: %w", err)}
	}
	if rerr != nil {
		return nil, &PeerError{Rank: l.prevRank, Op: op, Err: fmt.Errorf("receiving: %w", rerr)}
	}
	return got, nil
}

// AllReduce sums v element-wise over all ranks, in place. Every rank gets the same bits,
// the same on every run of the same shape: a vector of ringAllReduceMin bytes or more goes
// around the ring of every rank (ringAllReduce); a smaller one through rank 0, which adds in
// rank order and sends the result back.
func (t *TCP) AllReduce(v []float64) error {
	if t.cfg.World > 1 && 8*len(v) >= ringAllReduceMin {
		return t.ringAllReduce(v)
	}
	return t.allReduce("all-reduce", v)
}

// ringAllReduceMin is the vector size, in bytes, from which the ring beats the star: the ring
// takes 2(P-1) steps of a P-th of the vector, the star 2 steps of all of it through rank 0.
const ringAllReduceMin = 64 << 10

// worldLink is this rank's place on the ring of every rank: its own ring where that is the
// whole world.
func (t *TCP) worldLink() link {
	if t.world != nil {
		return *t.world
	}
	return link{next: t.next, prev: t.prev, nextRank: t.nextRank, prevRank: t.prevRank}
}

// ringAllReduce is the bandwidth-optimal all-reduce: a reduce-scatter (P-1 steps, each rank
// passing one P-th of the vector to the next rank and adding the one from the previous)
// then an all-gather (P-1 steps passing the reduced parts on). Each rank sends and receives
// 2(P-1)/P of the vector, whatever P, little-endian as it lies in memory. Part c is summed in
// ring order from rank c+1, the same order on every run, and copied, so every rank has the
// same bits.
func (t *TCP) ringAllReduce(v []float64) error {
	world, rank, l := t.cfg.World, t.cfg.Rank, t.worldLink()
	part := func(c int) []float64 {
		c = ((c % world) + world) % world
		return v[c*len(v)/world : (c+1)*len(v)/world]
	}
	for s := range world - 1 { // reduce-scatter
		out, in := part(rank-s), part(rank-s-1)
		b, err := exchange(l, "all-reduce", floatBytes(out))
		if err != nil {
			return err
		}
		if len(b) != 8*len(in) {
			return &PeerError{Rank: l.prevRank, Op: "all-reduce", Err: fmt.Errorf("sent %d bytes for a part of %d values", len(b), len(in))}
		}
		for i := range in {
			in[i] += math.Float64frombits(binary.LittleEndian.Uint64(b[8*i:]))
		}
	}
	for s := range world - 1 { // all-gather
		out, in := part(rank+1-s), part(rank-s)
		b, err := exchange(l, "all-reduce", floatBytes(out))
		if err != nil {
			return err
		}
		if len(b) != 8*len(in) {
			return &PeerError{Rank: l.prevRank, Op: "all-reduce", Err: fmt.Errorf("sent %d bytes for a part of %d values", len(b), len(in))}
		}
		setFloats(in, b)
	}
	return nil
}

// littleEndian says whether this machine keeps a float64 as its little-endian bytes: then
// a vector is sent as it lies in memory, without a copy.
var littleEndian = binary.NativeEndian.Uint16([]byte{1, 0}) == 1

// floatBytes is v's little-endian bytes: v's own memory on a little-endian machine.
func floatBytes(v []float64) []byte {
	if len(v) == 0 {
		return nil
	}
	if littleEndian {
		return unsafe.Slice((*byte)(unsafe.Pointer(&v[0])), 8*len(v))
	}
	b := make([]byte, 8*len(v))
	for i, x := range v {
		binary.LittleEndian.PutUint64(b[8*i:], math.Float64bits(x))
	}
	return b
}

// setFloats sets v from little-endian bytes b (8 per value).
func setFloats(v []float64, b []byte) {
	if littleEndian && len(v) > 0 {
		copy(unsafe.Slice((*byte)(unsafe.Pointer(&v[0])), 8*len(v)), b)
		return
	}
	for i := range v {
		v[i] = math.Float64frombits(binary.LittleEndian.Uint64(b[8*i:]))
	}
}

// allReduce is the all-reduce through rank 0; op names it in a PeerError.
func (t *TCP) allReduce(op string, v []float64) error {
	enc := func(v []float64) []byte {
		b := make([]byte, 8*len(v))
		for i, x := range v {
			binary.BigEndian.PutUint64(b[8*i:], math.Float64bits(x))
		}
		return b
	}
	dec := func(b []byte, v []float64) error {
		if len(b) != 8*len(v) {
			return fmt.Errorf("transport: all-reduce of %d values got %d bytes", len(v), len(b))
		}
		for i := range v {
			v[i] = math.Float64frombits(binary.BigEndian.Uint64(b[8*i:]))
		}
		return nil
	}
	if t.cfg.World == 1 {
		return nil
	}
	if t.cfg.Rank != 0 {
		if err := t.master.send(enc(v)); err != nil {
			return &PeerError{Rank: 0, Op: op, Err: err}
		}
		b, err := t.master.recv()
		if err != nil {
			return &PeerError{Rank: 0, Op: op, Err: err}
		}
		return dec(b, v)
	}
	parts := make([][]float64, t.cfg.World)
	for r := 1; r < t.cfg.World; r++ {
		b, err := t.members[r].recv()
		if err != nil {
			return &PeerError{Rank: r, Op: op, Err: err}
		}
		parts[r] = make([]float64, len(v))
		if err := dec(b, parts[r]); err != nil {
			return err
		}
	}
	for r := 1; r < t.cfg.World; r++ {
		for i := range v {
			v[i] += parts[r][i]
		}
	}
	out := enc(v)
	for r := 1; r < t.cfg.World; r++ {
		if err := t.members[r].send(out); err != nil {
			return &PeerError{Rank: r, Op: op, Err: err}
		}
	}
	return nil
}

// AllGather gives every rank every rank's part, by rank, through rank 0: each part crosses
// the network once to rank 0 and once to each other rank, as bytes (no float64 widening).
func (t *TCP) AllGather(part []byte) ([][]byte, error) {
	world := t.cfg.World
	if world == 1 {
		return [][]byte{part}, nil
	}
	if t.cfg.Rank != 0 {
		if err := t.master.send(part); err != nil {
			return nil, &PeerError{Rank: 0, Op: "all-gather", Err: err}
		}
		b, err := t.master.recv()
		if err != nil {
			return nil, &PeerError{Rank: 0, Op: "all-gather", Err: err}
		}
		return splitParts(b, world)
	}
	parts := make([][]byte, world)
	parts[0] = part
	total := 8 * world
	for r := 1; r < world; r++ {
		b, err := t.members[r].recv()
		if err != nil {
			return nil, &PeerError{Rank: r, Op: "all-gather", Err: err}
		}
		parts[r] = b
		total += len(b)
	}
	if total > maxFrame {
		return nil, fmt.Errorf("transport: all-gather of %d bytes is over the %d limit", total, maxFrame)
	}
	out := make([]byte, 0, total)
	for _, p := range parts {
		out = binary.BigEndian.AppendUint64(out, uint64(len(p)))
	}
	for _, p := range parts {
		out = append(out, p...)
	}
	errs := make([]error, world)
	var wg sync.WaitGroup
	for r := 1; r < world; r++ {
		wg.Go(func() {
			if err := t.members[r].send(out); err != nil {
				errs[r] = &PeerError{Rank: r, Op: "all-gather", Err: err}
			}
		})
	}
	wg.Wait()
	return parts, errors.Join(errs...)
}

// splitParts undoes AllGather's message: world lengths, then the parts.
func splitParts(b []byte, world int) ([][]byte, error) {
	if len(b) < 8*world {
		return nil, fmt.Errorf("transport: all-gather message of %d bytes for %d ranks", len(b), world)
	}
	parts := make([][]byte, world)
	off := uint64(8 * world)
	for r := range world {
		n := binary.BigEndian.Uint64(b[8*r:])
		if n > uint64(len(b))-off {
			return nil, fmt.Errorf("transport: all-gather message is shorter than its parts")
		}
		parts[r] = b[off : off+n]
		off += n
	}
	return parts, nil
}

// Barrier returns once every rank has called it.
func (t *TCP) Barrier() error { return t.allReduce("barrier", nil) }
