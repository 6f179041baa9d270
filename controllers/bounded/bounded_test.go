package bounded

import (
	"strings"
	"testing"
	"unicode/utf8"
)

func TestACutKeepsRunesWhole(t *testing.T) {
	long := strings.Repeat("é", MessageLength) // 2 bytes each
	got := Message(long)
	if len(got) > MessageLength || !strings.HasSuffix(got, "...") || !utf8.ValidString(got) {
		t.Errorf("Message gave %d bytes, valid=%v", len(got), utf8.ValidString(got))
	}
	if s := "short"; Message(s) != s {
		t.Errorf("Message changed a short message")
	}
	for n := range 4 {
		if got := Cut("abcdef", n); len(got) > n {
			t.Errorf("Cut to %d gave %q", n, got)
		}
	}
}
