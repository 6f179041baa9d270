// The decoder's element-wise and row-wise steps on the device (workers/model computes the same
// on the CPU): embedding, RMSNorm, GELU and softmax cross-entropy, forward and backward, on
// fp32 buffers that stay on the device. Row kernels give each row one wavefront and reduce
// across it with a fixed xor-shuffle tree; column reductions (a norm's gain, the embedding's
// rows) give each output one thread that walks the rows in order: no atomics, so every run
// gives the same bits.
#include <hip/hip_runtime.h>
#include "zaya_attention.h"

__device__ inline float wave_sum(float x) {
  for (int off = ZAYA_WAVE / 2; off > 0; off >>= 1) x += __shfl_xor(x, off, ZAYA_WAVE);
  return x;
}
__device__ inline float wave_max(float x) {
  for (int off = ZAYA_WAVE / 2; off > 0; off >>= 1) x = fmaxf(x, __shfl_xor(x, off, ZAYA_WAVE));
  return x;
}

// tanh from the hardware exponential (tanhf would call the ROCm device library).
__device__ inline float zaya_tanh(float y) { return 1.0f - 2.0f / (__builtin_expf(2.0f * y) + 1.0f); }

#define ZAYA_ELEM (ZAYA_BLOCK_X * ZAYA_WAVE + ZAYA_LANE)
#define ZAYA_GELU_C 0.7978845608028654f  // sqrt(2/pi)

// zaya_embed_fwd: x[i][c] = emb[tokens[i]][c]; grid = ceil(n d / 64).
extern "C" __global__ void __launch_bounds__(ZAYA_WAVE)
zaya_embed_fwd(const int* __restrict__ tokens, const float* __restrict__ emb, float* __restrict__ x, int n, int d) {
  const int e = ZAYA_ELEM;
  if (e >= n * d) return;
  x[e] = emb[(size_t)tokens[e / d] * d + e % d];
}

// zaya_embed_bwd: demb[v][c] += sum over the rows i of token v of dx[i][c], in i order. The
// rows of token v are order[start[v] .. start[v+1]) (ascending; the host groups them), so
// the work is O(vocab d + n d) and each sum keeps one order. grid = ceil(vocab d / 64).
extern "C" __global__ void __launch_bounds__(ZAYA_WAVE)
zaya_embed_bwd(const int* __restrict__ start, const int* __restrict__ order, const float* __restrict__ dx,
               float* __restrict__ demb, int vocab, int d) {
  const int e = ZAYA_ELEM;
  if (e >= vocab * d) return;
  const int v = e / d, c = e % d;
  float s = demb[e];
  for (int k = start[v]; k < start[v + 1]; ++k) s += dx[(size_t)order[k] * d + c];
  demb[e] = s;
}

// zaya_rmsnorm_fwd: y = x inv gain with inv = 1/sqrt(mean(x^2) + eps) per row; grid = rows.
extern "C" __global__ void __launch_bounds__(ZAYA_WAVE)
zaya_rmsnorm_fwd(const float* __restrict__ x, const float* __restrict__ gain, float* __restrict__ y,
                 float* __restrict__ inv, int d, float eps) {
  const size_t row = (size_t)ZAYA_BLOCK_X * d;
  float ss = 0.0f;
  for (int c = ZAYA_LANE; c < d; c += ZAYA_WAVE) ss += x[row + c] * x[row + c];
  const float r = 1.0f / __builtin_sqrtf(wave_sum(ss) / d + eps);
  for (int c = ZAYA_LANE; c < d; c += ZAYA_WAVE) y[row + c] = x[row + c] * r * gain[c];
  if (ZAYA_LANE == 0) inv[ZAYA_BLOCK_X] = r;
}

