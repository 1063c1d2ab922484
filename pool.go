package gpumem

// See doc.go for the overview.

import (
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"

	"github.com/gpumem/gpumem/device"
)

// Heap kinds: requests up to Config.SmallSize are served from the small
// heap, the rest from the large heap. Each pool has one of each.
const (
	heapSmall = iota
	heapLarge
	numHeaps
)

// A pool is everything one stream owns: its heaps, its spans,
// its pending frees. All fields are guarded by mu unless noted. Locks are
// taken pool by pool; a pool that needs another pool's memory while holding
// its own lock only ever TryLocks the other, so pools never deadlock.
type pool struct {
	a      *Allocator // immutable
	stream device.Stream
	_      [64]byte // keeps mu and the hot fields after it off others' lines
	mu     sync.Mutex

	heaps [numHeaps]heap

	spare    *block // recycled block nodes, linked through fnext
	pending  *block // freed blocks waiting for events, linked through fnext
	npending int

	// spans back this pool's virtual segments (vm.go); empty lists those
	// with no live chunk, oldest first. They still count as reserved; a
	// pool that needs memory remaps or releases them (newSpan).
	spans               []span
	freeSlots           []int32
	empty               spanList
	mappedChunks        int
	emptySeq, fencedSeq uint64  // span emptyings so far / covered by the last fence
	made                []int32 // spans placed by the current back (vm.go)
	fenceEv             device.Event
	haveFenceEv         bool
	// Lending (borrow): every release stamps the free block with freeSeq;
	// the blocks stamped up to safeSeq are lendable to other streams, since
	// an event recorded on this stream after those frees has completed.
	// epochEv is the event recorded last, after the frees up to epochSeq.
	// Invariants: free block b.freed <= freeSeq; safeSeq <= freeSeq;
	// epochPending ⇒ safeSeq <= epochSeq <= freeSeq.
	freeSeq, safeSeq, epochSeq uint64
	epochEv                    device.Event
	haveEpochEv, epochPending  bool
	spareEvents                []device.Event

	nallocs, nfrees uint64
	// gauges: exact for this pool; see noteAlloc.
	allocated, active         uint64
	peakAllocated, peakActive uint64
	dAllocated, dActive       int64 // not yet flushed to the allocator

	heldBound int64 // what held says, under mu

	// held bounds from above the frees this pool holds back (not yet
	// flushed), for other pools' flushes (see noteFree); written only by
	// this pool. On a cache line of its own.
	_    [64]byte
	held atomic.Int64
	_    [64]byte
}

// A heap is one size class of a pool: its segments and their free blocks.
type heap struct {
	pool *pool
	kind int
	free freeIndex
	segs []*segment
}

// A segment is a contiguous address range of the device: a plain
// allocation (fully backed) or a virtual reservation (backed chunk by
// chunk). Its blocks tile it in address order starting at first.
type segment struct {
	heap     *heap
	base     uint64
	size     uint64
	virtual  bool
	prealloc bool // plain preallocation: kept until Trim or Close
	first    *block
	chunks   []chunk  // virtual: one per granule
	ready    readyMap // virtual: chunks[i].ready, a bit each (readymap.go)
	hiSpan   int32    // virtual: no span ever covered a chunk above this; -1 for none
}

func newPool(a *Allocator, s device.Stream) *pool {
	p := &pool{a: a, stream: s, empty: spanList{head: -1, tail: -1}}
	for k := range p.heaps {
		p.heaps[k] = heap{pool: p, kind: k}
	}
	return p
}

// heapFor returns the heap that serves a request. In ModeVirtual every
// request goes to the large heap: see "Rounding and pools" in doc.go.
func (p *pool) heapFor(rounded uint64) *heap {
	if rounded <= p.a.small && p.a.mode == ModePlain {
		return &p.heaps[heapSmall]
	}
	return &p.heaps[heapLarge]
}

// shortage is the internal error of a request that needs more memory than
// the limit or the device allows; Alloc turns it into an OutOfMemoryError
// after one reclaim and retry.
type shortage struct {
	cause Cause // CauseLimit or CauseDevice
	err   error // the device's error for CauseDevice
}

