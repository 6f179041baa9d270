// Package transport moves bytes between the ranks of a training job. TCP is the transport of
// tests and fake-GPU clusters: rendezvous at MASTER_ADDR:MASTER_PORT (rank 0 listens there),
// every rank registers the address it listens on, then each rank connects to the next one in
// the ring. The same interface is what an RCCL transport implements on GPUs.
package transport

import (
	"bufio"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"os"
	"slices"
	"sync"
	"time"
	"unsafe"
)

// maxFrame bounds one message (a key/value block of a long sequence fits easily).
const maxFrame = 1 << 31

// heartbeatLen is the length word of a heartbeat, a frame without a body: above maxFrame, so
// no data frame has it.
const heartbeatLen = math.MaxUint64

// DefaultPeerTimeout is Config.PeerTimeout when it is 0.
const DefaultPeerTimeout = 5 * time.Second

// heartbeatsPerTimeout is how many heartbeats a live peer sends per PeerTimeout: one late
// heartbeat (a busy scheduler, a slow link) does not make it silent.
const heartbeatsPerTimeout = 4

// writeChunk is the most written under one write deadline: a large frame on a slow link that
// keeps moving is not a silent peer.
const writeChunk = 256 << 10

// recheck is how long a read whose deadline passed looks once more before blaming the peer.
const recheck = 20 * time.Millisecond

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

// helloTimeout bounds how long a connection may take to say who it is.
const helloTimeout = 10 * time.Second

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

// conn is one connection to a peer: frames of a big-endian length and that many bytes, and
// heartbeats. Until watch, recv reads the socket itself (the rendezvous); from then on a
// reader goroutine drains it, so a peer's sends never wait on this rank's compute and only a
// silent peer stalls them.
type conn struct {
	c       net.Conn
	r       *bufio.Reader
	peer    int           // the rank at the other end, for errors
	timeout time.Duration // the peer's silence allowed (start); <= 0: unbounded
	wait    time.Duration // how long recv waits for a live peer's frame; <= 0: unbounded
	bounded bool          // reads wait at most timeout (set by watch)
	reading bool          // the reader goroutine owns r (set by watch)

	wmu  sync.Mutex // one writer at a time: a heartbeat never lands inside a frame
	werr error      // a failed write cut a frame short: every later send fails with it

	mu     sync.Mutex
	ready  *sync.Cond // frames or rerr changed
	frames [][]byte   // data read ahead, oldest first (the collectives' lockstep keeps it to a frame or two)
	rerr   error      // why the reader stopped

	stop     chan struct{} // closed to stop the heartbeats
	stopOnce sync.Once
	wg       sync.WaitGroup // the heartbeat sender and the reader
}

func newConn(nc net.Conn) *conn {
	c := &conn{c: nc, stop: make(chan struct{})}
	c.r = bufio.NewReaderSize(liveReader{c}, 1<<20)
	c.ready = sync.NewCond(&c.mu)
	return c
}

// liveReader reads c's socket; once c is bounded every read waits at most c.timeout, so any
// byte from the peer, heartbeat or data, proves it alive.
type liveReader struct{ c *conn }

func (l liveReader) Read(p []byte) (int, error) {
	c := l.c
	if !c.bounded {
		return c.c.Read(p)
	}
	_ = c.c.SetReadDeadline(time.Now().Add(c.timeout))
	n, err := c.c.Read(p)
	if n == 0 && errors.Is(err, os.ErrDeadlineExceeded) {
		// The deadline may have passed while this process itself did not run (stopped,
		// starved of CPU) with the peer's bytes already here: look once more.
		_ = c.c.SetReadDeadline(time.Now().Add(recheck))
		n, err = c.c.Read(p)
	}
	return n, err
}

// start names the peer at the other end and, with a timeout, sends it heartbeats until Close.
func (c *conn) start(peer int, timeout time.Duration) {
	c.peer, c.timeout = peer, timeout
	if timeout <= 0 {
		return
	}
	c.wg.Go(func() {
		tick := time.NewTicker(timeout / heartbeatsPerTimeout)
		defer tick.Stop()
		for {
			select {
			case <-c.stop:
				return
			case <-tick.C:
				if c.frame(heartbeatLen, nil) != nil {
					return
				}
			}
		}
	})
}

