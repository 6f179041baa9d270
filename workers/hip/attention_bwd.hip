// Backward kernel of ring attention for MI300X (gfx942): the gradients of one block of queries
// against one block of keys/values, given the *global* output and LSE of the queries (so the
// attention weights are final and blocks can be summed in any order). One wavefront per query
// row: dq stays in registers, dk and dv are added with atomics (several query rows touch the
// same key).
#include <hip/hip_runtime.h>
#include "zaya_attention.h"

__device__ inline float wave_sum_b(float x) {
  for (int off = ZAYA_WAVE / 2; off > 0; off >>= 1) x += __shfl_xor(x, off, ZAYA_WAVE);
  return x;
}

// zaya_attn_bwd: grid.x = query rows, block = 64 threads. For each visible key j:
//   p = exp(s - lse), dV_j += p dO, dS = p (dO.V_j - dO.O), dQ += scale dS K_j, dK_j += scale dS Q.
extern "C" __global__ void __launch_bounds__(ZAYA_WAVE)
zaya_attn_bwd(const float* __restrict__ q, const float* __restrict__ k, const float* __restrict__ v,
              const float* __restrict__ out, const float* __restrict__ dout, const float* __restrict__ lse,
              const int* __restrict__ q_pos, const int* __restrict__ k_pos, int nk, int d, int causal,
              float scale, float* __restrict__ dq, float* __restrict__ dk, float* __restrict__ dv) {
  const int row = ZAYA_BLOCK_X;
  const int lane = ZAYA_LANE;
  const float l = lse[row];
  if (l == ZAYA_NEG_INF) return;  // saw no key anywhere: no gradient
  const int qp = q_pos[row];
  const float* qi = q + (size_t)row * d;
  const float* oi = out + (size_t)row * d;
  const float* doi = dout + (size_t)row * d;

  float di = 0.0f;  // dO . O, reduced over the wavefront
  for (int c = lane; c < d; c += ZAYA_WAVE) di += doi[c] * oi[c];
  di = wave_sum_b(di);

  float dqr[ZAYA_MAX_HEAD_DIM / ZAYA_WAVE];
  for (int t = 0; t < ZAYA_MAX_HEAD_DIM / ZAYA_WAVE; ++t) dqr[t] = 0.0f;

  for (int j = 0; j < nk; ++j) {
    if (!zaya_visible(causal, qp, k_pos[j])) continue;  // uniform across the wavefront
    const float* kj = k + (size_t)j * d;
    const float* vj = v + (size_t)j * d;
    float s = 0.0f, dp = 0.0f;
    for (int c = lane; c < d; c += ZAYA_WAVE) {
      s += qi[c] * kj[c];
      dp += doi[c] * vj[c];
    }
    s = wave_sum_b(s);
    dp = wave_sum_b(dp);
    const float p = __builtin_expf(s * scale - l);
    const float ds = p * (dp - di);
    for (int t = 0, c = lane; c < d; ++t, c += ZAYA_WAVE) {
      dqr[t] += scale * ds * kj[c];
      atomicAdd(&dk[(size_t)j * d + c], scale * ds * qi[c]);
      atomicAdd(&dv[(size_t)j * d + c], p * doi[c]);
    }
  }
  float* dqi = dq + (size_t)row * d;
  for (int t = 0, c = lane; c < d; ++t, c += ZAYA_WAVE) dqi[c] += dqr[t];
}
