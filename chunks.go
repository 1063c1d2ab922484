package gpumem

// See doc.go for the overview.

import (
	"errors"

	"github.com/gpumem/gpumem/device"
)

// Chunk handles (Config.ChunkHandles): a physical handle per chunk.
//
// With one handle per span (vm.go), a span's free chunks cannot be given up
// while another of its chunks is live: CUDA maps and unmaps whole handles
// only (cuMemMap's offset must be 0). That idle memory is what the default
// holds beyond the best placements (docs/EXPERIMENTS.md, "What the default
// holds beyond expandable segments"). With a handle per chunk a span is a
// run of chunks whose handles are mapped one by one (seg.hnd holds them,
// chunk by chunk) and granted access with one call over the run, and two
// operations become free of driver calls:
//
//   - splitSpan: a span becomes two, at any chunk, by bookkeeping alone;
//   - splitRuns: the free chunks of a partly used span (no live block over
//     them) become empty spans of their own.
//
// Growth uses them only where it would otherwise take memory from the
// device (newSpan's last resort; assemble and splitFree in pressure.go
// choose, and order the mechanics here): the chunks it needs are taken
// from the empty spans, split to size, unmapped where they are and mapped
// where the block is, and only what they lack is created. A program that
// fits in what it holds never splits; but memory held this close to what
// is live leaves less mapped room, and a steady state that the default
// serves from mapped memory may move chunks every step (resnet50_train on
// an H200: 34.5 driver calls and 1.9 fences a step, 2.5-9% longer steps,
// for 12 MiB less; docs/EXPERIMENTS.md, "One handle per chunk, built").
// Hence an option, not the default.
//
// The price: a span costs a create and a map per chunk (not one of each),
// a move an unmap and a map per chunk; one grant per span as before. A
// moved span leaves no dormant mapping (dormancy and the ordered moves are
// off: a dormant mapping is of a span's handles as they were, which splits
// would break), and Compact, Defrag and Gather are refused with it (New).
//
// A piece split off a partly used span joins the empty list with a fresh
// stamp (pushEmpty): its chunks' last frees may still have work pending on
// the GPU, so moving it waits as moving any span emptied after the last
// fence does (unmapSpan, stalls).
//
// Invariants (checked by checkPool): every chunk of a span in use has a
// handle in seg.hnd, and no handle is under two chunks.

// newHandles appends k new handles of one chunk each to dst. The caller has
// taken the budget for k chunks; on failure the handles made so far are
// released and the budget of all k given back (a handle the driver
// refuses to release stays counted, as dropHandle keeps it).
func (p *pool) newHandles(dst []device.Handle, k int) ([]device.Handle, error) {
	a := p.a
	n0 := len(dst)
	for j := 0; j < k; j++ {
		h, err := a.vm.Create(a.gran)
		if err != nil {
			for _, h := range dst[n0:] {
				a.dropHandle(h, a.gran)
			}
			a.giveBudget(uint64(k-(len(dst)-n0)) * a.gran)
			return dst[:n0], err
		}
		a.c.creates.Add(1)
		dst = append(dst, h)
	}
	return dst, nil
}

// spanHandles appends span i's handles, chunk by chunk, to dst.
func (p *pool) spanHandles(i int32, dst []device.Handle) []device.Handle {
	s := &p.spans[i]
	return append(dst, s.seg.hnd[s.c0:s.c0+s.n]...)
}

// placeChunks maps handles hs, one per chunk, over chunks [r0, r0+len(hs))
// of seg as a new span of p and grants it access; the chunks up to c1 hold
// the one live block being backed (see attach). Dormant mappings in the way
// are unmapped first. If a map fails, the chunks mapped so far become a
// span of their own (empty but for the block's chunks, as a failed back
// leaves the spans it made) and the other handles are released.
func (p *pool) placeChunks(hs []device.Handle, seg *segment, r0, c1 int, prealloc bool) error {
	a := p.a
	if err := p.evictOver(seg, r0, r0+len(hs)); err != nil {
		for _, h := range hs {
			a.dropHandle(h, a.gran)
		}
		return err
	}
	for j, h := range hs {
		if err := a.vm.Map(device.Ptr(seg.chunkAddr(r0+j, a.gran)), a.gran, h); err != nil {
			for _, h := range hs[j:] {
				a.dropHandle(h, a.gran)
			}
			if j > 0 {
				if aerr := p.attachChunks(hs[:j], seg, r0, c1, prealloc); aerr != nil {
					return errors.Join(err, aerr)
				}
			}
			return err
		}
		a.c.maps.Add(1)
	}
	return p.attachChunks(hs, seg, r0, c1, prealloc)
}

