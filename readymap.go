package gpumem

// See doc.go for the overview.

import "math/bits"

// readyMap mirrors chunk.ready of a virtual segment, one bit per chunk, so
// that the placement search (placement, findBacked) counts the
// not-ready chunks under a window a word at a time and skips windows that
// cannot beat the best place found so far, instead of stepping chunk by
// chunk. That search runs on every miss whose best fit lies (partly) in
// unmapped memory, and over a program's later passes, as its arena fills
// with unmapped holes, it stepped ever more chunks per search
// (docs/EXPERIMENTS.md, "Later passes: the placement search").
//
// Invariant (checked by checkPool): bit i is set ⇔ chunks[i].ready. Only
// grant and unmapSpan change readiness, and both keep the two together.
type readyMap []uint64

func newReadyMap(chunks int) readyMap { return make(readyMap, (chunks+63)/64) }

func (r readyMap) get(i int) bool { return r[i>>6]&(1<<(uint(i)&63)) != 0 }

// set sets chunks [c0, c1) ready (on) or not.
func (r readyMap) set(c0, c1 int, on bool) {
	for c0 < c1 {
		w, lo := c0>>6, uint(c0)&63
		n := min(uint(c1-c0), 64-lo)
		mask := (^uint64(0) >> (64 - n)) << lo
		if on {
			r[w] |= mask
		} else {
			r[w] &^= mask
		}
		c0 += int(n)
	}
}

// rangeMask is the mask of bits [lo, hi] (both within 0..63) of one word.
func rangeMask(lo, hi uint) uint64 { return (^uint64(0) >> (63 - hi)) &^ (1<<lo - 1) }

// count returns the ready chunks in [c0, c1].
func (r readyMap) count(c0, c1 int) int {
	w0, w1 := c0>>6, c1>>6
	if w0 == w1 {
		return bits.OnesCount64(r[w0] & rangeMask(uint(c0)&63, uint(c1)&63))
	}
	n := bits.OnesCount64(r[w0] & rangeMask(uint(c0)&63, 63))
	for w := w0 + 1; w < w1; w++ {
		n += bits.OnesCount64(r[w])
	}
	return n + bits.OnesCount64(r[w1]&rangeMask(0, uint(c1)&63))
}

// nextReady returns the first ready chunk in [c0, c1], or -1.
func (r readyMap) nextReady(c0, c1 int) int { return r.next(c0, c1, 0) }

// nextNotReady returns the first chunk in [c0, c1] that is not ready, or -1.
func (r readyMap) nextNotReady(c0, c1 int) int { return r.next(c0, c1, ^uint64(0)) }

// next returns the first chunk in [c0, c1] whose bit, xored with flip (0:
// ready, all ones: not ready), is set; or -1.
func (r readyMap) next(c0, c1 int, flip uint64) int {
	if c0 > c1 {
		return -1
	}
	w, w1 := c0>>6, c1>>6
	x := (r[w] ^ flip) &^ (1<<(uint(c0)&63) - 1)
	for {
		if w == w1 {
			x &= rangeMask(0, uint(c1)&63)
		}
		if x != 0 {
			return w<<6 + bits.TrailingZeros64(x)
		}
		if w == w1 {
			return -1
		}
		w++
		x = r[w] ^ flip
	}
}

// kthNotReady returns the k-th (from 1) chunk in [c0, c1] that is not
// ready; there must be at least k.
func (r readyMap) kthNotReady(c0, c1, k int) int {
	w, w1 := c0>>6, c1>>6
	x := ^r[w] &^ (1<<(uint(c0)&63) - 1)
	for {
		if w == w1 {
			x &= rangeMask(0, uint(c1)&63)
		}
		n := bits.OnesCount64(x)
		if n >= k {
			for ; k > 1; k-- {
				x &= x - 1
			}
			return w<<6 + bits.TrailingZeros64(x)
		}
		if w == w1 {
			panic("gpumem: kthNotReady: fewer not-ready chunks than asked")
		}
		k -= n
		w++
		x = ^r[w]
	}
}

// unmappedIn counts the chunks under [addr, addr+size) of seg that are not
// ready (unmapped, or mapped without access), up to limit+1: a count past
// limit is reported as limit+1.
func (p *pool) unmappedIn(seg *segment, addr, size uint64, limit int) int {
	if limit < 0 {
		return 0
	}
	c0, c1 := seg.chunkSpan(addr, size, p.a.gran)
	return min(c1-c0+1-seg.ready.count(c0, c1), limit+1)
}
