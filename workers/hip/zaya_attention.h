// zaya_attention.h: the math ring attention's kernels and the Go CPU backend share
// (workers/attention implements the same formulas). Plain C, usable from HIP device code and
// from host C: ZAYA_HD marks functions for both sides.
#ifndef ZAYA_ATTENTION_H
#define ZAYA_ATTENTION_H

#if defined(__HIPCC__) || defined(__HIP__)
#define ZAYA_HD __host__ __device__ inline
#else
#define ZAYA_HD static inline
#endif

// Wavefront size of CDNA3 (MI300X, gfx942).
#define ZAYA_WAVE 64
// Largest head dimension the kernels hold per query row.
#define ZAYA_MAX_HEAD_DIM 256

#define ZAYA_NEG_INF (-__builtin_inff())

// Work-group and lane ids straight from the AMDGPU builtins: the kernels then need no device
// library (ockl), so the gfx942 assembly CI compiles here is the whole kernel.
#if defined(__HIP_DEVICE_COMPILE__)
#define ZAYA_BLOCK_X ((int)__builtin_amdgcn_workgroup_id_x())
#define ZAYA_LANE ((int)__builtin_amdgcn_workitem_id_x())
// A work-group barrier with the fences __syncthreads implies, without HIP's header calling
// into the device library (__atomic_work_item_fence) that a GPU-less build cannot link.
#define ZAYA_SYNC()                                               \
  do {                                                            \
    __builtin_amdgcn_fence(__ATOMIC_RELEASE, "workgroup");        \
    __builtin_amdgcn_s_barrier();                                 \
    __builtin_amdgcn_fence(__ATOMIC_ACQUIRE, "workgroup");        \
  } while (0)
#endif

// zaya_merge_lse is log(exp(a) + exp(b)) without forming exp(a) or exp(b): max + log(1 +
// exp(min - max)). A side that saw no key has LSE -inf and contributes nothing; two such
// sides stay -inf instead of giving NaN from -inf - -inf.
ZAYA_HD float zaya_merge_lse(float a, float b) {
  if (b == ZAYA_NEG_INF) return a;
  if (a == ZAYA_NEG_INF) return b;
  float hi = a > b ? a : b;
  float lo = a > b ? b : a;
  return hi + __builtin_logf(1.0f + __builtin_expf(lo - hi));
}

// zaya_merge_weight is the weight of side b when b (LSE lse_b) is folded into a (LSE lse_a):
// sigmoid(lse_b - lse_a), computed without overflow, 0 when b saw nothing, 1 when only b saw
// something. Then o = o - w (o - o_b).
ZAYA_HD float zaya_merge_weight(float lse_a, float lse_b) {
  if (lse_b == ZAYA_NEG_INF) return 0.0f;
  if (lse_a == ZAYA_NEG_INF) return 1.0f;
  float x = lse_b - lse_a;
  if (x >= 0.0f) return 1.0f / (1.0f + __builtin_expf(-x));
  float e = __builtin_expf(x);
  return e / (1.0f + e);
}

// zaya_visible says whether a query at position qp sees a key at kp.
ZAYA_HD int zaya_visible(int causal, int qp, int kp) { return !causal || kp <= qp; }

#endif
