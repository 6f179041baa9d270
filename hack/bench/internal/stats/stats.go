// Package stats summarises a benchmark's runs.
package stats

import "slices"

// Median is the median of f over samples (the upper middle one of an even count); 0 for none.
func Median[T any](samples []T, f func(T) float64) float64 {
	if len(samples) == 0 {
		return 0
	}
	v := make([]float64, 0, len(samples))
	for _, s := range samples {
		v = append(v, f(s))
	}
	slices.Sort(v)
	return v[len(v)/2]
}
