package gpumem

// See doc.go for the overview.

import (
	"cmp"
	"errors"
	"fmt"
	"math/bits"
	"slices"

	"github.com/gpumem/gpumem/device"
)

// Virtual memory: chunks and spans.
//
// A virtual arena is divided into chunks of the device's granularity (2 MiB
// on NVIDIA), the unit of placement accounting. Physical memory backs it in
// spans: one device handle mapped whole over a run of chunks. CUDA can map
// only whole handles and unmap only whole mappings, and every mapping costs
// tens of microseconds to map, grant and unmap whatever its size
// (docs/EXPERIMENTS.md, "What the driver costs"), so the span is the unit of growth,
// of reuse elsewhere and of release. Each run of unmapped chunks under a new
// block gets spans of at most Config.SpanSize (larger at the frontier of a
// grown arena, see runEnd in pressure.go): one create, one map, one access
// grant each.
//
// The span size is the trade between speed and fit. Empty chunks of a span
// that still has a live chunk cannot be given back or moved, so larger spans
// hold more idle memory; smaller ones cost more driver calls. Measured on
// the six shipped traces (docs/EXPERIMENTS.md, "Span size"), 16 MiB spans
// keep every ratio under 1.02 with about a sixth of the driver time of
// 2 MiB spans.
//
// A span's life (each arrow names the function that performs it):
//
//	        newSpan                 vacate (last live chunk)
//	(none) ───────▶ occupied ◀──────────────────────────▶ empty, on pool.empty
//	                   ▲            occupy (first live chunk)  │
//	                   └────── remap (an exact-size run elsewhere) ◀┤
//	(none) ◀───────────────────────────── releaseSpan ─────────────┘
//
// (moveSpan performs the remap. Under Config.Compact the mapping a span
// leaves stays behind, dormant, and a remap back onto it makes no driver
// call: dormant.go.)
//
// So the device is asked for memory only when no empty span is held, and a
// hole in the address space holds no memory once its spans have emptied.
// What a span cannot give back are its empty chunks while another of its
// chunks is live: that, and partly used chunks, is all the overhead.
//
// Invariants (checked by checkPool):
//
//	chunk.span == i ⇔ the chunk lies in [spans[i].c0, spans[i].c0+spans[i].n) of spans[i].seg
//	chunk.ready ⇔ chunk.span ≥ 0 and that span has access
//	chunk.part == number of non-free blocks that overlap the chunk but do not cover it
//	a chunk is occupied ⇔ chunk.part > 0 or a non-free block covers it whole
//	an occupied chunk is ready
//	span.occupied == number of its chunks that are occupied
//	span is on its pool's empty list ⇔ span.occupied == 0
//	span.clean ⇒ span.occupied == 0 (cleared when it is next occupied)
//	span.shares >= 0 (a span with shares is never split: share.go)
//	Reserved == Σ plain segment sizes + Σ span sizes + Σ unreleased handles
//
// A chunk that a block covers whole is that block's alone, so occupying or
// vacating a block counts its whole chunks span by span (a 64 MiB block:
// 32 chunks, 2-4 spans), and only its one or two edge chunks one by one.
// Small blocks share chunks: they touch their chunk's count and reach the
// span only when the chunk's first block comes or its last one goes.
//
// Guarded by the owning pool's mu. Chunks and span links hold no Go
// pointers (indices), so the collector neither scans the arrays nor puts
// write barriers on the hot path.
type chunk struct {
	part  int32 // non-free blocks that overlap the chunk without covering it
	span  int32 // index in pool.spans; -1 when unmapped
	ready bool  // mapped with access: what the cache-hit path checks
}

// A span is one physical handle mapped over chunks [c0, c0+n) of seg (under
// Config.ChunkHandles, one per chunk, in seg.hnd: chunks.go).
type span struct {
	seg        *segment
	c0, n      int32
	h          device.Handle
	occupied   int32 // chunks that are occupied (see the invariants above)
	access     bool  // SetAccess done since it was mapped here
	clean      bool  // empty and mapped here by a failed backing: no stream's work has touched it (back)
	prealloc   bool  // Config.Preallocate: released only by Trim and Close
	inUse      bool  // the slot holds a span
	shares     int32 // Share calls not yet undone by Unshare: never split (share.go)
	seq        uint64
	prev, next int32 // pool.empty, oldest first; -1 for none
}

