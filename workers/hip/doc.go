// Package hip holds the HIP kernels of ring attention for AMD Instinct MI300X (gfx942) —
// attention_fwd.hip (block forward with LSE, and the merge), attention_bwd.hip (block
// backward), attention_fwd_mfma.hip (the forward as flash attention on the matrix cores: bf16
// in, fp32 accumulation, LDS tiles; workers/attention.ForwardMFMA runs its steps on the CPU)
// — and zaya_attention.h, the math they share with the Go CPU backend in
// workers/attention. BuildCodeObjects links them into the gfx942 code objects that the
// worker's HIP backend (workers/rocm, build tag rocm) loads with hipModuleLoad; tests here
// compile each kernel to gfx942 machine code and check both the assembly and the objects.
package hip
