//go:build !(rocm && cgo)

package rocm

import (
	"context"

	"github.com/zaya-operator/zaya-operator/workers/attention"
	"github.com/zaya-operator/zaya-operator/workers/model"
	"github.com/zaya-operator/zaya-operator/workers/transport"
)

// Built reports whether this worker has ROCm support.
const Built = false

// OpenBackend needs the rocm build tag.
func OpenBackend(Libraries, string, int) (attention.Backend, error) { return nil, ErrNotBuilt }

// OpenStep needs the rocm build tag.
func OpenStep(Libraries, string, int, model.Shape, []float32, [][]int, int, any) (TrainingStep, error) {
	return nil, ErrNotBuilt
}

// DialRCCL needs the rocm build tag.
func DialRCCL(context.Context, transport.Config, int, Libraries) (transport.Transport, error) {
	return nil, ErrNotBuilt
}
