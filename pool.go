package gpumem

// See doc.go for the overview.

import (
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gpumem/gpumem/device"
)

// Heap kinds: requests up to Config.SmallSize are served from the small
// heap, the rest from the large heap. Each pool has one of each.
const (
	heapSmall = iota
	heapLarge
	numHeaps
)

// A pool is one arena's worth of state: its heaps, its spans, its pending
// frees, and the streams it serves. In ModeVirtual one pool serves every
// stream of the allocator (one address range: free ranges of all streams
// coalesce; see "The stream contract" in doc.go for how a block freed on
// one stream is kept from the others until that stream's work is done); in
// ModePlain each stream has a pool of its own. All fields are guarded by
// mu unless noted. Locks are taken pool by pool; a pool that needs another
// pool's memory while holding its own lock only ever TryLocks the other, so
// pools never deadlock.
type pool struct {
	a      *Allocator    // immutable
	stream device.Stream // the first stream served (messages, snapshots)
	_      [64]byte      // keeps mu and the hot fields after it off others' lines
	mu     sync.Mutex

	heaps [numHeaps]heap

	spare    *block // recycled block nodes, linked through fnext
	pending  *block // freed blocks waiting for events, linked through fnext
	npending int
	nmarked  int // pending blocks with capture markers (capture.go)

	// spans back this pool's virtual segments (vm.go); empty lists those
	// with no live chunk, oldest first. They still count as reserved; a
	// pool that needs memory remaps or releases them (newSpan).
	spans               []span
	freeSlots           []int32
	empty               spanList
	mappedChunks        int
	emptySeq, fencedSeq uint64          // span emptyings so far (a batch's count once: pushEmpty) / covered by the last fence
	emptyBatch          uint32          // the batch (pool.batch) of the last stamp taken; 0 after a fence
	emptyDirty          bool            // the empty list's last batch may be out of order (sortEmpty)
	emptyRun            []int32         // sortEmpty's scratch
	made                []int32         // spans placed by the current back (pressure.go)
	carried             []int32         // of made, those moved with work possibly still on their handles (moveSpan)
	backing             *block          // the block the current back backs (live, not yet marked so)
	ungranted           []int32         // spans the current back mapped, access to grant at its end, in one call per contiguous run (grantAll)
	stageBuf            []freePiece     // defrag's staging search, reused (defrag.go)
	hbuf                []device.Handle // handles on their way between mappings, reused (chunks.go)
	occBuf              []bool          // chunks a live block lies on, reused (splitFree)
	gbuf                []device.Handle // handles assemble gathers, reused (pressure.go)
	candBuf             []splitCand     // spans splitFree may split, reused
	churn               churnGuard      // slack against moving spans on every few requests (churn.go)
	spanLimit           int             // the most chunks a new span may have: Config.SpanSize's, grown under Compact (pressure.go, spanMost)
	// dormants are mappings left behind by moved spans (dormant.go);
	// chains[i] is the newest of span slot i's handle + 1 (0: none), kept
	// beside spans rather than in them (the span stays 48 bytes for the
	// hot path); freeDormant is the head of their free list + 1 (0: none).
	dormants    []dormant
	chains      []int32
	freeDormant int32
	nDormant    int
	nRevived    uint64 // Stats.Revived

	// search counts findBacked's work, for tests and experiments
	// (deterministic, unlike its time): searches, those findFewest
	// answered (no ready place), the placement searches findReady ran, and
	// the candidates the ready cache answered without one.
	search struct{ finds, fewest, placements, cached uint64 }

	// streams are the stream slots of the pool (block.si indexes them);
	// deadSlots lists the slots of released streams, for reuse. freeSeq
	// counts the frees of every stream: each release stamps its block with
	// it (the block's tag, see block.si).
	// Invariants: free block b.freed <= freeSeq, b.si < 0 or a live slot;
	// non-free block b.si a live slot; per slot see streamState.
	streams     []streamState
	deadSlots   []slot
	live        int // live slots
	freeSeq     uint64
	spareEvents []device.Event

	// sites counts the allocations of each call stack since the pool
	// began (Config.RecordSites only; keyed by stackKey): the alloc_*
	// sample types of the pprof profile (SiteTotals).
	sites map[string]*SiteTotal

	nallocs, nfrees uint64
	peakLive        uint64 // the most of nallocs-nfrees since ResetPeaks
	// gauges: exact for this pool; see noteAlloc.
	allocated, active         uint64
	peakAllocated, peakActive uint64
	dAllocated, dActive       int64 // not yet flushed to the allocator

	heldBound int64 // what held says, under mu

	// bytes of the blocks allocated and freed so far, and the bytes
	// requested for them (Stats.AllocBytes and the three after it)
	allocBytes, freeBytes, allocReq, freeReq uint64

	// held bounds from above the frees this pool holds back (not yet
	// flushed), for other pools' flushes (see noteFree); written only by
	// this pool. On a cache line of its own.
	_    [64]byte
	held atomic.Int64
	_    [64]byte
}