func (s *shortage) Error() string {
	if s.err != nil {
		return fmt.Sprintf("shortage (%s): %v", s.cause, s.err)
	}
	return fmt.Sprintf("shortage (%s)", s.cause)
}

// allocFast is the cache-hit path: a free block that fits, in memory that is
// already backed. It returns nil when anything more is needed.
func (p *pool) allocFast(rounded uint64) *block {
	h := p.heapFor(rounded)
	b := h.free.find(rounded)
	if b == nil {
		return nil
	}
	if !b.seg.virtual {
		b = p.carve(h, b, rounded, 0)
		b.state = blockAllocated
		return b
	}
	if p.unmappedIn(b.seg, b.addr, rounded, 0) > 0 {
		return nil
	}
	b = p.carve(h, b, rounded, 0)
	p.occupy(b) // all mapped: no device call
	b.state = blockAllocated
	return b
}

// allocSlow is the rest of the ladder (see doc.go): pending frees whose
// events are done, growth, and on a shortage one reclaim of every pool's
// cache and a retry.
func (p *pool) allocSlow(rounded, size uint64) (*block, error) {
	b, err := p.allocate(rounded)
	if err == nil {
		return b, nil
	}
	var sh *shortage
	if !errors.As(err, &sh) {
		return nil, err
	}
	a := p.a
	a.c.retries.Add(1)
	p.mu.Unlock()
	a.reclaim()
	p.mu.Lock()
	if b, err = p.allocate(rounded); err == nil {
		return b, nil
	}
	if !errors.As(err, &sh) {
		return nil, err
	}
	a.c.ooms.Add(1)
	p.mu.Unlock()
	oom := a.oomError(size, p.stream, sh)
	p.mu.Lock()
	return nil, oom
}

func (p *pool) allocate(rounded uint64) (*block, error) {
	h := p.heapFor(rounded)
	// Frees whose other streams are done go back before anything grows. Not
	// only when no free block fits: a virtual arena almost always has a
	// free block that fits (its unbacked tail), so waiting for that left
	// completed frees parked until a reclaim while the heap grew past them
	// (2 GB over 40 steps of a two-stream program handing batches over
	// with record_stream). One event query per pending block, on the slow
	// path only.
	if p.npending > 0 {
		if err := p.processPending(false, false); err != nil {
			return nil, err
		}
	}
	b := h.free.find(rounded)
	if b == nil && p.npending > 0 {
		// Frees without events wait for a device synchronize: only when
		// nothing else fits.
		if err := p.processPending(false, true); err != nil {
			return nil, err
		}
		b = h.free.find(rounded)
	}
	if b == nil {
		if err := h.grow(rounded); err != nil {
			return nil, err
		}
		if b = h.free.find(rounded); b == nil {
			panic("gpumem: grown heap has no block that fits")
		}
	}
	var off uint64
	if b.seg.virtual {
		var missing int
		b, off, missing = p.findBacked(h, b, rounded)
		if missing > 0 && p.a.multi.Load() {
			if lent := p.borrow(rounded); lent != nil {
				return lent, nil
			}
		}
	}
	b = p.carve(h, b, rounded, off)
	if b.seg.virtual {
		if err := p.back(b); err != nil {
			p.release(b, false)
			return nil, err
		}
	}
	b.state = blockAllocated
	return b, nil
}

// borrow serves a request of this pool's stream from another pool's free
// memory that is already backed, where this pool's own would need new
// chunks (the second rung of the ladder, for blocks: see doc.go, "The stream
// contract"). Memory freed on one stream then serves another without a
// driver call once the work that used it is done: an event recorded on the
// lender's stream after the free has completed (advanceEpoch), so no wait
// is needed. Memory freed since is not lent: making this stream wait for
// the lender would order its work after all of the lender's, a prefetch
// copy behind which compute would stall. The block stays the other pool's
// and is marked used by this stream, so that freeing it waits for this
// stream's work before the other pool reuses it (as RecordStream). It
// returns the block, allocated, with its pool q still locked (the caller
// does the accounting under q.mu and unlocks), or nil. Other pools are
// only TryLocked. On the miss path of a program with several streams only.
func (p *pool) borrow(rounded uint64) *block {
	for _, q := range p.a.allPools() {
		if q == p || !q.mu.TryLock() {
			continue
		}
		if b := q.relend(p.stream, rounded); b != nil {
			return b
		}
		if q.npending > 0 {
			_ = q.processPending(false, false)
		}
		q.advanceEpoch()
		h := q.heapFor(rounded)
		if b, off := q.findLendable(h, rounded); b != nil {
			b = q.carve(h, b, rounded, off)
			q.occupy(b)
			b.state = blockAllocated
			x := b.extra()
			x.uses, x.lent = append(x.uses[:0], p.stream), true
			p.a.c.handoffs.Add(1)
			return b
		}
		q.mu.Unlock()
	}
	return nil
}

