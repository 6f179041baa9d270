package hip

import (
	"fmt"
	"os/exec"
	"path/filepath"
	"strings"
)

// Files are the kernel sources, each built into one code object.
var Files = []string{"attention_fwd.hip", "attention_bwd.hip", "attention_fwd_mfma.hip", "attention_bwd_mfma.hip", "gemm_mfma.hip", "adamw.hip", "model_ops.hip"}

// CodeObject is the name of the gfx942 code object built from a kernel file.
func CodeObject(file string) string { return strings.TrimSuffix(file, ".hip") + ".hsaco" }

// BuildCodeObjects compiles and links every kernel file in src for gfx942 into out, as the
// HIP backend loads them. clang is a HIP-capable clang (Debian's clang++-19 with lld-19 and
// libamdhip64-dev, or ROCm's); the kernels need no device library, so no GPU and no ROCm
// install is needed to build them.
func BuildCodeObjects(clang, src, out string) error {
	for _, f := range Files {
		cmd := exec.Command(clang, "-x", "hip", "--offload-arch=gfx942", "-nogpulib", "--rocm-path=/usr",
			"--cuda-device-only", "--no-gpu-bundle-output", "-O3", "-Wall", "-Werror", "-I", src,
			"-c", filepath.Join(src, f), "-o", filepath.Join(out, CodeObject(f)))
		if b, err := cmd.CombinedOutput(); err != nil {
			return fmt.Errorf("building %s: %w\n%s", f, err, b)
		}
	}
	return nil
}