// A slot indexes pool.streams.
type slot int16

// maxStreams bounds the streams one pool serves (a slot is 16 bits).
const maxStreams = 1 << 15

// A streamState is what a pool knows of one stream it serves: how far its
// frees are known done. The frees of the stream stamped up to safe are
// done (an event recorded on the stream after them has completed, or a
// fence); those up to fenced were covered by a host wait (a fence), before
// which no span they emptied is unmapped. epochEv is the event recorded
// last, after the frees up to epochSeq (advanceEpoch); with markers
// (Allocator.mk) epochMk is written epochSeq there instead, and done once
// it reads at least that (a stream whose marker could not be made keeps
// to events).
// after[j] says how far this stream's future work is ordered after stream
// j's (orderAfter): j's frees stamped up to after[j] are behind an event
// this stream waits for on the GPU, so their memory is this stream's too.
// Invariants: last, safe, epochSeq <= pool.freeSeq; fenced <= safe (a
// fence may pass a pending epoch: safe only grows); every after[j] <=
// pool.freeSeq; a pending epoch has its event or its marker, never both,
// and a stream has a marker only where the pool uses markers.
type streamState struct {
	s                         device.Stream
	live                      bool
	last, safe, fenced        uint64
	after                     []uint64
	epochSeq                  uint64
	epochEv, fenceEv          device.Event
	haveEpochEv, epochPending bool
	epochMk                   device.Marker
	haveEpochMk               bool
	haveFenceEv               bool
	fresh                     bool // an epoch event just recorded, for pollEpochs
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
	// dormant: under Config.Compact, per chunk, the dormant mapping over it
	// (index in pool.dormants + 1; 0 for none; dormant.go). nil otherwise:
	// the default keeps none, and the chunk array stays 12 bytes a chunk.
	dormant []int32
	// hnd: under Config.ChunkHandles, per chunk, the physical handle mapped
	// over it while its span is (chunk.span ≥ 0); stale otherwise. nil
	// without (chunks.go).
	hnd []device.Handle
}

func newPool(a *Allocator, s device.Stream) *pool {
	p := &pool{a: a, stream: s, empty: spanList{head: -1, tail: -1}, spanLimit: a.spanChunks}
	for k := range p.heaps {
		p.heaps[k] = heap{pool: p, kind: k}
	}
	p.addStream(s)
	return p
}

// addStream gives stream s a slot of p and returns it. Called with p.mu
// held (or before p is published).
func (p *pool) addStream(s device.Stream) slot {
	st := streamState{s: s, live: true, last: p.freeSeq, safe: p.freeSeq, fenced: p.freeSeq}
	p.live++
	if n := len(p.deadSlots); n > 0 {
		i := p.deadSlots[n-1]
		p.deadSlots = p.deadSlots[:n-1]
		p.streams[i] = st
		return i
	}
	p.streams = append(p.streams, st)
	return slot(len(p.streams) - 1)
}

// slotOf returns the live slot of stream s in p, or -1.
func (p *pool) slotOf(s device.Stream) slot {
	for i := range p.streams {
		if p.streams[i].live && p.streams[i].s == s {
			return slot(i)
		}
	}
	return -1
}

// tagUsable reports whether memory tagged (tsi, freed) may be used by
// stream slot si now (si -1: by every stream): si's own frees may, at once;
// for tsi >= 0 the frees of stream tsi up to freed must be done; for tsi
// -1 (pieces freed by several streams, see mergeTags), the frees up to
// freed of every other stream, or it has none not done.
// A stream ordered after another's frees (orderAfter) may use them too.
func (p *pool) tagUsable(si, tsi slot, freed uint64) bool {
	if freed == 0 || tsi == si && si >= 0 {
		return true
	}
	if tsi >= 0 {
		return freed <= p.streams[tsi].safe || freed <= p.orderedAfter(si, tsi)
	}
	for i := range p.streams {
		if st := &p.streams[i]; st.live && slot(i) != si {
			if f := min(freed, st.last); f > st.safe && f > p.orderedAfter(si, slot(i)) {
				return false
			}
		}
	}
	return true
}

// orderedAfter returns how far stream slot si's future work is ordered
// after stream slot j's frees (streamState.after); 0 for si -1.
func (p *pool) orderedAfter(si, j slot) uint64 {
	if si < 0 {
		return 0
	}
	if after := p.streams[si].after; int(j) < len(after) {
		return after[j]
	}
	return 0
}

// unordered reports whether stream slot j, not si, has frees whose work is
// neither known done nor ordered before si's.
func (p *pool) unordered(si, j slot) bool {
	st := &p.streams[j]
	return j != si && st.live && st.last > st.safe && st.last > p.orderedAfter(si, j)
}

