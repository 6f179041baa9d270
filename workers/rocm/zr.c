//go:build rocm

#include "zr.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

// The subset of the HIP runtime and NCCL/RCCL APIs the worker calls, declared here with the
// ABI's plain types (handles are pointers, enums are ints).
typedef void* hip_stream;
enum { H2D = 1, D2H = 2 };
enum { NCCL_UINT8 = 1, NCCL_FLOAT32 = 7, NCCL_FLOAT64 = 8, NCCL_SUM = 0 };

static struct {
  int (*Init)(unsigned);
  int (*GetDeviceCount)(int*);
  int (*SetDevice)(int);
  int (*Malloc)(void**, size_t);
  int (*Free)(void*);
  int (*Memcpy)(void*, const void*, size_t, int);
  int (*Memset)(void*, int, size_t);
  int (*DeviceSynchronize)(void);
  int (*StreamCreate)(hip_stream*);
  int (*StreamSynchronize)(hip_stream);
  int (*StreamDestroy)(hip_stream);
  int (*ModuleLoad)(void**, const char*);
  int (*ModuleGetFunction)(void**, void*, const char*);
  int (*ModuleLaunchKernel)(void*, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                            hip_stream, void**, void**);
  const char* (*GetErrorString)(int);
} hip;

static struct {
  int (*GetUniqueId)(zr_uid*);
  int (*CommInitRank)(void**, int, zr_uid, int);
  int (*AllReduce)(const void*, void*, size_t, int, int, void*, hip_stream);
  int (*Send)(const void*, size_t, int, int, void*, hip_stream);
  int (*Recv)(void*, size_t, int, int, void*, hip_stream);
  int (*GroupStart)(void);
  int (*GroupEnd)(void);
  int (*CommDestroy)(void*);
  const char* (*GetErrorString)(int);
} nccl;

static pthread_mutex_t load_mu = PTHREAD_MUTEX_INITIALIZER;
static void* hip_lib;
static void* rccl_lib;

static int resolve(void* lib, const char* name, void** into, char* err, int errlen) {
  *into = dlsym(lib, name);
  if (*into == NULL) {
    snprintf(err, errlen, "symbol %s not found", name);
    return -1;
  }
  return 0;
}

#define SYM(lib, table, field, name) \
  if (resolve(lib, name, (void**)&table.field, err, errlen)) return -1

// open_lib dlopens path once per process into *slot, resolving its symbols with bind.
static int open_lib(void** slot, const char* path, int (*bind)(void*, char*, int), char* err, int errlen) {
  pthread_mutex_lock(&load_mu);
  int rc = 0;
  if (*slot == NULL) {
    void* lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (lib == NULL) {
      snprintf(err, errlen, "%s", dlerror());
      rc = -1;
    } else if (bind(lib, err, errlen)) {
      dlclose(lib);
      rc = -1;
    } else {
      *slot = lib;
    }
  }
  pthread_mutex_unlock(&load_mu);
  return rc;
}

static int bind_hip(void* lib, char* err, int errlen) {
  SYM(lib, hip, Init, "hipInit");
  SYM(lib, hip, GetDeviceCount, "hipGetDeviceCount");
  SYM(lib, hip, SetDevice, "hipSetDevice");
  SYM(lib, hip, Malloc, "hipMalloc");
  SYM(lib, hip, Free, "hipFree");
  SYM(lib, hip, Memcpy, "hipMemcpy");
  SYM(lib, hip, Memset, "hipMemset");
  SYM(lib, hip, DeviceSynchronize, "hipDeviceSynchronize");
  SYM(lib, hip, StreamCreate, "hipStreamCreate");
  SYM(lib, hip, StreamSynchronize, "hipStreamSynchronize");
  SYM(lib, hip, StreamDestroy, "hipStreamDestroy");
  SYM(lib, hip, ModuleLoad, "hipModuleLoad");
  SYM(lib, hip, ModuleGetFunction, "hipModuleGetFunction");
  SYM(lib, hip, ModuleLaunchKernel, "hipModuleLaunchKernel");
  SYM(lib, hip, GetErrorString, "hipGetErrorString");
  return 0;
}

