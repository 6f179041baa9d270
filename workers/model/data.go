package model

import "math/rand/v2"

func newRand(seed, stream uint64) *rand.Rand { return rand.New(rand.NewPCG(seed, stream)) }

// Tokens is the sequence of seq+1 tokens of micro-batch k of step: the one data-parallel
// group k trains at the job's full width. It depends on nothing else, so a resumed run sees
// exactly the data the uninterrupted one did, and a run at another width the same data
// shared among fewer groups. k is below 2^20.
// The text is a Markov chain fixed by seed in which every token has two different, equally
// likely successors: a model that learns the chain reaches ln 2 ≈ 0.69 nats per token, from about
// ln(vocab) at the start.
func Tokens(seed uint64, step int64, k, seq, vocab int) []int32 {
	chain := newRand(seed^0xc4a1, 7)
	next := make([][2]int32, vocab)
	for t := range next {
		a := chain.IntN(vocab)
		next[t] = [2]int32{int32(a), int32((a + 1 + chain.IntN(vocab-1)) % vocab)} // two different tokens
	}
	r := newRand(seed^0x5eed, uint64(step)<<20|uint64(k))
	out := make([]int32, seq+1)
	out[0] = int32(r.IntN(vocab))
	for i := 1; i <= seq; i++ {
		out[i] = next[out[i-1]][r.IntN(2)]
	}
	return out
}

// Floor is the chain's entropy per token, the lowest mean loss a model can reach on Tokens.
const Floor = 0.6931471805599453