// watch hands the socket to a reader goroutine, which queues data frames for recv and, with a
// timeout, ends with ErrPeerSilent once the peer sends nothing for that long.
func (c *conn) watch() {
	if c.reading {
		return // a member watches rank 0 from the rendezvous on
	}
	c.bounded, c.reading = c.timeout > 0, true
	c.wg.Go(func() {
		for {
			b, err := c.readFrame()
			if err != nil && c.bounded && errors.Is(err, os.ErrDeadlineExceeded) {
				err = fmt.Errorf("%w: no heartbeat from rank %d for %v", ErrPeerSilent, c.peer, c.timeout)
			}
			c.mu.Lock()
			if err != nil {
				c.rerr = err
			} else {
				c.frames = append(c.frames, b)
			}
			c.ready.Broadcast()
			c.mu.Unlock()
			if err != nil {
				return
			}
		}
	})
}

// stopHeartbeats stops the heartbeat sender (Close; tests freeze a rank with it).
func (c *conn) stopHeartbeats() { c.stopOnce.Do(func() { close(c.stop) }) }

// Close closes the socket and waits for the connection's goroutines.
func (c *conn) Close() error {
	c.stopHeartbeats()
	err := c.c.Close()
	c.wg.Wait()
	return err
}

func (c *conn) send(b []byte) error {
	c.mu.Lock()
	silent := c.rerr
	c.mu.Unlock()
	if errors.Is(silent, ErrPeerSilent) {
		return silent // a peer that says nothing takes nothing either
	}
	return c.frame(uint64(len(b)), b)
}

// frame writes one frame: its length word (heartbeatLen for a heartbeat) and b.
func (c *conn) frame(n uint64, b []byte) error {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	if c.werr != nil {
		return c.werr
	}
	var hdr [8]byte
	binary.BigEndian.PutUint64(hdr[:], n)
	err := c.write(hdr[:])
	if err == nil {
		err = c.write(b)
	}
	if err != nil && c.timeout > 0 && errors.Is(err, os.ErrDeadlineExceeded) {
		err = fmt.Errorf("%w: rank %d took nothing sent to it for %v", ErrPeerSilent, c.peer, c.timeout)
	}
	c.werr = err
	return err
}

// write writes p; with a timeout, in chunks that must each leave within it.
func (c *conn) write(p []byte) error {
	for len(p) > 0 {
		n := len(p)
		if c.timeout > 0 {
			n = min(n, writeChunk)
			_ = c.c.SetWriteDeadline(time.Now().Add(c.timeout))
		}
		if _, err := c.c.Write(p[:n]); err != nil {
			return err
		}
		p = p[n:]
	}
	return nil
}

