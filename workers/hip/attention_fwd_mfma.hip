// Flash-attention forward for MI300X (gfx942) on the matrix cores: bf16 Q, K, V in, fp32
// accumulation, fp32 out and log-sum-exp (for the ring merge, zaya_attn_merge). One wavefront
// takes a tile of 16 query rows; keys and values stream through LDS in tiles of 16 rows;
// S = Q K^T and O += P V run on v_mfma_f32_16x16x16_bf16 with an online softmax in between.
// Causal masking and the zigzag ring blocks come from the rows' positions (q_pos, k_pos), as
// in zaya_attn_fwd. workers/attention/mfma.go runs the same steps, lane by lane, on the CPU
// through an emulation of the instruction (the tests compare it with the float64 reference).
//
// MFMA 16x16x16 lane layout (wave64, AMD's matrix instruction calculator):
//   A (16x16, M x K): lane l holds A[l % 16][4 (l / 16) + j], j = 0..3
//   B (16x16, K x N): lane l holds B[4 (l / 16) + j][l % 16], j = 0..3
//   C, D (16x16):     lane l holds D[4 (l / 16) + i][l % 16], i = 0..3
#include <hip/hip_runtime.h>
#include "zaya_attention.h"

// Tile sizes: rows of queries and of keys per step (the MFMA's M and N), and its K.
#define ZAYA_MFMA_M 16
#define ZAYA_MFMA_N 16
#define ZAYA_MFMA_K 16
// Largest head dimension the MFMA kernel holds (its output tile lives in registers).
#define ZAYA_MFMA_MAX_D 128

typedef short bf16x4 __attribute__((ext_vector_type(4)));
typedef float f32x4 __attribute__((ext_vector_type(4)));

// bf16 <-> fp32: a bf16 is the high half of an fp32; rounding to nearest even.
__device__ inline float bf16_to_f32(unsigned short h) { return __builtin_bit_cast(float, (unsigned)h << 16); }
__device__ inline unsigned short f32_to_bf16(float f) {
  unsigned u = __builtin_bit_cast(unsigned, f);
  if ((u & 0x7f800000u) == 0x7f800000u) return (unsigned short)((u >> 16) | ((u & 0x7fffffu) ? 0x40u : 0u));  // inf; nan stays nan
  u += 0x7fffu + ((u >> 16) & 1u);
  return (unsigned short)(u >> 16);
}

// Reductions over the 16 lanes that share a row group (lanes 16g .. 16g+15).
__device__ inline float group_max(float x) {
  for (int off = 8; off > 0; off >>= 1) x = fmaxf(x, __shfl_xor(x, off, ZAYA_WAVE));
  return x;
}
__device__ inline float group_sum(float x) {
  for (int off = 8; off > 0; off >>= 1) x += __shfl_xor(x, off, ZAYA_WAVE);
  return x;
}