// spanList links a pool's empty spans by index, oldest first.
type spanList struct {
	head, tail int32
	n          int
}

// pushEmpty puts span i, just emptied, at the tail of the empty list with
// its batch's stamp: one stamp for the spans a batch of frees empties, a
// new one after a fence (a stamp above fencedSeq is what says "emptied
// since the last fence"), in its place in that batch: the list is oldest
// batch first, each batch from the highest address down, whatever the
// order of its frees (pool.batch). Where the place is too far from the
// tail, sortEmpty puts it there before the pool's next decision
// (pool.settle).
func (p *pool) pushEmpty(i int32) {
	l, s := &p.empty, &p.spans[i]
	if bt := p.batch(); bt != p.emptyBatch {
		p.emptySeq++
		p.emptyBatch = bt
	}
	s.seq = p.emptySeq
	// Its place in the batch: after the batch's spans above it, found by a
	// walk back over at most pushWalk of them (one free emptying several
	// spans pushes them upward); past that, the tail, for sortEmpty.
	j := l.tail
	for n := 0; j >= 0 && p.spans[j].seq == s.seq && spanBefore(&p.spans[j], s); n++ {
		if n == pushWalk {
			j = l.tail
			p.emptyDirty = true
			break
		}
		j = p.spans[j].prev
	}
	s.prev = j
	if j >= 0 {
		s.next = p.spans[j].next
		p.spans[j].next = i
	} else {
		s.next = l.head
		l.head = i
	}
	if s.next >= 0 {
		p.spans[s.next].prev = i
	} else {
		l.tail = i
	}
	l.n++
}

// pushWalk bounds pushEmpty's walk: a free of a block over up to this many
// spans places them without a sort (a 64 MiB block over 16 MiB spans: an
// Alloc/Free pair 112 ns, against 145 ns when every such free left a sort
// for the next allocation).
const pushWalk = 8

// sortEmpty puts the spans of the empty list's last stamp in descending
// address order (pushEmpty).
func (p *pool) sortEmpty() {
	p.emptyDirty = false
	l := &p.empty
	if l.tail < 0 {
		return // emptied since (a release)
	}
	run := p.emptyRun[:0]
	for i := l.tail; i >= 0 && p.spans[i].seq == p.spans[l.tail].seq; i = p.spans[i].prev {
		run = append(run, i)
	}
	before := p.spans[run[len(run)-1]].prev
	slices.SortFunc(run, func(x, y int32) int { return spanCompare(&p.spans[y], &p.spans[x]) }) // highest address first
	prev := before
	for _, i := range run {
		p.spans[i].prev = prev
		if prev >= 0 {
			p.spans[prev].next = i
		} else {
			l.head = i
		}
		prev = i
	}
	p.spans[prev].next = -1
	l.tail = prev
	p.emptyRun = run
}

// spanBefore reports whether span s lies at a lower address than span t.
func spanBefore(s, t *span) bool { return spanCompare(s, t) < 0 }

// spanCompare orders spans by address.
func spanCompare(s, t *span) int {
	if s.seg != t.seg {
		return cmp.Compare(s.seg.base, t.seg.base)
	}
	return cmp.Compare(s.c0, t.c0)
}

func (p *pool) removeEmpty(i int32) {
	l, s := &p.empty, &p.spans[i]
	if s.prev >= 0 {
		p.spans[s.prev].next = s.next
	} else {
		l.head = s.next
	}
	if s.next >= 0 {
		p.spans[s.next].prev = s.prev
	} else {
		l.tail = s.prev
	}
	s.prev, s.next = -1, -1
	l.n--
}

// newSlot returns a free span slot of the pool.
func (p *pool) newSlot() int32 {
	if n := len(p.freeSlots); n > 0 {
		i := p.freeSlots[n-1]
		p.freeSlots = p.freeSlots[:n-1]
		return i
	}
	p.spans = append(p.spans, span{})
	p.chains = append(p.chains, 0)
	return int32(len(p.spans) - 1)
}

func (p *pool) freeSlot(i int32) {
	p.spans[i] = span{prev: -1, next: -1}
	p.chains[i] = 0
	p.freeSlots = append(p.freeSlots, i)
}

// chunkAddr is the address of chunk i of seg.
func (seg *segment) chunkAddr(i int, gran uint64) uint64 { return seg.base + uint64(i)*gran }