static int bind_rccl(void* lib, char* err, int errlen) {
  SYM(lib, nccl, GetUniqueId, "ncclGetUniqueId");
  SYM(lib, nccl, CommInitRank, "ncclCommInitRank");
  SYM(lib, nccl, AllReduce, "ncclAllReduce");
  SYM(lib, nccl, Send, "ncclSend");
  SYM(lib, nccl, Recv, "ncclRecv");
  SYM(lib, nccl, GroupStart, "ncclGroupStart");
  SYM(lib, nccl, GroupEnd, "ncclGroupEnd");
  SYM(lib, nccl, CommDestroy, "ncclCommDestroy");
  SYM(lib, nccl, GetErrorString, "ncclGetErrorString");
  return 0;
}

int zr_load_hip(const char* path, char* err, int errlen) { return open_lib(&hip_lib, path, bind_hip, err, errlen); }
int zr_load_rccl(const char* path, char* err, int errlen) { return open_lib(&rccl_lib, path, bind_rccl, err, errlen); }

const char* zr_hip_error(int code) { return hip_lib ? hip.GetErrorString(code) : "HIP runtime not loaded"; }

int zr_device_count(int* n) {
  int rc = hip.Init(0);
  if (rc) return rc;
  return hip.GetDeviceCount(n);
}

int zr_module_function(int dev, const char* path, const char* name, void** fn) {
  int rc = hip.SetDevice(dev);
  void* mod = NULL;
  if (rc == 0) rc = hip.ModuleLoad(&mod, path);
  if (rc == 0) rc = hip.ModuleGetFunction(fn, mod, name);
  return rc;
}

// A set of device buffers freed together.
typedef struct {
  void* p[16];
  int n;
} bufs;

static void release(bufs* b) {
  for (int i = 0; i < b->n; ++i) hip.Free(b->p[i]);
}

// upload allocates size bytes on the device and copies src (if any) there; zeroes otherwise.
static int upload(bufs* b, void** dst, const void* src, size_t size) {
  if (size == 0) size = 4;  // a zero-row block still gets a valid pointer
  int rc = hip.Malloc(dst, size);
  if (rc) return rc;
  b->p[b->n++] = *dst;
  return src ? hip.Memcpy(*dst, src, size, H2D) : hip.Memset(*dst, 0, size);
}

#define TRY(x)           \
  do {                   \
    if ((rc = (x))) goto out; \
  } while (0)

static int launch(void* fn, int groups, void** args) {
  int rc = hip.ModuleLaunchKernel(fn, groups, 1, 1, 64, 1, 1, 0, NULL, args, NULL);
  return rc ? rc : hip.DeviceSynchronize();
}

int zr_attn_fwd(void* fn, int dev, const float* q, const float* k, const float* v, const int* qpos,
                const int* kpos, int nq, int nk, int d, int causal, float scale, float* out, float* lse) {
  bufs b = {.n = 0};
  void *dq, *dk, *dv, *dqp, *dkp, *dout, *dlse;
  size_t fq = sizeof(float) * nq * d, fk = sizeof(float) * nk * d;
  int rc = hip.SetDevice(dev);
  if (rc || nq == 0) return rc;
  TRY(upload(&b, &dq, q, fq));
  TRY(upload(&b, &dk, k, fk));
  TRY(upload(&b, &dv, v, fk));
  TRY(upload(&b, &dqp, qpos, sizeof(int) * nq));
  TRY(upload(&b, &dkp, kpos, sizeof(int) * nk));
  TRY(upload(&b, &dout, NULL, fq));
  TRY(upload(&b, &dlse, NULL, sizeof(float) * nq));
  void* args[] = {&dq, &dk, &dv, &dqp, &dkp, &nk, &d, &causal, &scale, &dout, &dlse};
  TRY(launch(fn, nq, args));
  TRY(hip.Memcpy(out, dout, fq, D2H));
  TRY(hip.Memcpy(lse, dlse, sizeof(float) * nq, D2H));
out:
  release(&b);
  return rc;
}

int zr_attn_merge(void* fn, int dev, float* out_a, float* lse_a, int na, const float* out_b,
                  const float* lse_b, const int* rows, int nb, int d) {
  bufs b = {.n = 0};
  void *doa, *dla, *dob, *dlb, *drows;
  int rc = hip.SetDevice(dev);
  if (rc || nb == 0) return rc;
  TRY(upload(&b, &doa, out_a, sizeof(float) * na * d));
  TRY(upload(&b, &dla, lse_a, sizeof(float) * na));
  TRY(upload(&b, &dob, out_b, sizeof(float) * nb * d));
  TRY(upload(&b, &dlb, lse_b, sizeof(float) * nb));
  TRY(upload(&b, &drows, rows, sizeof(int) * nb));
  void* args[] = {&doa, &dla, &dob, &dlb, &drows, &d};
  TRY(launch(fn, nb, args));
  TRY(hip.Memcpy(out_a, doa, sizeof(float) * na * d, D2H));
  TRY(hip.Memcpy(lse_a, dla, sizeof(float) * na, D2H));
out:
  release(&b);
  return rc;
}

