package recovery

import (
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/util/validation"
)

func TestTaintValueIsAValidLabelValue(t *testing.T) {
	long := strings.Repeat("n", 63)
	for _, tc := range []struct{ ns, name string }{{"ns", "llm"}, {long, strings.Repeat("j", 50)}, {long[:60] + "-ab", "x"}} {
		v := TaintValue(tc.ns, tc.name)
		if errs := validation.IsValidLabelValue(v); len(errs) > 0 {
			t.Errorf("TaintValue(%q, %q) = %q: %v", tc.ns, tc.name, v, errs)
		}
	}
	if a, b := TaintValue(long, "a"+strings.Repeat("j", 49)), TaintValue(long, "b"+strings.Repeat("j", 49)); a == b {
		t.Errorf("two jobs share the taint value %q", a)
	}
	if got := TaintValue("ns", "llm"); got != "ns.llm" {
		t.Errorf("short value = %q, want ns.llm", got)
	}
}