// chunkSpan returns the chunk indices [c0, c1] that [addr, addr+size) touches.
// gran is a power of two: the division compiles to a shift only when the
// divisor is known to be one, so shift by its log (a DIV costs tens of
// cycles on some CPUs, and this runs three times per alloc/free pair).
func (seg *segment) chunkSpan(addr, size, gran uint64) (int, int) {
	sh := bits.TrailingZeros64(gran)
	return int((addr - seg.base) >> sh), int((addr + size - 1 - seg.base) >> sh)
}

// occupy counts b as live in its chunks and their spans; every chunk must
// be ready.
func (p *pool) occupy(b *block) { p.count(b, 1) }

// vacate uncounts b from its chunks. A span left with no live chunk joins
// the pool's empty list, still mapped: reused in place it costs nothing;
// growth elsewhere remaps or releases it.
func (p *pool) vacate(b *block) { p.count(b, -1) }

// count adds d (1 or -1) live blocks, b, to b's chunks: one by one to the
// edge chunks b covers in part, span by span to the chunks it covers whole.
// Unmapped chunks change no span (newSpan counts them when it maps them).
func (p *pool) count(b *block, d int32) {
	seg, g := b.seg, p.a.gran
	c0, c1 := seg.chunkSpan(b.addr, b.size, g)
	ch := seg.chunks
	// The two edge cases are written out: as a helper (not inlined: it
	// calls occupyBy) the small pair measured about 1 ns slower.
	if (b.addr-seg.base)&(g-1) != 0 { // starts inside chunk c0
		c := &ch[c0]
		c.part += d
		if c.span >= 0 && (c.part == 0 || c.part == d) { // c0's first or last block
			p.occupyBy(c.span, d)
		}
		c0++
	}
	if c1 >= c0 && (b.end()-seg.base)&(g-1) != 0 { // ends inside chunk c1
		c := &ch[c1]
		c.part += d
		if c.span >= 0 && (c.part == 0 || c.part == d) {
			p.occupyBy(c.span, d)
		}
		c1--
	}
	for i := c0; i <= c1; {
		si := ch[i].span
		if si < 0 {
			i++
			continue
		}
		s := &p.spans[si]
		end := min(int(s.c0+s.n)-1, c1)
		p.occupyBy(si, d*int32(end-i+1))
		i = end + 1
	}
}

// occupyBy adds d occupied chunks to span i, moving it off or onto the
// empty list when it leaves or reaches zero.
func (p *pool) occupyBy(i int32, d int32) {
	s := &p.spans[i]
	if s.occupied == 0 {
		p.removeEmpty(i)
		s.clean = false
	}
	s.occupied += d
	if s.occupied == 0 {
		p.pushEmpty(i)
	}
}

// grant gives span i access (SetAccess over its one mapping). Chunks that
// become ready can void the ready cache of the free blocks over them
// (block.nzFrom): it runs only under back, which clears those, and under
// preallocate, over a new arena.
func (p *pool) grant(i int32) error {
	a := p.a
	s := &p.spans[i]
	if err := a.vm.SetAccess(device.Ptr(s.seg.chunkAddr(int(s.c0), a.gran)), uint64(s.n)*a.gran); err != nil {
		return err
	}
	a.c.setAccess.Add(1)
	s.access = true
	p.markReady(i)
	return nil
}

// markReady marks span i's chunks ready (its mapping has access).
func (p *pool) markReady(i int32) {
	s := &p.spans[i]
	for j := s.c0; j < s.c0+s.n; j++ {
		s.seg.chunks[j].ready = true
	}
	s.seg.ready.set(int(s.c0), int(s.c0+s.n), true)
}

// createSpan backs chunks [r0, r1) of seg with a new handle of size bytes
// (see newSpan): a *shortage when the limit or the device refuses it.
func (p *pool) createSpan(seg *segment, r0, r1, c1 int, size uint64) error {
	a := p.a
	if !a.takeBudget(size) {
		return &shortage{cause: CauseLimit}
	}
	if a.chunkHandles {
		hs, err := p.newHandles(p.hbuf[:0], r1-r0)
		p.hbuf = hs
		if err != nil {
			if errors.Is(err, device.ErrOutOfMemory) {
				return &shortage{cause: CauseDevice, err: err}
			}
			return err
		}
		return p.placeChunks(hs, seg, r0, c1, false)
	}
	h, err := a.vm.Create(size)
	if err != nil {
		a.giveBudget(size)
		if errors.Is(err, device.ErrOutOfMemory) {
			return &shortage{cause: CauseDevice, err: err}
		}
		return err
	}
	a.c.creates.Add(1)
	return p.place(h, seg, r0, r1, c1, false)
}