// zaya_rmsnorm_bwd: dx (+)= inv (dy gain - xhat mean(dy gain xhat)) per row; grid = rows.
// accumulate adds into dx: the residual stream's gradient already there.
extern "C" __global__ void __launch_bounds__(ZAYA_WAVE)
zaya_rmsnorm_bwd(const float* __restrict__ x, const float* __restrict__ gain, const float* __restrict__ inv,
                 const float* __restrict__ dy, float* __restrict__ dx, int d, int accumulate) {
  const size_t row = (size_t)ZAYA_BLOCK_X * d;
  const float r = inv[ZAYA_BLOCK_X];
  float dot = 0.0f;
  for (int c = ZAYA_LANE; c < d; c += ZAYA_WAVE) dot += dy[row + c] * gain[c] * x[row + c] * r;
  dot = wave_sum(dot) / d;
  for (int c = ZAYA_LANE; c < d; c += ZAYA_WAVE) {
    const float g = r * (dy[row + c] * gain[c] - x[row + c] * r * dot);
    dx[row + c] = accumulate ? dx[row + c] + g : g;
  }
}

// zaya_rmsnorm_dgain: dgain[c] += sum over rows of dy x inv, in row order; grid = ceil(d / 64).
extern "C" __global__ void __launch_bounds__(ZAYA_WAVE)
zaya_rmsnorm_dgain(const float* __restrict__ x, const float* __restrict__ inv, const float* __restrict__ dy,
                   float* __restrict__ dgain, int rows, int d) {
  const int c = ZAYA_ELEM;
  if (c >= d) return;
  float s = dgain[c];
  for (int r = 0; r < rows; ++r) s += dy[(size_t)r * d + c] * x[(size_t)r * d + c] * inv[r];
  dgain[c] = s;
}

// zaya_gelu_fwd: g = gelu(u) (tanh form); grid = ceil(n / 64).
extern "C" __global__ void __launch_bounds__(ZAYA_WAVE)
zaya_gelu_fwd(const float* __restrict__ u, float* __restrict__ g, int n) {
  const int e = ZAYA_ELEM;
  if (e >= n) return;
  const float x = u[e];
  g[e] = 0.5f * x * (1.0f + zaya_tanh(ZAYA_GELU_C * (x + 0.044715f * x * x * x)));
}

// zaya_gelu_bwd: du = dg gelu'(u); grid = ceil(n / 64).
extern "C" __global__ void __launch_bounds__(ZAYA_WAVE)
zaya_gelu_bwd(const float* __restrict__ u, const float* __restrict__ dg, float* __restrict__ du, int n) {
  const int e = ZAYA_ELEM;
  if (e >= n) return;
  const float x = u[e];
  const float t = zaya_tanh(ZAYA_GELU_C * (x + 0.044715f * x * x * x));
  du[e] = dg[e] * (0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * ZAYA_GELU_C * (1.0f + 3.0f * 0.044715f * x * x));
}

// zaya_xent: per row, loss[r] = logsumexp(logits) - logits[target] and
// dlogits = (softmax - onehot(target)) / norm; grid = rows.
extern "C" __global__ void __launch_bounds__(ZAYA_WAVE)
zaya_xent(const float* __restrict__ logits, const int* __restrict__ targets, float* __restrict__ dlogits,
          float* __restrict__ loss, int vocab, float norm) {
  const size_t row = (size_t)ZAYA_BLOCK_X * vocab;
  float top = ZAYA_NEG_INF;
  for (int j = ZAYA_LANE; j < vocab; j += ZAYA_WAVE) top = fmaxf(top, logits[row + j]);
  top = wave_max(top);
  float sum = 0.0f;
  for (int j = ZAYA_LANE; j < vocab; j += ZAYA_WAVE) sum += __builtin_expf(logits[row + j] - top);
  const float lse = top + __builtin_logf(wave_sum(sum));
  const int t = targets[ZAYA_BLOCK_X];
  for (int j = ZAYA_LANE; j < vocab; j += ZAYA_WAVE) {
    const float p = __builtin_expf(logits[row + j] - lse);
    dlogits[row + j] = (j == t ? p - 1.0f : p) / norm;
  }
  if (ZAYA_LANE == 0) loss[ZAYA_BLOCK_X] = lse - logits[row + t];
}
