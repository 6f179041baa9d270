// Package exactsum sums float64 vectors over ranks so that the bits of the sum depend on
// neither the order of the additions nor how the terms are shared among ranks: each term is
// rounded once to a grid of 2^-e, fine enough that every partial sum is an integer below
// 2^53, which a float64 holds exactly. Float addition of such integers is exact, hence
// associative, so any all-reduce (a ring, a star, RCCL's) gives the same bytes at any world
// size. A training run can then change its data-parallel width and end bit-identical.
package exactsum

import (
	"fmt"
	"math"

	"github.com/zaya-operator/zaya-operator/workers/transport"
)

// MaxTerms bounds how many terms one sum may have (a million GPUs' gradients): each keeps at
// least 53-20 = 33 bits below the largest term's magnitude.
const MaxTerms = 1 << 20

// Exponent is the e for which terms values, each at most maxAbs in magnitude and rounded to
// a multiple of 2^-e, sum to at most 2^52 in magnitude, and as large as that allows. It
// fails for a maximum that is not a finite number (a diverged step) or a count outside
// 1..MaxTerms.
func Exponent(maxAbs float64, terms int) (int, error) {
	switch {
	case terms < 1 || terms > MaxTerms:
		return 0, fmt.Errorf("exactsum: %d terms, want 1 to %d", terms, MaxTerms)
	case math.IsNaN(maxAbs) || math.IsInf(maxAbs, 0) || maxAbs < 0:
		return 0, fmt.Errorf("exactsum: the largest term is %v, not a finite number", maxAbs)
	case maxAbs == 0:
		return 0, nil
	}
	_, x := math.Frexp(maxAbs) // maxAbs < 2^x
	bits := 0                  // 2^bits >= terms
	for 1<<bits < terms {
		bits++
	}
	// Each term rounds to at most 2^(x+e) = 2^(52-bits); terms of them to at most 2^52.
	return 52 - bits - x, nil
}

// Add adds round(x × 2^e) for every x of src to dst element-wise. dst holds integers, so
// the sum is exact as long as Exponent's bound holds for every term added.
func Add(dst, src []float64, e int) {
	for i, x := range src {
		dst[i] += math.Round(math.Ldexp(x, e))
	}
}

// Unscale turns sums of Add back into values: v[i] × 2^-e, exact for the integers Add makes.
func Unscale(v []float64, e int) {
	for i, x := range v {
		v[i] = math.Ldexp(x, -e)
	}
}

// MaxAbs is the largest magnitude in v, NaN if v holds a NaN, 0 for none.
func MaxAbs(v []float64) float64 {
	m := 0.0
	for _, x := range v {
		if math.IsNaN(x) {
			return x
		}
		m = max(m, math.Abs(x))
	}
	return m
}

// AllMax sets each element of local to its maximum over every rank. It needs only the
// transport's sum: each rank puts its values in its own slots of a vector of zeros, and x + 0
// is exact, so the sum holds every rank's values unchanged. The vector is the world size
// times len(local): small for the few maxima a step needs.
func AllMax(tr transport.Transport, local []float64) error {
	world, rank, k := tr.World(), tr.Rank(), len(local)
	if world == 1 || k == 0 {
		return nil
	}
	slots := make([]float64, world*k)
	copy(slots[rank*k:], local)
	if err := tr.AllReduce(slots); err != nil {
		return err
	}
	for i := range local {
		for r := range world {
			x := slots[r*k+i]
			if math.IsNaN(x) || x > local[i] {
				local[i] = x
			}
			if math.IsNaN(local[i]) {
				break
			}
		}
	}
	return nil
}
