// Flash-attention backward for MI300X (gfx942) on the matrix cores, deterministic: no atomics.
// Inputs as the MFMA forward's (bf16 Q, K, V and dO; fp32 O and the *global* log-sum-exp of
// each query, so a ring's blocks can be done in any order and summed); gradients in fp32,
// added into dq, dk and dv (each element by exactly one lane: the ring accumulates its blocks
// in place, in a fixed order, with no float atomics).
//
//   zaya_attn_bwd_mfma_prep  delta_i = dO_i . O_i, one thread per query row
//   zaya_attn_bwd_mfma_dkdv  one wavefront per 16 keys, every query tile in turn:
//                            S^T = K Q^T, P^T = exp(S^T scale - lse), dV += P^T dO,
//                            dP^T = V dO^T, dS^T = P^T (dP^T - delta), dK += scale dS^T Q
//   zaya_attn_bwd_mfma_dq    one wavefront per 16 queries, every key tile in turn:
//                            S = Q K^T, P, dP = dO V^T, dS = P (dP - delta), dQ += scale dS K
//
// Splitting dQ from dK/dV recomputes P once more (about 2.5x the forward's matrix work instead
// of 2x) and is what keeps the sums in a fixed order. workers/attention/mfma_bwd.go runs the
// same steps lane by lane on the CPU (the tests compare it with the float64 reference).
// MFMA lane layout as in attention_fwd_mfma.hip: A[l%16][4(l/16)+j], B[4(l/16)+j][l%16],
// D[4(l/16)+i][l%16].
#include <hip/hip_runtime.h>
#include "zaya_attention.h"

#define ZAYA_T 16         // rows per tile (queries or keys), the MFMA's M, N and K
#define ZAYA_BWD_MAX_D 128  // largest head dimension: operands and accumulators live in registers

typedef short bf16x4 __attribute__((ext_vector_type(4)));
typedef float f32x4 __attribute__((ext_vector_type(4)));

__device__ inline float bwd_bf16_to_f32(unsigned short h) { return __builtin_bit_cast(float, (unsigned)h << 16); }
__device__ inline unsigned short bwd_f32_to_bf16(float f) {
  unsigned u = __builtin_bit_cast(unsigned, f);
  if ((u & 0x7f800000u) == 0x7f800000u) return (unsigned short)((u >> 16) | ((u & 0x7fffffu) ? 0x40u : 0u));  // inf; nan stays nan
  u += 0x7fffu + ((u >> 16) & 1u);
  return (unsigned short)(u >> 16);
}
__device__ inline f32x4 mfma(bf16x4 a, bf16x4 b, f32x4 c) {
  return __builtin_amdgcn_mfma_f32_16x16x16bf16_1k(a, b, c, 0, 0, 0);
}

// Four consecutive bf16 (8-byte aligned: d is a multiple of 16) as one operand, one load.
__device__ inline bf16x4 load4(const unsigned short* p) { return *(const bf16x4*)p; }

// The A operand of one 16-wide slice (kk) of a tile's rows: lane holds X[row0 + l%16][kk + 4(l/16) + j].
__device__ inline bf16x4 load_a(const unsigned short* x, int row0, int n, int d, int kk, int col, int grp) {
  const int r = row0 + col;
  return r < n ? load4(x + (size_t)r * d + kk + 4 * grp) : (bf16x4){0, 0, 0, 0};
}

// Stages rows row0 .. row0+15 of x (bf16, rows past n as zeros) in LDS.
__device__ inline void stage(unsigned short* dst, const unsigned short* x, int row0, int n, int d, int lane) {
  for (int e = lane; e < ZAYA_T * d; e += ZAYA_WAVE) {
    const int r = e / d, c = e % d;
    dst[r * d + c] = row0 + r < n ? x[(size_t)(row0 + r) * d + c] : 0;
  }
}

// zaya_attn_bwd_mfma_prep: delta[i] = sum_c dO[i][c] O[i][c]; grid.x = ceil(n / 64), block 64.
extern "C" __global__ void __launch_bounds__(ZAYA_WAVE) __attribute__((amdgpu_waves_per_eu(2)))
zaya_attn_bwd_mfma_prep(const unsigned short* __restrict__ dout, const float* __restrict__ out, int n, int d,
                        float* __restrict__ delta) {
  const int r = ZAYA_BLOCK_X * ZAYA_WAVE + ZAYA_LANE;
  if (r >= n) return;
  float s = 0.0f;
  for (int c = 0; c < d; ++c) s += bwd_bf16_to_f32(dout[(size_t)r * d + c]) * out[(size_t)r * d + c];
  delta[r] = s;
}

