// A stand-in for libamdhip64 and librccl in one shared library, for tests on machines with no
// GPU. "Device" memory is host memory; hipModuleLaunchKernel runs a host rendition of each
// kernel of workers/hip (same arguments, same math through zaya_attention.h, fp32); NCCL
// communicators connect the threads of one process. Built by rocm_test.go, never shipped.
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "zaya_attention.h"

enum { OK = 0, E_INVALID_VALUE = 1, E_INVALID_DEVICE = 101, E_FILE_NOT_FOUND = 301, E_INVALID_IMAGE = 200, E_NOT_FOUND = 500 };

static int devices(void) {
  const char* s = getenv("FAKE_ROCM_DEVICES");
  return s ? atoi(s) : 8;
}

int hipInit(unsigned flags) { return OK; }
int hipGetDeviceCount(int* n) {
  *n = devices();
  return *n ? OK : 100;
}
int hipSetDevice(int d) { return d >= 0 && d < devices() ? OK : E_INVALID_DEVICE; }
int hipMalloc(void** p, size_t n) {
  *p = malloc(n);
  return *p ? OK : 2;
}
int hipFree(void* p) {
  free(p);
  return OK;
}
int hipMemcpy(void* d, const void* s, size_t n, int kind) {
  if (n) memcpy(d, s, n);
  return OK;
}
int hipMemset(void* d, int v, size_t n) {
  memset(d, v, n);
  return OK;
}
int hipDeviceSynchronize(void) { return OK; }
int hipStreamCreate(void** s) {
  *s = malloc(1);
  return OK;
}
int hipStreamSynchronize(void* s) { return OK; }
int hipStreamDestroy(void* s) {
  free(s);
  return OK;
}
const char* hipGetErrorString(int e) {
  switch (e) {
    case OK: return "hipSuccess";
    case E_INVALID_DEVICE: return "hipErrorInvalidDevice";
    case E_FILE_NOT_FOUND: return "hipErrorFileNotFound";
    case E_INVALID_IMAGE: return "hipErrorInvalidImage";
    case E_NOT_FOUND: return "hipErrorNotFound";
    default: return "hipErrorUnknown";
  }
}

// A module must be an ELF file; functions are known by name.
int hipModuleLoad(void** mod, const char* path) {
  FILE* f = fopen(path, "rb");
  if (!f) return E_FILE_NOT_FOUND;
  char magic[4] = {0};
  size_t n = fread(magic, 1, 4, f);
  fclose(f);
  if (n != 4 || memcmp(magic, "\x7f" "ELF", 4)) return E_INVALID_IMAGE;
  *mod = strdup(path);
  return OK;
}

enum {
  K_FWD = 1, K_MERGE, K_BWD, K_FWD_MFMA, K_BWD_PREP, K_BWD_DKDV, K_BWD_DQ, K_GEMM, K_ADAMW, K_CAST,
  K_EMBED_FWD, K_EMBED_BWD, K_RMS_FWD, K_RMS_BWD, K_RMS_DGAIN, K_GELU_FWD, K_GELU_BWD, K_XENT, K_SUMSQ
};
int hipModuleGetFunction(void** fn, void* mod, const char* name) {
  static int ids[] = {K_FWD,       K_MERGE,     K_BWD,     K_FWD_MFMA, K_BWD_PREP,  K_BWD_DKDV,
                      K_BWD_DQ,    K_GEMM,      K_ADAMW,   K_CAST,     K_EMBED_FWD, K_EMBED_BWD,
                      K_RMS_FWD,   K_RMS_BWD,   K_RMS_DGAIN, K_GELU_FWD, K_GELU_BWD, K_XENT, K_SUMSQ};
  static const char* names[] = {"zaya_attn_fwd",      "zaya_attn_merge",    "zaya_attn_bwd",
                                "zaya_attn_fwd_mfma", "zaya_attn_bwd_mfma_prep", "zaya_attn_bwd_mfma_dkdv",
                                "zaya_attn_bwd_mfma_dq", "zaya_gemm_mfma",  "zaya_adamw",
                                "zaya_cast_bf16",     "zaya_embed_fwd",     "zaya_embed_bwd",
                                "zaya_rmsnorm_fwd",   "zaya_rmsnorm_bwd",   "zaya_rmsnorm_dgain",
                                "zaya_gelu_fwd",      "zaya_gelu_bwd",      "zaya_xent",
                                "zaya_sumsq"};
  for (int i = 0; i < (int)(sizeof ids / sizeof ids[0]); ++i)
    if (!strcmp(name, names[i])) {
      *fn = &ids[i];
      return OK;
    }
  return E_NOT_FOUND;
}

