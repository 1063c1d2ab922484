package gpumem

// See doc.go for the overview.

import (
	"cmp"
	"fmt"
	"slices"
)

// Placement in a virtual arena: where, among the free blocks that fit, a
// request goes (pool.allocate's step 5 in doc.go). The default places a
// block where the most chunks under it are already ready (mapped with
// access), so that a program that repeats itself reuses its mappings and
// makes no driver call; Config.Compact skips this and takes the start of
// the best fit (pool.allocate). Placement reads the chunk map that mapping
// keeps (vm.go: chunk.ready, segment.ready, segment.hiSpan) and changes
// nothing in it: what it chooses, pool.back then backs.

// placement returns where in free block b to put rounded bytes so that the
// fewest chunks under them are not ready, and how many (at most limit+1
// are counted). It tries the block's start, its end, then every chunk
// boundary inside it, sliding a window over the chunks (a block's middle
// may be mapped while its ends are not); at most maxSlide positions.
func (p *pool) placement(b *block, rounded uint64, limit int) (off uint64, missing int) {
	g := p.a.gran
	seg := b.seg
	missing = p.unmappedIn(seg, b.addr, rounded, limit)
	if missing == 0 || b.size == rounded {
		return 0, missing
	}
	// The end next: placing at either end leaves one free piece, not two.
	// (Past the highest chunk any span ever covered nothing is ready.)
	if lo, _ := seg.chunkSpan(b.end()-rounded, rounded, g); lo > int(seg.hiSpan) {
		// every window from here on lies past the mapped part
	} else if m := p.unmappedIn(seg, b.end()-rounded, rounded, missing-1); m < missing {
		off, missing = b.size-rounded, m
		if m == 0 {
			return off, 0
		}
	}
	// Windows starting on chunk boundaries inside the block, in address
	// order: positions 0..last, window n over chunks [lo+n, lo+n+w) with m
	// of them not ready. A position is skipped only when it cannot beat the
	// best so far (missing <= m <= w once a window is counted): a window
	// that leaves behind fewer than k = m-missing+1 of this one's not-ready
	// chunks still holds missing or more, so the next candidate starts just
	// past the k-th; and a better window holds a ready chunk. So the first
	// place with the fewest not-ready chunks is found, as by stepping one
	// chunk at a time (readymap_internal_test.go checks both agree).
	s0 := (b.addr-seg.base+g-1)/g*g + seg.base
	if s0+rounded <= b.end() {
		lo, hi := seg.chunkSpan(s0, rounded, g)
		w := hi - lo + 1
		// The last position: the window inside the block, at most
		// maxSlide steps, and (past the first) starting at or below hiSpan.
		last := min(int((b.end()-rounded-s0)/g), maxSlide, int(seg.hiSpan)-lo)
		for n := 0; ; {
			m := w - seg.ready.count(lo+n, lo+n+w-1)
			if m < missing {
				off, missing = s0+uint64(n)*g-b.addr, m
				if m == 0 {
					return off, 0
				}
			}
			next := seg.ready.kthNotReady(lo+n, lo+n+w-1, m-missing+1) + 1 - lo
			if next <= last {
				r := seg.ready.nextReady(lo+next, lo+last+w-1)
				if r < 0 {
					break
				}
				next = max(next, r-w+1-lo)
			}
			if next > last {
				break
			}
			n = next
		}
	}
	return off, missing
}

// maxSlide bounds the positions placement tries in one block (8 GiB of
// address space with 2 MiB chunks).
const maxSlide = 4096