// advanceEpoch moves q's lendable horizon: the frees up to safeSeq were
// followed on q's stream by an event that has completed, so the work that
// used their memory is done. It queries the event recorded last and, once
// that has completed, records another (covering the frees since), queried
// at once: on an idle stream every free so far becomes lendable. Without
// events nothing is lendable (the alternative, a synchronize of the
// device, costs more than it saves). Called with q.mu held, on the miss
// path of another stream.
func (q *pool) advanceEpoch() {
	ev := q.a.ev
	if ev == nil {
		return
	}
	for range 2 {
		if q.epochPending {
			done, err := ev.Query(q.epochEv)
			if err != nil || !done {
				return
			}
			q.safeSeq, q.epochPending = q.epochSeq, false
		}
		if q.freeSeq == q.safeSeq {
			return
		}
		if !q.haveEpochEv {
			e, err := ev.NewEvent()
			if err != nil {
				return
			}
			q.epochEv, q.haveEpochEv = e, true
		}
		if ev.Record(q.epochEv, q.stream) != nil {
			return
		}
		q.epochSeq, q.epochPending = q.freeSeq, true
	}
}

// findLendable finds a free block of q whose memory is lendable (freed up
// to safeSeq) and a place in it for rounded bytes that is backed whole:
// the fitting blocks of every bin from the request's up, best fit first,
// at most maxCandidates of them.
func (q *pool) findLendable(h *heap, rounded uint64) (*block, uint64) {
	seen := 0
	for i := binOf(rounded); i >= 0 && seen < maxCandidates; i = h.free.nextBin(i + 1) {
		for b := h.free.heads[i]; b != nil && seen < maxCandidates; b = b.fnext {
			if b.size < rounded || b.freed > q.safeSeq || !b.seg.virtual {
				continue
			}
			seen++
			if off, m := q.placement(b, rounded, 0); m == 0 {
				return b, off
			}
		}
	}
	return nil, 0
}

// relend gives stream s back a block that q lent it and s freed, while it
// still waits for s's work: s may reuse it at once (its own work is
// ordered), as it would a block of its own pool. Only a block no other
// stream used, of rounded bytes up to relendSlack more (a pending block is
// taken whole). Called with q.mu held.
func (q *pool) relend(s device.Stream, rounded uint64) *block {
	link := &q.pending
	for b := q.pending; b != nil; link, b = &b.fnext, b.fnext {
		if x := b.x; x.lent && len(x.uses) == 1 && x.uses[0] == s && b.size >= rounded && b.size-rounded <= rounded/relendSlack {
			*link = b.fnext
			b.fnext = nil
			q.npending--
			q.spareEvents = append(q.spareEvents, x.events...)
			x.events = x.events[:0]
			b.state = blockAllocated
			return b
		}
	}
	return nil
}

// relendSlack: a pending lent block serves a request at most 1/relendSlack
// smaller (the rest would otherwise wait with it).
const relendSlack = 8