#define ARG(T, i) (*(T*)args[i])

static void fwd(unsigned rows, void** args) {
  const float *q = ARG(float*, 0), *k = ARG(float*, 1), *v = ARG(float*, 2);
  const int *qpos = ARG(int*, 3), *kpos = ARG(int*, 4);
  int nk = ARG(int, 5), d = ARG(int, 6), causal = ARG(int, 7);
  float scale = ARG(float, 8);
  float *out = ARG(float*, 9), *lse = ARG(float*, 10);
  for (unsigned r = 0; r < rows; ++r) {
    float mx = ZAYA_NEG_INF, sum = 0;
    for (int j = 0; j < nk; ++j) {
      if (!zaya_visible(causal, qpos[r], kpos[j])) continue;
      float s = 0;
      for (int c = 0; c < d; ++c) s += q[r * d + c] * k[j * d + c];
      s *= scale;
      if (s > mx) mx = s;
    }
    for (int c = 0; c < d; ++c) out[r * d + c] = 0;
    for (int j = 0; j < nk && mx != ZAYA_NEG_INF; ++j) {
      if (!zaya_visible(causal, qpos[r], kpos[j])) continue;
      float s = 0;
      for (int c = 0; c < d; ++c) s += q[r * d + c] * k[j * d + c];
      float p = expf(s * scale - mx);
      sum += p;
      for (int c = 0; c < d; ++c) out[r * d + c] += p * v[j * d + c];
    }
    for (int c = 0; c < d && sum > 0; ++c) out[r * d + c] /= sum;
    lse[r] = sum > 0 ? mx + logf(sum) : ZAYA_NEG_INF;
  }
}

static void merge(unsigned rows, void** args) {
  float *oa = ARG(float*, 0), *la = ARG(float*, 1);
  const float *ob = ARG(float*, 2), *lb = ARG(float*, 3);
  const int* idx = ARG(int*, 4);
  int d = ARG(int, 5);
  for (unsigned i = 0; i < rows; ++i) {
    int r = idx[i];
    float w = zaya_merge_weight(la[r], lb[i]);
    for (int c = 0; c < d; ++c) oa[r * d + c] -= w * (oa[r * d + c] - ob[i * d + c]);
    la[r] = zaya_merge_lse(la[r], lb[i]);
  }
}

static void bwd(unsigned rows, void** args) {
  const float *q = ARG(float*, 0), *k = ARG(float*, 1), *v = ARG(float*, 2), *o = ARG(float*, 3),
              *dout = ARG(float*, 4), *lse = ARG(float*, 5);
  const int *qpos = ARG(int*, 6), *kpos = ARG(int*, 7);
  int nk = ARG(int, 8), d = ARG(int, 9), causal = ARG(int, 10);
  float scale = ARG(float, 11);
  float *dq = ARG(float*, 12), *dk = ARG(float*, 13), *dv = ARG(float*, 14);
  for (unsigned r = 0; r < rows; ++r) {
    if (lse[r] == ZAYA_NEG_INF) continue;
    float di = 0;
    for (int c = 0; c < d; ++c) di += dout[r * d + c] * o[r * d + c];
    for (int j = 0; j < nk; ++j) {
      if (!zaya_visible(causal, qpos[r], kpos[j])) continue;
      float s = 0, dp = 0;
      for (int c = 0; c < d; ++c) {
        s += q[r * d + c] * k[j * d + c];
        dp += dout[r * d + c] * v[j * d + c];
      }
      float p = expf(s * scale - lse[r]), ds = p * (dp - di);
      for (int c = 0; c < d; ++c) {
        dq[r * d + c] += scale * ds * k[j * d + c];
        dk[j * d + c] += scale * ds * q[r * d + c];
        dv[j * d + c] += p * dout[r * d + c];
      }
    }
  }
}

// The MFMA kernels' host renditions: bf16 inputs widened to fp32, the same formulas in fp32
// (no matrix-core rounding of P and dS), over the tiles of the grid.
static float wide(unsigned short h) {
  unsigned u = (unsigned)h << 16;
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
}