// place maps new handle h over chunks [r0, r1) of seg as a new span of p
// and grants access; the chunks up to c1 hold the one live block being
// backed (none for c1 < r0). Dormant mappings in the way are unmapped
// first. If that or the mapping fails the handle is released; if the
// grant fails the span stays, without access.
func (p *pool) place(h device.Handle, seg *segment, r0, r1, c1 int, prealloc bool) error {
	a := p.a
	size := uint64(r1-r0) * a.gran
	err := p.evictOver(seg, r0, r1)
	if err == nil {
		err = a.vm.Map(device.Ptr(seg.chunkAddr(r0, a.gran)), size, h)
	}
	if err != nil {
		a.dropHandle(h, size)
		return err
	}
	a.c.maps.Add(1)
	i := p.newSlot()
	p.spans[i] = span{h: h, n: int32(r1 - r0), prealloc: prealloc}
	return p.attach(i, seg, r0, c1, false)
}

// attach makes span i, whose handle is mapped over chunks [r0, r0+n) of
// seg (access says whether granted), the span of those chunks; the chunks
// up to c1 hold the one live block being backed. It grants access if the
// mapping lacks it.
func (p *pool) attach(i int32, seg *segment, r0, c1 int, access bool) error {
	s := &p.spans[i]
	r1 := r0 + int(s.n)
	s.seg, s.c0, s.inUse, s.access, s.clean, s.seq, s.prev, s.next = seg, int32(r0), true, false, false, 0, -1, -1
	p.made = append(p.made, i)
	seg.hiSpan = max(seg.hiSpan, int32(r1-1))
	for j := r0; j < r1; j++ {
		seg.chunks[j].span = i
	}
	s.occupied = int32(max(0, min(r1-1, c1)-r0+1)) // every chunk of the block is occupied
	p.mappedChunks += int(s.n)
	if s.occupied == 0 {
		p.pushEmpty(i)
	}
	if !access {
		if p.backing != nil { // granted with its neighbours at the end of back (grantAll)
			p.ungranted = append(p.ungranted, i)
			return nil
		}
		return p.grant(i)
	}
	s.access = true
	p.markReady(i)
	return nil
}

// grantAll grants access to the spans the current back mapped without it
// (attach), one call per run of spans side by side: a block over several
// spans (a large request, or one whose chunks came from several moved
// spans) costs one access grant, not one a span. cuMemSetAccess takes a
// range over several mappings, and is the dearest of the calls a move
// makes (about 110 us with work queued on PyTorch's legacy default
// stream, against 10-30 us for a map or an unmap; docs/BENCHMARKS.md,
// "Where the tightening's step time goes"). A span already granted, or
// released since, is passed over. On a refusal the spans of that run and
// after stay mapped without access, as a failed grant leaves them (back
// grants such a span when a block next needs it).
func (p *pool) grantAll() error {
	a := p.a
	us := p.ungranted
	p.ungranted = us[:0]
	us = slices.DeleteFunc(us, func(i int32) bool { return !p.spans[i].inUse || p.spans[i].access })
	slices.SortFunc(us, func(x, y int32) int { return spanCompare(&p.spans[x], &p.spans[y]) })
	for k := 0; k < len(us); {
		s := &p.spans[us[k]]
		if !s.inUse || s.access {
			k++
			continue
		}
		end := k + 1
		for end < len(us) {
			t, last := &p.spans[us[end]], &p.spans[us[end-1]]
			if !t.inUse || t.access || t.seg != s.seg || t.c0 != last.c0+last.n {
				break
			}
			end++
		}
		last := &p.spans[us[end-1]]
		n := uint64(last.c0+last.n-s.c0) * a.gran
		if err := a.vm.SetAccess(device.Ptr(s.seg.chunkAddr(int(s.c0), a.gran)), n); err != nil {
			return err
		}
		a.c.setAccess.Add(1)
		for _, i := range us[k:end] {
			p.spans[i].access = true
			p.markReady(i)
		}
		k = end
	}
	return nil
}

