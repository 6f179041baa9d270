package supervisor

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/zaya-operator/zaya-operator/api/contract"
	"github.com/zaya-operator/zaya-operator/workers/gangwatch"
)

// A worker that ended before the gang's stop reached its supervisor ended on its own: its
// failure is the one that stopped the gang (the chaos soak, seed 1796636599: rank 0's user-code
// exit 2 became "stopped: gang watch: node rank 7's worker failed: exit 75", rank 7 having
// stopped over rank 0, and the job's root cause was lost). Anything that ended after the stop,
// or by the supervisor's signal, or with the stop's own code, is the stop's.
func TestAnExitBeforeTheGangsStopIsTheWorkersOwn(t *testing.T) {
	stop := time.Date(2026, 12, 7, 4, 12, 52, 500_000_000, time.UTC)
	for _, tc := range []struct {
		name      string
		code      int32
		exitAt    time.Time
		signalled bool
		want      bool
	}{
		{"its own failure, first", 2, stop.Add(-time.Millisecond), false, false},
		{"done before the stop", 0, stop.Add(-time.Second), false, false},
		{"killed before the stop", 137, stop.Add(-time.Millisecond), false, false},
		{"a launcher failing after the stop (torchrun's gloo error)", 1, stop.Add(300 * time.Millisecond), false, true},
		{"in the stop's instant", 1, stop, false, true},
		{"its own stop over a peer, first", contract.ExitStopped, stop.Add(-time.Millisecond), false, true},
		{"stopped by the supervisor's SIGTERM", 143, stop.Add(2 * time.Second), true, true},
		{"failing after the supervisor's SIGTERM", 1, stop.Add(2 * time.Second), true, true},
	} {
		if got := stopCaused(tc.code, tc.exitAt, stop, tc.signalled); got != tc.want {
			t.Errorf("%s: caused by the stop %v, want %v", tc.name, got, tc.want)
		}
	}
}

// fakeHub is the address of a hub that welcomes one member, hands its connection to then,
// and then says nothing more for a minute.
func fakeHub(t *testing.T, then func(net.Conn)) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ln.Close() })
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer func() { _ = c.Close() }()
		if _, err := bufio.NewReader(c).ReadString('\n'); err != nil {
			return
		}
		_, _ = io.WriteString(c, "welcome\n")
		then(c)
		time.Sleep(time.Minute)
	}()
	return ln.Addr().String()
}

