package hip

import (
	"bufio"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// kernels are the entry points each file must define.
var kernels = map[string][]string{
	"attention_fwd.hip": {"zaya_attn_fwd", "zaya_attn_merge"},
	"attention_bwd.hip": {"zaya_attn_bwd"},
}

// kernelMeta is what the assembler metadata says about one kernel.
type kernelMeta struct {
	name                    string
	vgprSpills, sgprSpills  string
	wavefront, privateFixed string
}

// compile builds one file to gfx942 assembly with Debian's clang-19 and no device library.
func compile(t *testing.T, clang, file string) string {
	t.Helper()
	out := filepath.Join(t.TempDir(), strings.TrimSuffix(file, ".hip")+".s")
	cmd := exec.Command(clang, "-x", "hip", "--offload-arch=gfx942", "-nogpulib", "--rocm-path=/usr",
		"--cuda-device-only", "-O3", "-Wall", "-Werror", "-I.", "-S", file, "-o", out)
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("%s: %v\n%s", file, err, b)
	}
	b, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func parseMeta(asm string) []kernelMeta {
	var out []kernelMeta
	sc := bufio.NewScanner(strings.NewReader(asm))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) != 2 {
			continue
		}
		switch f[0] {
		case ".name:":
			out = append(out, kernelMeta{name: f[1]})
		case ".vgpr_spill_count:", ".sgpr_spill_count:", ".wavefront_size:", ".private_segment_fixed_size:":
			if len(out) == 0 {
				continue
			}
			k := &out[len(out)-1]
			switch f[0] {
			case ".vgpr_spill_count:":
				k.vgprSpills = f[1]
			case ".sgpr_spill_count:":
				k.sgprSpills = f[1]
			case ".wavefront_size:":
				k.wavefront = f[1]
			default:
				k.privateFixed = f[1]
			}
		}
	}
	return out
}

// TestKernelsCompileToGfx942 compiles every kernel for MI300X and checks the machine code:
// the target, every expected kernel present, wave64, no register spills, no scratch memory,
// and no calls into a device library the test machine does not have.
func TestKernelsCompileToGfx942(t *testing.T) {
	clang := os.Getenv("ZAYA_HIP_CLANG")
	if clang == "" {
		clang = "clang++-19"
	}
	if _, err := exec.LookPath(clang); err != nil {
		if os.Getenv("CI") != "" {
			t.Fatalf("%s not found: CI installs clang-19, lld-19 and libamdhip64-dev (see .ci/run)", clang)
		}
		t.Skipf("%s not found: apt-get install clang-19 lld-19 libamdhip64-dev to compile the HIP kernels", clang)
	}
	files, err := filepath.Glob("*.hip")
	if err != nil {
		t.Fatal(err)
	}
	if len(files) != len(kernels) {
		t.Fatalf("kernel files %v, want %d: list new kernels in this test", files, len(kernels))
	}
	for _, file := range files {
		t.Run(file, func(t *testing.T) {
			asm := compile(t, clang, file)
			if !strings.Contains(asm, `.amdgcn_target "amdgcn-amd-amdhsa--gfx942"`) {
				t.Error("not compiled for gfx942")
			}
			if strings.Contains(asm, "__ocml") || strings.Contains(asm, "__ockl") {
				t.Error("calls a ROCm device library: the kernel is not self-contained")
			}
			meta := parseMeta(asm)
			var names []string
			for _, k := range meta {
				names = append(names, k.name)
				if k.vgprSpills != "0" || k.sgprSpills != "0" {
					t.Errorf("%s spills registers: vgpr %s, sgpr %s", k.name, k.vgprSpills, k.sgprSpills)
				}
				if k.wavefront != "64" {
					t.Errorf("%s: wavefront size %s, want 64", k.name, k.wavefront)
				}
				if k.privateFixed != "0" {
					t.Errorf("%s uses %s bytes of scratch", k.name, k.privateFixed)
				}
			}
			for _, want := range kernels[file] {
				if !slices.Contains(names, want) {
					t.Errorf("kernel %s missing; found %v", want, names)
				}
			}
		})
	}
}