// pendingOthers reports whether any stream is unordered for slot si.
func (p *pool) pendingOthers(si slot) bool {
	for j := range p.streams {
		if p.unordered(si, slot(j)) {
			return true
		}
	}
	return false
}

// errNoWait: orderAfter cannot make a stream wait (no events, a capture
// under way, or Config.NoStreamWaits).
var errNoWait = errors.New("gpumem: no stream wait here")

// orderAfter makes stream slot si's future work wait on the GPU for the
// work enqueued so far on every other stream whose frees are neither
// known done nor ordered before si's (pendingOthers): an event recorded on
// each now, which si's stream waits for (cuStreamWaitEvent), no host
// wait. Their free memory is then si's, in si's stream order, so that si
// reuses it instead of mapping more while their work is pending, and how
// far the host ran ahead of the GPU no longer decides what a program
// holds. CUDA's own stream-ordered pools do the same by default
// (cudaMemPoolReuseAllowInternalDependencies). The cost is on the GPU: the
// event also covers the other streams' later work (a prefetch enqueued
// since, say), which si then waits for; pool.allocate orders only where
// si would otherwise map memory. Not while a stream captures (events
// there belong to the graph) nor without events.
func (p *pool) orderAfter(si slot) error {
	a := p.a
	if a.ev == nil || a.capturing() || si < 0 || a.cfg.NoStreamWaits {
		return errNoWait
	}
	me := &p.streams[si]
	for j := range p.streams {
		if !p.unordered(si, slot(j)) {
			continue
		}
		st := &p.streams[j]
		e, err := p.event()
		if err != nil {
			return err
		}
		err = a.ev.Record(e, st.s)
		if err == nil {
			err = a.ev.StreamWait(me.s, e)
		}
		p.spareEvents = append(p.spareEvents, e)
		if err != nil {
			return err
		}
		for len(me.after) <= j {
			me.after = append(me.after, 0)
		}
		me.after[j] = p.freeSeq
		a.c.orders.Add(1)
	}
	return nil
}

// tagSettled reports whether memory tagged (tsi, freed) may be used by
// every stream.
func (p *pool) tagSettled(tsi slot, freed uint64) bool { return p.tagUsable(-1, tsi, freed) }

// usable reports whether free block b may be used by stream slot si now.
func (p *pool) usable(b *block, si slot) bool {
	return b.si == si || p.tagUsable(si, b.si, b.freed)
}

// mergeTags is the tag of two coalesced free pieces: the tag of a piece
// every stream may use yields to the other's; pieces of one stream keep
// it; pieces of two streams, neither done, are reused by no stream at once.
func (p *pool) mergeTags(s1 slot, f1 uint64, s2 slot, f2 uint64) (slot, uint64) {
	switch {
	case s1 == s2:
		return s1, max(f1, f2)
	case p.tagSettled(s2, f2):
		return s1, f1
	case p.tagSettled(s1, f1):
		return s2, f2
	}
	return -1, max(f1, f2)
}

// A heap is one size class
// heapFor returns the heap that serves a request. In ModeVirtual every
// request goes to the large heap: see "Rounding and pools" in doc.go.
func (p *pool) heapFor(rounded uint64) *heap {
	if rounded <= p.a.small && p.a.mode == ModePlain {
		return &p.heaps[heapSmall]
	}
	return &p.heaps[heapLarge]
}