static void fwd_mfma(unsigned groups, void** args) {
  const unsigned short *q = ARG(unsigned short*, 0), *k = ARG(unsigned short*, 1), *v = ARG(unsigned short*, 2);
  const int *qpos = ARG(int*, 3), *kpos = ARG(int*, 4);
  int nq = ARG(int, 5), nk = ARG(int, 6), d = ARG(int, 7), causal = ARG(int, 8);
  float scale = ARG(float, 9);
  float *out = ARG(float*, 10), *lse = ARG(float*, 11);
  for (int r = 0; r < nq && r < (int)groups * 16; ++r) {
    float mx = ZAYA_NEG_INF, sum = 0;
    for (int j = 0; j < nk; ++j) {
      if (!zaya_visible(causal, qpos[r], kpos[j])) continue;
      float s = 0;
      for (int c = 0; c < d; ++c) s += wide(q[r * d + c]) * wide(k[j * d + c]);
      if (s * scale > mx) mx = s * scale;
    }
    for (int c = 0; c < d; ++c) out[r * d + c] = 0;
    for (int j = 0; j < nk && mx != ZAYA_NEG_INF; ++j) {
      if (!zaya_visible(causal, qpos[r], kpos[j])) continue;
      float s = 0;
      for (int c = 0; c < d; ++c) s += wide(q[r * d + c]) * wide(k[j * d + c]);
      float p = expf(s * scale - mx);
      sum += p;
      for (int c = 0; c < d; ++c) out[r * d + c] += p * wide(v[j * d + c]);
    }
    for (int c = 0; c < d && sum > 0; ++c) out[r * d + c] /= sum;
    lse[r] = sum > 0 ? mx + logf(sum) : ZAYA_NEG_INF;
  }
}

static void bwd_prep(unsigned groups, void** args) {
  const unsigned short* dout = ARG(unsigned short*, 0);
  const float* o = ARG(float*, 1);
  int n = ARG(int, 2), d = ARG(int, 3);
  float* delta = ARG(float*, 4);
  for (int r = 0; r < n && r < (int)groups * ZAYA_WAVE; ++r) {
    float s = 0;
    for (int c = 0; c < d; ++c) s += wide(dout[r * d + c]) * o[r * d + c];
    delta[r] = s;
  }
}

// bwd_pair is query r against key j: P and dS, 0 where the mask hides the key.
static void bwd_pair(void** args, int r, int j, float* p, float* ds) {
  const unsigned short *q = ARG(unsigned short*, 0), *k = ARG(unsigned short*, 1), *v = ARG(unsigned short*, 2),
                       *dout = ARG(unsigned short*, 3);
  const float *lse = ARG(float*, 4), *delta = ARG(float*, 5);
  const int *qpos = ARG(int*, 6), *kpos = ARG(int*, 7);
  int d = ARG(int, 10), causal = ARG(int, 11);
  float scale = ARG(float, 12);
  *p = *ds = 0;
  if (lse[r] == ZAYA_NEG_INF || !zaya_visible(causal, qpos[r], kpos[j])) return;
  float s = 0, dp = 0;
  for (int c = 0; c < d; ++c) {
    s += wide(q[r * d + c]) * wide(k[j * d + c]);
    dp += wide(dout[r * d + c]) * wide(v[j * d + c]);
  }
  *p = expf(s * scale - lse[r]);
  *ds = *p * (dp - delta[r]);
}

static void bwd_dkdv(unsigned groups, void** args) {
  const unsigned short *q = ARG(unsigned short*, 0), *dout = ARG(unsigned short*, 3);
  int nq = ARG(int, 8), nk = ARG(int, 9), d = ARG(int, 10);
  float scale = ARG(float, 12);
  float *dk = ARG(float*, 13), *dv = ARG(float*, 14);
  for (int j = 0; j < nk && j < (int)groups * 16; ++j)
    for (int r = 0; r < nq; ++r) {
      float p, ds;
      bwd_pair(args, r, j, &p, &ds);
      for (int c = 0; c < d; ++c) {
        dv[j * d + c] += p * wide(dout[r * d + c]);
        dk[j * d + c] += scale * ds * wide(q[r * d + c]);
      }
    }
}

static void bwd_dq(unsigned groups, void** args) {
  const unsigned short* k = ARG(unsigned short*, 1);
  int nq = ARG(int, 8), nk = ARG(int, 9), d = ARG(int, 10);
  float scale = ARG(float, 12);
  float* dq = ARG(float*, 13);
  for (int r = 0; r < nq && r < (int)groups * 16; ++r)
    for (int j = 0; j < nk; ++j) {
      float p, ds;
      bwd_pair(args, r, j, &p, &ds);
      for (int c = 0; c < d; ++c) dq[r * d + c] += scale * ds * wide(k[j * d + c]);
    }
}

