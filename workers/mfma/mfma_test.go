package mfma

import (
	"math"
	"testing"
)

// BF16 rounds to nearest, ties to even, as the kernels' f32_to_bf16 and the model's products.
func TestBF16Rounding(t *testing.T) {
	for _, c := range []struct{ in, want float32 }{
		{1, 1}, {-2.5, -2.5}, {0, 0},
		{1 + 1.0/256, 1},           // a tie: to even, down
		{1 + 3.0/256, 1 + 4.0/256}, // a tie: to even, up
		{1 + 1.0/128 + 1e-6, 1 + 1.0/128},
		{float32(math.Inf(-1)), float32(math.Inf(-1))},
	} {
		if got := FromBF16(BF16(c.in)); got != c.want {
			t.Errorf("bf16(%v) = %v, want %v", c.in, got, c.want)
		}
	}
	if low := math.Float32frombits(0x7f800001); !math.IsNaN(float64(FromBF16(BF16(low)))) {
		t.Error("a NaN with its payload in the low half became a number")
	}
}