// allocFast is the cache-hit path: a free block that fits, in memory that is
// already backed, that stream slot si may use now. It returns nil when
// anything more is needed.
func (p *pool) allocFast(rounded uint64, si slot) *block {
	h := p.heapFor(rounded)
	b := h.free.find(rounded)
	if b == nil {
		return nil
	}
	if b.si != si {
		if !p.tagUsable(si, b.si, b.freed) {
			return nil
		}
		if b.si >= 0 {
			p.a.c.handoffs.Add(1)
		}
	}
	if !b.seg.virtual {
		if p.a.noSplit {
			if !wholeFits(b, rounded) {
				return nil
			}
			rounded = b.size // taken whole: no remainder to split off
		}
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

func (p *pool) allocate(rounded uint64, si slot) (*block, error) {
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
	if p.live > 1 {
		p.advanceEpochs(si)
	}
	b := p.findPlain(h, rounded)
	if b == nil && p.npending > 0 {
		// Frees without events wait for a device synchronize: only when
		// nothing else fits.
		if err := p.processPending(false, true); err != nil {
			return nil, err
		}
		b = p.findPlain(h, rounded)
	}
	if b == nil {
		if err := h.grow(rounded); err != nil {
			return nil, err
		}
		if p.a.noSplit {
			b = h.segs[len(h.segs)-1].first // made for this request
		} else if b = h.free.find(rounded); b == nil {
			panic("gpumem: grown heap has no block that fits")
		}
	}
	var off uint64
	// Config.Compact places every request at the start of its best fit
	// (if its stream may use it), mapped or not, and so does the default
	// once it holds more than half its limit (tight, pressure.go);
	// otherwise the best place is searched for among the fitting blocks
	// over memory already mapped.
	compact := p.a.compact || p.a.tight()
	if b.seg.virtual && compact && !p.usable(b, si) && p.pendingOthers(si) {
		_ = p.orderAfter(si) // b may be si's now (see below); if not, a search
	}
	if b.seg.virtual && !(compact && p.usable(b, si)) {
		first := b
		var ok bool
		var missing int
		if b, off, missing, ok = p.findBacked(h, first, rounded, si); missing > 0 || !ok {
			// No place ready for si: memory other streams freed, their
			// work pending, serves it once si waits for that work on
			// the GPU, rather than si mapping more (orderAfter).
			if p.pendingOthers(si) && p.orderAfter(si) == nil {
				b, off, _, ok = p.findBacked(h, first, rounded, si)
			}
		}
		if !ok {
			// Every fitting free range is another stream's, its work not
			// known done, with no unmapped room: more address space.
			if err := h.grow(rounded); err != nil {
				return nil, err
			}
			b, off = h.segs[len(h.segs)-1].first, 0
		}
	}
	if b.si != si && b.si >= 0 {
		p.a.c.handoffs.Add(1)
	}
	if p.a.noSplit {
		rounded = b.size // taken whole (PrivateConfig.NoSplit; plain: off is 0)
	}
	b = p.carve(h, b, rounded, off)
	if b.seg.virtual {
		grew, err := p.back(b, si)
		if grew {
			p.readyNear(b)
		}
		if err != nil {
			p.release(b, false)
			return nil, err
		}
	}
	b.state = blockAllocated
	return b, nil
}

// findPlain is h.free.find, but under PrivateConfig.NoSplit only a block
// that fits whole.
func (p *pool) findPlain(h *heap, rounded uint64) *block {
	b := h.free.find(rounded)
	if b != nil && p.a.noSplit && !wholeFits(b, rounded) {
		return nil // the best fit is too big: all are
	}
	return b
}

// wholeFits reports whether free block b may serve a request of rounded
// bytes whole (PrivateConfig.NoSplit): at most half of it unused.
func wholeFits(b *block, rounded uint64) bool { return b.size <= 2*rounded }

// advanceEpochs moves the horizons of the streams other than slot si that
// have frees not known done (advanceEpoch): with several streams, on the
// slow path, before a search, so that memory whose use is over is found.
func (p *pool) advanceEpochs(si slot) {
	fresh := false
	for i := range p.streams {
		if st := &p.streams[i]; st.live && slot(i) != si && st.last > st.safe {
			st.fresh = p.advanceEpoch(st)
			fresh = fresh || st.fresh
		}
	}
	if fresh {
		p.pollEpochs()
	}
}

// pollEpochs polls the epoch events advanceEpoch has just recorded
// (streamState.fresh). A GPU reaches a record some microseconds after it
// is made, even on an idle stream, so the query that follows at once
// finds it pending, and the asking stream grows rather than reuse the
// other streams' frees: on a real run of a two-stream program, twice the
// driver calls of its replay and 10% more memory (docs/BENCHMARKS.md,
// "Does the replay of a run's trace hold what the run held?"). So the
// fresh events are polled a little first, all of them together: at most
// epochPolls rounds within epochPollTime, about what a create costs,
// whatever the number of streams. Streams that stay busy cost that much a
// slow path; idle ones are found done. Markers are read, not queried: a
// round is loads, so the rounds are spread over epochPollTime (round k
// not before k/epochPolls of it), the GPU given as long to get there as
// with events, and there are always epochPolls of them: on the simulated
// device, whose GPU moves by reads (sim.Config.QueryLag), what a poll
// finds does not depend on how fast the host ran.
func (p *pool) pollEpochs() {
	markers := p.a.mk != nil
	t0 := time.Now()
	for k := 0; k < epochPolls; k++ {
		if markers {
			for time.Since(t0) < time.Duration(k)*epochPollTime/epochPolls {
				// spin: round k waits for k/epochPolls of the poll time
			}
		} else if k > 0 && time.Since(t0) >= epochPollTime {
			break // the first round always runs: a thread descheduled after t0 still polls once
		}
		left := false
		for i := range p.streams {
			st := &p.streams[i]
			if !st.fresh {
				continue
			}
			done, err := p.epochDone(st)
			switch {
			case err != nil:
				st.fresh = false
			case done:
				st.safe, st.epochPending, st.fresh = max(st.safe, st.epochSeq), false, false
			default:
				left = true
			}
		}
		if !left {
			return
		}
	}
	for i := range p.streams {
		p.streams[i].fresh = false
	}
}

// advanceEpoch moves stream st's horizon: its frees up to safe were
// followed on its stream by an event that has completed, so the work that
// used their memory is done. It queries the event recorded last and, once
// that has completed, records another (covering the frees since) and
// reports it fresh, for pollEpochs: on an idle stream every free so far
// becomes usable by all.
// Memory freed since is not: making another stream wait for st's would
// order its work after all of st's, a prefetch copy behind which compute
// would stall. Without events nothing advances (a synchronize of the
// device costs more than it saves; a fence advances it too).
func (p *pool) advanceEpoch(st *streamState) (fresh bool) {
	ev := p.a.ev
	if ev == nil || p.a.capturing() {
		return false
	}
	if st.epochPending {
		done, err := p.epochDone(st)
		if err != nil || !done {
			return false
		}
		st.safe, st.epochPending = max(st.safe, st.epochSeq), false
	}
	if st.last <= st.safe {
		return false
	}
	if mk := p.a.mk; mk != nil && !st.haveEpochMk && !st.haveEpochEv {
		// A stream's first epoch: a marker, or, where the device makes
		// none (no 64-bit stream memory operations, pinned host memory
		// refused), events for this stream from now on.
		if m, err := mk.NewMarker(); err == nil {
			st.epochMk, st.haveEpochMk = m, true
		}
	}
	if st.haveEpochMk {
		// freeSeq > the last epochSeq (last > safe): the values grow.
		if p.a.mk.Mark(st.epochMk, st.s, p.freeSeq) != nil {
			return false
		}
	} else {
		if !st.haveEpochEv {
			e, err := ev.NewEvent()
			if err != nil {
				return false
			}
			st.epochEv, st.haveEpochEv = e, true
		}
		if ev.Record(st.epochEv, st.s) != nil {
			return false
		}
	}
	st.epochSeq, st.epochPending = p.freeSeq, true
	return true
}

// epochDone reports whether st's pending epoch is done: its marker reads
// epochSeq (a load), or its event has completed (a driver call).
func (p *pool) epochDone(st *streamState) (bool, error) {
	if st.haveEpochMk {
		return p.a.mk.Reached(st.epochMk) >= st.epochSeq, nil
	}
	return p.a.ev.Query(st.epochEv)
}

// epochPolls and epochPollTime bound pollEpochs.
const (
	epochPolls    = 16
	epochPollTime = 20 * time.Microsecond
)

// carve takes b out of the free index and cuts [b.addr+off, +rounded) out of
// it, leaving what comes before and after as free blocks. Their outer
// neighbours are never free (free blocks are never neighbours), so they need
// no coalescing.
func (p *pool) carve(h *heap, b *block, rounded, off uint64) *block {
	h.free.remove(b)
	if off > 0 {
		n := p.newBlock()
		n.seg, n.addr, n.size, n.freed, n.si = b.seg, b.addr, off, b.freed, b.si
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
		n.seg, n.addr, n.size, n.freed, n.si = b.seg, b.addr+rounded, rest, b.freed, b.si
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
// with free neighbours and indexes it, tagged with a free of its stream
// (b.si) merged with its neighbours' tags (mergeTags).
func (p *pool) release(b *block, occupied bool) {
	h := &b.seg.heap.free
	if b.seg.virtual && occupied {
		p.vacate(b)
	}
	b.state, b.req, b.scope = blockFree, 0, nil
	b.nzFrom = 0 // its range may have changed since: see block.nzFrom
	if b.x != nil {
		b.x.site = nil
	}
	p.freeSeq++
	si, f := b.si, p.freeSeq
	if si >= 0 {
		p.streams[si].last = f
	}
	// The block's key in its batch (block.batch): the latest request freed
	// into it in this batch, whatever the order of the batch's frees.
	cur, key := p.batch(), b.id
	if n := b.next; n != nil && n.state == blockFree {
		if n.batch == cur {
			key = max(key, n.id)
		}
		h.remove(n)
		if n.si != si {
			si, f = p.mergeTags(si, f, n.si, n.freed)
		}
		p.absorb(b, n)
	}
	if pr := b.prev; pr != nil && pr.state == blockFree {
		if pr.batch == cur {
			key = max(key, pr.id)
		}
		h.remove(pr)
		if pr.si != si {
			si, f = p.mergeTags(pr.si, pr.freed, si, f)
		} else {
			f = max(f, pr.freed)
		}
		p.absorb(pr, b)
		b = pr
	}
	b.si, b.freed = si, f
	b.batch, b.id = cur, key
	h.insertFresh(b)
}

// settle puts the latest batch of frees in its order (pool.batch), in the
// free index and on the empty list, before the pool decides anything from
// either: at each allocation, before releasing memory down to a target,
// and before a trim (whose fences start a new stamp: sortEmpty sorts the
// last stamp's spans only). Never inside a walk of the empty list.
func (p *pool) settle() {
	if len(p.heaps[heapSmall].free.dirty)+len(p.heaps[heapLarge].free.dirty) > 0 || p.emptyDirty {
		p.settleBatch()
	}
}

func (p *pool) settleBatch() {
	for k := range p.heaps {
		p.heaps[k].free.sortFresh()
	}
	if p.emptyDirty {
		p.sortEmpty()
	}
}

// batch numbers the frees between two allocations: what a program frees
// at once (a list of tensors, a graph torn down, a collection by Python's
// garbage collector) comes in an order it does not choose and that may
// differ from run to run. The free index keeps each batch in the order of
// the requests freed (freeIndex.insertFresh), the empty list by address
// (pushEmpty), not in the order of the frees, so that what the
// allocator does next depends on which blocks were freed, never on their
// order: the same program holds the same memory in every run. The free
// index's order is the one its LIFO lists gave where a batch frees in
// reverse order of allocation, as 426,000 of the 614,000 ordered batches
// of the 46 real traces do (188,000 in allocation order, 230,000 neither):
// the block of the earliest request first in its bin; and the empty list's,
// highest address first, is the one a batch freeing in reverse order of
// allocation mostly gave (TestSecondPassReusesSpans: lowest first made a
// sweep of models create 11 spans again in its second pass, not 3).
// (Ordering the empty list by its requests too broke the guarantee: which
// free empties a span depends on the order of the frees onto it.) Without
// it, of the 46 real
// traces 34 peaked differently (by up to 3.1%, voxel_bev: 1,224 and 1,268
// MiB in real runs of the same program) when each batch of frees was
// replayed in address order and in reverse (docs/EXPERIMENTS.md, "The
// order of a batch of frees"). Never 0 (0 is no batch: block.batch).
func (p *pool) batch() uint32 { return uint32(p.nallocs) + 1 }

// absorb merges block n, b's successor, into b and recycles n.
func (p *pool) absorb(b, n *block) {
	b.size += n.size
	b.nzFrom = 0 // see block.nzFrom
	b.next = n.next
	if n.next != nil {
		n.next.prev = b
	}
	p.putBlock(n)
}

// deferFree parks b on the pending list until the work of the other
// streams that used it has completed: it records an event on each of them.
// During a capture no event may be recorded: the block waits for the
// capture's end (or, with SetCaptureReuse, for its streams' work to be
// joined: markFree), and the first processPending after the capture
// records its events then, as it does for a block whose recording failed.
// On a device without events the block waits for a processPending that
// synchronizes the whole device first.
func (p *pool) deferFree(b *block) {
	if p.a.capturing() {
		p.markFree(b)
	} else {
		p.recordUses(b)
	}
	b.state = blockPending
	b.req = 0
	b.fnext = p.pending
	p.pending = b
	p.npending++
}

// dropMarkers forgets pending block b's capture markers, if it has any.
func (p *pool) dropMarkers(b *block) {
	if x := b.x; len(x.markers) > 0 {
		p.nmarked--
		x.markers = x.markers[:0]
	}
}

// recordUses records an event on each stream that used b (its uses), after
// the work enqueued there so far; on any failure b keeps none (it waits
// for a device synchronize). Not during a capture.
func (p *pool) recordUses(b *block) {
	ev := p.a.ev
	if ev == nil {
		return
	}
	x := b.x
	for _, s := range x.uses {
		e, err := p.event()
		if err != nil {
			p.dropEvents(b)
			return
		}
		if err := ev.Record(e, s); err != nil {
			p.spareEvents = append(p.spareEvents, e)
			p.dropEvents(b)
			return
		}
		x.events = append(x.events, e)
	}
}

// dropEvents gives up on b's events: b will wait for a device synchronize.
func (p *pool) dropEvents(b *block) {
	p.spareEvents = append(p.spareEvents, b.x.events...)
	b.x.events = b.x.events[:0]
}

// processPending frees the pending blocks whose events have completed (all
// of them, waiting, when wait is set). A block without events gets them
// first; where it still has none (no event support, or recording failed
// again) it needs the whole device synchronized: done only when sync is
// set; otherwise it stays pending.
func (p *pool) processPending(wait, sync bool) error {
	if p.a.capturing() {
		return nil // no event is queried while a capture is underway
	}
	ev := p.a.ev
	if ev != nil {
		// Blocks without events (freed during a capture, now over, or
		// whose recording failed) get them now, after all the work
		// enqueued so far (PyTorch's allocator records a capture's at its
		// end), rather than wait for a device synchronize.
		for b := p.pending; b != nil; b = b.fnext {
			if len(b.x.events) == 0 {
				p.dropMarkers(b)
				p.recordUses(b)
			}
		}
	}
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
		p.unpend(b)
		b = next
	}
	return errors.Join(errs...)
}

// unpend frees pending block b, already unlinked from the pending list.
func (p *pool) unpend(b *block) {
	p.npending--
	x := b.x
	p.dropMarkers(b)
	p.spareEvents = append(p.spareEvents, x.events...)
	x.events, x.uses = x.events[:0], x.uses[:0]
	b.fnext = nil
	p.release(b, true)
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

// fence makes sure all work enqueued so far on the streams that freed
// memory of this pool since their last fence has completed, so that the
// spans it emptied can be unmapped or freed: a host wait on an event per
// such stream, or a device synchronize without events. A stream that freed
// nothing since its last fence is not waited for: its work since touches
// only memory it still holds, which keeps its spans occupied.
func (p *pool) fence() error {
	a := p.a
	if a.capturing() {
		return errCapturing
	}
	synced := false
	for i := range p.streams {
		st := &p.streams[i]
		if !st.live || st.last <= st.fenced {
			continue
		}
		if !synced && st.safe < st.last { // else an event after its frees has completed
			if a.ev == nil {
				if err := a.syncDevice(); err != nil {
					return err
				}
				synced = true // every stream at once
			} else if err := p.fenceStream(st); err != nil {
				if serr := a.syncDevice(); serr != nil {
					return errors.Join(err, serr)
				}
				synced = true // a synchronize of the device is a stronger fence
			}
		}
		st.fenced = st.last
		st.safe = max(st.safe, st.last)
	}
	p.fencedSeq = p.emptySeq
	p.emptyBatch = 0 // a span emptied from now on is not fenced: a new stamp
	return nil
}

// fenceStream waits until the work enqueued so far on st's stream has
// completed (a synchronize of the device without events; fence, above,
// synchronizes once for every stream then).
func (p *pool) fenceStream(st *streamState) error {
	a := p.a
	if a.capturing() {
		return errCapturing
	}
	if a.ev == nil {
		return a.syncDevice()
	}
	a.c.fences.Add(1)
	if !st.haveFenceEv {
		e, err := a.ev.NewEvent()
		if err != nil {
			return err
		}
		st.fenceEv, st.haveFenceEv = e, true
	}
	if err := a.ev.Record(st.fenceEv, st.s); err != nil {
		return err
	}
	return a.ev.Wait(st.fenceEv) // its time in WaitNanos (timedEvents)
}

func (a *Allocator) syncDevice() error {
	if a.capturing() {
		return errCapturing
	}
	a.c.fences.Add(1)
	defer addSince(&a.c.waitNanos, time.Now())
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
		n.pool, n.bin, n.si = p, -1, -1
		n.fnext = p.spare
		p.spare = n
	}
	b := &slab[0]
	b.pool, b.bin, b.si = p, -1, -1
	return b
}

func (p *pool) putBlock(b *block) {
	gen, x := b.gen, b.x
	if x != nil {
		x.uses, x.events, x.site = x.uses[:0], x.events[:0], nil
	}
	*b = block{pool: p, bin: -1, gen: gen + 1, x: x}
	b.si = -1 // a separate store: in the literal it measured 7 ns more per pair
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
	if a.noSplit {
		size = rounded // a segment of its own (PrivateConfig.NoSplit)
		if h.kind == heapLarge {
			size = (rounded + segmentRound - 1) &^ (segmentRound - 1)
		}
	}
	if !a.takeBudget(size) {
		exact := (rounded + segmentRound - 1) &^ (segmentRound - 1)
		if exact >= size || !a.takeBudget(exact) {
			return &shortage{cause: CauseLimit}
		}
		size = exact
	}
	ptr, err := a.segmentAlloc(size, p.stream)
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

// segmentAlloc takes a plain segment of size bytes for stream s: from the
// private pool's SegmentSource, or from the device.
func (a *Allocator) segmentAlloc(size uint64, s device.Stream) (device.Ptr, error) {
	if a.segs != nil {
		return a.segs.Alloc(size, s)
	}
	defer addSince(&a.c.driverNanos, time.Now())
	return a.dev.Alloc(size)
}

// segmentFree gives back what segmentAlloc took.
func (a *Allocator) segmentFree(base, size uint64, s device.Stream) error {
	if a.segs != nil {
		return a.segs.Free(device.Ptr(base), size, s)
	}
	defer addSince(&a.c.driverNanos, time.Now())
	return a.dev.Free(device.Ptr(base))
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
		if p.a.compact || p.a.tightens {
			seg.dormant = make([]int32, n)
		}
		if p.a.chunkHandles {
			seg.hnd = make([]device.Handle, n)
		}
		for i := range seg.chunks {
			seg.chunks[i].span = -1
		}
	}
	b := p.newBlock()
	b.seg, b.addr, b.size, b.state, b.si, b.freed = seg, base, size, blockFree, -1, 0
	seg.first = b
	h.segs = append(h.segs, seg)
	h.free.insert(b)
	maxTo64(&p.a.peakSegments, p.a.segments.Add(1))
	return seg
}

// maxTo64 raises *v to x if x is larger.
func maxTo64(v *atomic.Int64, x int64) {
	for {
		old := v.Load()
		if x <= old || v.CompareAndSwap(old, x) {
			return
		}
	}
}

func (h *heap) removeSegment(seg *segment) {
	for i, s := range h.segs {
		if s == seg {
			h.segs = append(h.segs[:i], h.segs[i+1:]...)
			h.pool.a.segments.Add(-1)
			return
		}
	}
}

// mappingsIn counts the mappings p holds in seg: its spans and dormant
// mappings (dormant.go).
func (seg *segment) mappingsIn(p *pool) int {
	n := 0
	for i := range p.spans {
		if p.spans[i].inUse && p.spans[i].seg == seg {
			n++
		}
	}
	for k := range p.dormants {
		if p.dormants[k].inUse && p.dormants[k].seg == seg {
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
			if seg.isFree() && seg.size >= rounded && (!a.noSplit || seg.size <= 2*rounded) && (best == nil || seg.size < best.size) {
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
	if a.capturing() {
		return errCapturing
	}
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
	p.settle() // before its fences start new stamps (pushEmpty)
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
			if err := a.segmentFree(seg.base, seg.size, p.stream); err != nil {
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
			if n := seg.mappingsIn(p); n > 0 {
				// Releasing address space with mappings in it is a
				// precondition violation: keep it, and say so.
				errs = append(errs, fmt.Errorf("gpumem: Close: %d mappings in arena 0x%x could not be unmapped; its address space is kept", n, seg.base))
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
		for i := range p.streams {
			errs = append(errs, p.streams[i].dropEvents(a.ev, a.mk))
		}
		for _, e := range p.spareEvents {
			errs = append(errs, a.ev.DestroyEvent(e))
		}
		p.spareEvents = nil
	}
	return errors.Join(errs...)
}

// dropEvents destroys the stream's fence and epoch events and its marker
// (mk: the allocator's markers, or nil).
func (st *streamState) dropEvents(ev device.Events, mk device.Markers) error {
	var errs []error
	if st.haveEpochMk {
		errs = append(errs, mk.DestroyMarker(st.epochMk))
		st.haveEpochMk, st.epochPending = false, false
	}
	if st.haveFenceEv {
		errs = append(errs, ev.DestroyEvent(st.fenceEv))
		st.haveFenceEv = false
	}
	if st.haveEpochEv {
		errs = append(errs, ev.DestroyEvent(st.epochEv))
		st.haveEpochEv, st.epochPending = false, false
	}
	return errors.Join(errs...)
}

// lentTo counts the buffers of this pool allocated and still used by
// stream s (named by RecordStream).
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

// liveOn counts the buffers of this pool allocated on stream slot si and
// not freed.
func (p *pool) liveOn(si slot) int {
	n := 0
	for k := range p.heaps {
		for _, seg := range p.heaps[k].segs {
			for b := seg.first; b != nil; b = b.next {
				if b.state == blockAllocated && b.si == si {
					n++
				}
			}
		}
	}
	return n
}

// dropStream forgets stream slot si of a pool that serves other streams
// too (ReleaseStream): it waits for the stream's work, so that the memory
// it freed may serve every stream at once, retags that memory as no
// stream's, destroys the stream's events and frees the slot. Called with
// p.mu held, with no live buffer on the stream.
func (p *pool) dropStream(si slot) error {
	st := &p.streams[si]
	if p.npending > 0 {
		if err := p.processPending(true, true); err != nil {
			return err
		}
		for b := p.pending; b != nil; b = b.fnext {
			if b.si == si || slices.Contains(b.x.uses, st.s) {
				return fmt.Errorf("a free of 0x%x on or for the stream still waits for other streams", b.addr)
			}
		}
	}
	if err := p.fenceStream(st); err != nil {
		return err
	}
	for k := range p.heaps {
		for _, seg := range p.heaps[k].segs {
			for b := seg.first; b != nil; b = b.next {
				if b.state == blockFree && b.si == si {
					b.si, b.freed = -1, 0
				}
			}
		}
	}
	var err error
	if ev := p.a.ev; ev != nil {
		err = st.dropEvents(ev, p.a.mk)
	}
	s := st.s
	*st = streamState{}
	p.deadSlots = append(p.deadSlots, si)
	p.live--
	if p.stream == s {
		for i := range p.streams {
			if p.streams[i].live {
				p.stream = p.streams[i].s
				break
			}
		}
	}
	return err
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
