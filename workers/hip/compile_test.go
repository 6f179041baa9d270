package hip

import (
	"bufio"
	"debug/elf"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// kernels are the entry points each file must define.
var kernels = map[string][]string{
	"attention_fwd.hip":      {"zaya_attn_fwd", "zaya_attn_merge"},
	"attention_bwd.hip":      {"zaya_attn_bwd"},
	"attention_fwd_mfma.hip": {"zaya_attn_fwd_mfma"},
	"attention_bwd_mfma.hip": {"zaya_attn_bwd_mfma_prep", "zaya_attn_bwd_mfma_dkdv", "zaya_attn_bwd_mfma_dq"},
	"gemm_mfma.hip":          {"zaya_gemm_mfma"},
	"adamw.hip":              {"zaya_adamw", "zaya_cast_bf16", "zaya_sumsq"},
	"model_ops.hip": {"zaya_embed_fwd", "zaya_embed_bwd", "zaya_rmsnorm_fwd", "zaya_rmsnorm_bwd", "zaya_rmsnorm_dgain",
		"zaya_gelu_fwd", "zaya_gelu_bwd", "zaya_xent"},
}

// kernelMeta is what the assembler metadata says about one kernel.
type kernelMeta struct {
	name                    string
	vgprSpills, sgprSpills  string
	wavefront, privateFixed string
}

// hipClang is the compiler to use, skipping the test only outside CI when it is missing.
func hipClang(t *testing.T) string {
	t.Helper()
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
	return clang
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
	clang := hipClang(t)
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
			if strings.Contains(asm, "__ocml") || strings.Contains(asm, "__ockl") || strings.Contains(asm, "s_swappc_b64") {
				t.Error("calls a function (a ROCm device library?): the kernel is not self-contained")
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

// TestKernelsLinkToCodeObjects links every kernel file into the gfx942 code object the HIP
// backend loads (hipModuleLoad) and checks it: an AMDGPU ELF for gfx942 that exports each
// kernel and its kernel descriptor. Linking also proves there is no undefined device symbol.
func TestKernelsLinkToCodeObjects(t *testing.T) {
	clang := hipClang(t)
	dir := t.TempDir()
	if err := BuildCodeObjects(clang, ".", dir); err != nil {
		t.Fatal(err)
	}
	for file, want := range kernels {
		path := filepath.Join(dir, CodeObject(file))
		f, err := elf.Open(path)
		if err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		if f.Machine != emAMDGPU || f.Type != elf.ET_DYN {
			t.Errorf("%s: machine %v type %v, want AMDGPU shared object", path, f.Machine, f.Type)
		}
		if got := readFlags(t, path) & 0xff; got != machGfx942 {
			t.Errorf("%s: e_flags machine %#x, want gfx942 (%#x)", path, got, machGfx942)
		}
		syms, err := f.Symbols()
		if err != nil {
			t.Fatal(err)
		}
		var names []string
		for _, s := range syms {
			names = append(names, s.Name)
		}
		for _, k := range want {
			if !slices.Contains(names, k) || !slices.Contains(names, k+".kd") {
				t.Errorf("%s: kernel %s or its descriptor missing; symbols %v", path, k, names)
			}
		}
		_ = f.Close()
	}
}

const (
	emAMDGPU   = elf.Machine(224)
	machGfx942 = 0x4c // EF_AMDGPU_MACH_AMDGCN_GFX942
)

// readFlags is the ELF header's e_flags, where AMDGPU keeps the target processor.
func readFlags(t *testing.T, path string) uint32 {
	b, err := os.ReadFile(path)
	if err != nil || len(b) < 52 {
		t.Fatalf("%s: %v", path, err)
	}
	return uint32(b[48]) | uint32(b[49])<<8 | uint32(b[50])<<16 | uint32(b[51])<<24
}

// asmStat is the value of a "; Name: value" line of the compiler's kernel summary.
func asmStat(t *testing.T, asm, name string) int {
	t.Helper()
	for line := range strings.Lines(asm) {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "; "+name+": "); ok {
			f := strings.Fields(v)
			n, err := strconv.Atoi(f[0])
			if err != nil {
				t.Fatalf("%s: %v", name, err)
			}
			return n
		}
	}
	t.Fatalf("no %q in the assembly", name)
	return 0
}

// kernelSection is one kernel's code and the compiler's summary of it: from its "Begin
// function" line to the next kernel's.
func kernelSection(t *testing.T, asm, name string) string {
	t.Helper()
	_, rest, ok := strings.Cut(asm, "; -- Begin function "+name+"\n")
	if !ok {
		t.Fatalf("no kernel %s in the assembly", name)
	}
	if i := strings.Index(rest, "; -- Begin function "); i >= 0 {
		rest = rest[:i]
	}
	return rest
}

// TestMFMAKernelRunsOnTheMatrixCores reads the gfx942 code of the MFMA flash-attention
// kernels: their products are bf16 matrix instructions, their tiles go through LDS, the
// backward's sums use no atomics (deterministic), and each fits the occupancy it targets
// (2 waves per SIMD: at most 256 of the 512 unified VGPRs/AGPRs a lane has, no scratch; LDS
// at most 16 KiB per work-group).
func TestMFMAKernelRunsOnTheMatrixCores(t *testing.T) {
	clang := hipClang(t)
	for _, c := range []struct {
		file, kernel string
		mfma         int // at least, for d up to 128 unrolled
	}{
		{"attention_fwd_mfma.hip", "zaya_attn_fwd_mfma", 1 + 128/16},        // S = Q K^T: 1 in a loop; P V: one per 16 columns
		{"attention_bwd_mfma.hip", "zaya_attn_bwd_mfma_dkdv", 4 * 128 / 16}, // S^T, dP^T, dV, dK: one per 16 columns each
		{"attention_bwd_mfma.hip", "zaya_attn_bwd_mfma_dq", 3 * 128 / 16},   // S, dP, dQ
		{"gemm_mfma.hip", "zaya_gemm_mfma", 2 * 2 * 2},                      // 2x2 tiles per wavefront, 2 K steps per slice
	} {
		t.Run(c.kernel, func(t *testing.T) {
			asm := kernelSection(t, compile(t, clang, c.file), c.kernel)
			counts := map[string]int{}
			for line := range strings.Lines(asm) {
				f := strings.Fields(line)
				if len(f) == 0 || strings.HasPrefix(f[0], ";") || strings.HasPrefix(f[0], ".") {
					continue
				}
				switch op := f[0]; {
				case strings.Contains(op, "atomic"):
					counts["atomic"]++
				case strings.HasPrefix(op, "v_mfma"):
					counts["mfma"]++
					counts[op]++
				case strings.HasPrefix(op, "ds_"):
					counts["lds"]++
				case strings.HasPrefix(op, "global_load"):
					counts["global_load"]++
				case strings.HasPrefix(op, "v_"):
					counts["valu"]++
				case strings.HasPrefix(op, "s_"):
					counts["salu"]++
				}
			}
			t.Logf("static instructions: %v", counts)
			if n := counts["v_mfma_f32_16x16x16_bf16"]; n < c.mfma {
				t.Errorf("%d v_mfma_f32_16x16x16_bf16, want at least %d: the products are not on the matrix cores", n, c.mfma)
			}
			if n := counts["atomic"]; n > 0 {
				t.Errorf("%d atomic instructions: sums in an order the hardware picks", n)
			}
			if counts["lds"] == 0 {
				t.Error("no LDS instruction: the tiles are not staged in LDS")
			}
			if n := asmStat(t, asm, "ScratchSize"); n != 0 {
				t.Errorf("%d bytes of scratch", n)
			}
			n := asmStat(t, asm, "TotalNumVgprs")
			if n > 256 {
				t.Errorf("%d VGPRs+AGPRs: more than the 256 that keep 2 waves per SIMD", n)
			}
			if n := asmStat(t, asm, "Occupancy"); n < 2 {
				t.Errorf("occupancy %d waves per SIMD, want at least 2", n)
			}
			lds := asmStat(t, asm, "LDSByteSize")
			if lds > 16<<10 {
				t.Errorf("%d bytes of LDS per work-group: over 16 KiB", lds)
			}
			t.Logf("%d VGPRs+AGPRs, %d bytes of LDS", n, lds)
		})
	}
}
