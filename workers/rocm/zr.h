// zr.h: the worker's C ABI to the ROCm runtime (libamdhip64) and RCCL (librccl), both
// loaded at run time with dlopen through tables of function pointers, so building needs no
// ROCm header or library. Every call that touches a device first selects it: HIP's current
// device is per OS thread and Go moves goroutines between threads.
#ifndef ZR_H
#define ZR_H

#include <stddef.h>

// zr_load_hip and zr_load_rccl open the libraries (a path or a soname) once per process;
// they return 0 or write why not into err.
int zr_load_hip(const char* path, char* err, int errlen);
int zr_load_rccl(const char* path, char* err, int errlen);

// HIP: status codes are hipError_t; zr_hip_error names one.
const char* zr_hip_error(int code);
int zr_device_count(int* n);
int zr_module_function(int dev, const char* path, const char* name, void** fn);

// The attention kernels of workers/hip, on host buffers: each call copies its inputs to the
// device, launches one wavefront per row and copies the results back.
int zr_attn_fwd(void* fn, int dev, const float* q, const float* k, const float* v, const int* qpos,
                const int* kpos, int nq, int nk, int d, int causal, float scale, float* out, float* lse);
int zr_attn_merge(void* fn, int dev, float* out_a, float* lse_a, int na, const float* out_b,
                  const float* lse_b, const int* rows, int nb, int d);
int zr_attn_bwd(void* fn, int dev, const float* q, const float* k, const float* v, const float* out,
                const float* dout, const float* lse, const int* qpos, const int* kpos, int nq, int nk,
                int d, int causal, float scale, float* dq, float* dk, float* dv);

// The MFMA kernels (attention_fwd_mfma.hip, attention_bwd_mfma.hip): bf16 inputs (uint16 bit
// patterns), one wavefront per 16 rows; d a multiple of 16 up to 128. zr_attn_bwd_mfma runs
// the three backward kernels (prep, dkdv, dq) and returns the block's gradients.
int zr_attn_fwd_mfma(void* fn, int dev, const unsigned short* q, const unsigned short* k, const unsigned short* v,
                     const int* qpos, const int* kpos, int nq, int nk, int d, int causal, float scale, float* out,
                     float* lse);
int zr_attn_bwd_mfma(void* prep, void* dkdv, void* dqfn, int dev, const unsigned short* q, const unsigned short* k,
                     const unsigned short* v, const float* out, const unsigned short* dout, const float* lse,
                     const int* qpos, const int* kpos, int nq, int nk, int d, int causal, float scale, float* dq,
                     float* dk, float* dv);

// Device memory the caller keeps across calls (the device-resident step: allocated once,
// copied in or out only when the host needs it), and the kernels that work on it in place.
int zr_alloc(int dev, size_t n, void** p);
int zr_release(int dev, void* p);
int zr_copy_in(int dev, void* dst, const void* src, size_t n);
int zr_copy_out(int dev, void* dst, const void* src, size_t n);
int zr_copy_dev(int dev, void* dst, const void* src, size_t n);
int zr_zero(int dev, void* p, size_t n);
// The MFMA attention kernels on device memory (the host-buffer calls above upload, call these
// and download). delta holds nq floats of scratch; dq, dk and dv are added into.
// zr_attn_merge_dev folds (out_b, lse_b) into rows[i] of (out_a, lse_a) on device memory.
int zr_attn_merge_dev(void* fn, int dev, float* out_a, float* lse_a, const float* out_b, const float* lse_b,
                      const int* rows, int nb, int d);
int zr_attn_fwd_mfma_dev(void* fn, int dev, const void* q, const void* k, const void* v, const int* qpos,
                         const int* kpos, int nq, int nk, int d, int causal, float scale, float* out, float* lse);
int zr_attn_bwd_mfma_dev(void* prep, void* dkdv, void* dqfn, int dev, const void* q, const void* k, const void* v,
                         const float* out, const void* dout, const float* lse, float* delta, const int* qpos,
                         const int* kpos, int nq, int nk, int d, int causal, float scale, float* dq, float* dk,
                         float* dv);
// zr_gemm: c (+)= op(a) op(b), a and b bf16, c fp32 (gemm_mfma.hip).
int zr_gemm(void* fn, int dev, const void* a, const void* b, float* c, int m, int n, int k, int lda, int ldb,
            int ldc, int ta, int tb, int accumulate);
int zr_adamw(void* fn, int dev, float* p, float* m, float* v, const float* g, const unsigned char* decay, int n,
             float lr, float beta1, float beta2, float eps, float wd, float c1, float c2, float clip);
int zr_cast_bf16(void* fn, int dev, const float* x, unsigned short* y, int n);
// zr_sumsq: out[g] = sum over x[64 g .. 64 g + 63] of x^2 (square) or x.
int zr_sumsq(void* fn, int dev, const float* x, int n, int square, float* out);
// The decoder's row and element steps (model_ops.hip), on device memory.
int zr_embed_fwd(void* fn, int dev, const int* tokens, const float* emb, float* x, int n, int d);
int zr_embed_bwd(void* fn, int dev, const int* start, const int* order, const float* dx, float* demb, int vocab, int d);
int zr_rmsnorm_fwd(void* fn, int dev, const float* x, const float* gain, float* y, float* inv, int rows, int d, float eps);
int zr_rmsnorm_bwd(void* fn, int dev, const float* x, const float* gain, const float* inv, const float* dy, float* dx,
                   int rows, int d, int accumulate);
int zr_rmsnorm_dgain(void* fn, int dev, const float* x, const float* inv, const float* dy, float* dgain, int rows, int d);
int zr_gelu_fwd(void* fn, int dev, const float* u, float* g, int n);
int zr_gelu_bwd(void* fn, int dev, const float* u, const float* dg, float* du, int n);
int zr_xent(void* fn, int dev, const float* logits, const int* targets, float* dlogits, float* loss, int rows, int vocab,
            float norm);

// RCCL: status codes are ncclResult_t (negative: a HIP error); zr_rccl_error names one.
typedef struct { char internal[128]; } zr_uid;
typedef struct zr_comm zr_comm;
const char* zr_rccl_error(int code);
int zr_unique_id(zr_uid* id);
int zr_comm_init(int dev, zr_uid id, int nranks, int rank, zr_comm** out);
// zr_allreduce sums n doubles over the communicator, in place.
int zr_allreduce(zr_comm* c, double* v, size_t n);
// zr_allreduce_f32_dev sums n floats of device memory on the communicator's device, in place.
int zr_allreduce_f32_dev(zr_comm* c, float* v, size_t n);
// zr_sendrecv_dev is zr_sendrecv on device memory: nothing is staged through the host.
int zr_sendrecv_dev(zr_comm* c, const void* send, size_t nsend, int to, void* recv, size_t nrecv, int from);
// zr_sendrecv sends nsend bytes to peer `to` and receives nrecv bytes from peer `from` in one
// group, so a ring of these never deadlocks.
int zr_sendrecv(zr_comm* c, const void* send, size_t nsend, int to, void* recv, size_t nrecv, int from);
void zr_comm_destroy(zr_comm* c);

#endif
