package gpumem

// See doc.go for the overview.

import (
	"errors"
	"fmt"
	"math/bits"
	"slices"

	"github.com/gpumem/gpumem/device"
)

// Check verifies every invariant of the allocator (see block.go, index.go,
// vm.go, scope.go, stats.go) and returns the violations found. It locks
// every pool for its duration; it is meant for tests and debugging. On a
// broken allocator (see ErrBroken) it returns that and checks nothing.
func (a *Allocator) Check() error {
	if a.broken.Load() {
		return fmt.Errorf("%w: Check: the books are known not to match the device (an invariant was violated, or a split lost live memory)", ErrBroken)
	}
	pools := a.allPools()
	for _, p := range pools {
		p.mu.Lock()
	}
	defer func() {
		for _, p := range pools {
			p.mu.Unlock()
		}
	}()
	var errs []error
	var plain, mappedBytes, active, allocated uint64
	for _, p := range pools {
		if err := p.check(); err != nil {
			errs = append(errs, err)
		}
		for k := range p.heaps {
			for _, seg := range p.heaps[k].segs {
				if !seg.virtual {
					plain += seg.size
				}
				for b := seg.first; b != nil; b = b.next {
					if b.state == blockAllocated {
						active += b.size
						allocated += b.req
					}
				}
			}
		}
		mappedBytes += uint64(p.mappedChunks) * a.gran
	}
	a.handlesMu.Lock()
	var spare uint64
	for _, hh := range a.handles {
		spare += hh.size
	}
	a.handlesMu.Unlock()
	// Scratch mappings a failed split could not unmap hold their handles
	// (Stats counts them in SpareBytes too). scratchMu after the pools'
	// locks, as split takes it.
	a.scratchMu.Lock()
	for _, m := range a.lostScratch {
		spare += m.size
	}
	a.scratchMu.Unlock()
	if r := a.reserved.Load(); r != plain+mappedBytes+spare {
		errs = append(errs, fmt.Errorf("reserved %d != plain %d + mapped %d + spare %d", r, plain, mappedBytes, spare))
	}
	if r, l := a.reserved.Load(), a.root.limit.Load(); r > l && r > a.root.overhang.Load() {
		errs = append(errs, fmt.Errorf("reserved %d > limit %d (and above the %d held when the limit was lowered)", r, l, a.root.overhang.Load()))
	}
	var pa, pr uint64
	var flushedAct, flushedReq int64
	for _, p := range pools {
		pa += p.active
		pr += p.allocated
		flushedAct += int64(p.active) - p.dActive
		flushedReq += int64(p.allocated) - p.dAllocated
	}
	if pa != active || pr != allocated {
		errs = append(errs, fmt.Errorf("pools' gauges active %d, allocated %d != Σ allocated block sizes %d, requested %d", pa, pr, active, allocated))
	}
	if v := a.active.Load(); v != flushedAct {
		errs = append(errs, fmt.Errorf("flushed active %d != Σ pools' active less unflushed %d", v, flushedAct))
	}
	if v := a.allocated.Load(); v != flushedReq {
		errs = append(errs, fmt.Errorf("flushed allocated %d != Σ pools' allocated less unflushed %d", v, flushedReq))
	}
	if active > a.reserved.Load() {
		errs = append(errs, fmt.Errorf("active %d > reserved %d", active, a.reserved.Load()))
	}
	return errors.Join(errs...)
}

// mustCheckPool panics if p breaks an invariant. Called with p.mu held; it
// unlocks p before panicking, so that a test's cleanup (Close) reports the
// broken allocator instead of waiting forever on the pool.
func (a *Allocator) mustCheckPool(p *pool) {
	if err := p.check(); err != nil {
		a.broken.Store(true)
		p.mu.Unlock()
		panic(fmt.Sprintf("gpumem: invariant violated after an operation on stream %d:\n%v", p.stream, err))
	}
}

