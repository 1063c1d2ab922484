package gpumem

// See doc.go for the overview.

import (
	"cmp"
	"math/bits"
	"slices"
)

// freeIndex finds a free block for a size in O(1): a two-level segregated
// fit in the manner of TLSF. Sizes are in units of minBlock (512 B). Units
// below 64 each have their own exact bin; above, each power of two is split
// into 64 bins, so the blocks of one bin differ by less than 1/64 of their
// size. A lookup scans the request's own bin for the best fit (bounded), and
// otherwise takes the best of the first non-empty larger bin, all of whose
// blocks fit. The result is best fit up to 1/64 of the size, found without a
// tree and without allocation.
//
// Invariants: heads[i] != nil ⇔ bit i of the bitmap is set; every block
// linked under bin i has bin(b.size) == i and state free.
type freeIndex struct {
	top   uint64           // bit w set ⇔ words[w] != 0
	words [numWords]uint64 // bit i%64 of words[i/64] set ⇔ heads[i] != nil
	heads [numBins]*block  // doubly linked through fprev/fnext
	count int              // blocks in the index
	bytes uint64           // sum of their sizes
	// dirty lists the bins whose head run of one batch's frees may be out
	// of order (insertFresh), each once: dirtyBits[i/64] bit i%64.
	dirty     []int32
	dirtyBits [numWords]uint64
	run       []*block // sortRun's scratch
}

const (
	minBlock   = 512
	minShift   = 9
	subBits    = 6
	subBins    = 1 << subBits
	maxLevel   = 47 // units up to 2^47 (64 PiB): more than any device
	numBins    = (maxLevel - subBits + 1) * subBins
	numWords   = numBins / 64
	scanBudget = 32 // blocks examined for a best fit within one bin
)

// binFloor is the least size of bin i (binOf(binFloor(i)) == i): every
// block of a bin below i is smaller.
func binFloor(i int) uint64 {
	if i < subBins {
		return uint64(i) << minShift
	}
	fl := i/subBins + subBits - 1
	u := uint64(1)<<fl | uint64(i%subBins)<<(fl-subBits)
	return u << minShift
}

// binOf maps a block size (a multiple of minBlock) to its bin.
func binOf(size uint64) int {
	u := size >> minShift
	if u < subBins {
		return int(u)
	}
	fl := bits.Len64(u) - 1
	sl := (u >> (fl - subBits)) & (subBins - 1)
	return (fl-subBits+1)*subBins + int(sl)
}

// insert links b, of no batch (a carve's remainder, a new segment), at the
// head of its bin. A head run listed for sortFresh that b would bury is
// sorted first: sortFresh sorts head runs only, and a buried run comes back
// to the head when the blocks above it go (insertFresh does the same).
func (x *freeIndex) insert(b *block) {
	i := binOf(b.size)
	if h := x.heads[i]; h != nil && h.batch != b.batch && h.batch != 0 && x.dirtyBits[i/64]&(1<<(i%64)) != 0 {
		x.sortRun(i, h)
	}
	x.insertIn(b, i)
}

// insertIn links b at the head of bin i, its bin. (Kept small enough to
// inline: the checks of a burial are its callers'.)
func (x *freeIndex) insertIn(b *block, i int) {
	b.bin = int32(i)
	b.fprev = nil
	b.fnext = x.heads[i]
	if b.fnext != nil {
		b.fnext.fprev = b
	} else {
		x.words[i/64] |= 1 << (i % 64)
		x.top |= 1 << (i / 64)
	}
	x.heads[i] = b
	x.count++
	x.bytes += b.size
}

// insertFresh inserts b, just freed in batch b.batch (pool.batch), at the
// head of its bin as insert does. If the head was a block of the same
// batch that comes before b (freshCompare), the run of that batch at the
// head of the bin is out of order: the bin is listed for sortFresh, which
// the pool calls before its next decision (pool.settle). So a batch costs
// a sort of its own frees, bin by bin, and a lone free nothing more
// (BenchmarkFreeBatch). Invariant (checkPool, freeIndex.unorderedRun):
// every run of one batch's frees side by side in a bin is in order, but
// the head run of a listed bin; insert, insertFresh and remove keep the
// others so when another batch's block comes above a listed run or goes
// from between two runs of one batch.
func (x *freeIndex) insertFresh(b *block) {
	i := binOf(b.size)
	if h := x.heads[i]; h != nil {
		listed := x.dirtyBits[i/64]&(1<<(i%64)) != 0
		switch {
		case h.batch == b.batch && freshCompare(h, b) < 0 && !listed:
			x.dirtyBits[i/64] |= 1 << (i % 64)
			x.dirty = append(x.dirty, int32(i))
		case h.batch != b.batch && h.batch != 0 && listed: // a later batch buries a listed run (see insert)
			x.sortRun(i, h)
		}
	}
	x.insertIn(b, i) // binOf once
}

// freshCompare orders two blocks of one batch in their bin: the one of the
// earlier request first (block.id), then the lower address.
func freshCompare(p, q *block) int {
	if c := cmp.Compare(p.id, q.id); c != 0 {
		return c
	}
	return cmp.Compare(p.addr, q.addr)
}

// sortFresh puts the head run of each listed bin (its blocks of the head's
// batch) in freshCompare's order.
func (x *freeIndex) sortFresh() {
	for _, i := range x.dirty {
		x.dirtyBits[i/64] &^= 1 << (i % 64)
		if h := x.heads[i]; h != nil {
			x.sortRun(int(i), h)
		}
	}
	x.dirty = x.dirty[:0]
}

