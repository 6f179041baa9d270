package supervisor

import (
	"testing"
	"time"

	"github.com/zaya-operator/zaya-operator/api/contract"
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