// check verifies one pool's structure. Called with p.mu held.
func (p *pool) check() error {
	a := p.a
	var errs []error
	bad := func(format string, args ...any) {
		if len(errs) < 20 {
			errs = append(errs, fmt.Errorf("stream %d: "+format, append([]any{p.stream}, args...)...))
		}
	}
	live := 0
	for i := range p.streams {
		st := &p.streams[i]
		if !st.live {
			if !slices.Contains(p.deadSlots, slot(i)) {
				bad("stream slot %d is dead but not listed for reuse", i)
			}
			continue
		}
		live++
		if st.last > p.freeSeq || st.safe > p.freeSeq || st.fenced > st.safe ||
			st.epochPending && st.epochSeq > p.freeSeq {
			bad("stream %d (slot %d): horizons out of order: last %d, safe %d, fenced %d, epoch %d (pending %v), frees %d",
				st.s, i, st.last, st.safe, st.fenced, st.epochSeq, st.epochPending, p.freeSeq)
		}
		if st.epochPending && !(st.haveEpochEv || st.haveEpochMk) || st.haveEpochMk && (p.a.mk == nil || st.haveEpochEv) {
			bad("stream %d (slot %d): an epoch pending (%v) without its event (%v) or marker (%v; markers in use %v)",
				st.s, i, st.epochPending, st.haveEpochEv, st.haveEpochMk, p.a.mk != nil)
		}
		for j, after := range st.after {
			if after > p.freeSeq {
				bad("stream %d (slot %d): ordered after slot %d's frees up to %d, past the pool's %d", st.s, i, j, after, p.freeSeq)
			}
		}
		for j := range i {
			if p.streams[j].live && p.streams[j].s == st.s {
				bad("stream %d has two slots (%d and %d)", st.s, j, i)
			}
		}
	}
	if live != p.live {
		bad("%d live stream slots, the pool counts %d", live, p.live)
	}
	liveSlot := func(si slot) bool { return si >= 0 && int(si) < len(p.streams) && p.streams[si].live }
	pending := 0
	partIn := map[*segment][]int32{} // per chunk, from the blocks: non-free blocks covering it in part
	fullIn := map[*segment][]bool{}  // per chunk: a non-free block covers it whole
	for k := range p.heaps {
		h := &p.heaps[k]
		if h.pool != p || h.kind != k {
			bad("heap %d has wrong pool or kind", k)
		}
		nfree, freeBytes := 0, uint64(0)
		for _, seg := range h.segs {
			if seg.heap != h {
				bad("segment 0x%x in heap %s points to another heap", seg.base, heapName(k))
			}
			var part []int32
			var full []bool
			if seg.virtual {
				part, full = make([]int32, len(seg.chunks)), make([]bool, len(seg.chunks))
				partIn[seg], fullIn[seg] = part, full
			}
			addr := seg.base
			var prev *block
			for b := seg.first; b != nil; prev, b = b, b.next {
				switch {
				case b.pool != p || b.seg != seg:
					bad("block 0x%x: wrong pool or segment", b.addr)
				case b.prev != prev:
					bad("block 0x%x: prev link broken", b.addr)
				case b.addr != addr:
					bad("block 0x%x: expected at 0x%x (gap or overlap)", b.addr, addr)
				case b.size == 0 || b.size%minBlock != 0:
					bad("block 0x%x: size %d not a positive multiple of %d", b.addr, b.size, minBlock)
				case b.req > b.size:
					bad("block 0x%x: requested %d > size %d", b.addr, b.req, b.size)
				}
				addr = b.addr + b.size
				switch b.state {
				case blockFree:
					nfree++
					freeBytes += b.size
					if b.req != 0 || b.scope != nil {
						bad("free block 0x%x still has a request or a scope", b.addr)
					}
					if prev != nil && prev.state == blockFree {
						bad("free blocks 0x%x and 0x%x are neighbours (not coalesced)", prev.addr, b.addr)
					}
					if int(b.bin) != binOf(b.size) {
						bad("free block 0x%x of %d bytes is in bin %d, want %d", b.addr, b.size, b.bin, binOf(b.size))
					}
					if b.freed > p.freeSeq {
						bad("free block 0x%x stamped with free %d, after the pool's last (%d)", b.addr, b.freed, p.freeSeq)
					}
					if b.si != -1 && !liveSlot(b.si) {
						bad("free block 0x%x is tagged with stream slot %d, not a live one", b.addr, b.si)
					}
					if b.si >= 0 && liveSlot(b.si) && b.freed > p.streams[b.si].last {
						bad("free block 0x%x is tagged with free %d of stream slot %d, after its last (%d)", b.addr, b.freed, b.si, p.streams[b.si].last)
					}
					if b.x != nil && len(b.x.uses) > 0 {
						bad("free block 0x%x is still marked used by other streams (uses %v)", b.addr, b.x.uses)
					}
					if b.nzFrom != 0 {
						// The cache's claim, at its smallest request and the
						// largest (readyPlace argues the sizes between).
						for _, r := range []uint64{b.nzFrom, b.size} {
							if !seg.virtual || r > b.size || r%minBlock != 0 {
								bad("free block 0x%x of %d bytes (virtual %v): ready cache from %d bytes", b.addr, b.size, seg.virtual, b.nzFrom)
								break
							}
							if off, m := p.placement(b, r, 0); m == 0 {
								bad("free block 0x%x: its ready cache says no place over ready chunks from %d bytes, but %d bytes fit at offset %d", b.addr, b.nzFrom, r, off)
							}
						}
					}
				case blockAllocated, blockPending:
					if b.state == blockAllocated && b.req == 0 {
						bad("allocated block 0x%x has no request", b.addr)
					}
					if b.state == blockPending {
						pending++
					}
					if !liveSlot(b.si) {
						bad("%s block 0x%x is of stream slot %d, not a live one", b.state, b.addr, b.si)
					}
					if seg.virtual {
						c0, c1 := seg.chunkSpan(b.addr, b.size, a.gran)
						for i := c0; i <= c1; i++ {
							if b.addr <= seg.chunkAddr(i, a.gran) && b.end() >= seg.chunkAddr(i+1, a.gran) {
								full[i] = true
							} else {
								part[i]++
							}
						}
					}
				default:
					bad("block 0x%x: invalid state %d", b.addr, b.state)
				}
			}
			if addr != seg.base+seg.size {
				bad("segment 0x%x: blocks end at 0x%x, segment at 0x%x", seg.base, addr, seg.base+seg.size)
			}
			for i := range seg.chunks {
				c := &seg.chunks[i]
				if c.part != part[i] {
					bad("chunk %d of segment 0x%x: %d blocks cover it in part, blocks say %d", i, seg.base, c.part, part[i])
				}
				if (part[i] > 0 || full[i]) && !c.ready {
					bad("chunk %d of segment 0x%x holds live blocks but is not ready (span %d)", i, seg.base, c.span)
				}
				if c.ready != seg.ready.get(i) {
					bad("chunk %d of segment 0x%x: ready %v, its bit in the ready map %v", i, seg.base, c.ready, seg.ready.get(i))
				}
				if c.span >= 0 {
					if int(c.span) >= len(p.spans) || !p.spans[c.span].inUse || p.spans[c.span].seg != seg ||
						int32(i) < p.spans[c.span].c0 || int32(i) >= p.spans[c.span].c0+p.spans[c.span].n {
						bad("chunk %d of segment 0x%x points to span %d that does not cover it", i, seg.base, c.span)
					} else if c.ready != p.spans[c.span].access {
						bad("chunk %d of segment 0x%x: ready %v, its span's access %v", i, seg.base, c.ready, p.spans[c.span].access)
					}
				} else if c.ready {
					bad("chunk %d of segment 0x%x is ready without a span", i, seg.base)
				}
				if seg.dormant == nil {
					continue
				}
				if k := seg.dormant[i] - 1; k >= 0 {
					if c.span >= 0 {
						bad("chunk %d of segment 0x%x has span %d and dormant mapping %d", i, seg.base, c.span, k)
					}
					if int(k) >= len(p.dormants) || !p.dormants[k].inUse || p.dormants[k].seg != seg ||
						int32(i) < p.dormants[k].c0 || int32(i) >= p.dormants[k].c0+p.dormants[k].n {
						bad("chunk %d of segment 0x%x points to dormant mapping %d that does not cover it", i, seg.base, k)
					}
				}
			}
		}
		if nfree != h.free.count || freeBytes != h.free.bytes {
			bad("heap %s: %d free blocks (%d bytes) in segments, %d (%d bytes) in the index", heapName(k), nfree, freeBytes, h.free.count, h.free.bytes)
		}
		n := 0
		for i := range h.free.heads {
			set := h.free.words[i/64]&(1<<(i%64)) != 0
			if set != (h.free.heads[i] != nil) {
				bad("heap %s: bin %d bitmap %v disagrees with its list", heapName(k), i, set)
			}
			var prev *block
			for b := h.free.heads[i]; b != nil; prev, b = b, b.fnext {
				n++
				if b.state != blockFree || int(b.bin) != i || b.fprev != prev || b.seg.heap != h {
					bad("heap %s: bin %d holds block 0x%x (state %s, bin %d) wrongly", heapName(k), i, b.addr, b.state, b.bin)
				}
			}
		}
		// Every run of one batch's frees in a bin is in freshCompare's
		// order, but a head run whose bin is listed for sortFresh.
		if b := h.free.unorderedRun(); b != nil {
			bad("heap %s: bin %d's batch out of order at block 0x%x, not its bin's head run listed for sortFresh", heapName(k), b.bin, b.addr)
		}
		listedBits := 0
		for _, w := range h.free.dirtyBits {
			listedBits += bits.OnesCount64(w)
		}
		for _, i := range h.free.dirty {
			if h.free.dirtyBits[i/64]&(1<<(i%64)) == 0 {
				listedBits = -1
			}
		}
		if listedBits != len(h.free.dirty) {
			bad("heap %s: the dirty list (%d bins) disagrees with its bits", heapName(k), len(h.free.dirty))
		}
		for w := 0; w < numWords; w++ {
			if (h.free.words[w] != 0) != (h.free.top&(1<<w) != 0) {
				bad("heap %s: top bitmap bit %d disagrees with word", heapName(k), w)
			}
		}
		if n != h.free.count {
			bad("heap %s: index lists %d blocks, counts %d", heapName(k), n, h.free.count)
		}
	}
	// Spans: each covers its chunks, counts the live blocks over them, and
	// the empty list holds exactly the empty spans, oldest first.
	mapped, empties := 0, 0
	type chunkRef struct {
		seg *segment
		c   int32
	}
	handleAt := map[device.Handle]chunkRef{} // under Config.ChunkHandles
	for i := range p.spans {
		s := &p.spans[i]
		if !s.inUse {
			continue
		}
		mapped += int(s.n)
		part, full := partIn[s.seg], fullIn[s.seg]
		if part == nil {
			bad("span %d lies in segment 0x%x, not one of this pool's virtual segments", i, s.seg.base)
			continue
		}
		occ := int32(0)
		for j := s.c0; j < s.c0+s.n; j++ {
			if int(j) >= len(s.seg.chunks) || s.seg.chunks[j].span != int32(i) {
				bad("span %d [%d, %d) of 0x%x: chunk %d does not point back", i, s.c0, s.c0+s.n, s.seg.base, j)
				break
			}
			if part[j] > 0 || full[j] {
				occ++
			}
		}
		if occ != s.occupied {
			bad("span %d: %d occupied chunks, counts %d", i, occ, s.occupied)
		}
		if p.a.chunkHandles {
			for j := s.c0; j < s.c0+s.n; j++ {
				h := s.seg.hnd[j]
				if h == 0 {
					bad("span %d: chunk %d of 0x%x has no handle", i, j, s.seg.base)
				} else if o, dup := handleAt[h]; dup {
					bad("handle %d is under chunk %d of 0x%x and chunk %d of 0x%x", h, o.c, o.seg.base, j, s.seg.base)
				} else {
					handleAt[h] = chunkRef{s.seg, j}
				}
			}
		}
		if s.occupied == 0 {
			empties++
		} else if s.clean {
			bad("span %d: occupied (%d chunks) yet marked clean", i, s.occupied)
		}
		if s.shares < 0 {
			bad("span %d: %d shares", i, s.shares)
		}
	}
	if mapped != p.mappedChunks {
		bad("spans cover %d chunks, pool counts %d", mapped, p.mappedChunks)
	}
	// Dormant mappings: each on the chain of the span that holds its
	// handle, covering chunks that point back, at most maxDormant a chain.
	onChain := 0
	for i := range p.spans {
		s := &p.spans[i]
		if !s.inUse {
			if p.chains[i] != 0 {
				bad("free span slot %d has dormant mappings", i)
			}
			continue
		}
		n := 0
		for k := p.chains[i] - 1; k >= 0; k = p.dormants[k].next {
			n++
			d := &p.dormants[k]
			if n > len(p.dormants) {
				bad("span %d: its dormant chain has a cycle", i)
				break
			}
			if !d.inUse || d.owner != int32(i) || d.n != s.n {
				bad("span %d: dormant mapping %d on its chain (in use %v, owner %d, %d chunks, the span %d)", i, k, d.inUse, d.owner, d.n, s.n)
				continue
			}
			for j := d.c0; j < d.c0+d.n; j++ {
				if int(j) >= len(d.seg.dormant) || d.seg.dormant[j] != k+1 {
					bad("dormant mapping %d [%d, %d) of 0x%x: chunk %d does not point back", k, d.c0, d.c0+d.n, d.seg.base, j)
					break
				}
			}
		}
		if n > maxDormant {
			bad("span %d has %d dormant mappings, more than %d", i, n, maxDormant)
		}
		onChain += n
	}
	inUse := 0
	for k := range p.dormants {
		if p.dormants[k].inUse {
			inUse++
		}
	}
	if onChain != inUse || inUse != p.nDormant {
		bad("dormant mappings: %d on chains, %d in use, pool counts %d", onChain, inUse, p.nDormant)
	}
	if g := &p.churn; g.level < 0 || g.level > churnMaxLevel || g.start > p.nallocs || g.n < 0 ||
		((a.compact || a.noChurn) && (g.level != 0 || g.taken != 0)) {
		bad("churn guard: level %d (0..%d), window from allocation %d of %d with %d counted, %d served (compact %v)",
			g.level, churnMaxLevel, g.start, p.nallocs, g.n, g.taken, a.compact)
	}
	ne, prevI, lastSeq := 0, int32(-1), uint64(0)
	for i := p.empty.head; i >= 0; prevI, i = i, p.spans[i].next {
		s := &p.spans[i]
		ne++
		if !s.inUse || s.occupied != 0 || s.prev != prevI {
			bad("empty list: span %d wrongly listed (in use %v, occupied %d)", i, s.inUse, s.occupied)
		}
		if s.seq < lastSeq {
			bad("empty list: span %d out of age order", i)
		}
		lastSeq = s.seq
		if ne > len(p.spans) {
			bad("empty list: cycle")
			break
		}
	}
	if p.empty.tail != prevI || ne != p.empty.n || ne != empties {
		bad("empty list: %d listed, counts %d, %d spans empty (tail %d, last %d)", ne, p.empty.n, empties, p.empty.tail, prevI)
	}
	np, nm := 0, 0
	for b := p.pending; b != nil; b = b.fnext {
		np++
		if b.state != blockPending {
			bad("pending list holds block 0x%x in state %s", b.addr, b.state)
		}
		if b.x != nil && len(b.x.markers) > 0 {
			nm++
		}
	}
	if np != p.npending || np != pending {
		bad("pending: list %d, count %d, blocks %d", np, p.npending, pending)
	}
	if nm != p.nmarked {
		bad("pending: %d blocks with capture markers, count %d", nm, p.nmarked)
	}
	return errors.Join(errs...)
}
