package recovery

import (
	"fmt"
	"hash/fnv"
	"slices"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/utils/ptr"

	trainingv1alpha1 "github.com/zaya-operator/zaya-operator/api/v1alpha1"
	"github.com/zaya-operator/zaya-operator/controllers/attribution"
)

// RepeatedFailuresToQuarantine is how many worker failures on one node within restartWindow
// (the current one included) quarantine it: a GPU that corrupts results or a flaky NIC can
// crash a rank again and again while every health signal stays green, and restarting in place
// on it would only repeat the crash.
const RepeatedFailuresToQuarantine = 3

// againstNode reports whether a failure counts against its node: a worker's failure does
// unless it is the program's own bug, which would follow the rank to any node (and has its own
// bound, userCodeRestarts), or a stop over a peer: a bystander of another rank's fault (its
// node lost, say, before its Lease told), which says nothing of its own node (the soak, seed
// 1621744479: a lost node's peer, stopped three times in a window, had its healthy node
// quarantined).
func againstNode(x trainingv1alpha1.JobFailure) bool {
	return (x.Reason == trainingv1alpha1.FailureReasonExitCode || x.Reason == trainingv1alpha1.FailureReasonHang) &&
		x.Category != string(attribution.UserCode) && ptr.Deref(x.ExitCode, 0) != trainingv1alpha1.ExitStopped
}

// RepeatedOnNode is how many failures f makes on its node since then, counting the recent
// ones (status.recentFailures) that count against a node; 0 when f itself does not.
func RepeatedOnNode(f trainingv1alpha1.JobFailure, recent []trainingv1alpha1.JobFailure, since time.Time) int {
	if f.Node == "" || !againstNode(f) {
		return 0
	}
	n := 1
	for _, r := range recent {
		if r.Node == f.Node && againstNode(r) && r.Time.After(since) {
			n++
		}
	}
	return n
}

// ExpireQuarantine releases from st the nodes quarantined longer than after, so a repaired node
// can come back, and returns them and when the next one is due (0 for none).
func ExpireQuarantine(st *trainingv1alpha1.ZayaTrainingJobStatus, after time.Duration, now time.Time) (released []trainingv1alpha1.QuarantinedNode, next time.Duration) {
	kept := st.QuarantinedNodes[:0:0]
	for _, q := range st.QuarantinedNodes {
		due := q.Since.Add(after).Sub(now)
		if due <= 0 {
			released = append(released, q)
			continue
		}
		if next == 0 || due < next {
			next = due
		}
		kept = append(kept, q)
	}
	if len(released) > 0 {
		st.QuarantinedNodes = kept
	}
	return released, next
}

// TaintValue names the job in the quarantine taint: <namespace>.<name>, shortened with a hash
// when longer than the 63 characters a taint value may hold (a namespace alone may be 63).
func TaintValue(ns, name string) string {
	v := ns + "." + name
	if len(v) <= validation.LabelValueMaxLength {
		return v
	}
	sum := fnv.New32a()
	_, _ = sum.Write([]byte(v))
	suffix := fmt.Sprintf("-%08x", sum.Sum32())
	return strings.TrimRight(v[:validation.LabelValueMaxLength-len(suffix)], "-_.") + suffix
}

// Quarantined reports whether the job keeps its ranks off node.
func Quarantined(st *trainingv1alpha1.ZayaTrainingJobStatus, node string) bool {
	return slices.ContainsFunc(st.QuarantinedNodes, func(q trainingv1alpha1.QuarantinedNode) bool { return q.Name == node })
}
