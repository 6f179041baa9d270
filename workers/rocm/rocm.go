//go:build rocm && cgo

package rocm

/*
#cgo LDFLAGS: -ldl -lpthread
#include <stdlib.h>
#include "zr.h"
*/
import "C"

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"path/filepath"
	"unsafe"

	"github.com/zaya-operator/zaya-operator/api/contract"
	"github.com/zaya-operator/zaya-operator/workers/attention"
	"github.com/zaya-operator/zaya-operator/workers/hip"
	"github.com/zaya-operator/zaya-operator/workers/mfma"
	"github.com/zaya-operator/zaya-operator/workers/transport"
)

// Built reports whether this worker has ROCm support.
const Built = true

func load(kind string, fn func(*C.char, *C.char, C.int) C.int, paths []string) error {
	var errs []error
	buf := (*C.char)(C.malloc(512))
	defer C.free(unsafe.Pointer(buf))
	for _, p := range paths {
		cp := C.CString(p)
		rc := fn(cp, buf, 512)
		C.free(unsafe.Pointer(cp))
		if rc == 0 {
			return nil
		}
		errs = append(errs, fmt.Errorf("%s: %s", p, C.GoString(buf)))
	}
	return fmt.Errorf("%w: loading %s: %w", ErrLibrary, kind, errors.Join(errs...))
}

func loadHIP(l Libraries) error {
	return load("the HIP runtime", func(p, e *C.char, n C.int) C.int { return C.zr_load_hip(p, e, n) },
		candidates(l.HIP, "libamdhip64.so", "libamdhip64.so.6", "libamdhip64.so.5"))
}

func loadRCCL(l Libraries) error {
	if err := loadHIP(l); err != nil {
		return err
	}
	return load("RCCL", func(p, e *C.char, n C.int) C.int { return C.zr_load_rccl(p, e, n) },
		candidates(l.RCCL, "librccl.so", "librccl.so.1"))
}

func hipErr(op string, rc C.int) error {
	if rc == 0 {
		return nil
	}
	return fmt.Errorf("rocm: %s: %s (hipError %d)", op, C.GoString(C.zr_hip_error(rc)), int(rc))
}

func rcclErr(op string, rc C.int) error {
	if rc == 0 {
		return nil
	}
	return fmt.Errorf("rocm: %s: %s (%d)", op, C.GoString(C.zr_rccl_error(rc)), int(rc))
}

// ncclRemoteError is RCCL's "a remote process exited or there was a network error".
const ncclRemoteError = 6

// collectiveErr is rcclErr for a call that involves other ranks: RCCL's remote error is the
// peers' failure (transport.PeerError, which rank is not known), anything else this rank's.
func collectiveErr(op, what string, rc C.int) error {
	err := rcclErr(what, rc)
	if rc == ncclRemoteError {
		return &transport.PeerError{Rank: -1, Op: op, Err: err}
	}
	return err
}

// device checks that dev exists.
func device(dev int) error {
	var n C.int
	if rc := C.zr_device_count(&n); rc != 0 {
		return fmt.Errorf("rocm: no usable HIP device: %w", hipErr("hipGetDeviceCount", rc))
	}
	if dev < 0 || dev >= int(n) {
		return fmt.Errorf("rocm: device %d requested, %d visible (%s larger than the pod's amd.com/gpu?)", dev, int(n), contract.EnvGPUsPerNode)
	}
	return nil
}

// Backend runs the attention kernels on one GPU: the MFMA kernels (bf16 in, fp32 out, on the
// matrix cores) for head dimensions they hold (multiples of 16 up to 128), the scalar fp32
// kernels for the others.
type Backend struct {
	dev                           int
	fwd, merge, bwdFunc           unsafe.Pointer
	fwdMFMA, bwdPrep, bwdKV, bwdQ unsafe.Pointer
}

// kernel is one kernel to load: its source file (the code object built from it) and name.
type kernel struct {
	file, name string
	into       *unsafe.Pointer
}

// openKernels loads the HIP runtime, checks device dev and loads every kernel from the code
// objects in dir (built by hip.BuildCodeObjects or the ROCm image).
func openKernels(l Libraries, dir string, dev int, ks []kernel) error {
	if err := loadHIP(l); err != nil {
		return err
	}
	if err := device(dev); err != nil {
		return err
	}
	for _, k := range ks {
		path := filepath.Join(dir, hip.CodeObject(k.file))
		cpath, cname := C.CString(path), C.CString(k.name)
		rc := C.zr_module_function(C.int(dev), cpath, cname, k.into)
		C.free(unsafe.Pointer(cpath))
		C.free(unsafe.Pointer(cname))
		if err := hipErr(fmt.Sprintf("loading kernel %s from %s", k.name, path), rc); err != nil {
			return err
		}
	}
	return nil
}