// emptyToStretch finds the smallest empty span of this pool larger than k
// chunks that fits over the unmapped chunks from r0: moved there, it backs
// the k chunks needed and maps the free chunks after them, where the next
// requests can go. Without it, spans of the frontier's larger size would
// rarely be reused (a run needs an exact size), and each would be released
// while a new one is created: measured on sweep_create_dispose, a second
// pass made 28 creates and 17 releases instead of 3 and 2
// (docs/EXPERIMENTS.md, "Growth at the frontier"). Other pools' spans are
// left to findEmpty's exact matches: moving them costs their stream a fence.
func (p *pool) emptyToStretch(seg *segment, r0 int, k int32, asker slot) int32 {
	room := p.roomAt(seg, r0)
	best := int32(-1)
	for i := p.empty.head; i >= 0; i = p.spans[i].next {
		s := &p.spans[i]
		if s.n > k && s.n <= room && !s.prealloc && (best < 0 || s.n < p.spans[best].n) && p.movable(i, asker) {
			best = i
		}
	}
	return best
}

// roomAt counts the unmapped chunks from r0 of seg, up to twice the span
// size (as it has grown, under Compact): how large a span emptyToStretch
// may stretch there.
func (p *pool) roomAt(seg *segment, r0 int) int32 {
	room := int32(0)
	for j := r0; j < len(seg.chunks) && seg.chunks[j].span < 0 && room < 2*int32(p.spanLimit); j++ {
		room++
	}
	return room
}

// stalls reports whether moving or releasing empty span i of a pool that
// serves several streams would make the host wait for the work of a stream
// other than the one asking (slot asker; -1: a request of another pool,
// whose streams are all others) that is not known done: the span
// emptied after the last fence, and fence would wait for that stream.
// Such spans are left where they are (the stream that emptied them reuses
// them in place), as a block that stream freed is, and new memory is taken
// instead: a host wait on another stream would stall this one behind all
// of that stream's work (a prefetch copy, say). The simulated device
// completes work at once, so there the rule never applies. The asking
// slot comes down from placement with the request (back's argument).
func (p *pool) stalls(i int32, asker slot) bool {
	if p.spans[i].seq <= p.fencedSeq || p.spans[i].clean {
		return false
	}
	if p.a.capturing() {
		return true // no fence while a capture is underway (capture.go)
	}
	if p.live < 2 {
		return false
	}
	for j := range p.streams {
		if st := &p.streams[j]; st.live && slot(j) != asker && st.last > st.fenced && st.last > st.safe {
			return true
		}
	}
	return false
}

// movable reports whether empty span i may move for stream slot asker
// without a host wait for another stream's work: it does not stall, or
// asker may be ordered after that work instead (orderedMove).
func (p *pool) movable(i int32, asker slot) bool {
	return !p.stalls(i, asker) || p.orderedMove(asker)
}

// orderedMove reports whether a span that stalls may move for stream slot
// asker all the same: asker then waits for the other streams' work on the
// GPU (orderAfter) and the span's mapping turns dormant, so that nothing
// is unmapped before a fence (dormant.seq). Only where segments keep
// dormant mappings (Compact, or the default that tightens) and a stream
// may wait (events, no capture, Config.NoStreamWaits unset); not with a
// handle per chunk, which keeps no dormant mapping. So how far the host
// runs ahead no longer decides whether a span is reused or memory taken
// anew.
func (p *pool) orderedMove(asker slot) bool {
	a := p.a
	return asker >= 0 && (a.compact || a.tightens && !a.chunkHandles) && a.ev != nil && !a.capturing() && !a.cfg.NoStreamWaits
}

// findEmpty finds an empty span of exactly k chunks, in this pool or
// another (which it returns locked), not preallocated, for a request of
// this pool's slot asker.
func (p *pool) findEmpty(k int32, asker slot) (*pool, int32) {
	if i := p.emptyOfSize(k, asker); i >= 0 {
		return p, i
	}
	for _, q := range p.a.allPools() {
		if q == p || !q.mu.TryLock() {
			continue
		}
		if i := q.emptyOfSize(k, -1); i >= 0 { // slots are per pool: none of q asks
			return q, i
		}
		q.mu.Unlock()
	}
	return nil, -1
}

func (p *pool) emptyOfSize(k int32, asker slot) int32 {
	for i := p.empty.head; i >= 0; i = p.spans[i].next {
		if s := &p.spans[i]; s.n == k && !s.prealloc && p.movable(i, asker) {
			return i
		}
	}
	return -1
}

