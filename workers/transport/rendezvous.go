package transport

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"slices"
	"time"
)

// helloTimeout bounds how long a connection may take to say who it is.
const helloTimeout = 10 * time.Second

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
