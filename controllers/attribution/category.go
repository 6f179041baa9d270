// Package attribution names what a failure was: a category (GPU hardware, NIC or fabric,
// collective timeout, out of memory, user code, storage, …) read from a failed rank's evidence,
// its exit and termination message, through a table of patterns the operator ships and users
// extend (a ConfigMap). Matching is RE2 (linear in the input) over a bounded input.
package attribution

// Category is what a failure was. The values are valid condition reasons and metric labels.
type Category string

const (
	// GPUHardware is a GPU fault the driver or runtime reported (memory access fault,
	// uncorrectable ECC, GPU reset or hang).
	GPUHardware Category = "GPUHardware"
	// NICFabric is a NIC or fabric fault (RDMA completion errors such as retry exceeded, a link
	// or port down).
	NICFabric Category = "NICFabric"
	// PeerLost is a rank whose collective broke because a peer went away (gloo's "Connection
	// reset by peer"): a symptom of another rank's failure, never its root while another rank
	// failed otherwise.
	PeerLost Category = "PeerLost"
	// CollectiveTimeout is a collective that did not complete in time (a watchdog timeout).
	CollectiveTimeout Category = "CollectiveTimeout"
	// Killed is a trainer killed by a signal from outside its code (SIGKILL, SIGTERM, SIGINT,
	// SIGHUP), as its launcher reports it (torchrun's "Signal 9 (SIGKILL) received by PID"):
	// a person, an agent or an OOM killer, never the program's own error.
	Killed Category = "Killed"
	// OutOfMemory is host or GPU memory exhausted.
	OutOfMemory Category = "OutOfMemory"
	// UserCode is the training program's own error (a traceback, an import error, bad
	// arguments).
	UserCode Category = "UserCode"
	// Storage is a failure to read or write files (no space, I/O error, stale handle).
	Storage Category = "Storage"
	// NodeLost is the node gone (NotReady, deleted, a lapsed Lease, shut down).
	NodeLost Category = "NodeLost"
	// Eviction is the pod evicted or preempted (a drain, the scheduler, the kubelet).
	Eviction Category = "Eviction"
	// Infrastructure is the platform failing the pod (image pull, admission, scheduling).
	Infrastructure Category = "Infrastructure"
	// Hang is a rank that stopped making progress (no heartbeat, or its peers found it silent)
	// with nothing else to name why.
	Hang Category = "Hang"
	// Straggler is a rank replaced for being slower than the others
	// (faultTolerance.stragglers.action Replace): no failure of its own, time lost all the same.
	Straggler Category = "Straggler"
	// Unknown is a failure no evidence names.
	Unknown Category = "Unknown"
)

// Categories lists every category, most specific evidence first: when a rank's message
// matches several (a GPU fault also prints a Python traceback), the first wins.
var Categories = []Category{GPUHardware, NICFabric, OutOfMemory, Storage, PeerLost, CollectiveTimeout, Killed, UserCode, NodeLost, Eviction, Infrastructure, Hang, Straggler, Unknown}

// rank orders categories by Categories: lower is more specific.
func rank(c Category) int {
	for i, x := range Categories {
		if x == c {
			return i
		}
	}
	return len(Categories)
}

// Valid reports whether c is a known category.
func Valid(c Category) bool { return rank(c) < len(Categories) }

// Hardware reports whether a failure of category c is the node's fault, not the program's:
// the kind a node is quarantined for.
func Hardware(c Category) bool { return c == GPUHardware || c == NICFabric }
