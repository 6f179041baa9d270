package transport

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
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
	master := testnet.FreeAddr(t)
	var wg sync.WaitGroup
	errs := make([]error, world)
	for r := world - 1; r >= 0; r-- { // the master comes up last
		wg.Go(func() {
			tr, err := Dial(context.Background(), Config{Rank: r, World: world, Master: master, Listen: "127.0.0.1:0", Timeout: 20 * time.Second})
			if err != nil {
				errs[r] = err
				return
			}
			defer func() { _ = tr.Close() }()
			errs[r] = f(tr)
		})
	}
	wg.Wait()
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
