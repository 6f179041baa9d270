package main

import (
	"errors"
	"os/exec"
	"strings"
	"testing"
)

const contractPkg = "github.com/zaya-operator/zaya-operator/api/contract"

// goList runs `go list args...` and returns the fields of its output.
func goList(t *testing.T, args ...string) []string {
	t.Helper()
	// go test puts its own go first on PATH, so this is the toolchain under test.
	goTool, err := exec.LookPath("go")
	if err != nil {
		t.Fatalf("the go command is needed to list dependencies: %v", err)
	}
	out, err := exec.Command(goTool, append([]string{"list"}, args...)...).Output()
	if err != nil {
		var exit *exec.ExitError
		if errors.As(err, &exit) {
			t.Fatalf("go list %v: %v\n%s", args, err, exit.Stderr)
		}
		t.Fatalf("go list %v: %v", args, err)
	}
	return strings.Fields(string(out))
}

// TestWorkerLinksNoKubernetes: the worker shares the contract with the operator through
// api/contract alone; importing api/v1alpha1 (or anything Kubernetes) would put
// controller-runtime and client-go into every training image.
func TestWorkerLinksNoKubernetes(t *testing.T) {
	for _, tags := range []string{"", "rocm"} {
		list := goList(t, "-deps", "-tags="+tags, ".")
		var kube []string
		sawContract := false
		for _, p := range list {
			if strings.HasPrefix(p, "k8s.io/") || strings.HasPrefix(p, "sigs.k8s.io/") {
				kube = append(kube, p)
			}
			sawContract = sawContract || p == contractPkg
		}
		if len(kube) > 0 {
			t.Errorf("-tags=%q: the worker links %d Kubernetes packages: %v", tags, len(kube), kube)
		}
		// Also shows the listing is the worker's real graph, not an empty one.
		if !sawContract {
			t.Errorf("-tags=%q: the worker does not link %s: %v", tags, contractPkg, list)
		}
	}
}

// TestContractImportsOnlyTheStandardLibrary keeps api/contract cheap for the worker to import.
func TestContractImportsOnlyTheStandardLibrary(t *testing.T) {
	got := goList(t, "-deps", "-f", "{{if not .Standard}}{{.ImportPath}}{{end}}", contractPkg)
	if len(got) != 1 || got[0] != contractPkg {
		t.Fatalf("%s depends on non-standard packages: %v", contractPkg, got)
	}
}
