package gangwatch

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"strings"
	"syscall"
	"testing"
	"time"
)

const timeout = 400 * time.Millisecond

// gang joins n members on loopback, rank 0's hub at a free port, and waits until every member
// is in the hub.
func gang(t *testing.T, n int) []*Member {
	t.Helper()
	addr := freeAddr(t)
	ms := make([]*Member, n)
	for r := range n {
		m, err := Join(Config{Rank: r, GPUsPerNode: 8, Hub: addr, Listen: addr, Token: "uid/0", Timeout: timeout, Log: io.Discard})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { m.Leave(false, "") })
		ms[r] = m
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		ms[0].hub.mu.Lock()
		joined := len(ms[0].hub.members)
		ms[0].hub.mu.Unlock()
		if joined == n {
			return ms
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d members joined", joined, n)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// freeAddr is a loopback address nothing listens at.
func freeAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	_ = ln.Close()
	return addr
}

// stopped waits for m's stop and returns its reason ("" if none came within d).
func stopped(m *Member, d time.Duration) string {
	select {
	case why := <-m.Stopped():
		return why
	case <-time.After(d):
		return ""
	}
}

// crash ends m as a killed container does: its connection closes, nothing said.
func crash(m *Member) {
	// The hub first: in a dead process nothing is left to tell the others that its own
	// member went away, as the hub would if it outlived its connection by a moment.
	if m.hub != nil {
		m.hub.close()
	}
	m.mu.Lock()
	m.stopped = true
	if m.conn != nil {
		_ = m.conn.Close()
	}
	m.mu.Unlock()
	m.cancel()
}

func TestAFailedWorkerStopsEveryOtherRank(t *testing.T) {
	ms := gang(t, 3)
	if at := ms[0].StoppedAt(); !at.IsZero() {
		t.Fatalf("stopped at %v before any stop", at)
	}
	left := time.Now()
	ms[1].Leave(true, "exit 1")
	for _, r := range []int{0, 2} {
		if why := stopped(ms[r], 2*time.Second); !strings.Contains(why, "node rank 1's worker failed: exit 1") {
			t.Errorf("rank %d: stop %q, want rank 1's failure", r, why)
		}
		// When the stop was heard: the supervisor tells a worker that ended before it from
		// one the stop ended.
		if at := ms[r].StoppedAt(); at.Before(left) || time.Since(at) > 2*time.Second {
			t.Errorf("rank %d: stopped at %v, want between %v and now", r, at, left)
		}
	}
}

func TestAKilledRankStopsTheOthers(t *testing.T) {
	ms := gang(t, 3)
	start := time.Now()
	crash(ms[2])
	for _, r := range []int{0, 1} {
		if why := stopped(ms[r], 2*time.Second); !strings.Contains(why, "node rank 2's supervisor went away") {
			t.Errorf("rank %d: stop %q, want rank 2 gone", r, why)
		}
	}
	if d := time.Since(start); d > timeout {
		t.Errorf("the stop took %v: a closed connection is seen at once, not after the timeout", d)
	}
}

// A frozen node's supervisor says nothing and keeps its connection open: the hub loses it
// after the timeout, with the words the operator reads as a silent peer (global rank).
func TestASilentRankIsLostAfterTheTimeout(t *testing.T) {
	ms := gang(t, 2)
	c, err := net.Dial("tcp", ms[0].cfg.Hub)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	fmt.Fprintf(c, "hello uid/0 3\n") // node rank 3, then silence
	why := stopped(ms[1], 5*timeout)
	if !strings.Contains(why, "lost rank 24 (node rank 3): peer silent") {
		t.Errorf("stop %q, want rank 24 (node rank 3 × 8 GPUs) silent", why)
	}
}

// The hub's rank lost: every member stops by itself.
func TestLosingTheHubStopsTheRank(t *testing.T) {
	ms := gang(t, 3)
	crash(ms[0])
	for _, r := range []int{1, 2} {
		if why := stopped(ms[r], 2*time.Second); !strings.Contains(why, "lost the hub") {
			t.Errorf("rank %d: stop %q, want the hub lost", r, why)
		}
	}
}

// Rank 0 done (the run is complete) and a rank done: nobody is stopped.
func TestRanksThatFinishStopNobody(t *testing.T) {
	ms := gang(t, 3)
	ms[2].Leave(false, "")
	ms[0].Leave(false, "")
	if why := stopped(ms[1], 3*timeout); why != "" {
		t.Errorf("rank 1 stopped after its peers finished: %q", why)
	}
}

// A connection that does not present the gang's token is dropped and changes nothing.
func TestAStrangerIsNotAMember(t *testing.T) {
	ms := gang(t, 2)
	c, err := net.Dial("tcp", ms[0].cfg.Hub)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	fmt.Fprintf(c, "hello other-uid/0 1\ndown evil\n")
	_ = c.SetReadDeadline(time.Now().Add(2 * time.Second))
	if _, err := bufio.NewReader(c).ReadString('\n'); err == nil {
		t.Error("the hub talked to a stranger")
	}
	if why := stopped(ms[1], 3*timeout); why != "" {
		t.Errorf("a stranger stopped the gang: %q", why)
	}
}

// A member that joins before the hub listens (rank 0 starts with the others) gets in once it
// does, and a stop after that reaches it.
func TestAMemberWaitsForTheHub(t *testing.T) {
	addr := freeAddr(t)
	cfg := Config{Hub: addr, Listen: addr, Token: "uid/0", Timeout: timeout, Log: io.Discard}
	m1 := rankOne(t, cfg)
	outOfEveryHub(t, m1, 3*timeout, "no hub yet")
	m0, err := Join(cfg)
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		m0.hub.mu.Lock()
		n := len(m0.hub.members)
		m0.hub.mu.Unlock()
		if n == 2 || time.Now().After(deadline) {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	select {
	case <-m1.Joined():
	case <-time.After(5 * time.Second):
		t.Fatal("not joined once the hub listens")
	}
	m0.Leave(true, "exit 134")
	if why := stopped(m1, 2*time.Second); !strings.Contains(why, "node rank 0's worker failed") {
		t.Errorf("stop %q, want rank 0's failure", why)
	}
}

// A frozen rank 0 (SIGSTOP, a frozen node) still completes handshakes in its kernel: a member
// restarted beside it must not take that for the hub, start its worker against a rank 0 that
// never trains and stop again a timeout later. It joins once the rank's new run answers.
func TestAFrozenHubIsNotJoined(t *testing.T) {
	frozen, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := frozen.Addr().String() // accepted by the kernel, never read: a stopped process
	cfg := Config{Hub: addr, Listen: addr, Token: "uid/1", Timeout: timeout, Log: io.Discard}
	m1 := rankOne(t, cfg)
	outOfEveryHub(t, m1, 4*timeout, "a hub that never answered")
	_ = frozen.Close() // the frozen pod is deleted; its rank's new run listens
	m0, err := Join(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer m0.Leave(false, "")
	select {
	case <-m1.Joined():
	case <-time.After(5 * time.Second):
		t.Fatal("not joined once the new hub listens")
	}
	if why := stopped(m1, 3*timeout); why != "" {
		t.Errorf("stopped in the new hub: %q", why)
	}
}

// A hub that stops as a member comes in (the last run's, its stop under way) does not take
// it: the member waits for the next one rather than start its worker and stop at once.
func TestAStoppingHubIsNotJoined(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			fmt.Fprintf(c, "stop node rank 2's worker failed: exit 1\n")
			_ = c.Close()
		}
	}()
	m1 := rankOne(t, Config{Hub: ln.Addr().String(), Token: "uid/0", Timeout: timeout, Log: io.Discard})
	outOfEveryHub(t, m1, 3*timeout, "a hub that was stopping")
}

// rankOne joins cfg's gang as node rank 1, leaving when the test ends.
func rankOne(t *testing.T, cfg Config) *Member {
	t.Helper()
	cfg.Rank = 1
	m, err := Join(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Leave(false, "") })
	return m
}

