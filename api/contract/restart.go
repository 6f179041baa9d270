package contract

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
)

// The in-pod restart rule of inPlaceMechanism Supervisor: the operator gives the worker
// container the job's restart rule as EnvRestartExitCodes (and the pod as
// RestartExitCodesAnnotation), zaya-supervisor applies it to the worker's exit, and a fatal
// exit comes back as a TerminationMessageExitCodePrefix line.
const (
	// EnvRestartExitCodes is the restart rule zaya-supervisor applies: "NotIn:0,78" or
	// "In:75,3". Unset, the supervisor passes every exit code through.
	EnvRestartExitCodes = "ZAYA_RESTART_EXIT_CODES"
	// RestartExitCodesAnnotation carries the same rule on the pod, for the operator to read
	// back which exits restart in place.
	RestartExitCodesAnnotation = "training.zaya.dev/restart-exit-codes"
	// TerminationMessageExitCodePrefix starts the line zaya-supervisor appends before it ends
	// its container with exit 0 for a worker exit the rule does not restart ("exit-code=78"):
	// the pod's restartPolicy (OnFailure) would restart any other exit.
	TerminationMessageExitCodePrefix = "exit-code="
)

// maxRuleCodes bounds a rule's codes: the spec's exit-code lists are bounded far below it.
const maxRuleCodes = 256

// RestartRule is which worker exit codes restart the worker in its pod: those In Codes, or
// with In false those not in Codes.
type RestartRule struct {
	In    bool
	Codes []int32
}

// Restarts reports whether an exit with code restarts the worker in place.
func (r RestartRule) Restarts(code int32) bool {
	return slices.Contains(r.Codes, code) == r.In
}

// String is the rule as EnvRestartExitCodes spells it.
func (r RestartRule) String() string {
	op := "NotIn"
	if r.In {
		op = "In"
	}
	codes := make([]string, len(r.Codes))
	for i, c := range r.Codes {
		codes[i] = strconv.FormatInt(int64(c), 10)
	}
	return op + ":" + strings.Join(codes, ",")
}

// ParseRestartRule reads a rule as String writes it.
func ParseRestartRule(s string) (RestartRule, error) {
	op, list, ok := strings.Cut(strings.TrimSpace(s), ":")
	var r RestartRule
	switch {
	case !ok:
		return r, fmt.Errorf("restart rule %q: want In:<codes> or NotIn:<codes>", s)
	case op == "In":
		r.In = true
	case op != "NotIn":
		return r, fmt.Errorf("restart rule %q: operator %q is neither In nor NotIn", s, op)
	}
	if list == "" {
		return r, nil
	}
	fields := strings.Split(list, ",")
	if len(fields) > maxRuleCodes {
		return r, fmt.Errorf("restart rule %q: more than %d codes", s, maxRuleCodes)
	}
	for _, f := range fields {
		c, err := strconv.ParseInt(strings.TrimSpace(f), 10, 32)
		if err != nil {
			return r, fmt.Errorf("restart rule %q: %q is not an exit code", s, f)
		}
		r.Codes = append(r.Codes, int32(c))
	}
	return r, nil
}