// findBacked looks, when the best fit lies (partly) in unmapped memory, for
// the free block and position with the fewest unmapped chunks: the fitting
// blocks of every bin from the request's up, at most maxCandidates blocks.
// A looser fit costs address space, which is free; each unmapped chunk
// costs driver calls (a span to create or move: tens of microseconds on a
// real GPU). On the miss path only.
//
// Only places stream slot si may use count: a block it may use (usable),
// or, in a block of another stream whose work is not known done, a place
// over unmapped chunks only (cleanPlacement): no work can touch memory
// that is not mapped, since unmapping fences the streams that freed it. It
// reports false when no fitting block has such a place.
//
// The answer is the first candidate, in the order above, whose place needs
// no new chunk, if there is one (nearly every search on the corpus: the
// rest are under 1 in 500); only otherwise the one needing fewest. So the
// search runs in two steps that decide exactly as one scan would
// (findFewest, which Config.CheckInvariants compares with every answer):
// findReady walks the candidates in the same order, counting them the
// same way, and asks of each only whether it has a place over ready chunks,
// skipping the blocks whose cached answer says no (block.nzFrom); only if
// none has does findFewest scan them all again for the fewest. Before the
// cache, a later pass of ckpt_grad_accum ran about 11 placement searches per
// miss, 10 of them over the same partly backed blocks that had failed the
// misses before (docs/EXPERIMENTS.md, "Later passes: the ready cache").
func (p *pool) findBacked(h *heap, first *block, rounded uint64, si slot) (*block, uint64, int, bool) {
	p.search.finds++
	b, off, ok := p.findReady(h, first, rounded, si)
	if !ok {
		p.search.fewest++
		var m int
		b, off, m, ok = p.findFewest(h, first, rounded, si)
		if p.a.checkSearch && ok && m == 0 {
			p.a.disagree(p, fmt.Sprintf("no ready place; a full scan finds one in block 0x%x at offset %d", b.addr, off))
		}
		return b, off, m, ok
	}
	if p.a.checkSearch {
		if b2, off2, m2, ok2 := p.findFewest(h, first, rounded, si); b2 != b || off2 != off || m2 != 0 || !ok2 {
			p.a.disagree(p, fmt.Sprintf("a ready place in block 0x%x at offset %d; a full scan finds block %p (0x%x) at offset %d, %d chunks missing",
				b.addr, off, b2, blockAddr(b2), off2, m2))
		}
	}
	return b, off, 0, true
}

// findReady returns the first place over ready chunks only that findFewest
// would try: the same candidates in the same order, at most maxCandidates
// of them counted the same way. Blocks of other streams not known done are
// skipped: their places (cleanPlacement) are over unmapped chunks. A block
// whose search fails records it (block.nzFrom).
func (p *pool) findReady(h *heap, first *block, rounded uint64, si slot) (*block, uint64, bool) {
	var found *block
	var at uint64
	candidates(h, first, rounded, func(b *block) bool {
		off, ok := p.readyPlace(b, rounded, si)
		if ok {
			found, at = b, off
		}
		return ok
	})
	return found, at, found != nil
}

// candidates calls try on the free blocks that findReady and findFewest
// search, in their order, until try returns true, and reports whether it
// did: first, then up to maxCandidates others of h that fit rounded, bin
// by bin from rounded's.
func candidates(h *heap, first *block, rounded uint64, try func(*block) bool) bool {
	if try(first) {
		return true
	}
	seen := 0
	for i := binOf(rounded); i >= 0 && seen < maxCandidates; i = h.free.nextBin(i + 1) {
		for b := h.free.heads[i]; b != nil && seen < maxCandidates; b = b.fnext {
			if b.size < rounded || b == first {
				continue
			}
			seen++
			if try(b) {
				return true
			}
		}
	}
	return false
}

// readyPlace returns the place in free block b that placement chooses for
// rounded bytes if it needs no new chunk, and whether there is one; false
// at once where b's cache says so (see block.nzFrom).
//
// placement's first place with no not-ready chunk does not depend on its
// limit (a window without one beats any best so far, so no limit skips
// it), so limit 0 finds the place findFewest would, the cheapest way. And
// a failure holds for every larger request while b and the ready chunks
// under it stay as they are: each window of a larger request, at the start,
// the end or a chunk boundary no further than the smaller one's last,
// contains the smaller one's window there, which holds a chunk not ready.
func (p *pool) readyPlace(b *block, rounded uint64, si slot) (uint64, bool) {
	if b.nzFrom != 0 && rounded >= b.nzFrom {
		p.search.cached++
		return 0, false
	}
	if !p.usable(b, si) {
		return 0, false
	}
	p.search.placements++
	off, m := p.placement(b, rounded, 0)
	if m == 0 {
		return off, true
	}
	if b.nzFrom == 0 || rounded < b.nzFrom {
		b.nzFrom = rounded
	}
	return 0, false
}

