// A bf16 GEMM for MI300X (gfx942) on the matrix cores, the model's projections and their
// gradients on the device: C (+)= op(A) op(B), A and B bf16, C fp32, op a transpose or not
// (forward X W; backward dX = dY W^T and dW = X^T dY). A work-group of 4 wavefronts computes a
// 64x64 tile of C, each wavefront a 32x32 quarter as 2x2 16x16 MFMA tiles; A's and B's 64x32
// slices for each 32 of K are staged in LDS, both with K contiguous, so every MFMA operand is
// one 8-byte LDS read. Each C element is one lane's fixed-order sum: deterministic, no atomics.
// workers/mfma/gemm.go runs the same steps lane by lane on the CPU.
// MFMA lane layout: A[l%16][4(l/16)+j], B[4(l/16)+j][l%16], D[4(l/16)+i][l%16].
#include <hip/hip_runtime.h>
#include "zaya_attention.h"

#define ZAYA_GEMM_TILE 64      // C rows and columns per work-group
#define ZAYA_GEMM_KT 32        // K per staged slice
#define ZAYA_GEMM_LDS_ROW 40   // 32 + 8 bf16 of padding: rows start 80 bytes apart (8-byte aligned)

typedef short bf16x4 __attribute__((ext_vector_type(4)));
typedef float f32x4 __attribute__((ext_vector_type(4)));

// Element (r, c) of op(X) where X is stored row-major with leading dimension ld: X[r][c], or
// X[c][r] when transposed; zero outside rows x cols.
__device__ inline unsigned short gemm_at(const unsigned short* x, int ld, int trans, int r, int c, int rows, int cols) {
  if (r >= rows || c >= cols) return 0;
  return trans ? x[(size_t)c * ld + r] : x[(size_t)r * ld + c];
}

// zaya_gemm_mfma: grid = (ceil(n / 64), ceil(m / 64)), block = 256 threads (4 wavefronts).
// op(A) is m x k, op(B) is k x n; ta: A is stored k x m; tb: B is stored n x k. accumulate:
// C += op(A) op(B), else C = op(A) op(B).
extern "C" __global__ void __launch_bounds__(4 * ZAYA_WAVE)
zaya_gemm_mfma(const unsigned short* __restrict__ a, const unsigned short* __restrict__ b, float* __restrict__ c,
               int m, int n, int k, int lda, int ldb, int ldc, int ta, int tb, int accumulate) {
  const int tid = ZAYA_LANE;
  const int wave = tid / ZAYA_WAVE, lane = tid % ZAYA_WAVE;
  const int col = lane % 16, grp = lane / 16;
  const int m0 = (int)__builtin_amdgcn_workgroup_id_y() * ZAYA_GEMM_TILE;
  const int n0 = ZAYA_BLOCK_X * ZAYA_GEMM_TILE;
  const int wm = 32 * (wave / 2), wn = 32 * (wave % 2);  // this wavefront's quarter

  __shared__ __attribute__((aligned(16))) unsigned short as[ZAYA_GEMM_TILE * ZAYA_GEMM_LDS_ROW];  // [m][k]
  __shared__ __attribute__((aligned(16))) unsigned short bs[ZAYA_GEMM_TILE * ZAYA_GEMM_LDS_ROW];  // [n][k]: B^T

  f32x4 acc[2][2];
  for (int i = 0; i < 2; ++i)
    for (int j = 0; j < 2; ++j) acc[i][j] = (f32x4){0.0f, 0.0f, 0.0f, 0.0f};

  for (int k0 = 0; k0 < k; k0 += ZAYA_GEMM_KT) {
    ZAYA_SYNC();  // the previous slice's readers are done
    for (int e = tid; e < ZAYA_GEMM_TILE * ZAYA_GEMM_KT; e += 4 * ZAYA_WAVE) {
      const int r = e / ZAYA_GEMM_KT, kk = e % ZAYA_GEMM_KT;
      as[r * ZAYA_GEMM_LDS_ROW + kk] = gemm_at(a, lda, ta, m0 + r, k0 + kk, m, k);
      bs[r * ZAYA_GEMM_LDS_ROW + kk] = gemm_at(b, ldb, !tb, n0 + r, k0 + kk, n, k);  // B^T[n][k]
    }
    ZAYA_SYNC();
#pragma unroll
    for (int kk = 0; kk < ZAYA_GEMM_KT; kk += 16) {
      bf16x4 fa[2], fb[2];
      for (int i = 0; i < 2; ++i) {
        fa[i] = *(const bf16x4*)&as[(wm + 16 * i + col) * ZAYA_GEMM_LDS_ROW + kk + 4 * grp];  // A[m][k]
        fb[i] = *(const bf16x4*)&bs[(wn + 16 * i + col) * ZAYA_GEMM_LDS_ROW + kk + 4 * grp];  // B[k][n] = B^T[n][k]
      }
      for (int i = 0; i < 2; ++i)
        for (int j = 0; j < 2; ++j) acc[i][j] = __builtin_amdgcn_mfma_f32_16x16x16bf16_1k(fa[i], fb[j], acc[i][j], 0, 0, 0);
    }
  }

  for (int i = 0; i < 2; ++i)
    for (int j = 0; j < 2; ++j)
      for (int v = 0; v < 4; ++v) {
        const int r = m0 + wm + 16 * i + 4 * grp + v, cc = n0 + wn + 16 * j + col;
        if (r >= m || cc >= n) continue;
        float* dst = &c[(size_t)r * ldc + cc];
        *dst = accumulate ? *dst + acc[i][j][v] : acc[i][j][v];
      }
}
