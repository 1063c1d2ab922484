package gpumem

// See doc.go for the overview.

import (
	"errors"
	"fmt"

	"github.com/gpumem/gpumem/device"
)

// A chunk is one granule of a virtual segment, the unit of physical backing.
// Its state machine (each arrow names the function that performs it):
//
//	unmapped ──mapMissing──▶ occupied (live > 0) ──vacate──▶ empty (live == 0, mapped, on pool.empty)
//	    ▲                       ▲                               │
//	    │                       └────────────occupy─────────────┤
//	    └──────────────steal (unmap; handle reused) / releaseEmpty (unmap, release)
//
// Invariants (checked by checkPool):
//
//	live == number of non-free blocks that overlap the chunk
//	live > 0 ⇒ mapped && access
//	mapped && live == 0 ⇔ the chunk is on its segment's empty list
//	Reserved == Σ plain segment sizes + (mapped chunks + spare handles) × granularity
//
// Guarded by the owning pool's mu. Chunks hold no Go pointers (links are
// indices into seg.chunks), so the collector neither scans the arrays nor
// puts write barriers on the hot path.
type chunk struct {
	live       int32
	mapped     bool
	access     bool  // access granted since it was mapped (SetAccess)
	prev, next int32 // seg.empty links; -1 for none
	h          device.Handle
	seq        uint64 // pool.emptySeq when it last became empty
}

// chunkAddr is the address of chunk i of seg.
func (seg *segment) chunkAddr(i int, gran uint64) uint64 { return seg.base + uint64(i)*gran }

// chunkList links a segment's empty chunks, oldest first, by index.
type chunkList struct {
	head, tail int32
	n          int
}

func (seg *segment) pushEmpty(i int) {
	l, ch := &seg.empty, seg.chunks
	c := &ch[i]
	c.prev, c.next = l.tail, -1
	if l.tail >= 0 {
		ch[l.tail].next = int32(i)
	} else {
		l.head = int32(i)
	}
	l.tail = int32(i)
	l.n++
	seg.heap.pool.nempty++
}

func (seg *segment) removeEmpty(i int) {
	l, ch := &seg.empty, seg.chunks
	c := &ch[i]
	if c.prev >= 0 {
		ch[c.prev].next = c.next
	} else {
		l.head = c.next
	}
	if c.next >= 0 {
		ch[c.next].prev = c.prev
	} else {
		l.tail = c.prev
	}
	c.prev, c.next = -1, -1
	l.n--
	seg.heap.pool.nempty--
}

// chunkSpan returns the chunk indices [c0, c1] that [addr, addr+size) touches.
func (seg *segment) chunkSpan(addr, size, gran uint64) (int, int) {
	return int((addr - seg.base) / gran), int((addr + size - 1 - seg.base) / gran)
}

// unmappedIn counts the chunks under [addr, addr+size) of seg that are not
// ready (unmapped, or mapped without access),
// stopping once it passes limit.
func (seg *segment) unmappedIn(addr, size, gran uint64, limit int) int {
	c0, c1 := seg.chunkSpan(addr, size, gran)
	ch := seg.chunks
	n := 0
	for i := c0; i <= c1 && n <= limit; i++ {
		if !ch[i].mapped || !ch[i].access {
			n++
		}
	}
	return n
}

// placement returns where in free block b to put rounded bytes, its start
// or its end (a block's low part may have been stolen while its high part is
// still mapped), and how many chunks there are unmapped (at most limit+1).
func (p *pool) placement(b *block, rounded uint64, limit int) (off uint64, missing int) {
	g := p.a.gran
	missing = b.seg.unmappedIn(b.addr, rounded, g, limit)
	if missing > 0 && b.size > rounded {
		if m := b.seg.unmappedIn(b.end()-rounded, rounded, g, missing-1); m < missing {
			return b.size - rounded, m
		}
	}
	return 0, missing
}