// disagree panics (as mustCheckPool does): findBacked's answer is not
// findFewest's. Called with p.mu held, under Config.CheckInvariants (or a
// test's checkSearch).
func (a *Allocator) disagree(p *pool, what string) {
	a.broken.Store(true)
	p.mu.Unlock()
	panic("gpumem: findBacked found " + what)
}

func blockAddr(b *block) uint64 {
	if b == nil {
		return 0
	}
	return b.addr
}

// findFewest is findBacked's search in one scan: it tries every candidate
// in turn (placement or cleanPlacement) and keeps the first with the fewest
// not-ready chunks, stopping at one with none.
func (p *pool) findFewest(h *heap, first *block, rounded uint64, si slot) (*block, uint64, int, bool) {
	var best *block
	var bestOff uint64
	bestMissing := 1 << 30
	try := func(b *block) bool {
		var off uint64
		var m int
		if p.usable(b, si) {
			off, m = p.placement(b, rounded, bestMissing-1)
		} else if off, m = p.cleanPlacement(b, rounded); m < 0 {
			return false
		}
		if m < bestMissing {
			best, bestOff, bestMissing = b, off, m
		}
		return m == 0
	}
	if candidates(h, first, rounded, try) {
		return best, bestOff, 0, true
	}
	return best, bestOff, bestMissing, best != nil
}

// cleanPlacement returns a place in free block b for rounded bytes whose
// chunks are all unmapped, and their number: the block's start, its end,
// or the first chunk past every chunk any span has covered; -1 for none.
func (p *pool) cleanPlacement(b *block, rounded uint64) (uint64, int) {
	g, seg := p.a.gran, b.seg
	offs := [3]uint64{0, b.size - rounded, b.size}
	if past := seg.chunkAddr(int(seg.hiSpan)+1, g); past > b.addr && past+rounded <= b.end() {
		offs[2] = past - b.addr
	}
	for _, off := range offs {
		if off+rounded > b.size {
			continue
		}
		c0, c1 := seg.chunkSpan(b.addr+off, rounded, g)
		clean := true
		for i := c0; i <= c1 && clean; i++ {
			clean = seg.chunks[i].span < 0
		}
		if clean {
			return off, c1 - c0 + 1
		}
	}
	return 0, -1
}

// maxCandidates bounds the free blocks one search for backed memory looks
// at (findBacked).
const maxCandidates = 1024

// readyNear voids the ready caches (block.nzFrom) that pool.back may have
// made wrong by making chunks ready for block b. Every chunk back makes
// ready lies under b or the free blocks beside it, so only theirs can turn
// false: a new span covers chunks of b and the unmapped chunks right after
// it (ahead at the frontier, or under a larger empty span stretched
// there), which are free memory up to the next block on a mapped chunk; a
// span granted again (mapped without access) holds no live block but b,
// so its other chunks are free memory on either side of b. (And hiSpan,
// which bounds placement's windows, rises only over these.) Chunks made
// unready elsewhere (a span moved away) void no cache: a cache says where
// there was no place. Called by pool.allocate after back, so that mapping
// need not reach up into placement's caches.
func (p *pool) readyNear(b *block) {
	for _, n := range [2]*block{b.prev, b.next} {
		if n != nil && n.state == blockFree {
			n.nzFrom = 0
		}
	}
}

// splitPlan is what placement tells a split of span i (defrag.go): the
// runs of its chunks that live blocks occupy, and where in the pool's free
// memory their bytes may wait while the span is remapped (nil: nowhere,
// the split goes through its scratch range).
func (p *pool) splitPlan(i int32) ([][2]int, []stagedMove) {
	runs := p.liveRuns(i)
	if len(runs) == 0 {
		return nil, nil
	}
	return runs, p.staging(i, runs)
}

// liveRuns returns the runs of occupied chunks of span i, as chunk offsets
// [r0, r1) from its start: a chunk is occupied when a block that is not
// free overlaps it (see the invariants in vm.go), or the block being
// backed, which is not marked allocated yet. It walks the segment's blocks
// (the chunk counts alone do not say which chunks a block covers whole).
func (p *pool) liveRuns(i int32) [][2]int {
	s := &p.spans[i]
	seg, c0, n := s.seg, int(s.c0), int(s.n)
	occ := make([]bool, n)
	for b := seg.first; b != nil; b = b.next {
		b0, b1 := seg.chunkSpan(b.addr, b.size, p.a.gran)
		if b1 < c0 {
			continue
		}
		if b0 >= c0+n {
			break
		}
		if b.state != blockFree || b == p.backing {
			for j := max(b0, c0); j <= min(b1, c0+n-1); j++ {
				occ[j-c0] = true
			}
		}
	}
	var runs [][2]int
	for j := 0; j < n; {
		if !occ[j] {
			j++
			continue
		}
		k := j
		for k < n && occ[k] {
			k++
		}
		runs = append(runs, [2]int{j, k})
		j = k
	}
	return runs
}

