// Package hip holds the HIP kernels of ring attention for AMD Instinct MI300X (gfx942) —
// attention_fwd.hip (block forward with LSE, and the merge), attention_bwd.hip (block
// backward) — and zaya_attention.h, the math they share with the Go CPU backend in
// workers/attention. The kernels are built into the worker only in the ROCm image; here a test
// compiles each one to gfx942 machine code and checks it.
package hip
