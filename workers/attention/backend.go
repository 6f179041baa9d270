package attention

// Backend computes attention blocks for ring attention. CPU is the reference and what tests
// and fake-GPU clusters run; the HIP kernels (workers/hip, build tag hip) implement the same
// three calls on MI300X. Shapes and conventions are those of Forward, Merge and Backward.
type Backend interface {
	Name() string
	Forward(q, k, v Matrix, qPos, kPos []int, causal bool, scale float64) (Partial, error)
	Merge(a *Partial, b Partial, rows []int) error
	Backward(q, k, v, out, dout Matrix, lse []float64, qPos, kPos []int, causal bool, scale float64,
		dq Grad, qRows []int, dk, dv Grad, kRows []int) error
}

// CPU is the Go backend of this package.
var CPU Backend = cpu{}

type cpu struct{}

func (cpu) Name() string { return "cpu" }

func (cpu) Forward(q, k, v Matrix, qPos, kPos []int, causal bool, scale float64) (Partial, error) {
	return Forward(q, k, v, qPos, kPos, causal, scale)
}

func (cpu) Merge(a *Partial, b Partial, rows []int) error {
	Merge(a, b, rows)
	return nil
}

func (cpu) Backward(q, k, v, out, dout Matrix, lse []float64, qPos, kPos []int, causal bool, scale float64,
	dq Grad, qRows []int, dk, dv Grad, kRows []int) error {
	return Backward(q, k, v, out, dout, lse, qPos, kPos, causal, scale, dq, qRows, dk, dv, kRows)
}