// findBacked looks, when the best fit lies (partly) in unmapped memory, for
// a free block that fits with fewer unmapped chunks under it: the fitting
// blocks of the request's bin and of the next few non-empty bins, at most
// scanBudget in each. It returns the best candidate and whether it is
// backed entirely. A looser fit costs address space, which is free; each
// unmapped chunk costs an unmap, a map and an access grant on a real GPU.
// Bounded; on the miss path only.
func (p *pool) findBacked(h *heap, first *block, rounded uint64) (*block, uint64, int) {
	const bins = 3
	best, bestOff, bestMissing := first, uint64(0), 0
	bestOff, bestMissing = p.placement(first, rounded, 1<<30)
	if bestMissing == 0 {
		return best, bestOff, 0
	}
	i := binOf(rounded)
	for n := 0; n < bins && i >= 0; n++ {
		k := 0
		for b := h.free.heads[i]; b != nil && k < scanBudget; b, k = b.fnext, k+1 {
			if b.size < rounded || b == first {
				continue
			}
			if off, m := p.placement(b, rounded, bestMissing-1); m < bestMissing {
				best, bestOff, bestMissing = b, off, m
				if m == 0 {
					return best, bestOff, 0
				}
			}
		}
		i = h.free.nextBin(i + 1)
	}
	return best, bestOff, bestMissing
}

// occupy counts b as live in its chunks; every chunk must be mapped.
func (p *pool) occupy(b *block) {
	c0, c1 := b.seg.chunkSpan(b.addr, b.size, p.a.gran)
	ch := b.seg.chunks
	for i := c0; i <= c1; i++ {
		c := &ch[i]
		if c.live == 0 {
			b.seg.removeEmpty(i)
		}
		c.live++
	}
}

// vacate uncounts b from its chunks; chunks left with no live block join the
// pool's empty list, still mapped: reusing them in place costs nothing, and
// a pool that needs physical memory elsewhere takes them (steal).
func (p *pool) vacate(b *block) {
	c0, c1 := b.seg.chunkSpan(b.addr, b.size, p.a.gran)
	ch := b.seg.chunks
	for i := c0; i <= c1; i++ {
		c := &ch[i]
		c.live--
		if c.live == 0 {
			p.emptySeq++
			c.seq = p.emptySeq
			b.seg.pushEmpty(i)
		}
	}
}

// back occupies b's chunks and maps those that have no physical memory
// (the growth step of ModeVirtual). Physical chunks come, in order, from
// spare handles, this pool's oldest empty chunks, other pools' empty chunks,
// and finally the device. On failure nothing changes but where spare
// handles are kept.
func (p *pool) back(b *block) error {
	a := p.a
	gran := a.gran
	c0, c1 := b.seg.chunkSpan(b.addr, b.size, gran)
	ch := b.seg.chunks
	missing, bare := 0, 0
	for i := c0; i <= c1; i++ {
		c := &ch[i]
		if c.live == 0 {
			if c.mapped {
				b.seg.removeEmpty(i)
			} else {
				missing++
			}
		}
		if c.mapped && !c.access {
			bare++
		}
		c.live++
	}
	if missing == 0 && bare == 0 {
		return nil
	}
	undo := func() {
		for i := c0; i <= c1; i++ {
			c := &ch[i]
			c.live--
			if c.live == 0 && c.mapped {
				p.emptySeq++
				c.seq = p.emptySeq
				b.seg.pushEmpty(i)
			}
		}
	}
	// 1. Acquire every handle first, so that a shortage maps nothing.
	hs := p.scratch[:0]
	for n := 0; n < missing; n++ {
		h, err := p.physical()
		if err != nil {
			a.keepHandles(hs)
			p.scratch = hs[:0]
			undo()
			return err
		}
		hs = append(hs, h)
	}
	p.scratch = hs[:0]
	// 2. Map them, then 3. grant access once per contiguous run of chunks
	// without it.
	next := 0
	runStart := -1
	var err error
	for i := c0; i <= c1 && err == nil; i++ {
		c := &ch[i]
		if !c.mapped {
			h := hs[next]
			if err = a.vm.Map(device.Ptr(b.seg.chunkAddr(i, gran)), gran, h); err != nil {
				break
			}
			a.c.maps.Add(1)
			next++
			p.nmapped++
			c.mapped, c.access, c.h = true, false, h
		}
		if !c.access {
			if runStart < 0 {
				runStart = i
			}
			continue
		}
		if runStart >= 0 {
			err = a.setAccess(b.seg, runStart, i)
			runStart = -1
		}
	}
	if err == nil && runStart >= 0 {
		err = a.setAccess(b.seg, runStart, c1+1)
	}
	if err != nil {
		// Unmap the chunks this call mapped that have no access, and keep
		// their handles and the unused ones as spares. A chunk whose unmap
		// fails stays mapped, without access (granted when it is next
		// occupied), and keeps its handle.
		keep := append([]device.Handle(nil), hs[next:]...)
		for i := c0; i <= c1; i++ {
			c := &ch[i]
			if !c.mapped || c.access || !containsHandle(hs[:next], c.h) {
				continue
			}
			if uerr := a.vm.Unmap(device.Ptr(b.seg.chunkAddr(i, gran)), gran); uerr == nil {
				a.c.unmaps.Add(1)
				p.nmapped--
				c.mapped = false
				keep = append(keep, c.h)
				c.h = 0
			}
		}
		a.keepHandles(keep)
		undo()
		return fmt.Errorf("gpumem: backing %d bytes at 0x%x: %w", b.size, b.addr, err)
	}
	return nil
}