// gemm: C (+)= op(A) op(B) over the (gx, gy) grid of 64x64 tiles, each element's products summed
// over K in order (the kernel's lane order); the grid must cover C.
static void gemm(unsigned gx, unsigned gy, void** args) {
  const unsigned short *a = ARG(unsigned short*, 0), *b = ARG(unsigned short*, 1);
  float* c = ARG(float*, 2);
  int m = ARG(int, 3), n = ARG(int, 4), k = ARG(int, 5), lda = ARG(int, 6), ldb = ARG(int, 7), ldc = ARG(int, 8);
  int ta = ARG(int, 9), tb = ARG(int, 10), acc = ARG(int, 11);
  for (int i = 0; i < m && i < (int)gy * 64; ++i)
    for (int j = 0; j < n && j < (int)gx * 64; ++j) {
      float s = 0;
      for (int x = 0; x < k; ++x) s += wide(ta ? a[x * lda + i] : a[i * lda + x]) * wide(tb ? b[j * ldb + x] : b[x * ldb + j]);
      c[i * ldc + j] = acc ? c[i * ldc + j] + s : s;
    }
}

static void adamw(unsigned groups, void** args) {
  float *p = ARG(float*, 0), *m = ARG(float*, 1), *v = ARG(float*, 2);
  const float* g = ARG(float*, 3);
  const unsigned char* decay = ARG(unsigned char*, 4);
  int n = ARG(int, 5);
  float lr = ARG(float, 6), b1 = ARG(float, 7), b2 = ARG(float, 8), eps = ARG(float, 9), wd = ARG(float, 10),
        c1 = ARG(float, 11), c2 = ARG(float, 12), clip = ARG(float, 13);
  for (int i = 0; i < n && i < (int)groups * ZAYA_WAVE; ++i) {
    float gi = g[i] * clip, mi = b1 * m[i] + (1 - b1) * gi, vi = b2 * v[i] + (1 - b2) * gi * gi;
    m[i] = mi;
    v[i] = vi;
    float x = p[i];
    if (decay[i]) x -= lr * wd * x;
    p[i] = x - lr * (mi / c1) / (sqrtf(vi / c2) + eps);
  }
}

// sumsq: the kernel's shuffle tree (xor 32, 16, ..., 1) per 64 values, so the bits match it.
static void sumsq(unsigned groups, void** args) {
  const float* x = ARG(float*, 0);
  int n = ARG(int, 1), square = ARG(int, 2);
  float* out = ARG(float*, 3);
  for (unsigned g = 0; g < groups; ++g) {
    float v[64];
    for (int l = 0; l < 64; ++l) {
      long i = (long)g * 64 + l;
      v[l] = i < n ? x[i] : 0.0f;
      if (square) v[l] *= v[l];
    }
    for (int off = 32; off > 0; off >>= 1) {
      float w[64];
      for (int l = 0; l < 64; ++l) w[l] = v[l] + v[l ^ off];
      memcpy(v, w, sizeof v);
    }
    out[g] = v[0];
  }
}

static void cast_bf16(unsigned groups, void** args) {
  const float* x = ARG(float*, 0);
  unsigned short* y = ARG(unsigned short*, 1);
  int n = ARG(int, 2);
  for (int i = 0; i < n && i < (int)groups * ZAYA_WAVE; ++i) {
    unsigned u;
    memcpy(&u, &x[i], sizeof u);
    if ((u & 0x7f800000u) != 0x7f800000u) u += 0x7fffu + ((u >> 16) & 1u);
    else if (u & 0x7fffffu) u |= 0x400000u;
    y[i] = (unsigned short)(u >> 16);
  }
}

// The model_ops.hip renditions: one wavefront per row for row kernels (gx = rows), one thread
// per element otherwise, the same formulas in fp32.
static float gelu_tanh(float y) { return 1.0f - 2.0f / (expf(2.0f * y) + 1.0f); }

