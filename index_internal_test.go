package gpumem

import (
	"math/rand/v2"
	"testing"
)

// TestPrevBin checks prevBin against a scan of the heads, for random sets
// of non-empty bins (few, many, at word edges) and every query bin.
func TestPrevBin(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for round := 0; round < 40; round++ {
		var x freeIndex
		var nodes []block
		n := []int{0, 1, 3, 50, 400}[round%5]
		nodes = make([]block, n)
		for k := range nodes {
			i := rng.IntN(numBins)
			if round%3 == 0 {
				i = (i/64)*64 + []int{0, 63}[k%2] // word edges
			}
			b := &nodes[k]
			if i < subBins {
				b.size = uint64(i) * minBlock
				if b.size == 0 {
					b.size = minBlock
				}
			} else {
				fl := i/subBins + subBits - 1
				b.size = (uint64(1)<<fl | uint64(i%subBins)<<(fl-subBits)) * minBlock
			}
			x.insert(b)
		}
		for i := -1; i <= numBins; i++ {
			want := -1
			for j := min(i, numBins-1); j >= 0; j-- {
				if x.heads[j] != nil {
					want = j
					break
				}
			}
			if got := x.prevBin(i); got != want {
				t.Fatalf("round %d (%d blocks): prevBin(%d) = %d, want %d", round, n, i, got, want)
			}
		}
	}
}