// outOfEveryHub waits d and fails unless m has neither joined nor been stopped by hub.
func outOfEveryHub(t *testing.T, m *Member, d time.Duration, hub string) {
	t.Helper()
	time.Sleep(d)
	select {
	case <-m.Joined():
		t.Fatalf("joined %s", hub)
	default:
	}
	if why := stopped(m, 0); why != "" {
		t.Fatalf("stopped by %s it never joined: %q", hub, why)
	}
}

// The hub's port is open to every pod. A stranger that sends bytes without a newline is cut off
// at the line bound, not read on (hundreds of MiB grew rank 0's supervisor), and the gang goes
// on.
func TestAStrangersEndlessLineIsCutOff(t *testing.T) {
	addr := freeAddr(t)
	// A hub whose hello deadline is far: only the bound can cut the stranger off in time.
	hello := 10 * time.Second
	m0, err := Join(Config{Hub: addr, Listen: addr, Token: "uid/0", Timeout: hello, Log: io.Discard})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m0.Leave(false, "") })
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	start := time.Now()
	chunk := []byte(strings.Repeat("x", 4096))
	var werr error
	for sent := 0; sent < 64<<20 && werr == nil; sent += len(chunk) {
		_ = c.SetWriteDeadline(time.Now().Add(2 * time.Second))
		_, werr = c.Write(chunk)
	}
	if werr == nil {
		t.Fatal("the hub took 64 MiB without a newline")
	}
	if took := time.Since(start); took > hello/2 {
		t.Errorf("cut off after %v, not at the line bound (the hello's deadline is %v)", took, hello)
	}
	if why := stopped(m0, timeout); why != "" {
		t.Errorf("a stranger stopped the gang: %q", why)
	}
}