// OpenBackend loads the HIP runtime and the attention kernels from dir for device dev.
func OpenBackend(l Libraries, dir string, dev int) (attention.Backend, error) {
	b := &Backend{dev: dev}
	err := openKernels(l, dir, dev, []kernel{{hip.Files[0], "zaya_attn_fwd", &b.fwd}, {hip.Files[0], "zaya_attn_merge", &b.merge},
		{hip.Files[1], "zaya_attn_bwd", &b.bwdFunc}, {hip.Files[2], "zaya_attn_fwd_mfma", &b.fwdMFMA},
		{hip.Files[3], "zaya_attn_bwd_mfma_prep", &b.bwdPrep}, {hip.Files[3], "zaya_attn_bwd_mfma_dkdv", &b.bwdKV},
		{hip.Files[3], "zaya_attn_bwd_mfma_dq", &b.bwdQ}})
	if err != nil {
		return nil, err
	}
	return b, nil
}

// Name is the backend's name in logs.
func (b *Backend) Name() string { return fmt.Sprintf("hip:%d", b.dev) }

func f32(xs []float64) []float32 {
	out := make([]float32, len(xs))
	for i, x := range xs {
		out[i] = float32(x)
	}
	return out
}

func i32(xs []int) []C.int {
	out := make([]C.int, len(xs))
	for i, x := range xs {
		out[i] = C.int(x)
	}
	return out
}

// fp, ip are C views of Go slices (never empty: the C side treats zero rows itself).
func fp(xs []float32) *C.float {
	if len(xs) == 0 {
		return nil
	}
	return (*C.float)(unsafe.Pointer(&xs[0]))
}

func ip(xs []C.int) *C.int {
	if len(xs) == 0 {
		return nil
	}
	return &xs[0]
}

func checkDim(d int) error {
	if d > maxHeadDim {
		return fmt.Errorf("rocm: head dimension %d exceeds the kernels' %d", d, maxHeadDim)
	}
	return nil
}

const maxHeadDim = 256 // ZAYA_MAX_HEAD_DIM

// bf16 is m's elements rounded to bfloat16 as the kernels take them, for C.
func bf16(m attention.Matrix) *C.ushort {
	if len(m.Data) == 0 {
		return nil
	}
	return (*C.ushort)(unsafe.Pointer(&mfma.BF16s(m.Data)[0]))
}

func b2i(b bool) C.int {
	if b {
		return 1
	}
	return 0
}

// Forward is attention.Forward on the GPU (fp32 accumulation).
func (b *Backend) Forward(q, k, v attention.Matrix, qPos, kPos []int, causal bool, scale float64) (attention.Partial, error) {
	if q.Cols != k.Cols || k.Rows != v.Rows || k.Cols != v.Cols || len(qPos) != q.Rows || len(kPos) != k.Rows {
		return attention.Partial{}, fmt.Errorf("rocm: forward shapes q %dx%d, k %dx%d, v %dx%d do not fit", q.Rows, q.Cols, k.Rows, k.Cols, v.Rows, v.Cols)
	}
	if err := checkDim(q.Cols); err != nil {
		return attention.Partial{}, err
	}
	p := attention.EmptyPartial(q.Rows, v.Cols)
	lse := make([]float32, q.Rows)
	qp, kp := i32(qPos), i32(kPos)
	var rc C.int
	name := "zaya_attn_fwd"
	if MFMA(q.Cols) {
		name = "zaya_attn_fwd_mfma"
		rc = C.zr_attn_fwd_mfma(b.fwdMFMA, C.int(b.dev), bf16(q), bf16(k), bf16(v), ip(qp), ip(kp), C.int(q.Rows), C.int(k.Rows),
			C.int(q.Cols), b2i(causal), C.float(scale), fp(p.Out.Data), fp(lse))
	} else {
		rc = C.zr_attn_fwd(b.fwd, C.int(b.dev), fp(q.Data), fp(k.Data), fp(v.Data), ip(qp), ip(kp), C.int(q.Rows), C.int(k.Rows),
			C.int(q.Cols), b2i(causal), C.float(scale), fp(p.Out.Data), fp(lse))
	}
	if err := hipErr(name, rc); err != nil {
		return attention.Partial{}, err
	}
	for i, x := range lse {
		p.LSE[i] = float64(x)
	}
	return p, nil
}

