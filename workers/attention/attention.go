// Package attention is the math of ring attention in pure Go: attention of one block of
// queries against one block of keys and values, giving a normalised output and the
// log-sum-exp (LSE) of each query's scores; the numerically stable merge of such partial
// results; and a plain full-attention reference in float64 to test both against. It does no
// I/O: the ring schedule and the transports live elsewhere, and the HIP kernels implement the
// same contract.
package attention

import (
	"fmt"
	"math"
)

// Matrix is a row-major rows×cols matrix of float32.
type Matrix struct {
	Rows, Cols int
	Data       []float32
}

// NewMatrix is a zeroed rows×cols matrix.
func NewMatrix(rows, cols int) Matrix {
	return Matrix{Rows: rows, Cols: cols, Data: make([]float32, rows*cols)}
}

// Row is row i, sharing storage.
func (m Matrix) Row(i int) []float32 { return m.Data[i*m.Cols : (i+1)*m.Cols] }

// SelectRows gathers the given rows into a new matrix.
func (m Matrix) SelectRows(idx []int) Matrix {
	out := NewMatrix(len(idx), m.Cols)
	for i, r := range idx {
		copy(out.Row(i), m.Row(r))
	}
	return out
}

// Partial is attention of some queries against some keys: Out is normalised over those keys
// and LSE[i] = log Σ_j exp(s_ij) over them (s = scaled score). A query that sees no key has
// LSE -Inf and a zero output: it contributes nothing when merged.
type Partial struct {
	Out Matrix
	LSE []float64
}

// EmptyPartial is the identity of Merge for n queries of width d.
func EmptyPartial(n, d int) Partial {
	lse := make([]float64, n)
	for i := range lse {
		lse[i] = math.Inf(-1)
	}
	return Partial{Out: NewMatrix(n, d), LSE: lse}
}

// Forward is attention of q against k and v. qPos and kPos are the tokens' positions in the
// whole sequence; with causal, query i sees key j only if kPos[j] <= qPos[i]. Positions make
// one routine serve every block of a zigzag ring. Scores and sums are accumulated in float64.
func Forward(q, k, v Matrix, qPos, kPos []int, causal bool, scale float64) (Partial, error) {
	if q.Cols != k.Cols || k.Rows != v.Rows || len(qPos) != q.Rows || len(kPos) != k.Rows {
		return Partial{}, fmt.Errorf("attention: shapes q %dx%d, k %dx%d, v %dx%d, positions %d/%d do not fit",
			q.Rows, q.Cols, k.Rows, k.Cols, v.Rows, v.Cols, len(qPos), len(kPos))
	}
	p := EmptyPartial(q.Rows, v.Cols)
	scores := make([]float64, k.Rows)
	acc := make([]float64, v.Cols)
	for i := range q.Rows {
		qi := q.Row(i)
		maxScore := math.Inf(-1)
		for j := range k.Rows {
			if causal && kPos[j] > qPos[i] {
				scores[j] = math.Inf(-1)
				continue
			}
			var dot float64
			kj := k.Row(j)
			for c := range qi {
				dot += float64(qi[c]) * float64(kj[c])
			}
			scores[j] = dot * scale
			maxScore = math.Max(maxScore, scores[j])
		}
		if math.IsInf(maxScore, -1) {
			continue // sees no key: LSE stays -Inf, output stays zero
		}
		clear(acc)
		var sum float64
		for j := range k.Rows {
			if math.IsInf(scores[j], -1) {
				continue
			}
			w := math.Exp(scores[j] - maxScore)
			sum += w
			vj := v.Row(j)
			for c := range acc {
				acc[c] += w * float64(vj[c])
			}
		}
		out := p.Out.Row(i)
		for c := range acc {
			out[c] = float32(acc[c] / sum)
		}
		p.LSE[i] = maxScore + math.Log(sum)
	}
	return p, nil
}

// MergeRow folds one query's partial result (oB, lseB) into (oA, lseA) in place and returns
// the new LSE. It never forms exp(lse): lse' = max + log1p(exp(min - max)) and
// o' = o - sigmoid(lseB - lseA)·(o - oB), so huge scores cannot overflow, and a side that
// saw no key (LSE -Inf) contributes nothing instead of producing NaN from -Inf - -Inf.
func MergeRow(oA []float32, lseA float64, oB []float32, lseB float64) float64 {
	switch {
	case math.IsInf(lseB, -1):
		return lseA
	case math.IsInf(lseA, -1):
		copy(oA, oB)
		return lseB
	}
	hi, lo := lseA, lseB
	if lo > hi {
		hi, lo = lo, hi
	}
	lse := hi + math.Log1p(math.Exp(lo-hi))
	wB := sigmoid(lseB - lseA)
	for c := range oA {
		oA[c] = float32(float64(oA[c]) - wB*(float64(oA[c])-float64(oB[c])))
	}
	return lse
}

// sigmoid is 1/(1+exp(-x)) without overflow for large |x|.
func sigmoid(x float64) float64 {
	if x >= 0 {
		return 1 / (1 + math.Exp(-x))
	}
	e := math.Exp(x)
	return e / (1 + e)
}

// Merge folds b into a for the rows listed in rows (rows[i] is the row of a that b's row i
// belongs to), in place.
func Merge(a *Partial, b Partial, rows []int) {
	for i, r := range rows {
		a.LSE[r] = MergeRow(a.Out.Row(r), a.LSE[r], b.Out.Row(i), b.LSE[i])
	}
}

// Reference is full attention of q against k and v in float64, the oracle for tests.
func Reference(q, k, v Matrix, causal bool, scale float64) ([][]float64, []float64) {
	out := make([][]float64, q.Rows)
	lse := make([]float64, q.Rows)
	for i := range q.Rows {
		s := make([]float64, k.Rows)
		m := math.Inf(-1)
		for j := range k.Rows {
			if causal && j > i {
				s[j] = math.Inf(-1)
				continue
			}
			for c := range q.Cols {
				s[j] += float64(q.Data[i*q.Cols+c]) * float64(k.Data[j*k.Cols+c])
			}
			s[j] *= scale
			m = math.Max(m, s[j])
		}
		out[i] = make([]float64, v.Cols)
		var sum float64
		for j := range k.Rows {
			if math.IsInf(s[j], -1) {
				continue
			}
			w := math.Exp(s[j] - m)
			sum += w
			for c := range v.Cols {
				out[i][c] += w * float64(v.Data[j*v.Cols+c])
			}
		}
		for c := range out[i] {
			out[i][c] /= sum
		}
		lse[i] = m + math.Log(sum)
	}
	return out, lse
}