// recv returns the next data frame: read here until watch, then from the reader goroutine.
func (c *conn) recv() ([]byte, error) {
	if !c.reading {
		return c.readFrame()
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	late := false
	if c.wait > 0 && len(c.frames) == 0 && c.rerr == nil {
		timer := time.AfterFunc(c.wait, func() {
			c.mu.Lock()
			late = true
			c.ready.Broadcast()
			c.mu.Unlock()
		})
		defer timer.Stop()
	}
	for len(c.frames) == 0 && c.rerr == nil && !late {
		c.ready.Wait()
	}
	if len(c.frames) == 0 && c.rerr == nil {
		return nil, fmt.Errorf("%w: rank %d sent nothing for %v", ErrCollectiveTimeout, c.peer, c.wait)
	}
	if len(c.frames) == 0 {
		return nil, c.rerr
	}
	b := c.frames[0]
	c.frames[0] = nil
	c.frames = c.frames[1:]
	return b, nil
}

// readFrame reads the next data frame from the socket, passing over heartbeats.
func (c *conn) readFrame() ([]byte, error) {
	var hdr [8]byte
	for {
		if _, err := io.ReadFull(c.r, hdr[:]); err != nil {
			return nil, err
		}
		n := binary.BigEndian.Uint64(hdr[:])
		if n == heartbeatLen {
			continue
		}
		if n > maxFrame {
			return nil, fmt.Errorf("transport: frame of %d bytes is over the %d limit", n, maxFrame)
		}
		b := make([]byte, n)
		_, err := io.ReadFull(c.r, b)
		return b, err
	}
}

type hello struct {
	Rank  int    `json:"rank"`
	Addr  string `json:"addr,omitempty"`
	Token string `json:"token"`
	// World marks a connection of the ring of every rank, beside the rank's own ring.
	World bool `json:"world,omitempty"`
}

// greeted is a connection that said who it is.
type greeted struct {
	c  *conn
	nc net.Conn
	h  hello
}

// acceptGreeted accepts connections on l until ctx ends and hands on those whose hello (read
// within helloTimeout, each connection on its own, so a silent one delays nobody) presents
// token; the others are closed.
func acceptGreeted(ctx context.Context, l net.Listener, token string) <-chan greeted {
	out := make(chan greeted)
	go func() {
		for {
			nc, err := l.Accept()
			if err != nil {
				return // closed: the caller is done, or ctx ended
			}
			go func() {
				_ = nc.SetReadDeadline(time.Now().Add(helloTimeout))
				c := newConn(nc)
				b, err := c.recv()
				var h hello
				if err == nil {
					err = json.Unmarshal(b, &h)
				}
				if err != nil || h.Token != token {
					_ = nc.Close()
					return
				}
				_ = nc.SetReadDeadline(time.Time{})
				select {
				case out <- greeted{c, nc, h}:
				case <-ctx.Done():
					_ = nc.Close()
				}
			}()
		}
	}()
	return out
}

// rendezvousJoined runs on rank 0 each time a rank takes its place in the rendezvous (tests
// order a rank's second dial after its first).
var rendezvousJoined = func(rank int) {}

// Dial joins the job: it blocks until every rank has registered and the ring is connected.
func Dial(ctx context.Context, cfg Config) (*TCP, error) {
	if cfg.World < 1 || cfg.Rank < 0 || cfg.Rank >= cfg.World {
		return nil, fmt.Errorf("transport: rank %d of world %d", cfg.Rank, cfg.World)
	}
	if cfg.RingSize < 0 || (cfg.RingSize > 0 && cfg.World%cfg.RingSize != 0) {
		return nil, fmt.Errorf("transport: rings of %d ranks do not divide a world of %d", cfg.RingSize, cfg.World)
	}
	first, size := cfg.ring()
	next := first + (cfg.Rank-first+1)%size
	prevRank := first + (cfg.Rank-first+size-1)%size
	if cfg.Timeout == 0 {
		cfg.Timeout = 2 * time.Minute
	}
	if cfg.PeerTimeout == 0 {
		cfg.PeerTimeout = DefaultPeerTimeout
	}
	if err := ctx.Err(); err != nil { // the caller gave up already: take no port
		return nil, fmt.Errorf("transport: %s: %w", OpRendezvous, err)
	}
	parent := ctx
	ctx, cancel := context.WithTimeout(ctx, cfg.Timeout)
	defer cancel()
	// peer blames rank (-1: none in particular) for a rendezvous that could not go on, unless
	// the caller itself stopped waiting.
	peer := func(rank int, err error) error {
		if parent.Err() != nil {
			return fmt.Errorf("transport: %s: %w", OpRendezvous, err)
		}
		return &PeerError{Rank: rank, Op: OpRendezvous, Err: err}
	}
	t := &TCP{cfg: cfg, nextRank: next, prevRank: prevRank}
	ok := false
	defer func() {
		if !ok {
			_ = t.Close()
		}
	}()

	ring, err := net.Listen("tcp", cfg.Listen)
	if err != nil {
		return nil, fmt.Errorf("transport: listening for the ring: %w", err)
	}
	t.closers = append(t.closers, ring)
	stop := context.AfterFunc(ctx, func() { _ = ring.Close() })
	defer stop()

	addrs, err := t.rendezvous(ctx, ring.Addr().(*net.TCPAddr).Port, peer)
	if err != nil {
		return nil, err
	}
	// Connect the ring, and the world's where this ring is smaller: dial the next ranks while
	// accepting the previous ones (only they may take these ends).
	own := link{nextRank: next, prevRank: prevRank}
	var world *link
	if size < cfg.World {
		world = &link{nextRank: (cfg.Rank + 1) % cfg.World, prevRank: (cfg.Rank + cfg.World - 1) % cfg.World}
	}
	type acceptResult struct {
		own, world *conn
		err        error
	}
	accepted := make(chan acceptResult, 1)
	ringCtx, stopRing := context.WithCancel(ctx)
	defer stopRing()
	greetings := acceptGreeted(ringCtx, ring, cfg.Token)
	go func() {
		var res acceptResult
		for res.own == nil || (world != nil && res.world == nil) {
			select {
			case g := <-greetings:
				switch {
				case !g.h.World && g.h.Rank == prevRank && res.own == nil:
					res.own = g.c // its reader may hold what followed the hello
				case g.h.World && world != nil && g.h.Rank == world.prevRank && res.world == nil:
					res.world = g.c
				default:
					_ = g.nc.Close()
				}
			case <-ringCtx.Done():
				for _, c := range []*conn{res.own, res.world} {
					if c != nil {
						_ = c.Close()
					}
				}
				accepted <- acceptResult{err: ringCtx.Err()}
				return
			}
		}
		accepted <- res
	}()
	var d net.Dialer
	dialNext := func(to int, isWorld bool) (*conn, error) {
		nc, err := dialRetry(ctx, &d, addrs[to])
		if err != nil {
			return nil, peer(to, fmt.Errorf("rank %d dialing rank %d: %w", cfg.Rank, to, err))
		}
		c := newConn(nc)
		t.closers = append(t.closers, c)
		b, _ := json.Marshal(hello{Rank: cfg.Rank, Token: cfg.Token, World: isWorld})
		if err := c.send(b); err != nil {
			return nil, peer(to, fmt.Errorf("rank %d greeting rank %d: %w", cfg.Rank, to, err))
		}
		c.start(to, cfg.PeerTimeout)
		return c, nil
	}
	if own.next, err = dialNext(next, false); err != nil {
		return nil, err
	}
	if world != nil {
		if world.next, err = dialNext(world.nextRank, true); err != nil {
			return nil, err
		}
	}
	a := <-accepted
	if a.err != nil {
		return nil, peer(prevRank, fmt.Errorf("rank %d accepting rank %d: %w", cfg.Rank, prevRank, a.err))
	}
	own.prev = a.own
	t.closers = append(t.closers, own.prev)
	own.prev.start(prevRank, cfg.PeerTimeout)
	t.next, t.prev = own.next, own.prev
	if world != nil {
		world.prev = a.world
		t.closers = append(t.closers, world.prev)
		world.prev.start(world.prevRank, cfg.PeerTimeout)
		t.world = world
	}
	// Each peer's heartbeats began once it had greeted, or had sent the address table: from
	// here on a silent connection is a lost peer.
	conns := append([]*conn{t.master, t.next, t.prev}, t.members...)
	if t.world != nil {
		conns = append(conns, t.world.next, t.world.prev)
	}
	for _, c := range conns {
		if c != nil {
			c.wait = cfg.CollectiveTimeout
			c.watch()
		}
	}
	ok = true
	return t, nil
}

// rendezvous registers this rank's ring address with rank 0 and returns everyone's; peer
// makes the errors that other ranks caused.
func (t *TCP) rendezvous(ctx context.Context, ringPort int, peer func(rank int, err error) error) ([]string, error) {
	cfg := t.cfg
	if cfg.Rank == 0 {
		listen := cfg.MasterListen
		if listen == "" {
			_, port, err := net.SplitHostPort(cfg.Master)
			if err != nil {
				return nil, fmt.Errorf("transport: master address %q: %w", cfg.Master, err)
			}
			listen = net.JoinHostPort("", port)
		}
		l, err := net.Listen("tcp", listen)
		if err != nil {
			return nil, fmt.Errorf("transport: rank 0 listening on %s: %w", listen, err)
		}
		defer func() { _ = l.Close() }()
		stop := context.AfterFunc(ctx, func() { _ = l.Close() })
		defer stop()
		host, _, err := net.SplitHostPort(cfg.Master)
		if err != nil {
			return nil, err
		}
		addrs := make([]string, cfg.World)
		addrs[0] = net.JoinHostPort(host, fmt.Sprint(ringPort))
		t.members = make([]*conn, cfg.World)
		greetings := acceptGreeted(ctx, l, cfg.Token)
		for joined := 0; joined < cfg.World-1; {
			var g greeted
			select {
			case g = <-greetings:
			case <-ctx.Done():
				return nil, peer(-1, fmt.Errorf("%d of %d ranks joined: %w", joined+1, cfg.World, ctx.Err()))
			}
			if g.h.Rank <= 0 || g.h.Rank >= cfg.World {
				_ = g.nc.Close() // presents the token but names no rank: not this gang's to break
				continue
			}
			if old := t.members[g.h.Rank]; old != nil {
				// The rank was restarted in place and dialed again while the others were
				// still coming: its earlier connection belongs to a dead process. The newest
				// greeting takes the rank's place, which is counted once.
				_ = old.Close()
				t.closers = slices.DeleteFunc(t.closers, func(c io.Closer) bool { return c == old })
			} else {
				joined++
			}
			t.closers = append(t.closers, g.c)
			t.members[g.h.Rank], addrs[g.h.Rank] = g.c, g.h.Addr
			// Heartbeats from the moment a rank joins: while it waits for the others it can
			// tell a rank 0 that is only waiting too from one that froze.
			g.c.start(g.h.Rank, cfg.PeerTimeout)
			rendezvousJoined(g.h.Rank)
		}
		table, _ := json.Marshal(addrs)
		for r, c := range t.members[1:] {
			if err := c.send(table); err != nil {
				return nil, peer(r+1, err)
			}
		}
		return addrs, nil
	}

	var d net.Dialer
	nc, err := dialRetry(ctx, &d, cfg.Master)
	if err != nil {
		return nil, peer(0, fmt.Errorf("rank %d reaching the master %s: %w", cfg.Rank, cfg.Master, err))
	}
	t.master = newConn(nc)
	t.closers = append(t.closers, t.master)
	// Peers reach us at the address we reach the master from.
	host, _, _ := net.SplitHostPort(nc.LocalAddr().String())
	b, _ := json.Marshal(hello{Rank: cfg.Rank, Addr: net.JoinHostPort(host, fmt.Sprint(ringPort)), Token: cfg.Token})
	if err := t.master.send(b); err != nil {
		return nil, peer(0, err)
	}
	t.master.start(0, cfg.PeerTimeout)
	// Rank 0 sends heartbeats while the others join: one silent for PeerTimeout is frozen or
	// gone (its pod may be getting replaced), and waiting out the rendezvous timeout for it
	// would hold this rank that long; it stops instead, and its restart dials rank 0 anew.
	t.master.watch()
	type result struct {
		table []byte
		err   error
	}
	done := make(chan result, 1)
	go func() {
		b, err := t.master.recv()
		done <- result{b, err}
	}()
	select {
	case r := <-done:
		if r.err != nil {
			return nil, peer(0, r.err)
		}
		var addrs []string
		if err := json.Unmarshal(r.table, &addrs); err != nil {
			return nil, fmt.Errorf("transport: rendezvous: rank 0's address table: %w", err)
		}
		if len(addrs) != cfg.World {
			return nil, fmt.Errorf("transport: rendezvous: rank 0 sent %d addresses for %d ranks", len(addrs), cfg.World)
		}
		return addrs, nil
	case <-ctx.Done():
		return nil, peer(-1, fmt.Errorf("rank %d waiting for the other ranks: %w", cfg.Rank, ctx.Err()))
	}
}

// dialRetry dials until it connects or ctx ends: peers start in any order.
func dialRetry(ctx context.Context, d *net.Dialer, addr string) (net.Conn, error) {
	for {
		c, err := d.DialContext(ctx, "tcp", addr)
		if err == nil {
			return c, nil
		}
		select {
		case <-ctx.Done():
			return nil, errors.Join(ctx.Err(), err)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// Rank is this rank.
func (t *TCP) Rank() int { return t.cfg.Rank }

// World is the number of ranks.
func (t *TCP) World() int { return t.cfg.World }

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

// Gatherer is a transport with an all-gather of bytes; transports without one can gather
// through AllReduce.
type Gatherer interface {
	AllGather(part []byte) ([][]byte, error)
}

var _ Gatherer = (*TCP)(nil)

// Barrier returns once every rank has called it.
func (t *TCP) Barrier() error { return t.allReduce("barrier", nil) }

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