// carve takes b out of the free index and cuts [b.addr+off, +rounded) out of
// it, leaving what comes before and after as free blocks. Their outer
// neighbours are never free (free blocks are never neighbours), so they need
// no coalescing.
func (p *pool) carve(h *heap, b *block, rounded, off uint64) *block {
	h.free.remove(b)
	if off > 0 {
		n := p.newBlock()
		n.seg, n.addr, n.size, n.freed = b.seg, b.addr, off, b.freed
		n.prev, n.next = b.prev, b
		if b.prev != nil {
			b.prev.next = n
		} else {
			b.seg.first = n
		}
		b.prev = n
		b.addr += off
		b.size -= off
		h.free.insert(n)
	}
	if rest := b.size - rounded; rest >= minBlock {
		n := p.newBlock()
		n.seg, n.addr, n.size, n.freed = b.seg, b.addr+rounded, rest, b.freed
		n.prev, n.next = b, b.next
		if b.next != nil {
			b.next.prev = n
		}
		b.next = n
		b.size = rounded
		h.free.insert(n)
	}
	return b
}

// freeBlock returns an allocated block: at once if only its own stream used
// it, else after events recorded now on the other streams complete.
func (p *pool) freeBlock(b *block) {
	if b.hasUses() {
		p.deferFree(b)
		return
	}
	b.req = 0
	p.release(b, true)
}

// release makes b free: it unbacks its chunks (if occupied), coalesces it
// with free neighbours and indexes it.
func (p *pool) release(b *block, occupied bool) {
	h := &b.seg.heap.free
	if b.seg.virtual && occupied {
		p.vacate(b)
	}
	b.state, b.req, b.scope = blockFree, 0, nil
	if b.x != nil {
		b.x.site = nil
	}
	if n := b.next; n != nil && n.state == blockFree {
		h.remove(n)
		p.absorb(b, n)
	}
	if pr := b.prev; pr != nil && pr.state == blockFree {
		h.remove(pr)
		p.absorb(pr, b)
		b = pr
	}
	p.freeSeq++
	b.freed = p.freeSeq
	h.insert(b)
}

// absorb merges block n, b's successor, into b and recycles n.
func (p *pool) absorb(b, n *block) {
	b.size += n.size
	b.next = n.next
	if n.next != nil {
		n.next.prev = b
	}
	p.putBlock(n)
}

// deferFree parks b on the pending list until the work of the other
// streams that used it has completed: it records an event on each of them.
// Without events, or if recording fails, the block waits with no events for
// the next processPending, which synchronizes the whole device first.
func (p *pool) deferFree(b *block) {
	x := b.x
	if ev := p.a.ev; ev != nil {
		for _, s := range x.uses {
			e, err := p.event()
			if err != nil {
				p.dropEvents(b)
				break
			}
			if err := ev.Record(e, s); err != nil {
				p.spareEvents = append(p.spareEvents, e)
				p.dropEvents(b)
				break
			}
			x.events = append(x.events, e)
		}
	}
	b.state = blockPending
	b.req = 0
	b.fnext = p.pending
	p.pending = b
	p.npending++
}

// dropEvents gives up on b's events: b will wait for a device synchronize.
func (p *pool) dropEvents(b *block) {
	p.spareEvents = append(p.spareEvents, b.x.events...)
	b.x.events = b.x.events[:0]
}

// processPending frees the pending blocks whose events have completed (all
// of them, waiting, when wait is set). Blocks without events (no event
// support, or recording failed) need the whole device synchronized: done
// only when sync is set; otherwise they stay pending.
func (p *pool) processPending(wait, sync bool) error {
	ev := p.a.ev
	var errs []error
	synced := false
	for b := p.pending; b != nil && sync; b = b.fnext {
		if len(b.x.events) == 0 {
			if err := p.a.syncDevice(); err != nil {
				errs = append(errs, err)
			} else {
				synced = true
			}
			break
		}
	}
	link := &p.pending
	for b := p.pending; b != nil; {
		next := b.fnext
		done := len(b.x.events) > 0 || synced
		for _, e := range b.x.events {
			var ok bool
			var err error
			if wait {
				err = ev.Wait(e)
				ok = err == nil
			} else {
				ok, err = ev.Query(e)
			}
			if err != nil {
				errs = append(errs, err)
			}
			if !ok {
				done = false
				break
			}
		}
		if !done {
			link = &b.fnext
			b = next
			continue
		}
		*link = next
		p.npending--
		p.spareEvents = append(p.spareEvents, b.x.events...)
		b.x.events, b.x.uses, b.x.lent = b.x.events[:0], b.x.uses[:0], false
		b.fnext = nil
		p.release(b, true)
		b = next
	}
	return errors.Join(errs...)
}

