package gpumem

import (
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"github.com/gpumem/gpumem/device/sim"
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

// TestSortFresh: blocks of one batch inserted in any order come out of
// sortFresh at the head of their bin in the order of their requests
// (block.id, whatever their addresses), ahead of the older blocks, which
// keep their order; a batch inserted in reverse order of its requests (the
// old LIFO order's best case), and a lone free, list no bin.
func TestSortFresh(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	for round := 0; round < 50; round++ {
		var x freeIndex
		old := make([]block, 5)
		for k := range old {
			old[k] = block{addr: uint64(1000+k) << 20, size: 8 * minBlock, batch: 1, id: uint64(k + 1)}
			x.insert(&old[k])
		}
		fresh := make([]block, 1+round%20)
		for k := range fresh {
			// Addresses fall as the requests rise: the order is theirs.
			fresh[k] = block{addr: uint64(len(fresh)-k) << 20, size: 8 * minBlock, batch: 2, id: uint64(100 + k)}
		}
		order := rng.Perm(len(fresh))
		if round%5 == 0 {
			for k := range order {
				order[k] = len(fresh) - 1 - k // the latest request freed first: each goes first
			}
		}
		for _, k := range order {
			x.insertFresh(&fresh[k])
		}
		if round%5 == 0 && len(x.dirty) != 0 {
			t.Fatalf("round %d: frees in reverse request order listed bins %v", round, x.dirty)
		}
		x.sortFresh(nil)
		var got []uint64
		for b := x.heads[binOf(8*minBlock)]; b != nil; b = b.fnext {
			got = append(got, b.id)
			if b.fnext != nil && b.fnext.fprev != b {
				t.Fatalf("round %d: broken back link after block %d", round, b.id)
			}
		}
		var want []uint64
		for k := range fresh {
			want = append(want, uint64(100+k))
		}
		for k := len(old) - 1; k >= 0; k-- {
			want = append(want, uint64(k+1))
		}
		if !slices.Equal(got, want) {
			t.Fatalf("round %d (order %v): bin holds requests %v, want %v", round, order, got, want)
		}
		if len(x.dirty) != 0 || x.dirtyBits != [numWords]uint64{} {
			t.Fatalf("round %d: bins still listed after sortFresh", round)
		}
		if x.count != len(old)+len(fresh) {
			t.Fatalf("round %d: count %d, want %d", round, x.count, len(old)+len(fresh))
		}
	}
}

// TestCheckSeesUnsortedBatch: a batch of frees out of order is listed
// for sortFresh until the next allocation sorts it; Check passes either
// way, and fails if the listing is lost (the invariant it guards).
func TestCheckSeesUnsortedBatch(t *testing.T) {
	a, err := New(sim.MustNew(sim.Config{Capacity: 1 << 30}), Config{Mode: ModeVirtual})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	var drop []Buffer
	for range 6 {
		b, err := a.Alloc(64<<10, 0)
		if err != nil {
			t.Fatal(err)
		}
		drop = append(drop, b)
		if _, err := a.Alloc(64<<10, 0); err != nil { // a live neighbour: no coalescing
			t.Fatal(err)
		}
	}
	for _, k := range []int{2, 0, 5, 1} { // one batch, out of request order
		if err := a.Free(drop[k]); err != nil {
			t.Fatal(err)
		}
	}
	if err := a.Check(); err != nil {
		t.Fatalf("a listed unsorted batch: %v", err)
	}
	p := a.allPools()[0]
	x := &p.heaps[heapLarge].free
	if len(x.dirty) != 1 {
		t.Fatalf("%d bins listed, want the one bin of the batch", len(x.dirty))
	}
	saved, bits := slices.Clone(x.dirty), x.dirtyBits
	x.dirty, x.dirtyBits = x.dirty[:0], [numWords]uint64{}
	if err := a.Check(); err == nil || !strings.Contains(err.Error(), "out of order") {
		t.Fatalf("Check with the listing lost: %v; want the batch out of order", err)
	}
	x.dirty, x.dirtyBits = saved, bits
	if _, err := a.Alloc(64<<10, 0); err != nil { // sorts the batch
		t.Fatal(err)
	}
	if err := a.Check(); err != nil || len(x.dirty) != 0 {
		t.Fatalf("after the next allocation: %v, %d bins listed", err, len(x.dirty))
	}
}
