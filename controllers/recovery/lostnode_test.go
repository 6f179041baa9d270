package recovery

import (
	"testing"
	"time"
)

func TestLaggardFate(t *testing.T) {
	const recheck = 2 * time.Second
	// A 40 s Lease: stale at 20 s. The fault's first whole second ended 4 s ago.
	base := Laggard{Stale: 20 * time.Second, SinceStop: 4 * time.Second}
	with := func(mut func(*Laggard)) Laggard { l := base; mut(&l); return l }
	for _, tc := range []struct {
		name string
		l    Laggard
		fate Fate
		due  time.Duration
	}{
		{"Lease lapsed", with(func(l *Laggard) { l.LeaseAge = 21 * time.Second }), FateLost, 0},
		{"Lease lapsed, even if its supervisor answers", with(func(l *Laggard) {
			l.LeaseAge, l.Reach, l.Control = 21*time.Second, ReachAnswered, ReachAnswered
		}), FateLost, 0},
		{"named silent, renewed since", with(func(l *Laggard) { l.LeaseAge, l.NamedSilent = time.Second, true }), FateHung, 0},
		{"named silent, silent to the operator, a peer answered", with(func(l *Laggard) {
			l.LeaseAge, l.NamedSilent, l.Reach, l.Control = 6*time.Second, true, ReachSilent, ReachAnswered
		}), FateLost, 0},
		// A peer between two runs refuses at its pod's address: its node and the way to it live.
		{"named silent, silent to the operator, a peer's address refused", with(func(l *Laggard) {
			l.LeaseAge, l.NamedSilent, l.Reach, l.Control = 6*time.Second, true, ReachSilent, ReachAlive
		}), FateLost, 0},
		{"named silent, silent, the peer unknown (a proxy's error)", with(func(l *Laggard) {
			l.LeaseAge, l.NamedSilent, l.Reach, l.Control = 6*time.Second, true, ReachSilent, ReachUnknown
		}), FateWait, recheck},
		{"named silent, silent, the peer silent too: the operator reaches nobody", with(func(l *Laggard) {
			l.LeaseAge, l.NamedSilent, l.Reach, l.Control = 6*time.Second, true, ReachSilent, ReachSilent
		}), FateWait, recheck},
		{"named silent, silent, no peer to ask", with(func(l *Laggard) {
			l.LeaseAge, l.NamedSilent, l.Reach = 6*time.Second, true, ReachSilent
		}), FateWait, recheck},
		{"silent to the operator but nobody named it", with(func(l *Laggard) {
			l.LeaseAge, l.Reach, l.Control = 6*time.Second, ReachSilent, ReachAnswered
		}), FateWait, 14 * time.Second},
		// Alive, its supervisor kills the worker and the kubelet restarts it, unless its
		// kubelet renews first (then it is hung, as without asking).
		{"named silent, its supervisor answered", with(func(l *Laggard) {
			l.LeaseAge, l.NamedSilent, l.Reach, l.Control = 6*time.Second, true, ReachAnswered, ReachAnswered
		}), FateWait, recheck},
		{"named silent, its address refused: a container between runs", with(func(l *Laggard) {
			l.LeaseAge, l.NamedSilent, l.Reach, l.Control = 6*time.Second, true, ReachAlive, ReachAnswered
		}), FateWait, recheck},
		{"named silent, not asked", with(func(l *Laggard) { l.LeaseAge, l.NamedSilent = 6*time.Second, true }), FateWait, recheck},
		// A renewal in the fault's own second may have come before the fault.
		{"renewed only in the fault's second, silent", with(func(l *Laggard) {
			l.LeaseAge, l.NamedSilent, l.Reach, l.Control = 4*time.Second, true, ReachSilent, ReachAnswered
		}), FateLost, 0},
		{"named gone, silent, a peer answered: its node shut down", with(func(l *Laggard) {
			l.LeaseAge, l.NamedGone, l.Reach, l.Control = 6*time.Second, true, ReachSilent, ReachAnswered
		}), FateLost, 0},
		{"named gone, answered: a new supervisor, not a hang", with(func(l *Laggard) {
			l.LeaseAge, l.NamedGone, l.Reach, l.Control = 6*time.Second, true, ReachAnswered, ReachAnswered
		}), FateWait, recheck},
		{"named gone, renewed since: its kubelet will say", with(func(l *Laggard) {
			l.LeaseAge, l.NamedGone, l.Reach, l.Control = time.Second, true, ReachSilent, ReachAnswered
		}), FateWait, 19 * time.Second},
		{"no Lease, named silent, answered", with(func(l *Laggard) {
			l.LeaseAge, l.NamedSilent, l.Reach = -1, true, ReachAnswered
		}), FateWait, 0},
		{"no Lease, named silent, silent: the in-place timeout decides", with(func(l *Laggard) {
			l.LeaseAge, l.NamedSilent, l.Reach, l.Control = -1, true, ReachSilent, ReachAnswered
		}), FateWait, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fate, due := LaggardFate(tc.l, recheck)
			if fate != tc.fate || due != tc.due {
				t.Errorf("LaggardFate(%+v) = %d, %s; want %d, %s", tc.l, fate, due, tc.fate, tc.due)
			}
		})
	}
}

// The gang watch's words for a connection that ended, either side, name the node rank.
func TestSupervisorGoneNamesTheNodeRank(t *testing.T) {
	for msg, want := range map[string]string{
		"zaya-supervisor: gang watch: node rank 3's supervisor went away: EOF":                          "3",
		"zaya-supervisor: gang watch: lost the hub (node rank 0 at llm-0-0.llm:29510): EOF":             "0",
		"zaya-supervisor: gang watch: lost rank 0 (node rank 0, the hub at llm-0-0:29510): peer silent": "",
		"zaya-supervisor: gang watch: node rank 2's worker failed: exit 1":                              "",
	} {
		m := SupervisorGone.FindStringSubmatch(msg)
		got := ""
		if m != nil {
			got = m[1] + m[2]
		}
		if got != want {
			t.Errorf("%q names node rank %q, want %q", msg, got, want)
		}
	}
}