// event returns a spare event of this pool, creating one if needed.
func (p *pool) event() (device.Event, error) {
	if n := len(p.spareEvents); n > 0 {
		e := p.spareEvents[n-1]
		p.spareEvents = p.spareEvents[:n-1]
		return e, nil
	}
	return p.a.ev.NewEvent()
}

// fence makes sure all work enqueued on this pool's stream so far has
// completed, so that memory it emptied can be unmapped or freed: a host
// wait on an event, or a device synchronize without events.
func (p *pool) fence() error {
	a := p.a
	a.c.fences.Add(1)
	if a.ev == nil {
		if err := a.syncDevice(); err != nil {
			return err
		}
		p.fencedSeq = p.emptySeq
		return nil
	}
	if !p.haveFenceEv {
		e, err := a.ev.NewEvent()
		if err != nil {
			if serr := a.syncDevice(); serr != nil {
				return errors.Join(err, serr)
			}
			p.fencedSeq = p.emptySeq
			return nil
		}
		p.fenceEv, p.haveFenceEv = e, true
	}
	err := a.ev.Record(p.fenceEv, p.stream)
	if err == nil {
		err = a.ev.Wait(p.fenceEv)
	}
	if err != nil {
		// A synchronize of the whole device is a stronger fence.
		if serr := a.syncDevice(); serr != nil {
			return errors.Join(err, serr)
		}
	}
	p.fencedSeq = p.emptySeq
	return nil
}

func (a *Allocator) syncDevice() error {
	a.c.fences.Add(1)
	return a.dev.Synchronize()
}

func (p *pool) newBlock() *block {
	if b := p.spare; b != nil {
		p.spare = b.fnext
		b.fnext = nil
		return b
	}
	// Allocate nodes in slabs: one Go allocation for 64 splits.
	slab := make([]block, 64)
	for i := range slab[1:] {
		n := &slab[i+1]
		n.pool, n.bin = p, -1
		n.fnext = p.spare
		p.spare = n
	}
	b := &slab[0]
	b.pool, b.bin = p, -1
	return b
}

func (p *pool) putBlock(b *block) {
	gen, x := b.gen, b.x
	if x != nil {
		x.uses, x.events, x.site, x.lent = x.uses[:0], x.events[:0], nil, false
	}
	*b = block{pool: p, bin: -1, gen: gen + 1, x: x}
	b.fnext = p.spare
	p.spare = b
}

// grow adds room for a request of rounded bytes to the heap: address space
// (virtual) or a segment (plain).
func (h *heap) grow(rounded uint64) error {
	p := h.pool
	a := p.a
	if a.mode == ModeVirtual {
		return h.reserve(rounded)
	}
	if p.adoptSegment(h.kind, rounded) {
		return nil
	}
	size := plainSegmentSize(h.kind, rounded, a.small)
	if !a.takeBudget(size) {
		exact := (rounded + segmentRound - 1) &^ (segmentRound - 1)
		if exact >= size || !a.takeBudget(exact) {
			return &shortage{cause: CauseLimit}
		}
		size = exact
	}
	ptr, err := a.dev.Alloc(size)
	if err != nil {
		a.giveBudget(size)
		if errors.Is(err, device.ErrOutOfMemory) {
			return &shortage{cause: CauseDevice, err: err}
		}
		return fmt.Errorf("gpumem: growing the %s heap of stream %d by %d bytes: %w", heapName(h.kind), p.stream, size, err)
	}
	a.c.deviceAllocs.Add(1)
	h.addSegment(uint64(ptr), size, false)
	return nil
}

// plainSegmentSize is PyTorch's proven rule: small requests share 2 MiB
// segments; requests under 10 MiB share 20 MiB segments, so that mid-sized
// tensors do not each pay for rounding; larger requests get their own
// segment rounded up to 2 MiB.
func plainSegmentSize(kind int, rounded, small uint64) uint64 {
	if kind == heapSmall {
		if rounded <= smallSegment && small <= smallSegment {
			return smallSegment
		}
		return (rounded + smallSegment - 1) &^ (smallSegment - 1)
	}
	if rounded < midLimit {
		return midSegment
	}
	return (rounded + segmentRound - 1) &^ (segmentRound - 1)
}