// A freePiece is free memory of the pool, mapped with access, inside one
// span: where staging may park live bytes.
type freePiece struct {
	p, n uint64
}

// staging plans where the live runs of span i wait while split remaps
// them: in free blocks of the pool over chunks mapped with access, outside
// span i, each piece inside one span (a copy's range lies in one mapping),
// among the stageScan largest free blocks, the largest pieces first, at
// most stageMaxPieces per run. The moves follow the runs in address order.
// nil if the pool has not that much such memory in that few pieces (split
// then goes through the scratch range). Nothing
// else can take that memory meanwhile: the pool's mu is held, and the
// device is synchronized before the first copy, so no kernel still uses a
// block freed in stream order.
func (p *pool) staging(i int32, runs [][2]int) []stagedMove {
	a := p.a
	s := &p.spans[i]
	base := s.seg.chunkAddr(int(s.c0), a.gran)
	var need uint64
	for _, r := range runs {
		need += uint64(r[1]-r[0]) * a.gran
	}
	pieces := p.stageBuf[:0]
	var have uint64
	scanned := 0
scan:
	for k := range p.heaps {
		x := &p.heaps[k].free
		for j := x.prevBin(numBins - 1); j >= 0; j = x.prevBin(j - 1) {
			for b := x.heads[j]; b != nil; b = b.fnext {
				if have >= need && len(pieces) <= stageMaxPieces*len(runs) || scanned == stageScan {
					break scan
				}
				scanned++
				seg := b.seg
				if !seg.virtual || b == p.backing {
					continue
				}
				// Ready chunks come in whole spans; each span's part of
				// b is one piece. No chunk past hiSpan was ever mapped.
				c0, c1 := seg.chunkSpan(b.addr, b.size, a.gran)
				c1 = min(c1, int(seg.hiSpan))
				for c := c0; c <= c1; {
					if c = seg.ready.nextReady(c, c1); c < 0 {
						break
					}
					si := seg.chunks[c].span
					sp := &p.spans[si]
					e := min(int(sp.c0+sp.n)-1, c1)
					if si != i {
						lo := max(b.addr, seg.chunkAddr(c, a.gran))
						hi := min(b.end(), seg.chunkAddr(e+1, a.gran))
						pieces = append(pieces, freePiece{lo, hi - lo})
						have += hi - lo
					}
					c = e + 1
				}
			}
		}
	}
	p.stageBuf = pieces
	slices.SortFunc(pieces, func(x, y freePiece) int { return cmp.Compare(y.n, x.n) })
	var taken uint64 // in the largest pieces, at most stageMaxPieces a run
	for k := 0; k < len(pieces) && k < stageMaxPieces*len(runs) && taken < need; k++ {
		taken += pieces[k].n
	}
	if taken < need {
		return nil
	}
	var moves []stagedMove
	k, used := 0, uint64(0) // the piece, and its bytes already planned
	for _, r := range runs {
		at, end := base+uint64(r[0])*a.gran, base+uint64(r[1])*a.gran
		for at < end {
			n := min(end-at, pieces[k].n-used)
			moves = append(moves, stagedMove{at, pieces[k].p + used, n})
			at += n
			if used += n; used == pieces[k].n {
				k, used = k+1, 0
			}
		}
	}
	return moves
}

// stageMaxPieces bounds the pieces of free memory a run is staged in: each
// costs two copies, a few microseconds each on an H100, against the map,
// grant and unmap (about 100 us) that staging saves per run. stageScan
// bounds the free blocks staging examines, largest first, so that its
// search costs a few microseconds of CPU, not a walk of the whole pool.
const (
	stageMaxPieces = 8
	stageScan      = 64
)
