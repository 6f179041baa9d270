// AdamW on the device, the decoder's optimizer step with its state resident: fp32 master
// weights, moments and gradients, one thread per parameter (grid = ceil(n / 64), block 64).
// c1 and c2 are the bias corrections 1 - beta^t; clip scales the gradient (the host computes
// the global norm's clip factor, 1 when not clipped); decay[i] != 0 applies weight decay.
// Each parameter is one thread's arithmetic: deterministic.
#include <hip/hip_runtime.h>
#include "zaya_attention.h"

extern "C" __global__ void __launch_bounds__(ZAYA_WAVE)
zaya_adamw(float* __restrict__ p, float* __restrict__ m, float* __restrict__ v, const float* __restrict__ g,
           const unsigned char* __restrict__ decay, int n, float lr, float beta1, float beta2, float eps, float wd,
           float c1, float c2, float clip) {
  const int i = ZAYA_BLOCK_X * ZAYA_WAVE + ZAYA_LANE;
  if (i >= n) return;
  const float gi = g[i] * clip;
  const float mi = beta1 * m[i] + (1.0f - beta1) * gi;
  const float vi = beta2 * v[i] + (1.0f - beta2) * gi * gi;
  m[i] = mi;
  v[i] = vi;
  float x = p[i];
  if (decay[i]) x -= lr * wd * x;
  x -= lr * (mi / c1) / (__builtin_sqrtf(vi / c2) + eps);
  p[i] = x;
}

// zaya_cast_bf16: y = bf16(x), rounding to nearest even as the MFMA kernels' inputs expect
// (the fp32 masters feed the GEMMs through this). grid = ceil(n / 64), block 64.
extern "C" __global__ void __launch_bounds__(ZAYA_WAVE)
zaya_cast_bf16(const float* __restrict__ x, unsigned short* __restrict__ y, int n) {
  const int i = ZAYA_BLOCK_X * ZAYA_WAVE + ZAYA_LANE;
  if (i >= n) return;
  unsigned u = __builtin_bit_cast(unsigned, x[i]);
  if ((u & 0x7f800000u) != 0x7f800000u) u += 0x7fffu + ((u >> 16) & 1u);
  else if (u & 0x7fffffu) u |= 0x400000u;  // a nan stays a nan
  y[i] = (unsigned short)(u >> 16);
}

// zaya_sumsq: out[g] = the sum of squares of x[64 g .. 64 g + 63] (zero past n), a fixed
// shuffle tree per wavefront; run again on out until one value is left, it is the squared
// norm the gradient clip needs, the same bits every run. grid = ceil(n / 64), block 64.
extern "C" __global__ void __launch_bounds__(ZAYA_WAVE)
zaya_sumsq(const float* __restrict__ x, int n, int square, float* __restrict__ out) {
  const int i = ZAYA_BLOCK_X * ZAYA_WAVE + ZAYA_LANE;
  float v = i < n ? x[i] : 0.0f;
  if (square) v *= v;
  for (int off = ZAYA_WAVE / 2; off > 0; off >>= 1) v += __shfl_xor(v, off, ZAYA_WAVE);
  if (ZAYA_LANE == 0) out[ZAYA_BLOCK_X] = v;
}