// Merge is attention.Merge on the GPU.
func (b *Backend) Merge(a *attention.Partial, p attention.Partial, rows []int) error {
	if len(rows) != p.Out.Rows || a.Out.Cols != p.Out.Cols {
		return fmt.Errorf("rocm: merge of %d rows into %d with %d row indices", p.Out.Rows, a.Out.Rows, len(rows))
	}
	la, lb, r := f32(a.LSE), f32(p.LSE), i32(rows)
	rc := C.zr_attn_merge(b.merge, C.int(b.dev), fp(a.Out.Data), fp(la), C.int(a.Out.Rows), fp(p.Out.Data), fp(lb), ip(r),
		C.int(p.Out.Rows), C.int(a.Out.Cols))
	if err := hipErr("zaya_attn_merge", rc); err != nil {
		return err
	}
	for i, x := range la {
		a.LSE[i] = float64(x)
	}
	return nil
}

// Backward is attention.Backward on the GPU: the kernel's fp32 gradients are added into the
// float64 accumulators at qRows and kRows.
func (b *Backend) Backward(q, k, v, out, dout attention.Matrix, lse []float64, qPos, kPos []int, causal bool, scale float64,
	dq attention.Grad, qRows []int, dk, dv attention.Grad, kRows []int) error {
	if q.Cols != k.Cols || k.Rows != v.Rows || out.Rows != q.Rows || dout.Rows != q.Rows || len(lse) != q.Rows ||
		len(qPos) != q.Rows || len(kPos) != k.Rows || len(qRows) != q.Rows || len(kRows) != k.Rows {
		return fmt.Errorf("rocm: backward shapes do not fit (q %dx%d, k %dx%d, v %dx%d)", q.Rows, q.Cols, k.Rows, k.Cols, v.Rows, v.Cols)
	}
	if err := checkDim(q.Cols); err != nil {
		return err
	}
	d := q.Cols
	gq, gk, gv := make([]float32, q.Rows*d), make([]float32, k.Rows*d), make([]float32, k.Rows*d)
	l, qp, kp := f32(lse), i32(qPos), i32(kPos)
	var rc C.int
	name := "zaya_attn_bwd"
	if MFMA(d) {
		name = "zaya_attn_bwd_mfma"
		rc = C.zr_attn_bwd_mfma(b.bwdPrep, b.bwdKV, b.bwdQ, C.int(b.dev), bf16(q), bf16(k), bf16(v), fp(out.Data), bf16(dout), fp(l), ip(qp), ip(kp),
			C.int(q.Rows), C.int(k.Rows), C.int(d), b2i(causal), C.float(scale), fp(gq), fp(gk), fp(gv))
	} else {
		rc = C.zr_attn_bwd(b.bwdFunc, C.int(b.dev), fp(q.Data), fp(k.Data), fp(v.Data), fp(out.Data), fp(dout.Data), fp(l), ip(qp), ip(kp),
			C.int(q.Rows), C.int(k.Rows), C.int(d), b2i(causal), C.float(scale), fp(gq), fp(gk), fp(gv))
	}
	if err := hipErr(name, rc); err != nil {
		return err
	}
	for i, r := range qRows {
		for c, x := range gq[i*d : (i+1)*d] {
			dq.Row(r)[c] += float64(x)
		}
	}
	for j, r := range kRows {
		for c := range d {
			dk.Row(r)[c] += float64(gk[j*d+c])
			dv.Row(r)[c] += float64(gv[j*d+c])
		}
	}
	return nil
}

// RCCL is one rank on an RCCL communicator over the whole world; ring exchanges go to the
// neighbours in its context-parallel group. The TCP transport bootstraps it (the unique id
// travels over its all-reduce) and is closed with it.
type RCCL struct {
	boot        *transport.TCP
	comm        *C.zr_comm
	rank, world int
	next, prev  int
}