int zr_alloc(int dev, size_t n, void** p) {
  int rc = hip.SetDevice(dev);
  return rc ? rc : hip.Malloc(p, n ? n : 4);
}

int zr_release(int dev, void* p) {
  int rc = hip.SetDevice(dev);
  return rc ? rc : hip.Free(p);
}

int zr_copy_in(int dev, void* dst, const void* src, size_t n) {
  int rc = hip.SetDevice(dev);
  return rc || n == 0 ? rc : hip.Memcpy(dst, src, n, H2D);
}

int zr_copy_out(int dev, void* dst, const void* src, size_t n) {
  int rc = hip.SetDevice(dev);
  return rc || n == 0 ? rc : hip.Memcpy(dst, src, n, D2H);
}

int zr_copy_dev(int dev, void* dst, const void* src, size_t n) {
  int rc = hip.SetDevice(dev);
  return rc || n == 0 ? rc : hip.Memcpy(dst, src, n, 3);  // hipMemcpyDeviceToDevice
}

int zr_zero(int dev, void* p, size_t n) {
  int rc = hip.SetDevice(dev);
  return rc || n == 0 ? rc : hip.Memset(p, 0, n);
}

int zr_gemm(void* fn, int dev, const void* a, const void* b, float* c, int m, int n, int k, int lda, int ldb,
            int ldc, int ta, int tb, int accumulate) {
  int rc = hip.SetDevice(dev);
  if (rc || m == 0 || n == 0) return rc;
  void* args[] = {&a, &b, &c, &m, &n, &k, &lda, &ldb, &ldc, &ta, &tb, &accumulate};
  rc = hip.ModuleLaunchKernel(fn, (n + 63) / 64, (m + 63) / 64, 1, 256, 1, 1, 0, NULL, args, NULL);
  return rc ? rc : hip.DeviceSynchronize();
}

int zr_adamw(void* fn, int dev, float* p, float* m, float* v, const float* g, const unsigned char* decay, int n,
             float lr, float beta1, float beta2, float eps, float wd, float c1, float c2, float clip) {
  int rc = hip.SetDevice(dev);
  if (rc || n == 0) return rc;
  void* args[] = {&p, &m, &v, &g, &decay, &n, &lr, &beta1, &beta2, &eps, &wd, &c1, &c2, &clip};
  return launch(fn, (n + 63) / 64, args);
}

int zr_sumsq(void* fn, int dev, const float* x, int n, int square, float* out) {
  int rc = hip.SetDevice(dev);
  if (rc || n == 0) return rc;
  void* args[] = {&x, &n, &square, &out};
  return launch(fn, (n + 63) / 64, args);
}

int zr_cast_bf16(void* fn, int dev, const float* x, unsigned short* y, int n) {
  int rc = hip.SetDevice(dev);
  if (rc || n == 0) return rc;
  void* args[] = {&x, &y, &n};
  return launch(fn, (n + 63) / 64, args);
}

// on launches fn over groups wavefronts on dev (nothing to do when groups is 0).
static int on(int dev, void* fn, int groups, void** args) {
  int rc = hip.SetDevice(dev);
  return rc || groups <= 0 ? rc : launch(fn, groups, args);
}

static int per64(long n) { return (int)((n + 63) / 64); }

int zr_embed_fwd(void* fn, int dev, const int* tokens, const float* emb, float* x, int n, int d) {
  void* args[] = {&tokens, &emb, &x, &n, &d};
  return on(dev, fn, per64((long)n * d), args);
}

int zr_embed_bwd(void* fn, int dev, const int* start, const int* order, const float* dx, float* demb, int vocab, int d) {
  void* args[] = {&start, &order, &dx, &demb, &vocab, &d};
  return on(dev, fn, per64((long)vocab * d), args);
}

int zr_rmsnorm_fwd(void* fn, int dev, const float* x, const float* gain, float* y, float* inv, int rows, int d, float eps) {
  void* args[] = {&x, &gain, &y, &inv, &d, &eps};
  return on(dev, fn, rows, args);
}

int zr_rmsnorm_bwd(void* fn, int dev, const float* x, const float* gain, const float* inv, const float* dy, float* dx,
                   int rows, int d, int accumulate) {
  void* args[] = {&x, &gain, &inv, &dy, &dx, &d, &accumulate};
  return on(dev, fn, rows, args);
}

