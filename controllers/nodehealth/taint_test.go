package nodehealth

import (
	"testing"
	"time"
)

func TestHardwareRootsReadNoGarbage(t *testing.T) {
	got := readHardwareRoots("a=2026-11-21T08:00:00Z,=2026-11-21T08:00:00Z,b=yesterday,c,d=2026-11-21T07:00:00Z", time.Date(2026, 11, 21, 8, 0, 0, 0, time.UTC).Add(-30*time.Minute))
	if len(got) != 1 || got[0].namespace != "a" {
		t.Errorf("read %+v, want only a's root", got)
	}
}