// failingListener fails its first accepts as a process out of file descriptors does.
type failingListener struct {
	net.Listener
	failures int
}

func (l *failingListener) Accept() (net.Conn, error) {
	if l.failures > 0 {
		l.failures--
		return nil, fmt.Errorf("accept tcp: %w", syscall.EMFILE)
	}
	return l.Listener.Accept()
}

// A burst of connections up to the pod's open-file limit fails the hub's accepts for a while:
// the hub must take members again once descriptors are free, or a restarted rank could never
// rejoin and the gang would stop for good.
func TestTheHubAcceptsAgainAfterRunningOutOfDescriptors(t *testing.T) {
	addr := freeAddr(t)
	cfg := Config{Hub: addr, Listen: addr, Token: "uid/0", Timeout: timeout, Log: io.Discard}
	h, err := listen(cfg)
	if err != nil {
		t.Fatal(err)
	}
	h.ln = &failingListener{Listener: h.ln, failures: 3}
	go h.serve()
	t.Cleanup(h.close)
	m1 := rankOne(t, cfg)
	select {
	case <-m1.Joined():
	case <-time.After(5 * time.Second):
		t.Fatal("not joined: the hub stopped accepting after its accepts failed")
	}
}

// A member that loses the hub itself (rank 0 killed, or this rank cut off) knows it was not
// told: its supervisor stops its worker at once, as its rank may be replaced elsewhere; so
// does rank 0 when its hub lost a member (rank 0 may be the one cut off). A failure's word
// from the hub is the gang's.
func TestAMemberKnowsItLostTheHubItself(t *testing.T) {
	ms := gang(t, 3)
	crash(ms[0])
	for _, r := range []int{1, 2} {
		if why := stopped(ms[r], 2*time.Second); why == "" || !ms[r].LostHub() {
			t.Errorf("rank %d: stop %q, lost the hub %t; want the hub lost", r, why, ms[r].LostHub())
		}
	}
	told := gang(t, 3)
	told[1].Leave(true, "exit 1")
	for _, r := range []int{0, 2} {
		if why := stopped(told[r], 2*time.Second); why == "" || told[r].LostHub() || told[r].PeerLost() {
			t.Errorf("rank %d: stop %q, lost the hub %t, a peer lost %t; want the hub's word of a failure", r, why, told[r].LostHub(), told[r].PeerLost())
		}
	}
	// Rank 0's hub lost a member: rank 0 may be the one cut off; the others heard the hub,
	// and know the stop is over a lost peer (their workers are stopped at once).
	cut := gang(t, 3)
	crash(cut[2])
	for r, want := range []bool{true, false} {
		if why := stopped(cut[r], 2*time.Second); why == "" || cut[r].LostHub() != want || !cut[r].PeerLost() {
			t.Errorf("rank %d: stop %q, lost the hub %t, a peer lost %t; want %t, true", r, why, cut[r].LostHub(), cut[r].PeerLost(), want)
		}
	}
	silent := gang(t, 3)
	c, err := net.Dial("tcp", silent[0].cfg.Hub)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	fmt.Fprintf(c, "hello uid/0 3\n") // node rank 3, then silence
	if why := stopped(silent[1], 5*timeout); why == "" || silent[1].LostHub() || !silent[1].PeerLost() {
		t.Errorf("rank 1: stop %q, lost the hub %t, a peer lost %t; want a silent peer's stop", why, silent[1].LostHub(), silent[1].PeerLost())
	}
}