int zr_rmsnorm_dgain(void* fn, int dev, const float* x, const float* inv, const float* dy, float* dgain, int rows, int d) {
  void* args[] = {&x, &inv, &dy, &dgain, &rows, &d};
  return on(dev, fn, per64(d), args);
}

int zr_gelu_fwd(void* fn, int dev, const float* u, float* g, int n) {
  void* args[] = {&u, &g, &n};
  return on(dev, fn, per64(n), args);
}

int zr_gelu_bwd(void* fn, int dev, const float* u, const float* dg, float* du, int n) {
  void* args[] = {&u, &dg, &du, &n};
  return on(dev, fn, per64(n), args);
}

int zr_xent(void* fn, int dev, const float* logits, const int* targets, float* dlogits, float* loss, int rows, int vocab,
            float norm) {
  void* args[] = {&logits, &targets, &dlogits, &loss, &vocab, &norm};
  return on(dev, fn, rows, args);
}

// The device side of a backward call: its inputs, positions and zeroed gradients.
typedef struct {
  void *q, *k, *v, *out, *dout, *lse, *qpos, *kpos, *dq, *dk, *dv;
} bwd_bufs;

// bwd_upload copies a backward call's inputs to the device (q, k, v and dout of elem bytes
// each: fp32 or bf16) and allocates its gradients, zeroed: the kernels add into them.
static int bwd_upload(bufs* b, bwd_bufs* g, size_t elem, const void* q, const void* k, const void* v,
                      const float* out, const void* dout, const float* lse, const int* qpos, const int* kpos, int nq,
                      int nk, int d) {
  int rc;
  size_t eq = elem * nq * d, ek = elem * nk * d, fq = sizeof(float) * nq * d, fk = sizeof(float) * nk * d;
  TRY(upload(b, &g->q, q, eq));
  TRY(upload(b, &g->k, k, ek));
  TRY(upload(b, &g->v, v, ek));
  TRY(upload(b, &g->out, out, fq));
  TRY(upload(b, &g->dout, dout, eq));
  TRY(upload(b, &g->lse, lse, sizeof(float) * nq));
  TRY(upload(b, &g->qpos, qpos, sizeof(int) * nq));
  TRY(upload(b, &g->kpos, kpos, sizeof(int) * nk));
  TRY(upload(b, &g->dq, NULL, fq));
  TRY(upload(b, &g->dk, NULL, fk));
  TRY(upload(b, &g->dv, NULL, fk));
out:
  return rc;
}

static int bwd_download(bwd_bufs* g, float* dq, float* dk, float* dv, int nq, int nk, int d) {
  int rc;
  TRY(hip.Memcpy(dq, g->dq, sizeof(float) * nq * d, D2H));
  TRY(hip.Memcpy(dk, g->dk, sizeof(float) * nk * d, D2H));
  TRY(hip.Memcpy(dv, g->dv, sizeof(float) * nk * d, D2H));
out:
  return rc;
}

int zr_attn_bwd(void* fn, int dev, const float* q, const float* k, const float* v, const float* out,
                const float* dout, const float* lse, const int* qpos, const int* kpos, int nq, int nk,
                int d, int causal, float scale, float* dq, float* dk, float* dv) {
  bufs b = {.n = 0};
  bwd_bufs g;
  int rc = hip.SetDevice(dev);
  if (rc || nq == 0) return rc;
  TRY(bwd_upload(&b, &g, sizeof(float), q, k, v, out, dout, lse, qpos, kpos, nq, nk, d));
  void* args[] = {&g.q, &g.k, &g.v, &g.out, &g.dout, &g.lse, &g.qpos, &g.kpos, &nk, &d, &causal, &scale, &g.dq, &g.dk, &g.dv};
  TRY(launch(fn, nq, args));
  TRY(bwd_download(&g, dq, dk, dv, nq, nk, d));
out:
  release(&b);
  return rc;
}

static int tiles(int rows, int per) { return (rows + per - 1) / per; }

int zr_attn_merge_dev(void* fn, int dev, float* out_a, float* lse_a, const float* out_b, const float* lse_b,
                      const int* rows, int nb, int d) {
  int rc = hip.SetDevice(dev);
  if (rc || nb == 0) return rc;
  void* args[] = {&out_a, &lse_a, &out_b, &lse_b, &rows, &d};
  return launch(fn, nb, args);
}