func containsHandle(hs []device.Handle, h device.Handle) bool {
	for _, x := range hs {
		if x == h {
			return true
		}
	}
	return false
}

// setAccess grants access to chunks [from, to) of seg in one call.
func (a *Allocator) setAccess(seg *segment, from, to int) error {
	if err := a.vm.SetAccess(device.Ptr(seg.base+uint64(from)*a.gran), uint64(to-from)*a.gran); err != nil {
		return err
	}
	a.c.setAccess.Add(1)
	for i := from; i < to; i++ {
		seg.chunks[i].access = true
	}
	return nil
}

// physical returns an unmapped physical chunk for this pool to map.
func (p *pool) physical() (device.Handle, error) {
	a := p.a
	if h, ok := a.spareHandle(); ok {
		return h, nil
	}
	if p.nempty > 0 {
		return p.steal()
	}
	for _, q := range a.allPools() {
		if q == p || !q.mu.TryLock() {
			continue
		}
		if q.nempty > 0 {
			h, err := q.steal()
			q.mu.Unlock()
			return h, err
		}
		q.mu.Unlock()
	}
	if !a.takeBudget(a.gran) {
		return 0, &shortage{cause: CauseLimit}
	}
	h, err := a.vm.Create(a.gran)
	if err != nil {
		a.giveBudget(a.gran)
		if errors.Is(err, device.ErrOutOfMemory) {
			return 0, &shortage{cause: CauseDevice, err: err}
		}
		return 0, err
	}
	a.c.creates.Add(1)
	return h, nil
}

// steal unmaps this pool's oldest empty chunk and returns its physical
// memory. The pool's stream is fenced first if the chunk emptied after the
// last fence: unmapping is not stream-ordered.
func (p *pool) steal() (device.Handle, error) {
	a := p.a
	var seg *segment
	for k := range p.heaps {
		for _, s := range p.heaps[k].segs {
			if s.empty.n > 0 && (seg == nil || s.chunks[s.empty.head].seq < seg.chunks[seg.empty.head].seq) {
				seg = s
			}
		}
	}
	i := int(seg.empty.head)
	c := &seg.chunks[i]
	if c.seq > p.fencedSeq {
		if err := p.fence(); err != nil {
			return 0, err
		}
	}
	if err := a.vm.Unmap(device.Ptr(seg.chunkAddr(i, a.gran)), a.gran); err != nil {
		return 0, err
	}
	a.c.unmaps.Add(1)
	seg.removeEmpty(i)
	p.nmapped--
	c.mapped, c.access = false, false
	h := c.h
	c.h = 0
	return h, nil
}

