// Command release builds what a release of zaya-operator ships, into one folder:
//
//   - kubectl-zaya_VERSION_OS_ARCH.tar.gz (.zip on Windows) for each platform: the plugin, as
//     krew and a person unpack it;
//   - zaya.yaml: the plugin's krew manifest, each platform's archive at -base-url with its
//     sha256 (`kubectl krew install --manifest=zaya.yaml`);
//   - zaya-operator-VERSION.tgz: the Helm chart, its version and appVersion the release's;
//   - checksums.txt: sha256sum's format for every file above.
//
// Archives are reproducible: the same source and Go give the same bytes (fixed times, owners
// and order; -trimpath, no build ID). make release runs it; hack/release's test installs what
// it built with krew.
package main

import (
	"archive/tar"
	"archive/zip"
	"bytes"
	"compress/gzip"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"time"

	"sigs.k8s.io/yaml"
)

// Platforms a release builds the plugin for by default.
var defaultPlatforms = "linux/amd64,linux/arm64,darwin/amd64,darwin/arm64,windows/amd64"

// versionRule is a release's version: semver with a leading v, as Go modules, krew and Helm
// (without the v) take it.
var versionRule = regexp.MustCompile(`^v(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)(-[0-9A-Za-z.-]+)?$`)

// epoch is every archived file's time: archives do not change with the clock.
var epoch = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

const (
	module  = "github.com/zaya-operator/zaya-operator"
	plugin  = "kubectl-zaya"
	chart   = "charts/zaya-operator"
	baseURL = "https://github.com/zaya-operator/zaya-operator/releases/download"
)

// options are a release's inputs.
type options struct {
	Version   string
	Out       string
	Platforms []platform
	BaseURL   string // where the archives will be downloaded from; the version is appended
	Helm      string // the helm binary; "" leaves the chart out
	Root      string // the repository
}

type platform struct{ OS, Arch string }

func (p platform) String() string { return p.OS + "/" + p.Arch }

func main() {
	root, err := os.Getwd()
	if err != nil {
		fail(err)
	}
	o := options{Root: root}
	var platforms string
	flag.StringVar(&o.Version, "version", "", "the release's version, vMAJOR.MINOR.PATCH[-PRE]")
	flag.StringVar(&o.Out, "out", "dist", "the folder to write into (emptied first)")
	flag.StringVar(&platforms, "platforms", defaultPlatforms, "OS/ARCH pairs to build the plugin for")
	flag.StringVar(&o.BaseURL, "base-url", baseURL, "the release's download URL, without the version")
	flag.StringVar(&o.Helm, "helm", filepath.Join(root, "bin", "helm"), `helm, to package the chart ("" to leave it out)`)
	flag.Parse()
	if o.Platforms, err = parsePlatforms(platforms); err != nil {
		fail(err)
	}
	files, err := release(context.Background(), o)
	if err != nil {
		fail(err)
	}
	for _, f := range files {
		fmt.Println(filepath.Join(o.Out, f))
	}
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "release:", err)
	os.Exit(1)
}

func parsePlatforms(s string) ([]platform, error) {
	var out []platform
	for _, p := range strings.Split(s, ",") {
		goos, goarch, ok := strings.Cut(strings.TrimSpace(p), "/")
		if !ok || goos == "" || goarch == "" {
			return nil, fmt.Errorf("-platforms: %q is not OS/ARCH", p)
		}
		out = append(out, platform{goos, goarch})
	}
	return out, nil
}

