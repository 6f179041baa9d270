package recovery

import "time"

// Reach is what the operator learned by asking a rank's supervisor directly
// (controllers/supervisorprobe): a second look, from another place than the gang's hub.
type Reach int

const (
	// ReachUnknown means not asked (no address, no port declared), or what came back proves nothing.
	ReachUnknown Reach = iota
	// ReachAnswered means the supervisor answered: its process, its kernel and its network live.
	ReachAnswered
	// ReachAlive means its pod's address refused: a live kernel there, no supervisor listening (a
	// container between two runs).
	ReachAlive
	// ReachSilent means nothing came back within the tries.
	ReachSilent
)

// Laggard is what the operator knows of a rank that has not come back from an in-place
// restart its peers stopped in.
type Laggard struct {
	// NamedSilent: a peer that stopped in the restart named it silent; NamedGone: one said its
	// supervisor went away (NamedLaggard).
	NamedSilent, NamedGone bool
	// LeaseAge is how long ago its node's kubelet renewed its Lease (negative: no Lease),
	// Stale the age at which the kubelet counts as gone, SinceStop how long ago the first
	// whole second after the fault ended (a renewal younger than that came after the fault).
	LeaseAge, Stale, SinceStop time.Duration
	// Reach is what asking its supervisor found; Control what asking a peer that stopped in the
	// restart, on another node, found at the same time: only when the operator reaches that
	// one (its supervisor answered, or its pod's address refused between two runs) is a
	// silence the rank's own.
	Reach, Control Reach
}

// Fate is what LaggardFate decides for a laggard.
type Fate int

const (
	// FateWait decides nothing yet; look again after the returned delay (0: on the next event).
	FateWait Fate = iota
	// FateHung means its node lives and its process does not: replace the pod, no quarantine.
	FateHung
	// FateLost means its node is lost or cut off: replace the pod elsewhere and quarantine the node.
	FateLost
)

// LaggardFate decides a laggard's fate, and when to look again if it waits
// (docs/design/fast-node-loss.md):
//   - its kubelet missed two Lease renewals: Lost (the Lease alone, as before any probe);
//   - its kubelet renewed since the fault: its node lives; Hung if its peers named it silent;
//   - its peers named it silent or gone, no renewal since the fault, and its supervisor silent
//     while a peer's answered or refused (the peer's node and the path to it live): Lost now, without waiting for the Lease (a lost node, or one
//     cut off from the pod network). Both looks, from two places, are needed: a frozen worker
//     or the hub's own blip reads as the first, a NetworkPolicy or a proxy as the second. (A
//     supervisor that went away on a live node leaves its pod's address refusing: Alive.);
//   - its supervisor answered: its node lives, but it is not judged hung before its kubelet
//     renews (as without asking): the supervisor, alive, kills a worker that ignores the
//     gang's stop within seconds, and the kubelet restarts it in place, no pod replaced;
//   - otherwise it waits for the Lease: a rank its peers named is looked at again every
//     recheck, the others when the Lease would lapse.
//
// With no Lease to judge by, the in-place timeout decides.
func LaggardFate(l Laggard, recheck time.Duration) (Fate, time.Duration) {
	if l.LeaseAge < 0 {
		return FateWait, 0
	}
	if l.LeaseAge >= l.Stale {
		return FateLost, 0
	}
	renewed := l.SinceStop > l.LeaseAge
	switch {
	case renewed && l.NamedSilent:
		return FateHung, 0
	case !renewed && (l.NamedSilent || l.NamedGone) && l.Reach == ReachSilent && (l.Control == ReachAnswered || l.Control == ReachAlive):
		return FateLost, 0
	}
	due := l.Stale - l.LeaseAge
	if l.NamedSilent || (l.NamedGone && !renewed) {
		due = min(due, recheck)
	}
	return FateWait, due
}