// releaseEmpty unmaps and releases this pool's empty chunks, oldest first,
// while more than target bytes are cached (all of them for target 0). A chunk whose release fails is
// kept as a spare handle and the loop goes on; an unmap that fails stops it
// (the chunk stays mapped and listed).
func (p *pool) releaseEmpty(target uint64) error {
	a := p.a
	var errs []error
	for p.nempty > 0 && (target == 0 || a.cached() > target) {
		h, err := p.steal()
		if err != nil {
			errs = append(errs, err)
			break
		}
		if err := a.vm.Release(h); err != nil {
			a.keepHandles([]device.Handle{h})
			errs = append(errs, err)
			continue
		}
		a.c.releases.Add(1)
		a.giveBudget(a.gran)
	}
	return errors.Join(errs...)
}

// reserve adds address space to a virtual heap: an arena as large as the
// device (a quarter for the small heap), or the request if larger. Address
// space costs no memory; holes in it cost nothing either.
func (h *heap) reserve(rounded uint64) error {
	a := h.pool.a
	size := a.total
	if h.kind == heapSmall {
		size /= 4
	}
	if rounded > size {
		size = rounded
	}
	size = (size + a.gran - 1) &^ (a.gran - 1)
	ptr, err := a.vm.Reserve(size, 0)
	if err != nil {
		return fmt.Errorf("gpumem: reserving %d bytes of address space for stream %d: %w", size, h.pool.stream, err)
	}
	a.c.reserves.Add(1)
	h.addSegment(uint64(ptr), size, true)
	return nil
}

func (a *Allocator) spareHandle() (device.Handle, bool) {
	a.handlesMu.Lock()
	defer a.handlesMu.Unlock()
	if n := len(a.handles); n > 0 {
		h := a.handles[n-1]
		a.handles = a.handles[:n-1]
		return h, true
	}
	return 0, false
}

func (a *Allocator) keepHandles(hs []device.Handle) {
	if len(hs) == 0 {
		return
	}
	a.handlesMu.Lock()
	a.handles = append(a.handles, hs...)
	a.handlesMu.Unlock()
}

// releaseHandles releases spare handles beyond keep.
func (a *Allocator) releaseHandles(keep int) error {
	a.handlesMu.Lock()
	defer a.handlesMu.Unlock()
	var errs []error
	for len(a.handles) > keep {
		h := a.handles[len(a.handles)-1]
		if err := a.vm.Release(h); err != nil {
			errs = append(errs, err)
			break
		}
		a.handles = a.handles[:len(a.handles)-1]
		a.c.releases.Add(1)
		a.giveBudget(a.gran)
	}
	return errors.Join(errs...)
}

// preallocate takes Config.Preallocate(Fraction) bytes at New: spare
// physical chunks (virtual) or one segment of the default stream's large
// heap (plain).
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
	if n > a.limit {
		return fmt.Errorf("gpumem: preallocating %d bytes: more than the limit of %d", n, a.limit)
	}
	if a.mode == ModePlain {
		if !a.takeBudget(n) {
			return fmt.Errorf("gpumem: preallocating %d bytes: over the limit", n)
		}
		ptr, err := a.dev.Alloc(n)
		if err != nil {
			a.giveBudget(n)
			return fmt.Errorf("gpumem: preallocating %d bytes: %w", n, err)
		}
		a.c.deviceAllocs.Add(1)
		p := a.poolFor(0)
		p.mu.Lock()
		p.heaps[heapLarge].addSegment(uint64(ptr), n, false).prealloc = true
		p.mu.Unlock()
		return nil
	}
	for done := uint64(0); done < n; done += a.gran {
		if !a.takeBudget(a.gran) {
			return fmt.Errorf("gpumem: preallocating %d bytes: over the limit", n)
		}
		h, err := a.vm.Create(a.gran)
		if err != nil {
			a.giveBudget(a.gran)
			return fmt.Errorf("gpumem: preallocating %d bytes: %w", n, err)
		}
		a.c.creates.Add(1)
		a.keepHandles([]device.Handle{h})
	}
	return nil
}
