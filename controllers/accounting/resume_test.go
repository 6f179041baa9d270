package accounting

import (
	"strings"
	"testing"

	"github.com/zaya-operator/zaya-operator/controllers/bounded"
	"github.com/zaya-operator/zaya-operator/controllers/gang"
)

// What status keeps of a corrupt step is the worker's word, bounded: a name only of the form
// the worker makes, a reason cut to the schema's length; a peer's account names no place.
func TestACorruptStepsAccountIsBounded(t *testing.T) {
	for _, tc := range []struct {
		detail, movedTo, reason string
	}{
		{"moved to corrupt-step-20-17: manifest.json: torn", "corrupt-step-20-17", "manifest.json: torn"},
		{"moved aside by rank 0", "", ""},
		{"moved to ../../etc: gone", "", "gone"},
		{"moved to corrupt-step-21-17: wrong step", "", "wrong step"},
		{"moved to corrupt-step-20-: no time", "", "no time"},
		{"moved to corrupt-step-20-1x: letters", "", "letters"},
		{"moved to corrupt-step-20-9: " + strings.Repeat("é", 400), "corrupt-step-20-9", bounded.Cut(strings.Repeat("é", 400), maxCorruptReason)},
	} {
		movedTo, reason := corruptAccount(gang.CorruptStep{Step: 20, Detail: tc.detail})
		if movedTo != tc.movedTo || reason != tc.reason {
			t.Errorf("%q: moved to %q because %q, want %q, %q", tc.detail, movedTo, reason, tc.movedTo, tc.reason)
		}
		if len(reason) > maxCorruptReason {
			t.Errorf("%q: reason of %d bytes", tc.detail, len(reason))
		}
	}
}