static void model_op(int k, unsigned groups, void** args) {
  long lanes = (long)groups * ZAYA_WAVE;
  switch (k) {
    case K_EMBED_FWD: {
      const int* tok = ARG(int*, 0);
      const float* emb = ARG(float*, 1);
      float* x = ARG(float*, 2);
      int n = ARG(int, 3), d = ARG(int, 4);
      for (long e = 0; e < (long)n * d && e < lanes; ++e) x[e] = emb[(long)tok[e / d] * d + e % d];
      break;
    }
    case K_EMBED_BWD: {
      const int *start = ARG(int*, 0), *order = ARG(int*, 1);
      const float* dx = ARG(float*, 2);
      float* demb = ARG(float*, 3);
      int vocab = ARG(int, 4), d = ARG(int, 5);
      for (long e = 0; e < (long)vocab * d && e < lanes; ++e)
        for (int k = start[e / d]; k < start[e / d + 1]; ++k) demb[e] += dx[(long)order[k] * d + e % d];
      break;
    }
    case K_RMS_FWD: {
      const float *x = ARG(float*, 0), *gain = ARG(float*, 1);
      float *y = ARG(float*, 2), *inv = ARG(float*, 3);
      int d = ARG(int, 4);
      float eps = ARG(float, 5);
      for (unsigned r = 0; r < groups; ++r) {
        float ss = 0;
        for (int c = 0; c < d; ++c) ss += x[r * d + c] * x[r * d + c];
        inv[r] = 1.0f / sqrtf(ss / d + eps);
        for (int c = 0; c < d; ++c) y[r * d + c] = x[r * d + c] * inv[r] * gain[c];
      }
      break;
    }
    case K_RMS_BWD: {
      const float *x = ARG(float*, 0), *gain = ARG(float*, 1), *inv = ARG(float*, 2), *dy = ARG(float*, 3);
      float* dx = ARG(float*, 4);
      int d = ARG(int, 5), acc = ARG(int, 6);
      for (unsigned r = 0; r < groups; ++r) {
        float dot = 0;
        for (int c = 0; c < d; ++c) dot += dy[r * d + c] * gain[c] * x[r * d + c] * inv[r];
        dot /= d;
        for (int c = 0; c < d; ++c) {
          float g = inv[r] * (dy[r * d + c] * gain[c] - x[r * d + c] * inv[r] * dot);
          dx[r * d + c] = acc ? dx[r * d + c] + g : g;
        }
      }
      break;
    }
    case K_RMS_DGAIN: {
      const float *x = ARG(float*, 0), *inv = ARG(float*, 1), *dy = ARG(float*, 2);
      float* dgain = ARG(float*, 3);
      int rows = ARG(int, 4), d = ARG(int, 5);
      for (int c = 0; c < d && c < lanes; ++c)
        for (int r = 0; r < rows; ++r) dgain[c] += dy[r * d + c] * x[r * d + c] * inv[r];
      break;
    }
    case K_GELU_FWD: {
      const float* u = ARG(float*, 0);
      float* g = ARG(float*, 1);
      int n = ARG(int, 2);
      for (long e = 0; e < n && e < lanes; ++e)
        g[e] = 0.5f * u[e] * (1 + gelu_tanh(0.7978845608f * (u[e] + 0.044715f * u[e] * u[e] * u[e])));
      break;
    }
    case K_GELU_BWD: {
      const float *u = ARG(float*, 0), *dg = ARG(float*, 1);
      float* du = ARG(float*, 2);
      int n = ARG(int, 3);
      for (long e = 0; e < n && e < lanes; ++e) {
        float x = u[e], t = gelu_tanh(0.7978845608f * (x + 0.044715f * x * x * x));
        du[e] = dg[e] * (0.5f * (1 + t) + 0.5f * x * (1 - t * t) * 0.7978845608f * (1 + 3 * 0.044715f * x * x));
      }
      break;
    }
    case K_XENT: {
      const float* lg = ARG(float*, 0);
      const int* tgt = ARG(int*, 1);
      float *dl = ARG(float*, 2), *loss = ARG(float*, 3);
      int vocab = ARG(int, 4);
      float norm = ARG(float, 5);
      for (unsigned r = 0; r < groups; ++r) {
        float top = ZAYA_NEG_INF, sum = 0;
        for (int j = 0; j < vocab; ++j) top = lg[r * vocab + j] > top ? lg[r * vocab + j] : top;
        for (int j = 0; j < vocab; ++j) sum += expf(lg[r * vocab + j] - top);
        float lse = top + logf(sum);
        for (int j = 0; j < vocab; ++j) {
          float p = expf(lg[r * vocab + j] - lse);
          dl[r * vocab + j] = (j == tgt[r] ? p - 1 : p) / norm;
        }
        loss[r] = lse - lg[r * vocab + tgt[r]];
      }
      break;
    }
  }
}

