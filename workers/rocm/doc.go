// Package rocm runs the worker on AMD GPUs: the attention Backend on the HIP kernels of
// workers/hip (code objects loaded with hipModuleLoad) and a Transport on RCCL. Both load
// libamdhip64 and librccl at run time through dlopen and a table of function pointers, so the
// worker builds with no ROCm header or library present; they are compiled in only with the
// build tag rocm (and cgo). Without it, Open and Dial explain how to get them.
package rocm

import (
	"errors"

	"github.com/zaya-operator/zaya-operator/workers/attention"
	"github.com/zaya-operator/zaya-operator/workers/model"
)

// Libraries says where the ROCm libraries are: paths or sonames the dynamic loader finds.
type Libraries struct {
	HIP  string // default libamdhip64.so, then libamdhip64.so.6 and .so.5
	RCCL string // default librccl.so, then librccl.so.1
}

// ErrLibrary marks a ROCm library that cannot be loaded or lacks a symbol the worker needs.
var ErrLibrary = errors.New("rocm: library")

// ErrNotBuilt is what every call returns in a worker built without ROCm support.
var ErrNotBuilt = errors.New("this worker was built without ROCm support: build it with -tags rocm " +
	"(workers/Dockerfile.rocm) to use the HIP backend or the RCCL transport")

// TrainingStep is the decoder's training step resident on a GPU (OpenStep): Grad adds the
// step's gradient into the host vector a TCP all-reduce sums and returns the summed loss,
// Update applies the all-reduced gradient, State and Load move the weights and AdamW's
// moments for checkpoints.
type TrainingStep interface {
	Grad(b model.Batch, grad []float64) (float64, error)
	Update(o model.AdamW, t int64, grad []float64) error
	// When OpenStep's transport sums device memory (RCCL), the gradient stays on the device:
	// GradReduced all-reduces it there and UpdateReduced applies it.
	Reduces() bool
	GradReduced(b model.Batch) (float64, error)
	UpdateReduced(o model.AdamW, t int64) error
	State() (params, m, v []float32, err error)
	Load(params, m, v []float32) error
	Close() error
}

// MFMA says whether the matrix-core kernels take head dimension d (a multiple of 16 up to
// 128): the HIP backend uses them for attention, and the device step needs them.
func MFMA(d int) bool { return d > 0 && d%16 == 0 && d <= attention.MFMAMaxD }