// A rank that lost the hub itself may be the one cut off, replaced elsewhere once its peers
// are back: its worker is stopped at once and killed after CutGrace, whatever OwnStop and
// StopGrace allow a stop the hub sent. Here a worker that ignores SIGTERM, under a stop
// policy of an hour, still ends.
func TestARankThatLostTheHubStopsItsWorkerAtOnce(t *testing.T) {
	// A hub that welcomes the member, then freezes: it says nothing more.
	hub := fakeHub(t, func(net.Conn) {})
	dir := t.TempDir()
	term := filepath.Join(dir, "termination-log")
	cfg := Config{
		Args:           []string{"sh", "-c", `trap "" TERM; touch ` + filepath.Join(dir, "started") + `; while :; do sleep 0.1; done`},
		TerminationLog: term, Log: io.Discard,
		Gang:     &gangwatch.Config{Rank: 1, GPUsPerNode: 1, Hub: hub, Token: "uid/0", Timeout: 500 * time.Millisecond, Log: io.Discard},
		JoinWait: time.Minute, OwnStop: time.Hour, StopGrace: time.Hour, CutGrace: 100 * time.Millisecond,
	}
	done := make(chan int32, 1)
	go func() { done <- cfg.run() }()
	select {
	case code := <-done:
		msg, _ := os.ReadFile(term)
		if code != contract.ExitStopped || !strings.Contains(string(msg), "lost rank 0 (node rank 0, the hub at") {
			t.Errorf("exit %d, message %q; want 75 and the lost hub", code, msg)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the worker still runs 30 s after its rank lost the hub")
	}
}

// The hub's stop over a rank it lost (silent, gone) names the cause itself: a member's worker,
// which may sit in a collective with the lost rank for as long as its backend allows, is sent
// SIGTERM at once rather than after OwnStop (an hour here), so that the operator sees every
// peer stop as soon as the gang knows.
func TestAStopOverALostPeerStopsTheWorkerAtOnce(t *testing.T) {
	dir := t.TempDir()
	started := filepath.Join(dir, "started")
	// A hub that welcomes the member and, once its worker runs, stops the gang over rank 1.
	hub := fakeHub(t, func(c net.Conn) {
		for range 200 {
			if _, err := os.Stat(started); err == nil {
				break
			}
			time.Sleep(50 * time.Millisecond)
		}
		_, _ = io.WriteString(c, "stop lost rank 1 (node rank 1): peer silent for 5s\n")
	})
	term := filepath.Join(dir, "termination-log")
	cfg := Config{
		Args:           []string{"sh", "-c", `touch ` + started + `; while :; do sleep 0.1; done`},
		TerminationLog: term, Log: io.Discard,
		Gang:     &gangwatch.Config{Rank: 2, GPUsPerNode: 1, Hub: hub, Token: "uid/0", Timeout: time.Minute, Log: io.Discard},
		JoinWait: time.Minute, OwnStop: time.Hour, StopGrace: time.Hour, CutGrace: time.Hour,
	}
	done := make(chan int32, 1)
	go func() { done <- cfg.run() }()
	select {
	case code := <-done:
		msg, _ := os.ReadFile(term)
		if code != contract.ExitStopped || !strings.Contains(string(msg), "gang watch: lost rank 1 (node rank 1): peer silent") {
			t.Errorf("exit %d, message %q; want 75 and the lost peer", code, msg)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the worker still runs 30 s after the hub stopped the gang over a lost peer")
	}
}

// A replacement for a rank lost with its node waits, before its worker starts, until the old
// rank's worker has surely been stopped by its own supervisor had its node only been cut off:
// a quarter of the gang's timeout, CutGrace and a quarter second after the decision, never
// more than maxLostWait, and not at all without a gang to watch or a decision.
func TestAReplacementWaitsForTheLostRanksOldWorker(t *testing.T) {
	at := time.Date(2026, 12, 8, 0, 0, 0, 0, time.UTC)
	gang := &gangwatch.Config{Timeout: 5 * time.Second}
	for _, tc := range []struct {
		name string
		cfg  Config
		now  time.Time
		want time.Duration
	}{
		{"at the decision", Config{NodeLostAt: at, Gang: gang, CutGrace: time.Second}, at, 2500 * time.Millisecond},
		{"the pod came up 2 s later", Config{NodeLostAt: at, Gang: gang, CutGrace: time.Second}, at.Add(2 * time.Second), 500 * time.Millisecond},
		{"long after", Config{NodeLostAt: at, Gang: gang, CutGrace: time.Second}, at.Add(time.Minute), 0},
		{"a decision far ahead (a clock off)", Config{NodeLostAt: at.Add(time.Hour), Gang: gang, CutGrace: time.Second}, at, maxLostWait},
		{"no gang watched", Config{NodeLostAt: at, CutGrace: time.Second}, at, 0},
		{"not a replacement", Config{Gang: gang, CutGrace: time.Second}, at, 0},
	} {
		if got := tc.cfg.oldRankStopped(tc.now); got != tc.want {
			t.Errorf("%s: wait %v, want %v", tc.name, got, tc.want)
		}
	}
}

// The wait holds the worker back: it starts no earlier than the bound.
func TestAReplacementsWorkerStartsAfterTheBound(t *testing.T) {
	dir := t.TempDir()
	started := filepath.Join(dir, "started")
	hub := fakeHub(t, func(net.Conn) {})
	begun := time.Now()
	cfg := Config{
		Args:           []string{"sh", "-c", `date +%s.%N >` + started},
		TerminationLog: filepath.Join(dir, "termination-log"), Log: io.Discard,
		Gang:     &gangwatch.Config{Rank: 1, GPUsPerNode: 1, Hub: hub, Token: "uid/0", Timeout: 2 * time.Second, Log: io.Discard},
		JoinWait: time.Minute, OwnStop: time.Hour, StopGrace: time.Hour, CutGrace: 200 * time.Millisecond,
		NodeLostAt: begun,
	}
	if code := cfg.run(); code != 0 {
		t.Fatalf("exit %d, want the worker's 0", code)
	}
	b, err := os.ReadFile(started)
	if err != nil {
		t.Fatal(err)
	}
	var secs float64
	if _, err := fmt.Sscan(strings.TrimSpace(string(b)), &secs); err != nil {
		t.Fatal(err)
	}
	bound := begun.Add(500*time.Millisecond + 200*time.Millisecond + 250*time.Millisecond)
	if at := time.Unix(0, int64(secs*1e9)); at.Before(bound) {
		t.Errorf("the worker started at %v, before the old rank's bound %v", at, bound)
	}
}
