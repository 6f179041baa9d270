package transport

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/zaya-operator/zaya-operator/internal/testnet"
)

// group dials world ranks concurrently (in any order, as pods start) and runs f on each.
func group(t *testing.T, world int, f func(t *TCP) error) {
	t.Helper()
	groupWith(t, Config{World: world}, f)
}

// groupWith is group with cfg's World, RingSize and PeerTimeout; the ranks must be done
// within a minute (a hang fails the test instead of stalling it).
func groupWith(t *testing.T, cfg Config, f func(t *TCP) error) {
	t.Helper()
	world := cfg.World
	cfg.Master, cfg.Listen, cfg.Timeout = testnet.FreeAddr(t), "127.0.0.1:0", 20*time.Second
	var wg sync.WaitGroup
	errs := make([]error, world)
	for r := world - 1; r >= 0; r-- { // the master comes up last
		wg.Go(func() {
			cfg := cfg
			cfg.Rank = r
			tr, err := Dial(context.Background(), cfg)
			if err != nil {
				errs[r] = err
				return
			}
			defer func() { _ = tr.Close() }()
			errs[r] = f(tr)
		})
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(time.Minute):
		t.Fatal("ranks still blocked after a minute")
	}
	for r, err := range errs {
		if err != nil {
			t.Fatalf("rank %d: %v", r, err)
		}
	}
}

func TestExchangePassesAroundTheRing(t *testing.T) {
	for _, world := range []int{1, 2, 5} {
		t.Run(strconv.Itoa(world), func(t *testing.T) {
			group(t, world, func(tr *TCP) error {
				msg := []byte(strings.Repeat("x", tr.Rank()) + fmt.Sprint(tr.Rank()))
				for step := range 3 {
					got, err := tr.Exchange(msg)
					if err != nil {
						return err
					}
					prev := (tr.Rank() - step - 1 + 2*world) % world
					if want := strings.Repeat("x", prev) + fmt.Sprint(prev); string(got) != want {
						return fmt.Errorf("step %d: got %q, want %q", step, got, want)
					}
					msg = got
				}
				return nil
			})
		})
	}
}

func TestRingsOfAGroupStayInTheGroup(t *testing.T) {
	master := testnet.FreeAddr(t)
	const world, size = 6, 3
	var wg sync.WaitGroup
	errs := make([]error, world)
	for r := range world {
		wg.Go(func() {
			tr, err := Dial(context.Background(), Config{Rank: r, World: world, Master: master, Listen: "127.0.0.1:0", RingSize: size, Timeout: 20 * time.Second})
			if err != nil {
				errs[r] = err
				return
			}
			defer func() { _ = tr.Close() }()
			got, err := tr.Exchange([]byte(strconv.Itoa(r)))
			if err != nil {
				errs[r] = err
				return
			}
			first := r - r%size
			if want := strconv.Itoa(first + (r-first+size-1)%size); string(got) != want {
				errs[r] = fmt.Errorf("got %s from the ring, want %s", got, want)
			}
		})
	}
	wg.Wait()
	for r, err := range errs {
		if err != nil {
			t.Errorf("rank %d: %v", r, err)
		}
	}
	if _, err := Dial(context.Background(), Config{Rank: 0, World: 4, RingSize: 3}); err == nil {
		t.Error("rings of 3 in a world of 4 were accepted")
	}
}

func TestAllReduceGivesEveryRankTheSameSum(t *testing.T) {
	const world = 4
	var mu sync.Mutex
	results := map[int][]float64{}
	group(t, world, func(tr *TCP) error {
		v := []float64{float64(tr.Rank()), 0.1, 1e16}
		if err := tr.AllReduce(v); err != nil {
			return err
		}
		if err := tr.Barrier(); err != nil {
			return err
		}
		mu.Lock()
		results[tr.Rank()] = v
		mu.Unlock()
		return nil
	})
	want := fmt.Sprint(results[0])
	for r := range world {
		if got := fmt.Sprint(results[r]); got != want {
			t.Errorf("rank %d has %s, rank 0 has %s: an all-reduce must give identical bits", r, got, want)
		}
	}
	if results[0][0] != 6 {
		t.Errorf("sum of ranks = %v, want 6", results[0][0])
	}
}