// zaya_attn_bwd_mfma_dkdv: grid.x = ceil(nk / 16) key tiles, block = 64 threads (one wavefront).
extern "C" __global__ void __launch_bounds__(ZAYA_WAVE) __attribute__((amdgpu_waves_per_eu(2)))
zaya_attn_bwd_mfma_dkdv(const unsigned short* __restrict__ q, const unsigned short* __restrict__ k,
                        const unsigned short* __restrict__ v, const unsigned short* __restrict__ dout,
                        const float* __restrict__ lse, const float* __restrict__ delta,
                        const int* __restrict__ q_pos, const int* __restrict__ k_pos, int nq, int nk, int d,
                        int causal, float scale, float* __restrict__ dk, float* __restrict__ dv) {
  const int lane = ZAYA_LANE, col = lane % 16, grp = lane / 16;
  const int key0 = ZAYA_BLOCK_X * ZAYA_T;

  __shared__ __attribute__((aligned(16))) unsigned short qs[ZAYA_T * ZAYA_BWD_MAX_D];
  __shared__ __attribute__((aligned(16))) unsigned short dos[ZAYA_T * ZAYA_BWD_MAX_D];
  __shared__ __attribute__((aligned(16))) unsigned short pts[ZAYA_T * ZAYA_T];   // P^T, rows keys, columns queries
  __shared__ __attribute__((aligned(16))) unsigned short dsts[ZAYA_T * ZAYA_T];  // dS^T

  // This tile's keys and values as A operands, kept in registers for every query tile.
  bf16x4 ka[ZAYA_BWD_MAX_D / 16], va[ZAYA_BWD_MAX_D / 16];
  f32x4 acc_k[ZAYA_BWD_MAX_D / 16], acc_v[ZAYA_BWD_MAX_D / 16];
#pragma unroll
  for (int t = 0; t < ZAYA_BWD_MAX_D / 16; ++t) {
    acc_k[t] = acc_v[t] = (f32x4){0.0f, 0.0f, 0.0f, 0.0f};
    if (t * 16 >= d) continue;
    ka[t] = load_a(k, key0, nk, d, 16 * t, col, grp);
    va[t] = load_a(v, key0, nk, d, 16 * t, col, grp);
  }
  int kp[4];  // the keys of this lane's rows (4 grp + i) in the C layout
  for (int i = 0; i < 4; ++i) kp[i] = key0 + 4 * grp + i < nk ? k_pos[key0 + 4 * grp + i] : -1;

  for (int q0 = 0; q0 < nq; q0 += ZAYA_T) {
    ZAYA_SYNC();  // the previous tile's readers are done
    stage(qs, q, q0, nq, d, lane);
    stage(dos, dout, q0, nq, d, lane);
    ZAYA_SYNC();
    const int qr = q0 + col;  // this lane's query (the C layout's column)
    const int qp = qr < nq ? q_pos[qr] : -1;
    const float l = qr < nq ? lse[qr] : ZAYA_NEG_INF;
    const float dl = qr < nq ? delta[qr] : 0.0f;

    // S^T = K Q^T and dP^T = V dO^T over the head dimension.
    f32x4 st = {0.0f, 0.0f, 0.0f, 0.0f}, dpt = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
    for (int t = 0; t < ZAYA_BWD_MAX_D / 16; ++t) {
      if (t * 16 >= d) break;
      st = mfma(ka[t], load4(qs + col * d + 16 * t + 4 * grp), st);     // B[k][n] = Q[n][k]
      dpt = mfma(va[t], load4(dos + col * d + 16 * t + 4 * grp), dpt);  // B[k][n] = dO[n][k]
    }
    for (int i = 0; i < 4; ++i) {
      const bool seen = kp[i] >= 0 && qp >= 0 && l != ZAYA_NEG_INF && zaya_visible(causal, qp, kp[i]);
      const float p = seen ? __builtin_expf(st[i] * scale - l) : 0.0f;
      pts[(4 * grp + i) * ZAYA_T + col] = bwd_f32_to_bf16(p);
      dsts[(4 * grp + i) * ZAYA_T + col] = bwd_f32_to_bf16(p * (dpt[i] - dl));
    }
    ZAYA_SYNC();

    // dV += P^T dO and dK += dS^T Q, 16 output columns at a time.
    const bf16x4 pa = load4(pts + col * ZAYA_T + 4 * grp), dsa = load4(dsts + col * ZAYA_T + 4 * grp);
#pragma unroll
    for (int t = 0; t < ZAYA_BWD_MAX_D / 16; ++t) {
      if (t * 16 >= d) break;
      bf16x4 dob, qb;
      for (int j = 0; j < 4; ++j) {
        dob[j] = (short)dos[(4 * grp + j) * d + 16 * t + col];  // B[k][n] = dO[k][n]
        qb[j] = (short)qs[(4 * grp + j) * d + 16 * t + col];    // B[k][n] = Q[k][n]
      }
      acc_v[t] = mfma(pa, dob, acc_v[t]);
      acc_k[t] = mfma(dsa, qb, acc_k[t]);
    }
  }

  for (int i = 0; i < 4; ++i) {
    const int r = key0 + 4 * grp + i;
    if (r >= nk) continue;
#pragma unroll
    for (int t = 0; t < ZAYA_BWD_MAX_D / 16; ++t) {
      if (t * 16 >= d) break;
      dk[(size_t)r * d + 16 * t + col] += acc_k[t][i] * scale;
      dv[(size_t)r * d + 16 * t + col] += acc_v[t][i];
    }
  }
}