int zr_attn_fwd_mfma_dev(void* fn, int dev, const void* q, const void* k, const void* v, const int* qpos,
                         const int* kpos, int nq, int nk, int d, int causal, float scale, float* out, float* lse) {
  int rc = hip.SetDevice(dev);
  if (rc || nq == 0) return rc;
  void* args[] = {&q, &k, &v, &qpos, &kpos, &nq, &nk, &d, &causal, &scale, &out, &lse};
  return launch(fn, tiles(nq, 16), args);
}

int zr_attn_bwd_mfma_dev(void* prep, void* dkdv, void* dqfn, int dev, const void* q, const void* k, const void* v,
                         const float* out, const void* dout, const float* lse, float* delta, const int* qpos,
                         const int* kpos, int nq, int nk, int d, int causal, float scale, float* dq, float* dk,
                         float* dv) {
  int rc = hip.SetDevice(dev);
  if (rc || nq == 0) return rc;
  void* pargs[] = {&dout, &out, &nq, &d, &delta};
  if ((rc = launch(prep, tiles(nq, 64), pargs))) return rc;
  if (nk > 0) {
    void* kargs[] = {&q, &k, &v, &dout, &lse, &delta, &qpos, &kpos, &nq, &nk, &d, &causal, &scale, &dk, &dv};
    if ((rc = launch(dkdv, tiles(nk, 16), kargs))) return rc;
  }
  void* qargs[] = {&q, &k, &v, &dout, &lse, &delta, &qpos, &kpos, &nq, &nk, &d, &causal, &scale, &dq};
  return launch(dqfn, tiles(nq, 16), qargs);
}

int zr_attn_fwd_mfma(void* fn, int dev, const unsigned short* q, const unsigned short* k, const unsigned short* v,
                     const int* qpos, const int* kpos, int nq, int nk, int d, int causal, float scale, float* out,
                     float* lse) {
  bufs b = {.n = 0};
  void *gq, *gk, *gv, *gqp, *gkp, *gout, *glse;
  size_t hq = sizeof(unsigned short) * nq * d, hk = sizeof(unsigned short) * nk * d;
  int rc = hip.SetDevice(dev);
  if (rc || nq == 0) return rc;
  TRY(upload(&b, &gq, q, hq));
  TRY(upload(&b, &gk, k, hk));
  TRY(upload(&b, &gv, v, hk));
  TRY(upload(&b, &gqp, qpos, sizeof(int) * nq));
  TRY(upload(&b, &gkp, kpos, sizeof(int) * nk));
  TRY(upload(&b, &gout, NULL, sizeof(float) * nq * d));
  TRY(upload(&b, &glse, NULL, sizeof(float) * nq));
  TRY(zr_attn_fwd_mfma_dev(fn, dev, gq, gk, gv, gqp, gkp, nq, nk, d, causal, scale, gout, glse));
  TRY(hip.Memcpy(out, gout, sizeof(float) * nq * d, D2H));
  TRY(hip.Memcpy(lse, glse, sizeof(float) * nq, D2H));
out:
  release(&b);
  return rc;
}

int zr_attn_bwd_mfma(void* prep, void* dkdv, void* dqfn, int dev, const unsigned short* q, const unsigned short* k,
                     const unsigned short* v, const float* out, const unsigned short* dout, const float* lse,
                     const int* qpos, const int* kpos, int nq, int nk, int d, int causal, float scale, float* dq,
                     float* dk, float* dv) {
  bufs b = {.n = 0};
  bwd_bufs g;
  void* gdelta;
  int rc = hip.SetDevice(dev);
  if (rc || nq == 0) return rc;
  TRY(bwd_upload(&b, &g, sizeof(unsigned short), q, k, v, out, dout, lse, qpos, kpos, nq, nk, d));
  TRY(upload(&b, &gdelta, NULL, sizeof(float) * nq));
  TRY(zr_attn_bwd_mfma_dev(prep, dkdv, dqfn, dev, g.q, g.k, g.v, g.out, g.dout, g.lse, gdelta, g.qpos, g.kpos, nq, nk, d,
                           causal, scale, g.dq, g.dk, g.dv));
  TRY(bwd_download(&g, dq, dk, dv, nq, nk, d));
out:
  release(&b);
  return rc;
}

// RCCL. A communicator keeps one stream and device staging buffers that grow as needed.
struct zr_comm {
  void* comm;
  int dev;
  hip_stream stream;
  void *sbuf, *rbuf;
  size_t scap, rcap;
};

