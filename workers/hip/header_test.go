package hip

import (
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/zaya-operator/zaya-operator/workers/attention"
)

// TestSharedMathMatchesTheGoBackend compiles zaya_attention.h into a host program and checks
// that its merge agrees with workers/attention's, edge cases included.
func TestSharedMathMatchesTheGoBackend(t *testing.T) {
	cc := os.Getenv("ZAYA_HOST_CLANG")
	if cc == "" {
		cc = "clang-19"
	}
	if _, err := exec.LookPath(cc); err != nil {
		if os.Getenv("CI") != "" {
			t.Fatalf("%s not found: CI installs clang-19 (see .ci/run)", cc)
		}
		t.Skipf("%s not found: apt-get install clang-19", cc)
	}
	bin := filepath.Join(t.TempDir(), "merge_host")
	if b, err := exec.Command(cc, "-O2", "-Wall", "-Werror", "-o", bin, "testdata/merge_host.c", "-lm").CombinedOutput(); err != nil {
		t.Fatalf("compiling the host harness: %v\n%s", err, b)
	}
	pairs := [][2]float64{
		{0, 0}, {1, -1}, {-3.5, 2.25}, {80, 80.5}, {1e30, 1e30}, {-800, 800}, {88, -88},
		{math.Inf(-1), 2}, {2, math.Inf(-1)}, {math.Inf(-1), math.Inf(-1)},
	}
	var args []string
	for _, p := range pairs {
		args = append(args, fmt.Sprint(p[0]), fmt.Sprint(p[1]))
	}
	out, err := exec.Command(bin, args...).Output()
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	if len(lines) != len(pairs) {
		t.Fatalf("harness printed %d lines for %d pairs", len(lines), len(pairs))
	}
	for i, p := range pairs {
		var gotLSE, gotW float64
		if _, err := fmt.Sscan(lines[i], &gotLSE, &gotW); err != nil {
			t.Fatalf("line %q: %v", lines[i], err)
		}
		// The Go merge on one-element outputs 0 and 1 gives the weight of side b as its output.
		o := []float32{0}
		wantLSE := attention.MergeRow(o, p[0], []float32{1}, p[1])
		wantW := float64(o[0])
		if math.IsNaN(gotLSE) || (gotLSE != wantLSE && math.Abs(gotLSE-wantLSE) > 1e-6*(1+math.Abs(wantLSE))) {
			t.Errorf("merge_lse(%v, %v): header %v, Go %v", p[0], p[1], gotLSE, wantLSE)
		}
		if math.Abs(gotW-wantW) > 1e-6 {
			t.Errorf("merge weight(%v, %v): header %v, Go %v", p[0], p[1], gotW, wantW)
		}
	}
}