// zaya_attn_fwd_mfma: grid.x = ceil(nq / 16) query tiles, block = 64 threads (one wavefront).
// d is a multiple of 16, at most 128. Rows that see no key get lse = -inf and a zero output.
extern "C" __global__ void __launch_bounds__(ZAYA_WAVE)
zaya_attn_fwd_mfma(const unsigned short* __restrict__ q, const unsigned short* __restrict__ k,
                   const unsigned short* __restrict__ v, const int* __restrict__ q_pos,
                   const int* __restrict__ k_pos, int nq, int nk, int d, int causal, float scale,
                   float* __restrict__ out, float* __restrict__ lse) {
  const int lane = ZAYA_LANE;
  const int row0 = ZAYA_BLOCK_X * ZAYA_MFMA_M;
  const int col = lane % 16;        // D's column; A's row
  const int grp = lane / 16;        // D's row group (rows 4 grp .. 4 grp + 3); A's and B's k group

  __shared__ unsigned short qs[ZAYA_MFMA_M * ZAYA_MFMA_MAX_D];
  __shared__ unsigned short ks[ZAYA_MFMA_N * ZAYA_MFMA_MAX_D];
  __shared__ unsigned short vs[ZAYA_MFMA_N * ZAYA_MFMA_MAX_D];
  __shared__ unsigned short ps[ZAYA_MFMA_M * ZAYA_MFMA_N];
  __shared__ int kp[ZAYA_MFMA_N];

  // The query tile, rows past nq as zeros.
  for (int e = lane; e < ZAYA_MFMA_M * d; e += ZAYA_WAVE) {
    const int r = e / d, c = e % d;
    qs[r * d + c] = row0 + r < nq ? q[(size_t)(row0 + r) * d + c] : 0;
  }
  int qp[4];
  for (int i = 0; i < 4; ++i) {
    const int r = row0 + 4 * grp + i;
    qp[i] = r < nq ? q_pos[r] : -1;
  }

  f32x4 acc[ZAYA_MFMA_MAX_D / 16];
#pragma unroll
  for (int t = 0; t < ZAYA_MFMA_MAX_D / 16; ++t) acc[t] = (f32x4){0.0f, 0.0f, 0.0f, 0.0f};
  float run_max[4], run_sum[4];
  for (int i = 0; i < 4; ++i) run_max[i] = ZAYA_NEG_INF, run_sum[i] = 0.0f;

  for (int base = 0; base < nk; base += ZAYA_MFMA_N) {
    ZAYA_SYNC();  // the previous tile's readers are done
    for (int e = lane; e < ZAYA_MFMA_N * d; e += ZAYA_WAVE) {
      const int r = e / d, c = e % d;
      const bool in = base + r < nk;
      ks[r * d + c] = in ? k[(size_t)(base + r) * d + c] : 0;
      vs[r * d + c] = in ? v[(size_t)(base + r) * d + c] : 0;
    }
    if (lane < ZAYA_MFMA_N) kp[lane] = base + lane < nk ? k_pos[base + lane] : -1;
    ZAYA_SYNC();

    // S = Q K^T over the head dimension, 16 at a time.
    f32x4 s = {0.0f, 0.0f, 0.0f, 0.0f};
    for (int kk = 0; kk < d; kk += ZAYA_MFMA_K) {
      bf16x4 a, b;
      for (int j = 0; j < 4; ++j) {
        a[j] = (short)qs[col * d + kk + 4 * grp + j];  // A[m = col][k]
        b[j] = (short)ks[col * d + kk + 4 * grp + j];  // B[k][n = col] = K[n][k]
      }
      s = __builtin_amdgcn_mfma_f32_16x16x16bf16_1k(a, b, s, 0, 0, 0);
    }

    // Online softmax: lane holds S[4 grp + i][col]; its row group's 16 lanes hold the rows.
    const bool key_in = kp[col] >= 0;
    float corr[4];
    for (int i = 0; i < 4; ++i) {
      const bool seen = key_in && qp[i] >= 0 && zaya_visible(causal, qp[i], kp[col]);
      const float x = seen ? s[i] * scale : ZAYA_NEG_INF;
      const float tile_max = group_max(x);
      const float new_max = fmaxf(run_max[i], tile_max);
      const float p = (x == ZAYA_NEG_INF) ? 0.0f : __builtin_expf(x - new_max);
      corr[i] = (run_max[i] == ZAYA_NEG_INF || new_max == ZAYA_NEG_INF) ? 0.0f : __builtin_expf(run_max[i] - new_max);
      if (new_max == ZAYA_NEG_INF) corr[i] = 1.0f;  // nothing seen yet: nothing to scale
      run_sum[i] = run_sum[i] * corr[i] + group_sum(p);
      run_max[i] = new_max;
      ps[(4 * grp + i) * ZAYA_MFMA_N + col] = f32_to_bf16(p);
    }
    ZAYA_SYNC();

    // O = O corr + P V, 16 output columns at a time.
    bf16x4 pa;
    for (int j = 0; j < 4; ++j) pa[j] = (short)ps[col * ZAYA_MFMA_N + 4 * grp + j];  // A[m = col][k]
#pragma unroll
    for (int t = 0; t < ZAYA_MFMA_MAX_D / 16; ++t) {  // unrolled: acc stays in registers
      if (t * 16 >= d) break;
      f32x4 o = acc[t];
      for (int i = 0; i < 4; ++i) o[i] *= corr[i];
      bf16x4 vb;
      for (int j = 0; j < 4; ++j) vb[j] = (short)vs[(4 * grp + j) * d + 16 * t + col];  // B[k][n]
      acc[t] = __builtin_amdgcn_mfma_f32_16x16x16bf16_1k(pa, vb, o, 0, 0, 0);
    }
  }

  for (int i = 0; i < 4; ++i) {
    const int r = row0 + 4 * grp + i;
    if (r >= nq) continue;
    const float inv = run_sum[i] > 0.0f ? 1.0f / run_sum[i] : 0.0f;
#pragma unroll
    for (int t = 0; t < ZAYA_MFMA_MAX_D / 16; ++t)
      if (t * 16 < d) out[(size_t)r * d + 16 * t + col] = acc[t][i] * inv;
    if (col == 0) lse[r] = run_sum[i] > 0.0f ? run_max[i] + __builtin_logf(run_sum[i]) : ZAYA_NEG_INF;
  }
}