// moveSpan moves empty span i of q over chunks [r0, r0+n) of seg, as a
// span of p, whose chunks up to c1 are live (see attach), for p's stream
// slot asker. q's streams are fenced first if the span emptied after the
// last fence (unmapping is not stream-ordered, and the memory changes
// hands); or, where that would wait for another stream's work (stalls),
// asker is ordered after that work on the GPU instead and the old mapping
// turns dormant, unmapped only after a fence (movable).
//
// By default (and between pools) the handle is unmapped where it was and
// mapped there. With dormancy (the caller's policy: Compact, or the
// default while tight; pressure.go), within a pool, its old mapping stays,
// dormant (dormant.go), and a dormant mapping of the handle over exactly
// the new range is revived: no driver call at all; otherwise the handle is
// mapped there, after the dormant mappings in the way are unmapped, and on
// failure the span is back where it was, empty. (If the mapping fails
// after an unmap, the handle is released.)
func (q *pool) moveSpan(i int32, p *pool, seg *segment, r0, c1 int, asker slot, dormancy bool) error {
	ordered := q == p && p.stalls(i, asker) && p.orderedMove(asker)
	if q != p || !dormancy && !ordered {
		s := q.spans[i]
		var hs []device.Handle
		if p.a.chunkHandles {
			hs = q.spanHandles(i, p.hbuf[:0])
		}
		if err := q.dropDormant(i); err != nil {
			return err
		}
		if err := q.unmapSpan(i); err != nil {
			return err
		}
		if p.a.chunkHandles {
			p.hbuf = hs
			return p.placeChunks(hs, seg, r0, c1, false)
		}
		return p.place(s.h, seg, r0, r0+int(s.n), c1, false)
	}
	a := p.a
	s := &p.spans[i]
	// Other streams' work may be on the memory: asker waits for it on
	// the GPU, and its mapping here turns dormant, not unmapped; if the
	// wait cannot be made, the host waits (fenceEmptied) as before.
	if ordered && p.orderAfter(asker) != nil {
		ordered = false
	}
	if !ordered && (p.live > 1 || a.capturing()) {
		// Another stream's work may be on the memory: it must be done
		// before this stream's. With one stream, stream order suffices:
		// its mapping here turns dormant and is not unmapped yet.
		if err := p.fenceEmptied(i); err != nil {
			return err
		}
	} else if s.seq > p.fencedSeq && !s.clean && p.backing != nil {
		// Unfenced, the handle brings its stream's pending work along.
		// The free memory it maps beside the block keeps that address
		// range's tags (never freed: any stream's), which a stream that
		// arrives later would take unordered: tag it as freed now, by
		// several streams (mergeTags), so that such a stream waits for
		// this one's frees so far first.
		for _, n := range [2]*block{p.backing.prev, p.backing.next} {
			if n != nil && n.state == blockFree {
				n.si, n.freed = -1, p.freeSeq
			}
		}
	}
	n := int(s.n)
	d := p.revivable(i, seg, r0)
	// Room on the chain for the mapping about to turn dormant: unmap the
	// oldest past maxDormant-1 (not the one to revive).
	if err := p.trimChain(i, d); err != nil {
		return err
	}
	if d < 0 {
		if err := p.evictOver(seg, r0, r0+n); err != nil {
			return err
		}
	}
	oldSeg, oldC0 := s.seg, int(s.c0)
	unfenced := s.seq > p.fencedSeq && !s.clean
	p.removeEmpty(i)
	p.retire(i)
	if unfenced {
		p.markDormant(i, asker)
	}
	if d >= 0 {
		access := p.dormants[d].access
		p.unlink(d, p.chainPrev(d))
		p.nRevived++
		err := p.attach(i, seg, r0, c1, access)
		p.carry(i, unfenced)
		return err
	}
	if err := a.vm.Map(device.Ptr(seg.chunkAddr(r0, a.gran)), uint64(n)*a.gran, s.h); err != nil {
		// Back where it was: revive the mapping just retired.
		back := p.chains[i] - 1
		access := p.dormants[back].access
		p.unlink(back, -1)
		if aerr := p.attach(i, oldSeg, oldC0, -1, access); aerr != nil {
			return errors.Join(err, aerr)
		}
		p.made = p.made[:len(p.made)-1]
		return err
	}
	a.c.maps.Add(1)
	err := p.attach(i, seg, r0, c1, false)
	p.carry(i, unfenced)
	return err
}

