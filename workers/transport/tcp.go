// Package transport moves bytes between the ranks of a training job. TCP is the transport of
// tests and fake-GPU clusters: rendezvous at MASTER_ADDR:MASTER_PORT (rank 0 listens there),
// every rank registers the address it listens on, then each rank connects to the next one in
// the ring. The same interface is what an RCCL transport implements on GPUs.
package transport

import (
	"errors"
	"fmt"
	"io"
	"time"
)

// DefaultPeerTimeout is Config.PeerTimeout when it is 0.
const DefaultPeerTimeout = 5 * time.Second

// ErrPeerSilent is in the PeerError of a peer that for PeerTimeout sent nothing, not even a
// heartbeat, or took nothing this rank sent: its process is frozen (SIGSTOP, a hung driver)
// or its host or the network is gone, while its sockets stay open and TCP reports nothing.
var ErrPeerSilent = errors.New("peer silent")

// ErrCollectiveTimeout is in the PeerError of a peer that stayed alive (heartbeats) but sent
// nothing a collective waited for within CollectiveTimeout: a rank stuck in its own code, or
// one that took another path through the program.
var ErrCollectiveTimeout = errors.New("collective timeout")

// Config says who this rank is and where rendezvous happens.
type Config struct {
	Rank, World int
	// Master is rank 0's rendezvous address, host:port (MASTER_ADDR:MASTER_PORT).
	Master string
	// MasterListen is where rank 0 listens for the rendezvous; empty: every interface, at
	// Master's port (a pod's own name may not resolve to it yet, or at all, inside the pod).
	MasterListen string
	// Listen is where this rank accepts its ring neighbour (":0" picks a port); the address
	// peers dial is the one this rank reaches the master from, with this port.
	Listen string
	// Timeout bounds rendezvous (default 2 minutes).
	Timeout time.Duration
	// RingSize splits the world into rings of consecutive ranks (context-parallel groups);
	// Exchange passes messages around this rank's ring. 0 means one ring of every rank.
	RingSize int
	// Token is what every rank of this gang, and nothing else, knows (the job's UID and the
	// attempt): a connection that does not present it — a stray client, another job's or an
	// older attempt's rank — is dropped instead of joining or breaking the rendezvous.
	Token string
	// PeerTimeout bounds how long a peer may stay silent once its connection is up (0:
	// DefaultPeerTimeout; negative: no bound). Every connection carries heartbeats both ways,
	// sent whatever the rank computes, so only a frozen process or a lost host or network
	// falls silent; a collective with it then fails with a PeerError wrapping ErrPeerSilent
	// instead of waiting forever. A peer that is alive but late to a collective is waited
	// for, up to CollectiveTimeout.
	PeerTimeout time.Duration
	// CollectiveTimeout bounds how long a collective waits for a live peer's part
	// (ZAYA_COLLECTIVE_TIMEOUT); 0: no bound.
	CollectiveTimeout time.Duration
}

// PeerError is a failure that another rank caused, not this one: a peer closed its connection
// or died during a collective, sent what no rank of the gang sends, or the rendezvous ended
// before every rank came. A rank that fails with one stopped because of a peer; its own
// faults are other errors. The worker tells the two apart by it (exit 75 against exit 1).
type PeerError struct {
	Rank int    // the peer; -1 when no one rank is to blame (RCCL, a rendezvous short of ranks)
	Op   string // OpRendezvous (Dial), or the collective: "all-reduce", "barrier", "all-gather", "exchange"
	Err  error
}

// OpRendezvous is the PeerError.Op of a failure while the gang forms (Dial).
const OpRendezvous = "rendezvous"

func (e *PeerError) Error() string {
	if e.Rank < 0 {
		return fmt.Sprintf("transport: %s: %v", e.Op, e.Err)
	}
	return fmt.Sprintf("transport: %s with rank %d: %v", e.Op, e.Rank, e.Err)
}

func (e *PeerError) Unwrap() error { return e.Err }

// ring is the first rank and the size of rank's ring.
func (c Config) ring() (first, size int) {
	size = c.RingSize
	if size <= 0 {
		size = c.World
	}
	return c.Rank - c.Rank%size, size
}

// TCP is one rank's connections: to the master (rank 0 keeps one per rank) for collectives
// and to its ring neighbours for exchanges.
type TCP struct {
	cfg                Config
	master             *conn   // ranks > 0: to rank 0
	members            []*conn // rank 0: from every rank, by rank
	next, prev         *conn
	nextRank, prevRank int
	// world is the ring of every rank, for the ring all-reduce, where this rank's ring is
	// smaller (context parallelism); nil where it is the whole world.
	world   *link
	closers []io.Closer
}

// link is a rank's two neighbours on a ring.
type link struct {
	next, prev         *conn
	nextRank, prevRank int
}

// Rank is this rank.
func (t *TCP) Rank() int { return t.cfg.Rank }

// World is the number of ranks.
func (t *TCP) World() int { return t.cfg.World }

// Gatherer is a transport with an all-gather of bytes; transports without one can gather
// through AllReduce.
type Gatherer interface {
	AllGather(part []byte) ([][]byte, error)
}

var _ Gatherer = (*TCP)(nil)

// Close closes every connection.
func (t *TCP) Close() error {
	var errs []error
	for _, c := range t.closers {
		errs = append(errs, c.Close())
	}
	t.closers = nil
	return errors.Join(errs...)
}

// Transport is what training needs from the collectives: exchanges around this rank's ring
// (its context-parallel group) and all-reduce and barrier over the world. TCP implements it
// everywhere; workers/rocm implements it on RCCL.
type Transport interface {
	Rank() int
	World() int
	Exchange(b []byte) ([]byte, error)
	AllReduce(v []float64) error
	Barrier() error
	Close() error
}

var _ Transport = (*TCP)(nil)