func TestAllGatherGivesEveryRankEveryPart(t *testing.T) {
	const world = 4
	var mu sync.Mutex
	results := map[int]string{}
	group(t, world, func(tr *TCP) error {
		part := bytes.Repeat([]byte{byte('a' + tr.Rank())}, tr.Rank()) // rank 0's part is empty
		parts, err := tr.AllGather(part)
		if err != nil {
			return err
		}
		mu.Lock()
		results[tr.Rank()] = fmt.Sprintf("%q", parts)
		mu.Unlock()
		return nil
	})
	for r := range world {
		if got := results[r]; got != `["" "b" "cc" "ddd"]` {
			t.Errorf("rank %d gathered %s", r, got)
		}
	}
}

// A rendezvous that times out is the missing ranks' doing (a PeerError); one the caller
// cancels is not.
func TestDialFailsClearlyWhenARankNeverComes(t *testing.T) {
	master := testnet.FreeAddr(t)
	_, err := Dial(context.Background(), Config{Rank: 1, World: 2, Master: master, Listen: "127.0.0.1:0", Timeout: 300 * time.Millisecond})
	var pe *PeerError
	if err == nil || !strings.Contains(err.Error(), "rank 1 reaching the master") {
		t.Errorf("err = %v, want a rendezvous timeout naming the rank", err)
	} else if !errors.As(err, &pe) || pe.Rank != 0 || pe.Op != OpRendezvous {
		t.Errorf("err = %#v, want a PeerError blaming rank 0 in the rendezvous", err)
	}
	_, err = Dial(context.Background(), Config{Rank: 0, World: 3, Master: master, Listen: "127.0.0.1:0", Timeout: 300 * time.Millisecond})
	if !errors.As(err, &pe) || pe.Rank != -1 || pe.Op != OpRendezvous || !strings.Contains(err.Error(), "rendezvous: 1 of 3 ranks joined") {
		t.Errorf("rank 0 alone: err = %v, want a PeerError: rendezvous: 1 of 3 ranks joined", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, err = Dial(ctx, Config{Rank: 0, World: 2, Master: master, Listen: "127.0.0.1:0", Timeout: time.Minute})
	if !errors.Is(err, context.Canceled) || errors.As(err, &pe) {
		t.Errorf("cancelled by the caller: err = %v, want context.Canceled and no PeerError", err)
	}
	if _, err := Dial(context.Background(), Config{Rank: 2, World: 2}); err == nil {
		t.Error("rank 2 of world 2 was accepted")
	}
}

// Connections to rank 0's rendezvous port that are not this gang's — one that says nothing,
// one that sends garbage, another attempt's rank claiming a rank with the wrong token — are
// dropped: the gang still forms, with its own ranks, and exchanges.
func TestStraysCannotJoinOrBreakTheRendezvous(t *testing.T) {
	const world, token = 3, "job-uid/4"
	master := testnet.FreeAddr(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	strays := []func(net.Conn){
		func(net.Conn) {}, // silent, held open
		func(c net.Conn) { _, _ = c.Write([]byte("\x00\x00\x00\x05hello")) },
		func(c net.Conn) {
			b, _ := json.Marshal(hello{Rank: 1, Addr: "127.0.0.1:1", Token: "job-uid/3"})
			_ = newConn(c).send(b)
		},
	}
	// Rank 0 listens first; the strays connect; only then do the gang's other ranks dial.
	var wg sync.WaitGroup
	errs := make([]error, world)
	rank := func(r int) {
		tr, err := Dial(ctx, Config{Rank: r, World: world, Master: master, Listen: "127.0.0.1:0", Token: token})
		if err != nil {
			errs[r] = err
			return
		}
		defer func() { _ = tr.Close() }()
		got, err := tr.Exchange([]byte{byte(r)})
		if err == nil && (len(got) != 1 || int(got[0]) != (r+world-1)%world) {
			err = fmt.Errorf("got %v from the previous rank", got)
		}
		errs[r] = err
	}
	wg.Go(func() { rank(0) })
	connected := make(chan struct{}, len(strays))
	for _, stray := range strays {
		go func() {
			var d net.Dialer
			c, err := dialRetry(ctx, &d, master)
			if err != nil {
				return
			}
			defer func() { _ = c.Close() }()
			stray(c)
			connected <- struct{}{}
			<-ctx.Done()
		}()
	}
	for range strays {
		select {
		case <-connected:
		case <-ctx.Done():
			t.Fatal("the strays never reached rank 0")
		}
	}
	for r := 1; r < world; r++ {
		wg.Go(func() { rank(r) })
	}
	wg.Wait()
	for r, err := range errs {
		if err != nil {
			t.Errorf("rank %d: %v", r, err)
		}
	}
}

// A rank restarted in place dials rank 0 again while the rendezvous still waits for others:
// its new connection takes the rank's place (the old one is closed, the rank counted once),
// the gang forms with the new process and its all-reduce works.
func TestARankRestartedInPlaceRejoinsTheRendezvous(t *testing.T) {
	const world, token = 3, "job-uid/0"
	master := testnet.FreeAddr(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	joins := make(chan int, 2*world)
	rendezvousJoined = func(rank int) { joins <- rank }
	t.Cleanup(func() { rendezvousJoined = func(int) {} })
	awaitJoin := func(what string, rank int) {
		t.Helper()
		select {
		case r := <-joins:
			if r != rank {
				t.Fatalf("%s: rank %d joined, want rank %d", what, r, rank)
			}
		case <-ctx.Done():
			t.Fatalf("%s: rank %d never took its place", what, rank)
		}
	}

	var wg sync.WaitGroup
	sums := make([]float64, world)
	errs := make([]error, world)
	rank := func(r int) {
		tr, err := Dial(ctx, Config{Rank: r, World: world, Master: master, Listen: "127.0.0.1:0", Token: token})
		if err != nil {
			errs[r] = err
			return
		}
		defer func() { _ = tr.Close() }()
		v := []float64{float64(r + 1)}
		errs[r] = tr.AllReduce(v)
		sums[r] = v[0]
	}
	wg.Go(func() { rank(0) })

	// Rank 1's first process greets rank 0, then hangs or dies: its connection stays open here,
	// so only rank 0 can close it.
	var d net.Dialer
	first, err := dialRetry(ctx, &d, master)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = first.Close() }()
	b, _ := json.Marshal(hello{Rank: 1, Addr: "127.0.0.1:1", Token: token})
	if err := newConn(first).send(b); err != nil {
		t.Fatal(err)
	}
	awaitJoin("rank 1's first process", 1)

	wg.Go(func() { rank(1) }) // restarted in place
	awaitJoin("rank 1's restarted process", 1)
	wg.Go(func() { rank(2) })
	wg.Wait()
	for r := range world {
		if errs[r] != nil {
			t.Errorf("rank %d: %v", r, errs[r])
		} else if sums[r] != 6 {
			t.Errorf("rank %d: sum %v, want 6", r, sums[r])
		}
	}
	// Rank 0 closed the first connection instead of sending it the gang's addresses.
	_ = first.SetReadDeadline(time.Now().Add(10 * time.Second))
	if n, err := first.Read(make([]byte, 1)); n != 0 || !errors.Is(err, io.EOF) {
		t.Errorf("rank 1's first connection read %d bytes, %v; want EOF: rank 0 must close it", n, err)
	}
}

// A rank that goes away during a collective is a PeerError on the others, naming the rank
// each lost: rank 0 the one that left, the other ranks rank 0 (which stops with it).
func TestALostPeerIsAPeerError(t *testing.T) {
	group(t, 3, func(tr *TCP) error {
		if tr.Rank() == 2 {
			return nil // leaves: its connections close
		}
		err := tr.AllReduce([]float64{1})
		want := map[int]int{0: 2, 1: 0}[tr.Rank()]
		var pe *PeerError
		if !errors.As(err, &pe) || pe.Rank != want || pe.Op != "all-reduce" {
			return fmt.Errorf("all-reduce without rank 2: %w, want a PeerError naming rank %d", err, want)
		}
		return nil
	})
}

// conns are every connection tr holds.
func conns(tr *TCP) []*conn {
	var cs []*conn
	for _, c := range append([]*conn{tr.master, tr.next, tr.prev}, tr.members...) {
		if c != nil {
			cs = append(cs, c)
		}
	}
	return cs
}

// A rank whose process is frozen keeps its sockets open, so TCP never reports it; its peers
// find it silent within PeerTimeout and fail their collective with a PeerError naming it: the
// members on the master link when rank 0 froze, rank 0 on the member link, a ring neighbour
// on the exchange. The ranks it did not talk to lose the rank that gave up on it.
func TestAFrozenRankIsLost(t *testing.T) {
	const world, timeout = 3, 300 * time.Millisecond
	for _, c := range []struct {
		name   string
		frozen int
		op     string
		silent map[int]bool // rank: whether it finds the frozen rank silent (else: any PeerError)
	}{
		{"rank 0 in an all-reduce", 0, "all-reduce", map[int]bool{1: true, 2: true}},
		{"rank 0 in an all-gather", 0, "all-gather", map[int]bool{1: true, 2: true}},
		{"rank 2 in an all-reduce", 2, "all-reduce", map[int]bool{0: true, 1: false}},
		{"rank 1 in a barrier", 1, "barrier", map[int]bool{0: true, 2: false}},
		{"rank 1 in an exchange", 1, "exchange", map[int]bool{2: true, 0: false}}, // 2 receives from 1, 0 sends to it
	} {
		t.Run(c.name, func(t *testing.T) {
			var alive sync.WaitGroup
			alive.Add(world - 1)
			othersDone := make(chan struct{})
			go func() { alive.Wait(); close(othersDone) }()
			groupWith(t, Config{World: world, PeerTimeout: timeout}, func(tr *TCP) error {
				if tr.Rank() == c.frozen {
					// Frozen: no heartbeat, no collective, its sockets open until the others gave up.
					for _, cn := range conns(tr) {
						cn.stopHeartbeats()
					}
					<-othersDone
					return nil
				}
				defer alive.Done()
				start := time.Now()
				var err error
				// The first call may complete where it needs nothing from the frozen rank (rank
				// 0's exchange receives from rank 2, which sent before waiting); the next fails.
				for range 2 {
					switch c.op {
					case "all-reduce":
						err = tr.AllReduce([]float64{1})
					case "all-gather":
						_, err = tr.AllGather([]byte{1})
					case "barrier":
						err = tr.Barrier()
					case "exchange":
						_, err = tr.Exchange([]byte{1})
					}
					if err != nil {
						break
					}
				}
				var pe *PeerError
				switch {
				case !errors.As(err, &pe) || pe.Op != c.op:
					return fmt.Errorf("%s with rank %d frozen: %w, want a PeerError of the %s", c.op, c.frozen, err, c.op)
				case c.silent[tr.Rank()] && (pe.Rank != c.frozen || !errors.Is(err, ErrPeerSilent)):
					return fmt.Errorf("%s: %w, want rank %d found silent", c.op, err, c.frozen)
				case time.Since(start) > 20*time.Second:
					return fmt.Errorf("%s: found after %v, want within about %v", c.op, time.Since(start), timeout)
				}
				if want := fmt.Sprintf("no heartbeat from rank %d for %v", c.frozen, timeout); c.silent[tr.Rank()] && !strings.Contains(err.Error(), want) {
					return fmt.Errorf("%q does not say %q", err.Error(), want)
				}
				return nil
			})
		})
	}
}

// A rank that is slow but alive — computing or sleeping for 3 x PeerTimeout before a
// collective — is waited for, not lost, even while its peers push frames far larger than the
// socket buffers at it: its heartbeats go on and its connections are drained whatever it does.
func TestASlowRankIsNotLost(t *testing.T) {
	const world, timeout = 3, time.Second // generous: a loaded CI machine may starve the process for a while
	const big = 4 << 20
	groupWith(t, Config{World: world, PeerTimeout: timeout}, func(tr *TCP) error {
		for _, cn := range conns(tr) {
			// Small socket buffers: without the reader goroutine a sender would stall on the
			// slow rank's full buffers and find it silent.
			_ = cn.c.(*net.TCPConn).SetReadBuffer(64 << 10)
			_ = cn.c.(*net.TCPConn).SetWriteBuffer(64 << 10)
		}
		for i, step := range []struct {
			slow int
			op   string
		}{{0, "all-gather"}, {2, "exchange"}, {1, "all-reduce"}, {1, "barrier"}} {
			if tr.Rank() == step.slow {
				if i%2 == 0 {
					for start := time.Now(); time.Since(start) < 3*timeout; { // computing
					}
				} else {
					time.Sleep(3 * timeout)
				}
			}
			part := bytes.Repeat([]byte{byte(tr.Rank())}, big)
			var err error
			switch step.op {
			case "all-gather":
				var parts [][]byte
				parts, err = tr.AllGather(part)
				for r, p := range parts {
					if len(p) != big || p[big-1] != byte(r) {
						err = fmt.Errorf("rank %d's part has %d bytes", r, len(p))
					}
				}
			case "exchange":
				var got []byte
				got, err = tr.Exchange(part)
				if prev := (tr.Rank() + world - 1) % world; err == nil && (len(got) != big || got[big-1] != byte(prev)) {
					err = fmt.Errorf("got %d bytes, want %d from rank %d", len(got), big, prev)
				}
			case "all-reduce":
				v := make([]float64, big/8)
				v[0] = 1
				if err = tr.AllReduce(v); err == nil && v[0] != world {
					err = fmt.Errorf("sum %v, want %d", v[0], world)
				}
			case "barrier":
				err = tr.Barrier()
			}
			if err != nil {
				return fmt.Errorf("%s with rank %d slow: %w", step.op, step.slow, err)
			}
		}
		return nil
	})
}

// A peer whose sockets stay open but which reads nothing (a frozen process whose buffers
// filled) fails a send within PeerTimeout, and every send after it.
func TestASendToAPeerThatTakesNothingFails(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = l.Close() }()
	nc, err := net.Dial("tcp", l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	peer, err := l.Accept() // never read
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = peer.Close() }()
	c := newConn(nc)
	defer func() { _ = c.Close() }()
	c.start(1, 300*time.Millisecond)
	sent := make(chan error, 1)
	go func() { sent <- c.send(make([]byte, 256<<20)) }()
	select {
	case err = <-sent:
	case <-time.After(30 * time.Second):
		t.Fatal("the send still blocks after 30s")
	}
	if !errors.Is(err, ErrPeerSilent) || !strings.Contains(err.Error(), "rank 1 took nothing sent to it for 300ms") {
		t.Fatalf("send: %v, want ErrPeerSilent: rank 1 took nothing", err)
	}
	if err := c.send([]byte{1}); !errors.Is(err, ErrPeerSilent) {
		t.Errorf("the next send: %v, want the same failure (the frame before it was cut short)", err)
	}
}

// PeerTimeout 0 is DefaultPeerTimeout; a negative one turns the bound and the heartbeats off.
// Close stops every goroutine of the connections.
func TestPeerTimeoutDefaultAndClose(t *testing.T) {
	for _, c := range []struct {
		set, want time.Duration
	}{{0, DefaultPeerTimeout}, {-1, -1}, {time.Second, time.Second}} {
		groupWith(t, Config{World: 2, PeerTimeout: c.set}, func(tr *TCP) error {
			for _, cn := range conns(tr) {
				if cn.timeout != c.want || cn.bounded != (c.want > 0) {
					return fmt.Errorf("PeerTimeout %v: a connection with rank %d waits %v (bounded %v), want %v", c.set, cn.peer, cn.timeout, cn.bounded, c.want)
				}
			}
			return tr.Barrier()
		})
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		buf := make([]byte, 1<<20)
		stacks := string(buf[:runtime.Stack(buf, true)])
		if !strings.Contains(stacks, "(*conn).start") && !strings.Contains(stacks, "(*conn).watch") {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("connection goroutines left after Close:\n%s", stacks)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// A rank waiting at the rendezvous for the others finds out when rank 0 froze (its socket
// accepts, nothing comes back): it stops within PeerTimeout, blaming rank 0, instead of waiting
// out the rendezvous timeout; while rank 0 is alive and only waiting for a late rank, the ranks
// that came wait with it.
func TestARankAtTheRendezvousLosesAFrozenRankZero(t *testing.T) {
	const timeout = 300 * time.Millisecond
	master := testnet.FreeAddr(t)
	l, err := net.Listen("tcp", master)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = l.Close() }()
	go func() { // frozen: the kernel accepts, the process never reads or writes
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			defer func() { _ = c.Close() }()
		}
	}()
	start := time.Now()
	_, err = Dial(context.Background(), Config{Rank: 1, World: 2, Master: master, Listen: "127.0.0.1:0", Timeout: 20 * time.Second, PeerTimeout: timeout})
	var pe *PeerError
	if !errors.As(err, &pe) || pe.Rank != 0 || pe.Op != OpRendezvous || !errors.Is(err, ErrPeerSilent) {
		t.Fatalf("err = %v, want a rendezvous PeerError blaming a silent rank 0", err)
	}
	if took := time.Since(start); took > 10*time.Second {
		t.Errorf("took %v to find rank 0 silent, want about PeerTimeout, far below the rendezvous timeout", took)
	}

	// Alive: rank 2 comes 3 x PeerTimeout late, and nobody gives up (a generous PeerTimeout:
	// a loaded machine must not make a live rank 0 look silent).
	const alive = time.Second
	master = testnet.FreeAddr(t)
	errs := make(chan error, 3)
	for r := range 3 {
		go func() {
			if r == 2 {
				time.Sleep(3 * alive)
			}
			tr, err := Dial(context.Background(), Config{Rank: r, World: 3, Master: master, Listen: "127.0.0.1:0", Timeout: 20 * time.Second, PeerTimeout: alive})
			if err == nil {
				err = tr.Barrier()
				_ = tr.Close()
			}
			errs <- err
		}()
	}
	for range 3 {
		if err := <-errs; err != nil {
			t.Errorf("a rank gave up on a live rendezvous: %v", err)
		}
	}
}

// TestRankZeroListensOnEveryInterface: rank 0 takes the rendezvous on every interface, so the
// other ranks reach it whichever of its addresses MASTER_ADDR names (here 127.0.0.2 for rank
// 0 itself, 127.0.0.1 for rank 1), before and whether or not its own name resolves to one.
func TestRankZeroListensOnEveryInterface(t *testing.T) {
	_, port, _ := net.SplitHostPort(testnet.FreeAddr(t))
	var wg sync.WaitGroup
	errs := make([]error, 2)
	for r, host := range []string{"127.0.0.2", "127.0.0.1"} {
		wg.Go(func() {
			cfg := Config{Rank: r, World: 2, Master: net.JoinHostPort(host, port), Listen: ":0", Timeout: 10 * time.Second}
			tr, err := Dial(context.Background(), cfg)
			if err == nil {
				err = tr.AllReduce([]float64{1})
				_ = tr.Close()
			}
			errs[r] = err
		})
	}
	wg.Wait()
	for r, err := range errs {
		if err != nil {
			t.Errorf("rank %d: %v", r, err)
		}
	}
}

// TestALatePeerEndsACollectiveAfterTheCollectiveTimeout: rank 1 stays alive (its heartbeats
// flow) but never joins the all-reduce; rank 0 gives up after CollectiveTimeout with a
// PeerError naming it, instead of waiting forever.
func TestALatePeerEndsACollectiveAfterTheCollectiveTimeout(t *testing.T) {
	release := make(chan struct{})
	var got error
	var took time.Duration
	groupWith(t, Config{World: 2, CollectiveTimeout: 300 * time.Millisecond}, func(tr *TCP) error {
		if tr.Rank() == 1 {
			<-release // alive, elsewhere in its program
			return nil
		}
		began := time.Now()
		got = tr.AllReduce([]float64{1})
		took = time.Since(began)
		close(release)
		return nil
	})
	var pe *PeerError
	if !errors.As(got, &pe) || pe.Rank != 1 || !errors.Is(got, ErrCollectiveTimeout) {
		t.Fatalf("all-reduce with a late rank 1: %v, want a PeerError for rank 1 wrapping ErrCollectiveTimeout", got)
	}
	if took < 300*time.Millisecond {
		t.Errorf("gave up after %v, before the 300ms timeout", took)
	}
}

// TestRingAllReduceSumsBigVectorsAlike: vectors of 64 KiB and more go around the ring of
// every rank, on worlds of 2, 3, 4 and 8 ranks, split in rings of their own (context
// parallel groups of 1 or 2, which then have a world ring besides) or not, lengths that do
// not divide by the world included: exact sums (whole numbers), and the same bits on every
// rank and on a second run (random values). Each rank's own ring still passes its exchanges.
func TestRingAllReduceSumsBigVectorsAlike(t *testing.T) {
	for _, shape := range [][2]int{{2, 0}, {3, 0}, {4, 0}, {8, 0}, {2, 1}, {4, 2}, {8, 2}} {
		world, ringSize := shape[0], shape[1]
		for _, n := range []int{ringAllReduceMin / 8, ringAllReduceMin/8 + 5} {
			var mu sync.Mutex
			results := map[string][]float64{}
			groupWith(t, Config{World: world, RingSize: ringSize}, func(tr *TCP) error {
				for run := range 2 {
					if _, err := tr.Exchange([]byte{byte(tr.Rank())}); err != nil {
						return err
					}
					whole, random := make([]float64, n), make([]float64, n)
					rng := rand.New(rand.NewPCG(uint64(tr.Rank()), 1))
					for i := range n {
						whole[i] = float64(tr.Rank()*n + i)
						random[i] = rng.NormFloat64() * 1e3
					}
					if err := tr.AllReduce(whole); err != nil {
						return err
					}
					if err := tr.AllReduce(random); err != nil {
						return err
					}
					for i := range n {
						// sum over r of (r*n + i) = n*world*(world-1)/2 + world*i
						if want := float64(n*world*(world-1)/2 + world*i); whole[i] != want {
							return fmt.Errorf("rank %d: element %d = %v, want %v", tr.Rank(), i, whole[i], want)
						}
					}
					mu.Lock()
					results[fmt.Sprintf("%d/%d", tr.Rank(), run)] = random
					mu.Unlock()
				}
				return nil
			})
			want := results["0/0"]
			for key, got := range results {
				if !slices.Equal(got, want) {
					t.Errorf("world %d, rings of %d, %d values: rank/run %s differs from rank 0's first run", world, ringSize, n, key)
				}
			}
		}
	}
}