// attachChunks makes the mapped handles hs over chunks [r0, r0+len(hs)) of
// seg a new span and grants it access (attach).
func (p *pool) attachChunks(hs []device.Handle, seg *segment, r0, c1 int, prealloc bool) error {
	copy(seg.hnd[r0:r0+len(hs)], hs)
	i := p.newSlot()
	p.spans[i] = span{n: int32(len(hs)), prealloc: prealloc}
	return p.attach(i, seg, r0, c1, false)
}

// unmapChunks unmaps span i's chunks one by one. If the driver refuses one,
// the chunks unmapped before it leave the span (their handles are
// released) and the span keeps the rest, still mapped: the bookkeeping
// matches the device either way.
func (q *pool) unmapChunks(i int32) error {
	a := q.a
	s := &q.spans[i]
	seg, c0 := s.seg, int(s.c0)
	for j := 0; j < int(s.n); j++ {
		if err := a.vm.Unmap(device.Ptr(seg.chunkAddr(c0+j, a.gran)), a.gran); err != nil {
			if j > 0 {
				for c := c0; c < c0+j; c++ {
					ch := &seg.chunks[c]
					ch.span, ch.ready = -1, false
					a.dropHandle(seg.hnd[c], a.gran)
				}
				seg.ready.set(c0, c0+j, false)
				q.mappedChunks -= j
				s.c0 += int32(j)
				s.n -= int32(j)
			}
			return err
		}
		a.c.unmaps.Add(1)
	}
	return nil
}

// splitSpan cuts span i at chunk offset at (0 < at < n): i keeps its first
// at chunks, and a new span, returned, takes the rest, of which occTail
// are occupied. A part left with no occupied chunk is empty: the tail of a
// span that was empty follows it on the empty list with its stamp; a part
// that empties by the cut joins the list with a fresh one (pushEmpty).
// No driver call: each chunk has its own handle.
func (p *pool) splitSpan(i, at, occTail int32) int32 {
	j := p.newSlot()
	s := &p.spans[i]
	wasEmpty := s.occupied == 0
	t := &p.spans[j]
	*t = span{seg: s.seg, c0: s.c0 + at, n: s.n - at, occupied: occTail, access: s.access, clean: s.clean, inUse: true, seq: s.seq, prev: -1, next: -1}
	s.n = at
	s.occupied -= occTail
	for c := t.c0; c < t.c0+t.n; c++ {
		t.seg.chunks[c].span = j
	}
	switch {
	case wasEmpty:
		p.insertEmptyAfter(i, j)
	case t.occupied == 0:
		p.pushEmpty(j)
	}
	if !wasEmpty && s.occupied == 0 {
		p.pushEmpty(i)
	}
	return j
}

// insertEmptyAfter puts span j, whose stamp is span i's, right after i on
// the empty list (which stays oldest first). pushEmpty links at the tail
// the same way, written out: one helper for both (linkEmpty) made
// pushEmpty too large to inline, and Alloc/Free pairs of 64 MiB 4 ns
// slower (BenchmarkAllocFree, 110 against 115 ns).
func (p *pool) insertEmptyAfter(i, j int32) {
	l, s, t := &p.empty, &p.spans[i], &p.spans[j]
	t.prev, t.next = i, s.next
	if s.next >= 0 {
		p.spans[s.next].prev = j
	} else {
		l.tail = j
	}
	s.next = j
	l.n++
}

// splitCand is a partly used span splitFree may split, and its free chunks.
type splitCand struct {
	si   int32
	free int32
}

// occupiedChunks returns, for each chunk of seg up to its highest span,
// whether a block that is not free (or the block being backed) lies on it.
func (p *pool) occupiedChunks(seg *segment) []bool {
	g := p.a.gran
	n := int(seg.hiSpan) + 1
	if cap(p.occBuf) < n {
		p.occBuf = make([]bool, n)
	}
	occ := p.occBuf[:n]
	clear(occ)
	for b := seg.first; b != nil && b.addr < seg.chunkAddr(n, g); b = b.next {
		if b.state != blockFree || b == p.backing {
			b0, b1 := seg.chunkSpan(b.addr, b.size, g)
			for c := b0; c <= min(b1, n-1); c++ {
				occ[c] = true
			}
		}
	}
	return occ
}

// splitRuns cuts span si at every change between occupied and free chunks
// (occ, its segment's), from the end, so that si keeps the first run.
func (p *pool) splitRuns(si int32, occ []bool) {
	s := &p.spans[si]
	c0, end := int(s.c0), int(s.c0+s.n)
	for e := end; e > c0; {
		st := e - 1
		for st > c0 && occ[st-1] == occ[e-1] {
			st--
		}
		if st > c0 {
			tail := int32(0)
			if occ[e-1] {
				tail = int32(e - st)
			}
			p.splitSpan(si, int32(st-c0), tail)
		}
		e = st
	}
}
