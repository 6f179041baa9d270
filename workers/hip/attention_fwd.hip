// Forward kernels of ring attention for MI300X (gfx942): one block of queries against one
// block of keys/values giving (out, lse), and the merge of such partial results. fp32 storage
// and accumulation; one wavefront (64 lanes) per query row.
#include <hip/hip_runtime.h>
#include "zaya_attention.h"

// Reduction across the 64 lanes of a wavefront.
__device__ inline float wave_max(float x) {
  for (int off = ZAYA_WAVE / 2; off > 0; off >>= 1) x = fmaxf(x, __shfl_xor(x, off, ZAYA_WAVE));
  return x;
}
__device__ inline float wave_sum(float x) {
  for (int off = ZAYA_WAVE / 2; off > 0; off >>= 1) x += __shfl_xor(x, off, ZAYA_WAVE);
  return x;
}

// zaya_attn_fwd: grid.x = query rows, block = 64 threads (one wavefront). Keys are visited in
// tiles of 64 with an online softmax: each lane scores one key of the tile, the wavefront
// finds the tile's max and sum, and lanes then accumulate the output over the head dimension
// (lane c owns columns c, c+64, ...). Rows that see no key get lse = -inf and a zero output.
extern "C" __global__ void __launch_bounds__(ZAYA_WAVE)
zaya_attn_fwd(const float* __restrict__ q, const float* __restrict__ k, const float* __restrict__ v,
              const int* __restrict__ q_pos, const int* __restrict__ k_pos, int nk, int d, int causal,
              float scale, float* __restrict__ out, float* __restrict__ lse) {
  const int row = ZAYA_BLOCK_X;
  const int lane = ZAYA_LANE;
  const float* qi = q + (size_t)row * d;
  const int qp = q_pos[row];

  __shared__ float qs[ZAYA_MAX_HEAD_DIM];
  __shared__ float ps[ZAYA_WAVE];
  for (int c = lane; c < d; c += ZAYA_WAVE) qs[c] = qi[c];
  ZAYA_SYNC();

  float acc[ZAYA_MAX_HEAD_DIM / ZAYA_WAVE];
  for (int t = 0; t < ZAYA_MAX_HEAD_DIM / ZAYA_WAVE; ++t) acc[t] = 0.0f;
  float run_max = ZAYA_NEG_INF, run_sum = 0.0f;

  for (int base = 0; base < nk; base += ZAYA_WAVE) {
    const int j = base + lane;
    float s = ZAYA_NEG_INF;
    if (j < nk && zaya_visible(causal, qp, k_pos[j])) {
      const float* kj = k + (size_t)j * d;
      float dot = 0.0f;
      for (int c = 0; c < d; ++c) dot += qs[c] * kj[c];
      s = dot * scale;
    }
    const float tile_max = wave_max(s);
    if (tile_max == ZAYA_NEG_INF) continue;  // nothing visible in this tile
    const float new_max = fmaxf(run_max, tile_max);
    const float p = (s == ZAYA_NEG_INF) ? 0.0f : __builtin_expf(s - new_max);
    const float correction = (run_max == ZAYA_NEG_INF) ? 0.0f : __builtin_expf(run_max - new_max);
    run_sum = run_sum * correction + wave_sum(p);
    run_max = new_max;
    ps[lane] = p;
    ZAYA_SYNC();
    for (int t = 0, c = lane; c < d; ++t, c += ZAYA_WAVE) {
      float a = acc[t] * correction;
      const int tile = min(ZAYA_WAVE, nk - base);
      for (int jj = 0; jj < tile; ++jj) a += ps[jj] * v[(size_t)(base + jj) * d + c];
      acc[t] = a;
    }
    ZAYA_SYNC();
  }

  float* oi = out + (size_t)row * d;
  const float inv = run_sum > 0.0f ? 1.0f / run_sum : 0.0f;
  for (int t = 0, c = lane; c < d; ++t, c += ZAYA_WAVE) oi[c] = acc[t] * inv;
  if (lane == 0) lse[row] = run_sum > 0.0f ? run_max + __builtin_logf(run_sum) : ZAYA_NEG_INF;
}

// zaya_attn_merge folds partial (out_b, lse_b) into (out_a, lse_a) for rows[i] of a:
// grid.x = rows of b, block = 64 threads over the head dimension.
extern "C" __global__ void __launch_bounds__(ZAYA_WAVE)
zaya_attn_merge(float* __restrict__ out_a, float* __restrict__ lse_a, const float* __restrict__ out_b,
                const float* __restrict__ lse_b, const int* __restrict__ rows, int d) {
  const int i = ZAYA_BLOCK_X;
  const int r = rows[i];
  const float la = lse_a[r], lb = lse_b[i];
  const float w = zaya_merge_weight(la, lb);
  float* oa = out_a + (size_t)r * d;
  const float* ob = out_b + (size_t)i * d;
  for (int c = ZAYA_LANE; c < d; c += ZAYA_WAVE) oa[c] = oa[c] - w * (oa[c] - ob[c]);
  ZAYA_SYNC();
  if (ZAYA_LANE == 0) lse_a[r] = zaya_merge_lse(la, lb);
}