int hipModuleLaunchKernel(void* fn, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
                          unsigned shmem, void* stream, void** args, void** extra) {
  if (*(int*)fn == K_GEMM) {  // 4 wavefronts per 64x64 tile of C
    if (gz != 1 || bx != 4 * ZAYA_WAVE || by != 1 || bz != 1 || extra) return E_INVALID_VALUE;
    gemm(gx, gy, args);
    return OK;
  }
  if (gy != 1 || gz != 1 || bx != ZAYA_WAVE || by != 1 || bz != 1 || extra) return E_INVALID_VALUE;
  switch (*(int*)fn) {
    case K_FWD: fwd(gx, args); break;
    case K_MERGE: merge(gx, args); break;
    case K_BWD: bwd(gx, args); break;
    case K_FWD_MFMA: fwd_mfma(gx, args); break;
    case K_BWD_PREP: bwd_prep(gx, args); break;
    case K_BWD_DKDV: bwd_dkdv(gx, args); break;
    case K_BWD_DQ: bwd_dq(gx, args); break;
    case K_ADAMW: adamw(gx, args); break;
    case K_CAST: cast_bf16(gx, args); break;
    case K_SUMSQ: sumsq(gx, args); break;
    case K_EMBED_FWD:
    case K_EMBED_BWD:
    case K_RMS_FWD:
    case K_RMS_BWD:
    case K_RMS_DGAIN:
    case K_GELU_FWD:
    case K_GELU_BWD:
    case K_XENT: model_op(*(int*)fn, gx, args); break;
    default: return E_INVALID_VALUE;
  }
  return OK;
}

// NCCL. A communicator is shared by the ranks that name the same unique id.
typedef struct { char internal[128]; } uid;
typedef struct msg {
  struct msg* next;
  int from, to;
  size_t n;
  char data[];
} msg;
typedef struct comm {
  uid id;
  int nranks, joined, refs;
  pthread_mutex_t mu;
  pthread_cond_t cv;
  // all-reduce rendezvous
  long gen;
  int arrived;
  double** bufs;
  size_t count;
  msg* mail;
  struct comm* next;
} comm;
typedef struct {
  comm* c;
  int rank;
} handle;

static pthread_mutex_t reg_mu = PTHREAD_MUTEX_INITIALIZER;
static comm* reg;
static int uid_seq;

int ncclGetUniqueId(uid* id) {
  pthread_mutex_lock(&reg_mu);
  memset(id, 0, sizeof *id);
  snprintf(id->internal, sizeof id->internal, "fake-%d-%d", (int)getpid(), ++uid_seq);
  pthread_mutex_unlock(&reg_mu);
  return 0;
}

int ncclCommInitRank(handle** out, int nranks, uid id, int rank) {
  if (rank < 0 || rank >= nranks) return 4;  // ncclInvalidArgument
  pthread_mutex_lock(&reg_mu);
  comm* c = reg;
  while (c && memcmp(&c->id, &id, sizeof id)) c = c->next;
  if (!c) {
    c = calloc(1, sizeof *c);
    c->id = id;
    c->nranks = nranks;
    c->bufs = calloc(nranks, sizeof(double*));
    pthread_mutex_init(&c->mu, NULL);
    pthread_cond_init(&c->cv, NULL);
    c->next = reg;
    reg = c;
  }
  c->refs++;
  pthread_mutex_unlock(&reg_mu);
  pthread_mutex_lock(&c->mu);
  c->joined++;
  pthread_cond_broadcast(&c->cv);
  while (c->joined < c->nranks) pthread_cond_wait(&c->cv, &c->mu);
  pthread_mutex_unlock(&c->mu);
  handle* h = malloc(sizeof *h);
  h->c = c;
  h->rank = rank;
  *out = h;
  return 0;
}