// DialRCCL rendezvouses over TCP (cfg), then joins the RCCL communicator on device dev.
func DialRCCL(ctx context.Context, cfg transport.Config, dev int, l Libraries) (transport.Transport, error) {
	if err := loadRCCL(l); err != nil {
		return nil, err
	}
	if err := device(dev); err != nil {
		return nil, err
	}
	boot, err := transport.Dial(ctx, cfg)
	if err != nil {
		return nil, err
	}
	var id C.zr_uid
	raw := unsafe.Slice((*byte)(unsafe.Pointer(&id.internal[0])), len(id.internal))
	vec := make([]float64, len(raw))
	if cfg.Rank == 0 {
		if err := rcclErr("ncclGetUniqueId", C.zr_unique_id(&id)); err != nil {
			_ = boot.Close()
			return nil, err
		}
		for i, x := range raw {
			vec[i] = float64(x)
		}
	}
	if err := boot.AllReduce(vec); err != nil { // everyone else adds zeros: all get rank 0's id
		_ = boot.Close()
		return nil, fmt.Errorf("rocm: sharing the RCCL unique id: %w", err)
	}
	for i := range raw {
		raw[i] = byte(vec[i])
	}
	t := &RCCL{boot: boot, rank: cfg.Rank, world: cfg.World}
	var comm *C.zr_comm
	rc := C.zr_comm_init(C.int(dev), id, C.int(cfg.World), C.int(cfg.Rank), &comm) //nolint:gocritic // cgo's generated pointer check trips dupSubExpr
	if err := collectiveErr(transport.OpRendezvous, "ncclCommInitRank", rc); err != nil {
		_ = boot.Close()
		return nil, err
	}
	t.comm = comm
	size := cfg.RingSize
	if size <= 0 {
		size = cfg.World
	}
	first := cfg.Rank - cfg.Rank%size
	t.next = first + (cfg.Rank-first+1)%size
	t.prev = first + (cfg.Rank-first-1+size)%size
	return t, nil
}

// Rank is this rank.
func (t *RCCL) Rank() int { return t.rank }

// World is the number of ranks.
func (t *RCCL) World() int { return t.world }

// Exchange sends b to the next rank of the ring and returns the previous rank's message:
// lengths first, then the bytes, each as one grouped send/receive.
func (t *RCCL) Exchange(b []byte) ([]byte, error) {
	var n, m [8]byte
	binary.LittleEndian.PutUint64(n[:], uint64(len(b)))
	if err := t.sendrecv(n[:], m[:]); err != nil {
		return nil, err
	}
	got := make([]byte, binary.LittleEndian.Uint64(m[:]))
	if err := t.sendrecv(b, got); err != nil {
		return nil, err
	}
	return got, nil
}

func (t *RCCL) sendrecv(send, recv []byte) error {
	var sp, rp unsafe.Pointer
	if len(send) > 0 {
		sp = unsafe.Pointer(&send[0])
	}
	if len(recv) > 0 {
		rp = unsafe.Pointer(&recv[0])
	}
	rc := C.zr_sendrecv(t.comm, sp, C.size_t(len(send)), C.int(t.next), rp, C.size_t(len(recv)), C.int(t.prev))
	return collectiveErr("exchange", fmt.Sprintf("rank %d exchanging with %d/%d", t.rank, t.next, t.prev), rc)
}

// AllReduce sums v over all ranks in place (float64, ncclSum).
func (t *RCCL) AllReduce(v []float64) error {
	var p *C.double
	if len(v) > 0 {
		p = (*C.double)(unsafe.Pointer(&v[0]))
	}
	return collectiveErr("all-reduce", fmt.Sprintf("rank %d all-reduce of %d values", t.rank, len(v)), C.zr_allreduce(t.comm, p, C.size_t(len(v))))
}

// AllReduceDevice sums the first n float32 of a device buffer (on this rank's device) over
// all ranks in place, on the device: the device step's gradients never visit the host.
func (t *RCCL) AllReduceDevice(b *Buffer, n int) error {
	if err := holds("all-reduce", b, 4*n); err != nil {
		return err
	}
	return collectiveErr("all-reduce", fmt.Sprintf("rank %d device all-reduce of %d values", t.rank, n), C.zr_allreduce_f32_dev(t.comm, f(b), C.size_t(n)))
}

// ExchangeDevice sends bytes of send (device memory) to the next rank of the ring and receives
// as many from the previous one into recv, device to device.
func (t *RCCL) ExchangeDevice(send, recv *Buffer, bytes int) error {
	if err := holds("exchange", send, bytes, recv, bytes); err != nil {
		return err
	}
	rc := C.zr_sendrecv_dev(t.comm, send.p, C.size_t(bytes), C.int(t.next), recv.p, C.size_t(bytes), C.int(t.prev))
	return collectiveErr("exchange", fmt.Sprintf("rank %d exchanging %d device bytes with %d/%d", t.rank, bytes, t.next, t.prev), rc)
}

// Barrier returns once every rank has called it.
func (t *RCCL) Barrier() error {
	var one [1]float64
	return t.AllReduce(one[:])
}

// Close leaves the communicator and closes the bootstrap connections.
func (t *RCCL) Close() error {
	if t.comm != nil {
		C.zr_comm_destroy(t.comm)
		t.comm = nil
	}
	return t.boot.Close()
}

func candidates(path string, defaults ...string) []string {
	if path != "" {
		return []string{path}
	}
	return defaults
}
