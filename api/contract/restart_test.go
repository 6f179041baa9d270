package contract

import (
	"strings"
	"testing"
)

func TestARestartRuleReadsBackAsWritten(t *testing.T) {
	for _, r := range []RestartRule{{In: false, Codes: []int32{0, 78}}, {In: true, Codes: []int32{3, 75}}, {In: true}} {
		got, err := ParseRestartRule(r.String())
		if err != nil || got.In != r.In || len(got.Codes) != len(r.Codes) {
			t.Fatalf("%q read back as %+v, %v", r.String(), got, err)
		}
		for i := range r.Codes {
			if got.Codes[i] != r.Codes[i] {
				t.Fatalf("%q read back as %+v", r.String(), got)
			}
		}
	}
}

func TestARestartRuleRestartsExactlyItsCodes(t *testing.T) {
	notIn := RestartRule{Codes: []int32{0, 78}}
	in := RestartRule{In: true, Codes: []int32{75}}
	for _, c := range []struct {
		rule RestartRule
		code int32
		want bool
	}{{notIn, 1, true}, {notIn, 137, true}, {notIn, 0, false}, {notIn, 78, false}, {in, 75, true}, {in, 1, false}} {
		if got := c.rule.Restarts(c.code); got != c.want {
			t.Errorf("%s restarts %d: %v, want %v", c.rule, c.code, got, c.want)
		}
	}
}

func TestABadRestartRuleIsRefused(t *testing.T) {
	for _, s := range []string{"", "0,78", "Maybe:1", "In:x", "In:1,,2", "NotIn:99999999999", "In:" + strings.Repeat("1,", 300) + "1"} {
		if r, err := ParseRestartRule(s); err == nil {
			t.Errorf("%q read as %+v, want an error", s, r)
		}
	}
}