// Sums in rank order, like the TCP transport, so results are bit-identical to it.
int ncclAllReduce(const void* send, void* recv, size_t count, int dtype, int op, handle* h, void* stream) {
  if ((dtype != 8 && dtype != 7) || op != 0) return 4;  // ncclFloat64, ncclFloat32; ncclSum
  if (getenv("FAKE_RCCL_REMOTE_ERROR")) return 6;  // ncclRemoteError: as if a peer had died
  const char* most = getenv("FAKE_RCCL_MAX_FLOAT64");  // tests: no float64 all-reduce larger than this
  if (most && *most && dtype == 8 && count > (size_t)atoll(most)) return 4;
  size_t es = dtype == 8 ? sizeof(double) : sizeof(float);
  comm* c = h->c;
  pthread_mutex_lock(&c->mu);
  long gen = c->gen;
  c->bufs[h->rank] = recv;
  if (send != recv) memcpy(recv, send, count * es);
  c->count = count;
  if (++c->arrived == c->nranks) {
    if (dtype == 8) {
      double* sum = calloc(count ? count : 1, sizeof(double));
      for (size_t i = 0; i < count; ++i) {
        sum[i] = c->bufs[0][i];
        for (int r = 1; r < c->nranks; ++r) sum[i] += c->bufs[r][i];
      }
      for (int r = 0; r < c->nranks; ++r) memcpy(c->bufs[r], sum, count * sizeof(double));
      free(sum);
    } else {
      float* sum = calloc(count ? count : 1, sizeof(float));
      for (size_t i = 0; i < count; ++i) {
        sum[i] = ((float*)c->bufs[0])[i];
        for (int r = 1; r < c->nranks; ++r) sum[i] += ((float*)c->bufs[r])[i];
      }
      for (int r = 0; r < c->nranks; ++r) memcpy(c->bufs[r], sum, count * sizeof(float));
      free(sum);
    }
    c->arrived = 0;
    c->gen++;
    pthread_cond_broadcast(&c->cv);
  } else {
    while (c->gen == gen) pthread_cond_wait(&c->cv, &c->mu);
  }
  pthread_mutex_unlock(&c->mu);
  return 0;
}

// Sends are buffered; receives inside a group wait until ncclGroupEnd.
static __thread int group_depth;
static __thread struct pending {
  handle* h;
  void* buf;
  size_t n;
  int from;
} pend[16];
static __thread int npend;

static int do_recv(handle* h, void* buf, size_t n, int from) {
  comm* c = h->c;
  pthread_mutex_lock(&c->mu);
  for (;;) {
    for (msg** m = &c->mail; *m; m = &(*m)->next) {
      if ((*m)->from == from && (*m)->to == h->rank) {
        msg* got = *m;
        *m = got->next;
        pthread_mutex_unlock(&c->mu);
        if (got->n != n) {
          free(got);
          return 5;  // ncclInvalidUsage: sizes differ
        }
        memcpy(buf, got->data, n);
        free(got);
        return 0;
      }
    }
    pthread_cond_wait(&c->cv, &c->mu);
  }
}

int ncclSend(const void* buf, size_t count, int dtype, int peer, handle* h, void* stream) {
  if (dtype != 1 || peer < 0 || peer >= h->c->nranks) return 4;
  msg* m = malloc(sizeof *m + count);
  m->from = h->rank;
  m->to = peer;
  m->n = count;
  m->next = NULL;
  memcpy(m->data, buf, count);
  comm* c = h->c;
  pthread_mutex_lock(&c->mu);
  msg** tail = &c->mail;
  while (*tail) tail = &(*tail)->next;
  *tail = m;
  pthread_cond_broadcast(&c->cv);
  pthread_mutex_unlock(&c->mu);
  return 0;
}

int ncclRecv(void* buf, size_t count, int dtype, int peer, handle* h, void* stream) {
  if (dtype != 1 || peer < 0 || peer >= h->c->nranks) return 4;
  if (group_depth == 0) return do_recv(h, buf, count, peer);
  if (npend == 16) return 5;
  pend[npend++] = (struct pending){h, buf, count, peer};
  return 0;
}

int ncclGroupStart(void) {
  group_depth++;
  return 0;
}

int ncclGroupEnd(void) {
  if (group_depth == 0) return 5;
  if (--group_depth > 0) return 0;
  int rc = 0;
  for (int i = 0; i < npend && rc == 0; ++i) rc = do_recv(pend[i].h, pend[i].buf, pend[i].n, pend[i].from);
  npend = 0;
  return rc;
}

int ncclCommDestroy(handle* h) {
  free(h);
  return 0;
}

const char* ncclGetErrorString(int e) {
  switch (e) {
    case 0: return "no error";
    case 4: return "invalid argument";
    case 5: return "invalid usage";
    default: return "unhandled error";
  }
}