const char* zr_rccl_error(int code) {
  if (code < 0) return zr_hip_error(-code);
  return rccl_lib ? nccl.GetErrorString(code) : "RCCL not loaded";
}

int zr_unique_id(zr_uid* id) { return nccl.GetUniqueId(id); }

int zr_comm_init(int dev, zr_uid id, int nranks, int rank, zr_comm** out) {
  zr_comm* c = calloc(1, sizeof(zr_comm));
  int rc = hip.SetDevice(dev);
  if (rc == 0) rc = hip.StreamCreate(&c->stream);
  if (rc) {
    free(c);
    return -rc;
  }
  c->dev = dev;
  rc = nccl.CommInitRank(&c->comm, nranks, id, rank);
  if (rc) {
    hip.StreamDestroy(c->stream);
    free(c);
    return rc;
  }
  *out = c;
  return 0;
}

static int grow(void** buf, size_t* cap, size_t n) {
  if (n <= *cap) return 0;
  if (*buf) hip.Free(*buf);
  *buf = NULL;
  *cap = 0;
  int rc = hip.Malloc(buf, n);
  if (rc == 0) *cap = n;
  return rc;
}

int zr_allreduce(zr_comm* c, double* v, size_t n) {
  size_t size = n * sizeof(double);
  int rc = hip.SetDevice(c->dev);
  if (rc == 0) rc = grow(&c->sbuf, &c->scap, size ? size : 8);
  if (rc == 0) rc = hip.Memcpy(c->sbuf, v, size, H2D);
  if (rc) return -rc;
  rc = nccl.AllReduce(c->sbuf, c->sbuf, n, NCCL_FLOAT64, NCCL_SUM, c->comm, c->stream);
  if (rc) return rc;
  rc = hip.StreamSynchronize(c->stream);
  if (rc == 0) rc = hip.Memcpy(v, c->sbuf, size, D2H);
  return -rc;
}

int zr_allreduce_f32_dev(zr_comm* c, float* v, size_t n) {
  int rc = hip.SetDevice(c->dev);
  if (rc) return -rc;
  rc = nccl.AllReduce(v, v, n, NCCL_FLOAT32, NCCL_SUM, c->comm, c->stream);
  if (rc) return rc;
  return -hip.StreamSynchronize(c->stream);
}

int zr_sendrecv(zr_comm* c, const void* send, size_t nsend, int to, void* recv, size_t nrecv, int from) {
  int rc = hip.SetDevice(c->dev);
  if (rc == 0) rc = grow(&c->sbuf, &c->scap, nsend ? nsend : 8);
  if (rc == 0) rc = grow(&c->rbuf, &c->rcap, nrecv ? nrecv : 8);
  if (rc == 0) rc = hip.Memcpy(c->sbuf, send, nsend, H2D);
  if (rc) return -rc;
  // Group start, both calls and group end on one OS thread: RCCL's group state is per thread.
  rc = nccl.GroupStart();
  if (rc) return rc;
  int rs = nccl.Send(c->sbuf, nsend, NCCL_UINT8, to, c->comm, c->stream);
  int rr = nccl.Recv(c->rbuf, nrecv, NCCL_UINT8, from, c->comm, c->stream);
  rc = nccl.GroupEnd();
  if (rs) return rs;
  if (rr) return rr;
  if (rc) return rc;
  rc = hip.StreamSynchronize(c->stream);
  if (rc == 0) rc = hip.Memcpy(recv, c->rbuf, nrecv, D2H);
  return -rc;
}

int zr_sendrecv_dev(zr_comm* c, const void* send, size_t nsend, int to, void* recv, size_t nrecv, int from) {
  int rc = hip.SetDevice(c->dev);
  if (rc) return -rc;
  rc = nccl.GroupStart();
  if (rc) return rc;
  int rs = nccl.Send(send, nsend, NCCL_UINT8, to, c->comm, c->stream);
  int rr = nccl.Recv(recv, nrecv, NCCL_UINT8, from, c->comm, c->stream);
  rc = nccl.GroupEnd();
  if (rs) return rs;
  if (rr) return rr;
  if (rc) return rc;
  return -hip.StreamSynchronize(c->stream);
}

void zr_comm_destroy(zr_comm* c) {
  if (c == NULL) return;
  hip.SetDevice(c->dev);
  nccl.CommDestroy(c->comm);
  if (c->sbuf) hip.Free(c->sbuf);
  if (c->rbuf) hip.Free(c->rbuf);
  hip.StreamDestroy(c->stream);
  free(c);
}
