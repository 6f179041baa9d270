package supervisor

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// The installed copy is the executable itself, runnable, and installing again over a copy
// (an init container restarted) replaces it whole.
func TestInstallCopiesTheExecutable(t *testing.T) {
	dir := t.TempDir()
	src := filepath.Join(t.TempDir(), "bin")
	if err := os.WriteFile(src, []byte("#!/bin/sh\necho installed \"$@\"\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if err := installFrom(src, dir); err != nil {
			t.Fatal(err)
		}
	}
	out, err := exec.Command(filepath.Join(dir, InstalledName), "ok").Output()
	if err != nil || string(out) != "installed ok\n" {
		t.Fatalf("running the copy: %q, %v", out, err)
	}
	entries, _ := os.ReadDir(dir)
	if len(entries) != 1 {
		t.Errorf("the folder holds %d entries, want only %s", len(entries), InstalledName)
	}
	if fi, err := os.Stat(filepath.Join(dir, InstalledName)); err != nil || fi.Mode().Perm() != 0o555 {
		t.Errorf("mode %v, %v: want r-xr-xr-x", fi.Mode(), err)
	}
	if got, _ := os.ReadFile(filepath.Join(dir, InstalledName)); !bytes.HasPrefix(got, []byte("#!/bin/sh")) {
		t.Errorf("copy holds %q", got)
	}
	if err := installFrom(src, filepath.Join(dir, "missing")); err == nil || !strings.Contains(err.Error(), "install") {
		t.Errorf("installing into a missing folder: %v", err)
	}
}