func heapName(kind int) string {
	if kind == heapSmall {
		return "small"
	}
	return "large"
}

// addSegment makes a segment of [base, base+size) with one free block.
func (h *heap) addSegment(base, size uint64, virtual bool) *segment {
	p := h.pool
	seg := &segment{heap: h, base: base, size: size, virtual: virtual, hiSpan: -1}
	if virtual {
		n := size / p.a.gran
		seg.chunks = make([]chunk, n)
		seg.ready = newReadyMap(int(n))
		for i := range seg.chunks {
			seg.chunks[i].span = -1
		}
	}
	b := p.newBlock()
	b.seg, b.addr, b.size, b.state = seg, base, size, blockFree
	seg.first = b
	h.segs = append(h.segs, seg)
	h.free.insert(b)
	return seg
}

func (h *heap) removeSegment(seg *segment) {
	for i, s := range h.segs {
		if s == seg {
			h.segs = append(h.segs[:i], h.segs[i+1:]...)
			return
		}
	}
}

// mappedSpans counts the spans of p mapped in seg.
func (seg *segment) mappedSpans(p *pool) int {
	n := 0
	for i := range p.spans {
		if p.spans[i].inUse && p.spans[i].seg == seg {
			n++
		}
	}
	return n
}

func (seg *segment) isFree() bool {
	return seg.first.state == blockFree && seg.first.size == seg.size
}

// adoptSegment takes a wholly free plain segment from another stream's pool
// (the second rung of the ladder): the other stream records an event and
// this stream waits on it, so work already enqueued there finishes before
// this stream's next work touches the memory. Other pools are only
// TryLocked, so this never blocks or deadlocks.
func (p *pool) adoptSegment(kind int, rounded uint64) bool {
	a := p.a
	for _, q := range a.allPools() {
		if q == p || !q.mu.TryLock() {
			continue
		}
		var best *segment
		for _, seg := range q.heaps[kind].segs {
			if seg.isFree() && seg.size >= rounded && (best == nil || seg.size < best.size) {
				best = seg
			}
		}
		if best == nil {
			q.mu.Unlock()
			continue
		}
		if err := q.handOff(p.stream); err != nil {
			q.mu.Unlock()
			continue
		}
		qh := &q.heaps[kind]
		qh.free.remove(best.first)
		q.putBlock(best.first)
		qh.removeSegment(best)
		q.mu.Unlock()
		h := &p.heaps[kind]
		seg := h.addSegment(best.base, best.size, false)
		seg.prealloc = best.prealloc
		a.c.handoffs.Add(1)
		return true
	}
	return false
}

// handOff orders the future work of stream to after all work enqueued on
// q's stream so far.
func (q *pool) handOff(stream device.Stream) error {
	a := q.a
	if a.ev == nil {
		return a.syncDevice()
	}
	e, err := q.event()
	if err != nil {
		return err
	}
	defer func() { q.spareEvents = append(q.spareEvents, e) }()
	if err := a.ev.Record(e, q.stream); err != nil {
		return err
	}
	return a.ev.StreamWait(stream, e)
}