// zaya_attn_bwd_mfma_dq: grid.x = ceil(nq / 16) query tiles, block = 64 threads (one wavefront).
extern "C" __global__ void __launch_bounds__(ZAYA_WAVE) __attribute__((amdgpu_waves_per_eu(2)))
zaya_attn_bwd_mfma_dq(const unsigned short* __restrict__ q, const unsigned short* __restrict__ k,
                      const unsigned short* __restrict__ v, const unsigned short* __restrict__ dout,
                      const float* __restrict__ lse, const float* __restrict__ delta,
                      const int* __restrict__ q_pos, const int* __restrict__ k_pos, int nq, int nk, int d,
                      int causal, float scale, float* __restrict__ dq) {
  const int lane = ZAYA_LANE, col = lane % 16, grp = lane / 16;
  const int q0 = ZAYA_BLOCK_X * ZAYA_T;

  __shared__ __attribute__((aligned(16))) unsigned short ks[ZAYA_T * ZAYA_BWD_MAX_D];
  __shared__ __attribute__((aligned(16))) unsigned short vs[ZAYA_T * ZAYA_BWD_MAX_D];
  __shared__ __attribute__((aligned(16))) unsigned short dss[ZAYA_T * ZAYA_T];  // dS, rows queries, columns keys

  bf16x4 qa[ZAYA_BWD_MAX_D / 16], da[ZAYA_BWD_MAX_D / 16];
  f32x4 acc[ZAYA_BWD_MAX_D / 16];
#pragma unroll
  for (int t = 0; t < ZAYA_BWD_MAX_D / 16; ++t) {
    acc[t] = (f32x4){0.0f, 0.0f, 0.0f, 0.0f};
    if (t * 16 >= d) continue;
    qa[t] = load_a(q, q0, nq, d, 16 * t, col, grp);
    da[t] = load_a(dout, q0, nq, d, 16 * t, col, grp);
  }
  int qp[4];
  float l[4], dl[4];
  for (int i = 0; i < 4; ++i) {
    const int r = q0 + 4 * grp + i;
    qp[i] = r < nq ? q_pos[r] : -1;
    l[i] = r < nq ? lse[r] : ZAYA_NEG_INF;
    dl[i] = r < nq ? delta[r] : 0.0f;
  }

  for (int k0 = 0; k0 < nk; k0 += ZAYA_T) {
    ZAYA_SYNC();
    stage(ks, k, k0, nk, d, lane);
    stage(vs, v, k0, nk, d, lane);
    ZAYA_SYNC();
    const int kr = k0 + col;
    const int kp = kr < nk ? k_pos[kr] : -1;

    // S = Q K^T and dP = dO V^T.
    f32x4 s = {0.0f, 0.0f, 0.0f, 0.0f}, dp = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
    for (int t = 0; t < ZAYA_BWD_MAX_D / 16; ++t) {
      if (t * 16 >= d) break;
      s = mfma(qa[t], load4(ks + col * d + 16 * t + 4 * grp), s);    // B[k][n] = K[n][k]
      dp = mfma(da[t], load4(vs + col * d + 16 * t + 4 * grp), dp);  // B[k][n] = V[n][k]
    }
    for (int i = 0; i < 4; ++i) {
      const bool seen = kp >= 0 && qp[i] >= 0 && l[i] != ZAYA_NEG_INF && zaya_visible(causal, qp[i], kp);
      const float p = seen ? __builtin_expf(s[i] * scale - l[i]) : 0.0f;
      dss[(4 * grp + i) * ZAYA_T + col] = bwd_f32_to_bf16(p * (dp[i] - dl[i]));
    }
    ZAYA_SYNC();

    // dQ += dS K.
    const bf16x4 dsa = load4(dss + col * ZAYA_T + 4 * grp);
#pragma unroll
    for (int t = 0; t < ZAYA_BWD_MAX_D / 16; ++t) {
      if (t * 16 >= d) break;
      bf16x4 kb;
      for (int j = 0; j < 4; ++j) kb[j] = (short)ks[(4 * grp + j) * d + 16 * t + col];  // B[k][n] = K[k][n]
      acc[t] = mfma(dsa, kb, acc[t]);
    }
  }

  for (int i = 0; i < 4; ++i) {
    const int r = q0 + 4 * grp + i;
    if (r >= nq) continue;
#pragma unroll
    for (int t = 0; t < ZAYA_BWD_MAX_D / 16; ++t) {
      if (t * 16 >= d) break;
      dq[(size_t)r * d + 16 * t + col] += acc[t][i] * scale;
    }
  }
}