// release builds everything into o.Out and returns the files' names.
func release(ctx context.Context, o options) ([]string, error) {
	if !versionRule.MatchString(o.Version) {
		return nil, fmt.Errorf("-version %q: want vMAJOR.MINOR.PATCH[-PRE], as a Git tag", o.Version)
	}
	if err := os.RemoveAll(o.Out); err != nil {
		return nil, err
	}
	if err := os.MkdirAll(o.Out, 0o755); err != nil {
		return nil, err
	}
	manifest := krewManifest(o.Version)
	var files []string
	for _, p := range o.Platforms {
		name, sum, err := pluginArchive(ctx, o, p)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", p, err)
		}
		files = append(files, name)
		manifest.Spec.Platforms = append(manifest.Spec.Platforms, platformOf(p, strings.TrimSuffix(o.BaseURL, "/")+"/"+o.Version+"/"+name, sum))
	}
	b, err := yaml.Marshal(manifest)
	if err != nil {
		return nil, err
	}
	if err := os.WriteFile(filepath.Join(o.Out, "zaya.yaml"), b, 0o644); err != nil {
		return nil, err
	}
	files = append(files, "zaya.yaml")
	if o.Helm != "" {
		name, err := chartPackage(ctx, o)
		if err != nil {
			return nil, fmt.Errorf("the chart: %w", err)
		}
		files = append(files, name)
	}
	return append(files, "checksums.txt"), checksums(o.Out, files)
}

// pluginArchive builds the plugin for p and archives it; it returns the archive's name and
// sha256.
func pluginArchive(ctx context.Context, o options, p platform) (string, string, error) {
	exe := plugin
	if p.OS == "windows" {
		exe += ".exe"
	}
	build := filepath.Join(o.Out, ".build", p.OS+"-"+p.Arch)
	defer func() { _ = os.RemoveAll(filepath.Join(o.Out, ".build")) }()
	cmd := exec.CommandContext(ctx, "go", "build", "-trimpath", "-buildvcs=false",
		"-ldflags", "-s -w -buildid= -X "+module+"/internal/zayactl.Version="+o.Version,
		"-o", filepath.Join(build, exe), "./cmd/kubectl-zaya")
	cmd.Dir = o.Root
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS="+p.OS, "GOARCH="+p.Arch)
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", "", fmt.Errorf("go build: %w\n%s", err, out)
	}
	bin, err := os.ReadFile(filepath.Join(build, exe))
	if err != nil {
		return "", "", err
	}
	readme, err := os.ReadFile(filepath.Join(o.Root, "cmd", "kubectl-zaya", "README.md"))
	if err != nil {
		return "", "", err
	}
	entries := []entry{{exe, bin, 0o755}, {"README.md", readme, 0o644}}
	name := fmt.Sprintf("%s_%s_%s_%s", plugin, o.Version, p.OS, p.Arch)
	var b []byte
	if p.OS == "windows" {
		name += ".zip"
		b, err = zipOf(entries)
	} else {
		name += ".tar.gz"
		b, err = tarGzOf(entries)
	}
	if err != nil {
		return "", "", err
	}
	sum := sha256.Sum256(b)
	return name, hex.EncodeToString(sum[:]), os.WriteFile(filepath.Join(o.Out, name), b, 0o644)
}

// entry is a file in an archive.
type entry struct {
	Name string
	Data []byte
	Mode fs.FileMode
}