// sortRun puts the run of blocks of start's batch from start on, in bin i,
// in freshCompare's order.
func (x *freeIndex) sortRun(i int, start *block) {
	run := x.run[:0]
	for b := start; b != nil && b.batch == start.batch; b = b.fnext {
		run = append(run, b)
	}
	before, after := start.fprev, run[len(run)-1].fnext
	slices.SortFunc(run, freshCompare)
	if before != nil {
		before.fnext = run[0]
	} else {
		x.heads[i] = run[0]
	}
	run[0].fprev = before
	for k := 1; k < len(run); k++ {
		run[k-1].fnext, run[k].fprev = run[k], run[k-1]
	}
	run[len(run)-1].fnext = after
	if after != nil {
		after.fprev = run[len(run)-1]
	}
	clear(run)
	x.run = run[:0]
}

// unorderedRun returns a block out of freshCompare's order within a run of
// one batch's frees in its bin (blocks side by side in the bin's list, of
// one batch other than 0), the head run of a bin listed for sortFresh
// excepted; nil if there is none. Invariant (checkPool): there is none.
func (x *freeIndex) unorderedRun() *block {
	for i, h := range x.heads {
		listed := x.dirtyBits[i/64]&(1<<(i%64)) != 0
		head := true // still in the head run
		for b := h; b != nil && b.fnext != nil; b = b.fnext {
			n := b.fnext
			if n.batch != b.batch {
				head = false
				continue
			}
			if n.batch != 0 && !(head && listed) && freshCompare(b, n) > 0 {
				return n
			}
		}
	}
	return nil
}

// remove unlinks b from its bin. Where b lay between two blocks of one
// batch not its own, their runs join: sorted now if the join is out of
// order (a rare event: a block of another batch must have been linked
// between them), so that every run but a listed head run stays in order.
func (x *freeIndex) remove(b *block) {
	i := int(b.bin)
	p, n := b.fprev, b.fnext
	join := p != nil && n != nil && p.batch == n.batch && p.batch != b.batch && p.batch != 0 && freshCompare(p, n) > 0
	if b.fprev != nil {
		b.fprev.fnext = b.fnext
	} else {
		x.heads[i] = b.fnext
		if b.fnext == nil {
			x.words[i/64] &^= 1 << (i % 64)
			if x.words[i/64] == 0 {
				x.top &^= 1 << (i / 64)
			}
		}
	}
	if b.fnext != nil {
		b.fnext.fprev = b.fprev
	}
	b.fprev, b.fnext, b.bin = nil, nil, -1
	x.count--
	x.bytes -= b.size
	if join {
		x.joinRuns(i, p)
	}
}

// joinRuns sorts the run of p's batch that p now lies in, in bin i, from
// its first block on (see remove).
func (x *freeIndex) joinRuns(i int, p *block) {
	start := p
	for start.fprev != nil && start.fprev.batch == p.batch {
		start = start.fprev
	}
	x.sortRun(i, start)
}

// find returns the free block that fits size best (see freeIndex), or nil.
func (x *freeIndex) find(size uint64) *block {
	i := binOf(size)
	if b := x.heads[i]; b != nil {
		if b.size == size {
			return b
		}
		if best := bestIn(b, size); best != nil {
			return best
		}
	}
	j := x.nextBin(i + 1)
	if j < 0 {
		return nil
	}
	return bestIn(x.heads[j], size)
}

// bestIn returns the smallest block ≥ size among the first scanBudget blocks
// of a bin list (lowest address on ties), or nil.
func bestIn(b *block, size uint64) *block {
	var best *block
	for n := 0; b != nil && n < scanBudget; b, n = b.fnext, n+1 {
		if b.size < size {
			continue
		}
		if best == nil || b.size < best.size || (b.size == best.size && b.addr < best.addr) {
			best = b
			if b.size == size {
				break
			}
		}
	}
	return best
}

// prevBin returns the last non-empty bin ≤ i, or -1.
func (x *freeIndex) prevBin(i int) int {
	if i < 0 {
		return -1
	}
	i = min(i, numBins-1)
	w := i / 64
	m := x.words[w]
	if s := i % 64; s < 63 {
		m &= 1<<(s+1) - 1
	}
	if m != 0 {
		return w*64 + bits.Len64(m) - 1
	}
	t := x.top & (1<<w - 1)
	if t == 0 {
		return -1
	}
	w = bits.Len64(t) - 1
	return w*64 + bits.Len64(x.words[w]) - 1
}

// nextBin returns the first non-empty bin ≥ i, or -1.
func (x *freeIndex) nextBin(i int) int {
	if i >= numBins {
		return -1
	}
	w := i / 64
	if m := x.words[w] &^ (1<<(i%64) - 1); m != 0 {
		return w*64 + bits.TrailingZeros64(m)
	}
	t := x.top &^ (1<<(w+1) - 1)
	if w+1 >= 64 || t == 0 {
		return -1
	}
	w = bits.TrailingZeros64(t)
	return w*64 + bits.TrailingZeros64(x.words[w])
}

// largest returns the size of the largest free block, or 0.
func (x *freeIndex) largest() uint64 {
	if x.top == 0 {
		return 0
	}
	w := 63 - bits.LeadingZeros64(x.top)
	i := w*64 + 63 - bits.LeadingZeros64(x.words[w])
	var m uint64
	for b := x.heads[i]; b != nil; b = b.fnext {
		if b.size > m {
			m = b.size
		}
	}
	return m
}