// trim returns this pool's cache to the device: waits for pending frees,
// releases empty spans and wholly free segments (preallocated ones only
// when all is set).
func (p *pool) trim(all bool) error {
	p.flush()
	var errs []error
	if p.npending > 0 {
		if err := p.processPending(true, true); err != nil {
			errs = append(errs, err)
		}
	}
	if err := p.releaseEmpty(0, all); err != nil {
		errs = append(errs, err)
	}
	if err := p.releaseSegments(0, all); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// releaseExcess returns cached memory until the allocator caches at most
// target bytes.
func (p *pool) releaseExcess(target uint64) {
	_ = p.releaseEmpty(target, false)
	_ = p.releaseSegments(target, false)
}

// releaseSegments frees wholly free plain segments while more than target
// bytes are cached.
func (p *pool) releaseSegments(target uint64, all bool) error {
	a := p.a
	fenced := false
	var errs []error
	for k := range p.heaps {
		h := &p.heaps[k]
		for i := 0; i < len(h.segs); i++ {
			seg := h.segs[i]
			if seg.virtual || !seg.isFree() || (seg.prealloc && !all) || (target > 0 && a.cached() <= target) {
				continue
			}
			if !fenced {
				if err := p.fence(); err != nil {
					return err
				}
				fenced = true
			}
			if err := a.dev.Free(device.Ptr(seg.base)); err != nil {
				errs = append(errs, fmt.Errorf("gpumem: freeing segment 0x%x of %d bytes: %w", seg.base, seg.size, err))
				continue
			}
			a.c.deviceFrees.Add(1)
			a.giveBudget(seg.size)
			h.free.remove(seg.first)
			p.putBlock(seg.first)
			h.removeSegment(seg)
			i--
		}
	}
	return errors.Join(errs...)
}

// teardown releases the address space and events of a fully trimmed pool
// (Close).
func (p *pool) teardown() error {
	a := p.a
	var errs []error
	// Segments that cannot go back yet stay listed, so that a later Close
	// can try again.
	for k := range p.heaps {
		h := &p.heaps[k]
		kept := h.segs[:0]
		for _, seg := range h.segs {
			switch {
			case !seg.isFree():
				errs = append(errs, fmt.Errorf("gpumem: Close: segment 0x%x still has blocks in use", seg.base))
				kept = append(kept, seg)
				continue
			case !seg.virtual:
				// trim frees every free plain segment; this one failed.
				errs = append(errs, fmt.Errorf("gpumem: Close: segment 0x%x of %d bytes could not be freed", seg.base, seg.size))
				kept = append(kept, seg)
				continue
			}
			if n := seg.mappedSpans(p); n > 0 {
				// Releasing address space with mappings in it is a
				// precondition violation: keep it, and say so.
				errs = append(errs, fmt.Errorf("gpumem: Close: %d spans of arena 0x%x could not be unmapped; its address space is kept", n, seg.base))
				kept = append(kept, seg)
				continue
			}
			if err := a.vm.ReleaseAddress(device.Ptr(seg.base), seg.size); err != nil {
				errs = append(errs, err)
				kept = append(kept, seg)
				continue
			}
			h.free.remove(seg.first)
			p.putBlock(seg.first)
		}
		clear(h.segs[len(kept):])
		h.segs = kept
	}
	if a.ev != nil {
		if p.haveFenceEv {
			errs = append(errs, a.ev.DestroyEvent(p.fenceEv))
			p.haveFenceEv = false
		}
		if p.haveEpochEv {
			errs = append(errs, a.ev.DestroyEvent(p.epochEv))
			p.haveEpochEv, p.epochPending = false, false
		}
		for _, e := range p.spareEvents {
			errs = append(errs, a.ev.DestroyEvent(e))
		}
		p.spareEvents = nil
	}
	return errors.Join(errs...)
}

// reclaim returns every pool's cache to the device (keeping preallocation),
// after waiting for pending frees. Called with no pool lock held, before an
// allocation's one retry.
func (a *Allocator) reclaim() {
	for _, p := range a.allPools() {
		p.mu.Lock()
		_ = p.trim(false)
		p.mu.Unlock()
	}
}

// lentTo counts the buffers of this pool allocated and still used by
// stream s (lent by borrow, or named by RecordStream).
func (p *pool) lentTo(s device.Stream) int {
	n := 0
	for k := range p.heaps {
		for _, seg := range p.heaps[k].segs {
			for b := seg.first; b != nil; b = b.next {
				if b.state == blockAllocated && b.x != nil && slices.Contains(b.x.uses, s) {
					n++
				}
			}
		}
	}
	return n
}

// leaks lists the buffers still allocated in this pool.
func (p *pool) leaks() []LeakedBuffer {
	var out []LeakedBuffer
	for k := range p.heaps {
		for _, seg := range p.heaps[k].segs {
			for b := seg.first; b != nil; b = b.next {
				if b.state == blockAllocated {
					out = append(out, p.leakOf(b))
				}
			}
		}
	}
	return out
}