func tarGzOf(entries []entry) ([]byte, error) {
	var buf bytes.Buffer
	gz, err := gzip.NewWriterLevel(&buf, gzip.BestCompression)
	if err != nil {
		return nil, err
	}
	tw := tar.NewWriter(gz)
	for _, e := range entries {
		h := &tar.Header{Name: e.Name, Mode: int64(e.Mode), Size: int64(len(e.Data)), ModTime: epoch, Typeflag: tar.TypeReg, Format: tar.FormatPAX}
		if err := tw.WriteHeader(h); err != nil {
			return nil, err
		}
		if _, err := tw.Write(e.Data); err != nil {
			return nil, err
		}
	}
	if err := errors.Join(tw.Close(), gz.Close()); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

func zipOf(entries []entry) ([]byte, error) {
	var buf bytes.Buffer
	zw := zip.NewWriter(&buf)
	for _, e := range entries {
		h := &zip.FileHeader{Name: e.Name, Method: zip.Deflate, Modified: epoch}
		h.SetMode(e.Mode)
		w, err := zw.CreateHeader(h)
		if err != nil {
			return nil, err
		}
		if _, err := w.Write(e.Data); err != nil {
			return nil, err
		}
	}
	if err := zw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// krewPlugin is krew's plugin manifest (krew.googlecontainertools.github.com/v1alpha2), the
// fields a release fills. krew's own types (sigs.k8s.io/krew/pkg/index) cannot be imported:
// its go.mod needs github.com/imdario/mergo, which this module's graph lifts to v1.0.2, a
// release renamed dario.cat/mergo. The test installs the manifest with krew itself.
type krewPlugin struct {
	APIVersion string `json:"apiVersion"`
	Kind       string `json:"kind"`
	Metadata   struct {
		Name string `json:"name"`
	} `json:"metadata"`
	Spec krewSpec `json:"spec"`
}

type krewSpec struct {
	Version          string         `json:"version"`
	Homepage         string         `json:"homepage"`
	ShortDescription string         `json:"shortDescription"`
	Description      string         `json:"description"`
	Platforms        []krewPlatform `json:"platforms"`
}

type krewPlatform struct {
	Selector struct {
		MatchLabels map[string]string `json:"matchLabels"`
	} `json:"selector"`
	URI    string     `json:"uri"`
	Sha256 string     `json:"sha256"`
	Files  []krewFile `json:"files"`
	Bin    string     `json:"bin"`
}

type krewFile struct {
	From string `json:"from"`
	To   string `json:"to"`
}

func krewManifest(version string) *krewPlugin {
	m := &krewPlugin{
		APIVersion: "krew.googlecontainertools.github.com/v1alpha2", Kind: "Plugin",
		Spec: krewSpec{
			Version:          version,
			Homepage:         "https://" + module,
			ShortDescription: "Look at ZayaTrainingJobs: gang, failures, goodput, logs",
			Description: "kubectl zaya shows what zaya-operator knows about a distributed training job:\n" +
				"status (the gang, its ranks, spares and quarantined nodes), why (every failure's root\n" +
				"rank, category, evidence and what the operator did), goodput (a timeline, also as SVG),\n" +
				"logs (a rank's, or the root cause's as it failed) and preflight (what the cluster\n" +
				"lacks before the first job).\n",
		},
	}
	m.Metadata.Name = "zaya"
	return m
}

func platformOf(p platform, uri, sum string) krewPlatform {
	exe := plugin
	if p.OS == "windows" {
		exe += ".exe"
	}
	k := krewPlatform{URI: uri, Sha256: sum, Files: []krewFile{{From: exe, To: "."}, {From: "README.md", To: "."}}, Bin: exe}
	k.Selector.MatchLabels = map[string]string{"os": p.OS, "arch": p.Arch}
	return k
}

// chartPackage packages the chart with the release's version as its version and appVersion
// (the images' tag), and returns the package's name.
func chartPackage(ctx context.Context, o options) (string, error) {
	v := strings.TrimPrefix(o.Version, "v")
	cmd := exec.CommandContext(ctx, o.Helm, "package", filepath.Join(o.Root, chart), "--version", v, "--app-version", v, "-d", o.Out)
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("helm package: %w\n%s", err, out)
	}
	return "zaya-operator-" + v + ".tgz", nil
}

// checksums writes checksums.txt as sha256sum writes it: `sha256sum -c checksums.txt` checks
// a download.
func checksums(dir string, files []string) error {
	var b strings.Builder
	for _, f := range slices.Sorted(slices.Values(files)) {
		data, err := os.ReadFile(filepath.Join(dir, f))
		if err != nil {
			return err
		}
		sum := sha256.Sum256(data)
		fmt.Fprintf(&b, "%s  %s\n", hex.EncodeToString(sum[:]), f)
	}
	return os.WriteFile(filepath.Join(dir, "checksums.txt"), []byte(b.String()), 0o644)
}
