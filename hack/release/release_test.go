package main

import (
	"archive/zip"
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"
)

// tool is a binary hack/tools.sh built into bin/.
func tool(t *testing.T, name string) string {
	t.Helper()
	p, err := filepath.Abs(filepath.Join("..", "..", "bin", name))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(p); err != nil {
		t.Fatalf("%s is missing: run `hack/tools.sh %s`: %v", name, name, err)
	}
	return p
}

func run(t *testing.T, env []string, dir, bin string, args ...string) string {
	t.Helper()
	cmd := exec.Command(bin, args...)
	cmd.Dir, cmd.Env = dir, append(os.Environ(), env...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%s %v: %v\n%s", filepath.Base(bin), args, err, out)
	}
	return string(out)
}

// TestARelease builds a release for this machine's platform and installs its plugin as krew
// does, from the manifest and the archive, checked against the manifest's sha256: the
// installed plugin reports the release's version. The checksums are sha256sum's, the chart's
// package carries the version, and a second build gives the same archive.
func TestARelease(t *testing.T) {
	root, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	const version = "v0.9.1-rc.1"
	here := platform{runtime.GOOS, runtime.GOARCH}
	o := options{Version: version, Out: filepath.Join(t.TempDir(), "dist"), Platforms: []platform{here}, BaseURL: "https://example.com/r", Helm: tool(t, "helm"), Root: root}
	files, err := release(context.Background(), o)
	if err != nil {
		t.Fatal(err)
	}
	archive := "kubectl-zaya_" + version + "_" + here.OS + "_" + here.Arch + ".tar.gz"
	want := []string{archive, "zaya.yaml", "zaya-operator-0.9.1-rc.1.tgz", "checksums.txt"}
	if strings.Join(files, " ") != strings.Join(want, " ") {
		t.Fatalf("release wrote %v, want %v", files, want)
	}
	run(t, nil, o.Out, "sha256sum", "--check", "--strict", "checksums.txt")

	b, err := os.ReadFile(filepath.Join(o.Out, "zaya.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var m krewPlugin
	if err := yaml.UnmarshalStrict(b, &m); err != nil {
		t.Fatalf("zaya.yaml: %v", err)
	}
	if len(m.Spec.Platforms) != 1 || m.Spec.Platforms[0].URI != "https://example.com/r/"+version+"/"+archive {
		t.Errorf("zaya.yaml's platforms: %+v", m.Spec.Platforms)
	}

	// krew checks the manifest (its schema, name and selectors) and the archive's sha256
	// against it, unpacks it and links the binary.
	krewRoot := t.TempDir()
	env := []string{"KREW_ROOT=" + krewRoot, "HOME=" + t.TempDir()}
	run(t, env, o.Out, tool(t, "krew"), "install", "--no-update-index", "--manifest=zaya.yaml", "--archive="+archive)
	if out := run(t, nil, "", filepath.Join(krewRoot, "bin", "kubectl-zaya"), "version"); !strings.HasPrefix(out, "kubectl-zaya "+version+" ") {
		t.Errorf("the installed plugin says %q, want version %s", out, version)
	}

	chart := run(t, nil, "", o.Helm, "show", "chart", filepath.Join(o.Out, "zaya-operator-0.9.1-rc.1.tgz"))
	for _, line := range []string{"version: 0.9.1-rc.1", "appVersion: 0.9.1-rc.1"} {
		if !strings.Contains(chart, line) {
			t.Errorf("the chart's package lacks %q:\n%s", line, chart)
		}
	}

	// Reproducible: the same source builds the same archive.
	first, err := os.ReadFile(filepath.Join(o.Out, archive))
	if err != nil {
		t.Fatal(err)
	}
	o.Out, o.Helm = filepath.Join(t.TempDir(), "again"), ""
	if _, err := release(context.Background(), o); err != nil {
		t.Fatal(err)
	}
	if again, err := os.ReadFile(filepath.Join(o.Out, archive)); err != nil || !bytes.Equal(first, again) {
		t.Errorf("a second build's archive differs from the first (%v)", err)
	}
}

func TestAReleaseRefusesABadVersionOrPlatform(t *testing.T) {
	for _, v := range []string{"", "0.3.0", "v0.3", "v0.3.0;rm -rf /", "v01.2.3"} {
		if _, err := release(context.Background(), options{Version: v, Out: t.TempDir()}); err == nil || !strings.Contains(err.Error(), "-version") {
			t.Errorf("version %q: %v, want an error naming -version", v, err)
		}
	}
	for _, p := range []string{"linux", "linux/", "/amd64", "linux/amd64,"} {
		if _, err := parsePlatforms(p); err == nil {
			t.Errorf("platforms %q: no error", p)
		}
	}
}

func TestZipArchivesKeepTheExecutableBit(t *testing.T) {
	b, err := zipOf([]entry{{"kubectl-zaya.exe", []byte("MZ"), 0o755}})
	if err != nil {
		t.Fatal(err)
	}
	r, err := zip.NewReader(bytes.NewReader(b), int64(len(b)))
	if err != nil {
		t.Fatal(err)
	}
	if m := r.File[0].Mode(); m.Perm() != 0o755 || !r.File[0].Modified.Equal(epoch) {
		t.Errorf("zipped as %v at %v, want 0755 at %v", m, r.File[0].Modified, epoch)
	}
	again, _ := zipOf([]entry{{"kubectl-zaya.exe", []byte("MZ"), 0o755}})
	if !bytes.Equal(b, again) {
		t.Error("the same files zip to different bytes")
	}
}