// carry records span i, just moved by back, as carried if it moved
// without a fence (unfenced): the streams that used its handle may still
// have work on it (an ordered move orders only the asking stream after
// that work), so a failed back does not mark it clean (pressure.go).
func (p *pool) carry(i int32, unfenced bool) {
	if unfenced && p.backing != nil {
		p.carried = append(p.carried, i)
	}
}

// fenceEmptied fences q's streams if empty span i emptied after the last
// fence: the work that used its memory must be done before the memory is
// unmapped or changes hands.
func (q *pool) fenceEmptied(i int32) error {
	if q.spans[i].seq > q.fencedSeq && !q.spans[i].clean {
		return q.fence()
	}
	return nil
}

// unmapSpan fences q's stream if the span emptied after the last fence,
// unmaps empty span i and frees its slot. Its handle is the caller's; it
// must have no dormant mapping left (dropDormant).
func (q *pool) unmapSpan(i int32) error {
	a := q.a
	s := &q.spans[i]
	if err := q.fenceEmptied(i); err != nil {
		return err
	}
	if a.chunkHandles {
		if err := q.unmapChunks(i); err != nil {
			return err
		}
	} else {
		size := uint64(s.n) * a.gran
		if err := a.vm.Unmap(device.Ptr(s.seg.chunkAddr(int(s.c0), a.gran)), size); err != nil {
			return err
		}
		a.c.unmaps.Add(1)
	}
	for j := s.c0; j < s.c0+s.n; j++ {
		c := &s.seg.chunks[j]
		c.span, c.ready = -1, false
	}
	s.seg.ready.set(int(s.c0), int(s.c0+s.n), false) // (which voids no ready cache: see block.nzFrom)
	q.mappedChunks -= int(s.n)
	q.removeEmpty(i)
	q.freeSlot(i)
	return nil
}

// releaseSpan unmaps empty span i and gives its memory back to the device.
func (q *pool) releaseSpan(i int32) error {
	a := q.a
	h, size := q.spans[i].h, uint64(q.spans[i].n)*a.gran
	var hs []device.Handle
	if a.chunkHandles {
		hs = q.spanHandles(i, q.hbuf[:0])
	}
	if err := q.dropDormant(i); err != nil {
		return err
	}
	if err := q.unmapSpan(i); err != nil {
		return err
	}
	if a.chunkHandles {
		for _, h := range hs {
			a.dropHandle(h, a.gran)
		}
		q.hbuf = hs
		return nil
	}
	a.dropHandle(h, size)
	return nil
}

// dropHandle releases an unmapped handle; if the driver refuses, the handle
// is kept (and still counted) for Trim or Close to try again.
func (a *Allocator) dropHandle(h device.Handle, size uint64) {
	if err := a.vm.Release(h); err != nil {
		a.handlesMu.Lock()
		a.handles = append(a.handles, heldHandle{h, size})
		a.handlesMu.Unlock()
		return
	}
	a.c.releases.Add(1)
	a.giveBudget(size)
}

// heldHandle is a handle unmapped but not released (the driver refused).
type heldHandle struct {
	h    device.Handle
	size uint64
}

// releaseEmpty releases this pool's empty spans, oldest first, while more
// than target bytes are cached (all of them for target 0; preallocated ones
// only when all is set).
func (p *pool) releaseEmpty(target uint64, all bool) error {
	a := p.a
	var errs []error
	for i := p.empty.head; i >= 0 && (target == 0 || a.cached() > target); {
		next := p.spans[i].next
		if all || !p.spans[i].prealloc {
			if err := p.releaseSpan(i); err != nil {
				errs = append(errs, err)
			}
		}
		i = next
	}
	return errors.Join(errs...)
}

// releaseHandles retries the release of handles the driver refused before.
func (a *Allocator) releaseHandles() error {
	a.handlesMu.Lock()
	held := a.handles
	a.handles = nil
	a.handlesMu.Unlock()
	var errs []error
	for _, hh := range held {
		if err := a.vm.Release(hh.h); err != nil {
			errs = append(errs, err)
			a.handlesMu.Lock()
			a.handles = append(a.handles, hh)
			a.handlesMu.Unlock()
			continue
		}
		a.c.releases.Add(1)
		a.giveBudget(hh.size)
	}
	return errors.Join(errs...)
}

// reserve adds address space to a virtual heap: an arena arenaDevices times
// as large as the device, or the request if larger. Address space costs no
// memory; holes in it cost nothing either.
func (h *heap) reserve(rounded uint64) error {
	a := h.pool.a
	size := max(arenaDevices*a.total, rounded)
	size = (size + a.gran - 1) &^ (a.gran - 1)
	ptr, err := a.vm.Reserve(size, 0)
	if err != nil {
		return fmt.Errorf("gpumem: reserving %d bytes of address space for stream %d: %w", size, h.pool.stream, err)
	}
	a.c.reserves.Add(1)
	h.addSegment(uint64(ptr), size, true)
	return nil
}

// arenaDevices is how many times the device's memory one arena's address
// space spans. Free ranges in an arena are holes that hold no memory once
// their spans empty, so a program that fills the device leaves live blocks
// and holes that together pass the device's size: an arena only as large
// as the device then runs out of address space at the program's peak, and
// the next one splits the heap in two. A block cannot straddle two arenas,
// the first arena's free tail is lost to every larger request, and the
// frontier's larger spans start again at the second arena's base, holding
// idle chunks beside live ones. Measured (docs/EXPERIMENTS.md, "A tight
// device: the arena"): on a 936 MiB device gpt2_generate reserved a second
// arena at its live peak and ran out 57,000 events later with 108 MiB idle
// in spans that held live buffers; with twice the address space it never
// reserves another and fits from 928 MiB up (it was 938). With twice the
// device, the holes must pass the device's whole size first. Address space
// is plentiful (a GPU's spans terabytes; this is 160 GiB for an 80 GiB
// H100), and the arena's per-chunk arrays cost 16 bytes and a bit per 2 MiB
// of it (about 1.3 MiB for that H100).
const arenaDevices = 2

// preallocate takes Config.Preallocate(Fraction) bytes at New: one span at
// the start of the default stream's arena (virtual), or one segment of its
// large heap (plain). Either is kept until Trim or Close.
func (a *Allocator) preallocate() error {
	n := a.cfg.Preallocate
	if f := a.cfg.PreallocateFraction; f > 0 {
		if f > 1 {
			return fmt.Errorf("gpumem: PreallocateFraction %.3f is more than 1", f)
		}
		if m := uint64(f * float64(a.total)); m > n {
			n = m
		}
	}
	if n == 0 {
		return nil
	}
	n = (n + a.gran - 1) &^ (a.gran - 1)
	if l := a.limit.Load(); n > l || !a.takeBudget(n) {
		return fmt.Errorf("gpumem: preallocating %d bytes: more than the limit of %d", n, l)
	}
	p, _, err := a.poolFor(0)
	if err != nil {
		return err
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if a.mode == ModePlain {
		ptr, err := a.dev.Alloc(n)
		if err != nil {
			a.giveBudget(n)
			return fmt.Errorf("gpumem: preallocating %d bytes: %w", n, err)
		}
		a.c.deviceAllocs.Add(1)
		p.heaps[heapLarge].addSegment(uint64(ptr), n, false).prealloc = true
		return nil
	}
	// One handle, or one per chunk (Config.ChunkHandles: chunks.go).
	hs, size := []device.Handle{0}, n
	if a.chunkHandles {
		hs, size = make([]device.Handle, 0, n/a.gran), a.gran
		if hs, err = p.newHandles(hs, int(n/a.gran)); err != nil {
			return fmt.Errorf("gpumem: preallocating %d bytes: %w", n, err)
		}
	} else {
		if hs[0], err = a.vm.Create(n); err != nil {
			a.giveBudget(n)
			return fmt.Errorf("gpumem: preallocating %d bytes: %w", n, err)
		}
		a.c.creates.Add(1)
	}
	hp := &p.heaps[heapLarge]
	if err := hp.reserve(n); err != nil {
		for _, h := range hs {
			a.dropHandle(h, size)
		}
		return err
	}
	seg := hp.segs[len(hp.segs)-1]
	if a.chunkHandles {
		err = p.placeChunks(hs, seg, 0, -1, true)
	} else {
		err = p.place(hs[0], seg, 0, int(n/a.gran), -1, true)
	}
	if err != nil {
		return fmt.Errorf("gpumem: preallocating %d bytes: %w", n, err)
	}
	return nil
}
