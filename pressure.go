package gpumem

// See doc.go for the overview.

import (
	"cmp"
	"errors"
	"fmt"
	"slices"

	"github.com/gpumem/gpumem/device"
)

// Growth and memory pressure: how a placed block gets its memory (at the
// end of this file: back, runEnd, spanMost, newSpan), and what the
// allocator does as memory gets short, in the order it does it. The
// steps that act only when memory is short are here too; the others live
// beside the structure they change (placement in place.go, the mechanics
// of mapping in vm.go and dormant.go), and are named here so that the
// whole policy can be read from one place. Calls go down from here to
// mapping, never up.
//
// While memory is plentiful:
//   - placement prefers memory already mapped (place.go), and growth at
//     the frontier takes spans ahead of the request (runEnd, below);
//   - a program that moves spans every few requests gets a slack of
//     memory beside its empty spans instead (churn.go).
// As the allocator nears its limit:
//   - the frontier's bet ahead shrinks with the room left under the limit
//     (runEnd, aheadShare);
//   - a request that could never fit is refused before anything is taken
//     (feasible, below);
//   - growth first moves an empty span of the right size, or releases
//     empty spans, oldest first, this pool's and then others', before the
//     device is asked for memory (newSpan and makeRoom, below);
//   - under Config.Defrag, growth past peak active + 1% splits sparse
//     spans first (defrag.go).
// When a request does not fit (a shortage, pool.allocSlow below):
//  1. pending frees are waited for and the streams fenced
//     (Allocator.makeRoomFor; with several pools every pool's cache goes
//     back to the device, Allocator.reclaim) and the request is tried
//     again. The spans a failed attempt mapped stay, empty (back, below):
//     the retry reuses them, and releases empty spans only as far as it
//     needs;
//  2. under Config.Gather, sparse spans are split one at a time, the
//     request tried again after each (gather, below; the split is in
//     defrag.go);
//  3. with one pool that holds empty spans, every pool's cache goes back
//     to the device (Allocator.reclaim) and the request is tried once
//     more;
//  4. the empty spans go back to the device and the request fails with an
//     *OutOfMemoryError and the verdict (oom.go).
// Config.Compact is the policy that is tight all the time: best-fit
// placement whatever is mapped, small spans, dormant mappings.

// shortage is the internal error of a request that needs more memory than
// the limit or the device allows; allocSlow turns it into an
// OutOfMemoryError once the retry (and under Config.Gather the
// gathering) did not help.
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

// allocSlow is the rest of the ladder (see doc.go): pending frees whose
// events are done, growth, and on a shortage one wait for every pending
// free and a retry (makeRoomFor), then under Config.Gather a split and a
// retry at a time, then the whole cache given back and a last retry.
func (p *pool) allocSlow(rounded, size uint64, si slot) (*block, error) {
	a := p.a
	if size > a.root.limit.Load() {
		// More than the limit (at most the device's memory): no memory
		// could ever serve it. It fails at once, before an arena is
		// reserved for it (address space, and books on the host in
		// proportion to it: a petabyte took minutes and gigabytes) and
		// before the retries give every cached byte back for nothing.
		return nil, p.oom(size, si, &shortage{cause: CauseLimit})
	}
	b, err := p.allocate(rounded, si)
	if err == nil {
		return b, nil
	}
	var sh *shortage
	if !errors.As(err, &sh) {
		return nil, err
	}
	a.c.retries.Add(1)
	p.mu.Unlock()
	a.makeRoomFor(p)
	p.mu.Lock()
	if b, err = p.allocate(rounded, si); err == nil {
		return b, nil
	}
	if !errors.As(err, &sh) {
		return nil, err
	}
	for a.gathers() {
		split, gerr := p.gather()
		if gerr != nil {
			return nil, gerr
		}
		if !split {
			break
		}
		if b, err = p.allocate(rounded, si); err == nil {
			return b, nil
		}
		if !errors.As(err, &sh) {
			return nil, err
		}
	}
	if a.Lone() && !a.keep && p.empty.n > 0 {
		// Last, where the retries kept empty spans: every pool's cache
		// back to the device, then the request once more. A request the
		// retries placed where nothing was mapped may now land where
		// those spans were (infer_server: a ten-pass fit of 970 MiB
		// rather than 980; docs/EXPERIMENTS.md, "A failed backing keeps
		// its spans"). With nothing kept, makeRoomFor already gave back
		// all a reclaim would: one retry, as before.
		p.mu.Unlock()
		a.reclaim()
		p.mu.Lock()
		if b, err = p.allocate(rounded, si); err == nil {
			return b, nil
		}
		if !errors.As(err, &sh) {
			return nil, err
		}
	}
	// The attempts may have left spans mapped and empty (back keeps them
	// for the retry): an out-of-memory leaves none behind, and its
	// verdict counts what a trim would give back.
	_ = p.releaseEmpty(0, false)
	return nil, p.oom(size, si, sh)
}

// oom counts an out-of-memory of a request of size bytes on stream slot si
// and returns its verdict (oomError), which reads every pool: called with
// p.mu held, it lets go of it meanwhile.
func (p *pool) oom(size uint64, si slot, sh *shortage) error {
	a := p.a
	a.c.ooms.Add(1)
	s := p.streams[si].s // under mu: addStream may grow the slice meanwhile
	p.mu.Unlock()
	oom := a.oomError(size, s, sh)
	p.mu.Lock()
	return oom
}

// reclaim returns every pool's cache to the device (keeping preallocation),
// after waiting for pending frees: after an idle time, and before the retry
// of a request that found memory short where the allocator has several
// pools (makeRoomFor). Called with no pool lock held.
func (a *Allocator) reclaim() {
	if a.keep {
		// A private pool keeps its memory: its root gives back its own.
		a.root.reclaim()
		return
	}
	for _, p := range a.allPools() {
		p.mu.Lock()
		_ = p.trim(false)
		p.mu.Unlock()
	}
}

// makeRoomFor readies the allocator for the retry of a request of p that
// found memory short: every pool's pending frees are waited for and, where
// p is the allocator's one pool, its streams fenced, so that every empty
// span may be moved or released; the empty spans themselves stay, for the
// retry to reuse where they are and to release, oldest first, only as far
// as it needs (newSpan, makeRoom). Giving them all back here (reclaim)
// made the retry create them again, and under a tight limit made every
// pass give back and remake its spans (docs/EXPERIMENTS.md, "A failed
// backing keeps its spans"). With several pools, or in a private pool
// (whose growth cannot take its root's empty spans), it reclaims as
// before. Called with no pool lock held.
func (a *Allocator) makeRoomFor(p *pool) {
	if a.keep || !a.Lone() {
		a.reclaim()
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.flush()
	if p.npending > 0 {
		_ = p.processPending(true, true)
	}
	if !a.capturing() {
		_ = p.fence()
	}
	_ = p.releaseSegments(0, false)
}

// feasible refuses at once a block that needs more new memory than could
// ever be had: more than the limit leaves beside this pool's live blocks,
// or, for large requests, more than the device's free memory and the
// allocator's whole cache together. Without it such a request would create
// span after span up to the limit or the device's end, then give them all
// back: a wasted tenth of a second per gigabyte on a real GPU, with the
// memory taken from every other process meanwhile. Both bounds are loose
// (other pools' live blocks and the free memory inside partly used spans
// are not counted), so nothing that could succeed is refused.
func (p *pool) feasible(need uint64) error {
	a := p.a
	if p.active+need > a.limit.Load() {
		return &shortage{cause: CauseLimit}
	}
	if need < feasibleCheckBytes {
		return nil
	}
	free, _, err := a.dev.MemInfo()
	if err != nil {
		return nil // the growth itself will find out
	}
	if need > free+a.reserved.Load()+feasibleSlack {
		return &shortage{cause: CauseDevice, err: fmt.Errorf("%w: %d bytes needed, %d free on the device", device.ErrOutOfMemory, need, free)}
	}
	return nil
}

// feasibleCheckBytes: growth below this asks the device nothing first (a
// cuMemGetInfo costs about a microsecond; a span, tens). feasibleSlack
// covers what the device's count may lag.
const (
	feasibleCheckBytes = 1 << 30
	feasibleSlack      = 64 << 20
)

// makeRoom releases empty spans, oldest first, this pool's and then others'
// (TryLocked), before size bytes are taken from the device, so that the
// device is asked for memory only when nothing reclaimable is held, and the
// limit is not hit while empty memory is held. asker is the requesting
// stream's slot in p (stalls); other pools' spans are released only where
// no stream of theirs would stall.
func (p *pool) makeRoom(size uint64, asker slot) {
	// Preallocated spans yield only when the limit would refuse the request.
	for _, prealloc := range []bool{false, true} {
		if prealloc && p.a.reserved.Load()+size <= p.a.limit.Load() {
			return
		}
		if p.releaseOldest(size, prealloc, asker) {
			return
		}
		for _, q := range p.a.allPools() {
			if q == p || !q.mu.TryLock() {
				continue
			}
			done := q.releaseOldest(size, prealloc, -1) // slots are per pool: none of q asks
			q.mu.Unlock()
			if done {
				return
			}
		}
	}
}

// releaseOldest releases this pool's empty spans, oldest first (the
// preallocated ones too if prealloc is set), until `want` bytes were
// released or none is left; it reports whether it got there.
func (p *pool) releaseOldest(want uint64, prealloc bool, asker slot) bool {
	var got uint64
	for i := p.empty.head; i >= 0 && got < want; {
		next := p.spans[i].next
		if (prealloc || !p.spans[i].prealloc) && !p.stalls(i, asker) {
			n := uint64(p.spans[i].n) * p.a.gran
			if p.releaseSpan(i) != nil {
				return false
			}
			got += n
		}
		i = next
	}
	return got >= want
}

// gather splits one sparse span of p before an out-of-memory
// (Config.Gather): the one that gives back the most among those whose live
// chunks fit beside what is reserved, under the limit and in the device's
// free memory. p's empty spans (the failed attempts before it keep theirs:
// back) count as room, and are released only as far as the split needs.
// It reports whether it split one.
func (p *pool) gather() (bool, error) {
	a := p.a
	if a.capturing() {
		return false, nil
	}
	room := a.headroom()
	spare := int64(p.emptyBytes())
	i := p.sparsest(room + spare)
	if i < 0 {
		return false, nil
	}
	need := int64(p.spans[i].occupied) * int64(a.gran)
	if need > room && need <= room+spare {
		p.releaseOldest(uint64(need-room), false, -1)
		room = a.headroom()
	}
	if need > room {
		// No span's live chunks fit beside it: the one that gives back
		// the most, moved through free memory of the pool before its
		// handle goes (splitReleasing) if the pool has that much.
		i = p.sparsest(1 << 62)
	}
	runs, moves := p.splitPlan(i)
	return p.timedSplit(i, runs, moves)
}

// emptyBytes counts the bytes of p's empty spans that are not
// preallocated: what releaseOldest could give back.
func (p *pool) emptyBytes() uint64 {
	var n uint64
	for i := p.empty.head; i >= 0; i = p.spans[i].next {
		if !p.spans[i].prealloc {
			n += uint64(p.spans[i].n) * p.a.gran
		}
	}
	return n
}

// headroom is what the allocator could still take from the device: the
// room under its limit, and no more than the device's free memory.
func (a *Allocator) headroom() int64 {
	room := int64(a.limit.Load()) - int64(a.reserved.Load())
	if free, _, err := a.dev.MemInfo(); err == nil {
		room = min(room, int64(free))
	}
	return room
}

// Config.Defrag's trigger and the choice of span to split (the split
// itself is mapping's: defrag.go).

// defragShare: growth past peak active bytes plus 1/defragShare of them
// moves live chunks first (Config.Defrag).
const defragShare = 100

// defrag frees physical memory by splitting sparse spans of p before size
// bytes are taken from the device, while growth would take the allocator
// past its bound: first empty spans go (makeRoom, as newSpan does again
// before it creates, for size bytes each time), then live chunks move.
// Errors from a split stop it (the growth goes on); only a split that
// could not restore a live span returns its error.
func (p *pool) defrag(size uint64, asker slot) error {
	a := p.a
	if a.capturing() {
		return nil // a split synchronizes the device (capture.go)
	}
	live := max(a.peakActive.Load(), p.peakActive, p.active)
	bound := min(live+live/defragShare, a.limit.Load())
	if a.reserved.Load()+size <= bound {
		return nil
	}
	p.makeRoom(size, asker)
	for a.reserved.Load()+size > bound {
		// Bytes in flight during a copy stay under the peak already
		// reached, or the bound.
		room := int64(max(bound, a.peakReserved.Load())) - int64(a.reserved.Load())
		i := p.sparsest(room)
		if i < 0 {
			return nil
		}
		runs, moves := p.splitPlan(i)
		if ok, err := p.timedSplit(i, runs, moves); !ok {
			return err
		}
	}
	return nil
}

// sparsest picks the span to split: among the sparse spans (some chunks
// live, some empty) whose live chunks fit in room bytes, the one that gives
// back the most net of what it copies; if none fits, the one that copies
// least. -1 if no span is sparse. Spans the current back placed are left
// alone (its undo list names them), and so are shared ones (share.go).
func (p *pool) sparsest(room int64) int32 {
	best, bestScore := int32(-1), int64(-1<<62)
	g := int64(p.a.gran)
	for i := range p.spans {
		s := &p.spans[i]
		if !s.inUse || s.prealloc || s.shares > 0 || s.occupied == 0 || s.occupied == s.n || !s.access || p.placedNow(int32(i)) {
			continue
		}
		live, empty := int64(s.occupied), int64(s.n-s.occupied)
		var score int64
		if live*g <= room {
			score = 1<<40 + (empty-live)<<20 + empty
		} else {
			score = -live<<20 + empty
		}
		if score > bestScore {
			best, bestScore = int32(i), score
		}
	}
	return best
}

func (p *pool) placedNow(i int32) bool {
	for _, m := range p.made {
		if m == i {
			return true
		}
	}
	return false
}

// Tightening as memory runs short (issue 40): the default places as it
// does while memory is plentiful (over what is mapped, in 16 MiB spans,
// with a bet ahead at the frontier), and past half its limit (or the
// device, without one) places as Config.Compact does: every request at
// the start of its best fit, mapped or not, its base span at most
// compactSpanSize, no doubled spans at the frontier. Its base span is also
// at most 1/compactSpanShare of the limit at all times, so that a small
// limit gets small spans from the start: a span partly under live blocks
// holds all of its memory, and what a layout strands is about the number
// of partly used spans times their size. (The base span, spanMost: while
// not tight the frontier may still double it. The churn guard, its slack
// and its large spans, churnSpan, take no part while tight: its memory
// undid the tightening's, so that a limit with room held more than none;
// docs/EXPERIMENTS.md, "The churn guard while tight".)
//
// Why half: tightening at the first shortage changes nothing (the layout
// that strands memory is made by then), and past 0.8 of the limit is too
// late on 5 of the 19 programs where the default missed the fit bar
// (docs/EXPERIMENTS.md, "Tightening under pressure"). What it costs is
// driver calls: the small spans and best-fit placement remap and create
// more, up to tens of times the calls of an unlimited run at 1.3 times
// the program's peak. Nothing moves: the default stays move-free.

// tightShare: the default tightens past 1/tightShare of its limit.
const tightShare = 2

// tight reports whether the default allocator holds more than
// 1/tightShare of its limit (Config.Limit, or the device): it then places
// and sizes spans as Compact does, and a moved span leaves its mapping
// dormant (dormancy). Never under Compact, which is tight
// all the time.
func (a *Allocator) tight() bool {
	return a.tightens && a.reserved.Load() > a.limit.Load()/tightShare
}

// dormancy reports whether a moved span leaves its old mapping dormant
// (dormant.go): under Compact, and in the default while tight, except with
// a handle per chunk (Config.ChunkHandles), whose spans split: a dormant
// mapping is of a span's handles as they were.
func (a *Allocator) dormancy() bool { return a.compact || a.tight() && !a.chunkHandles }

// tightSpan is the most chunks a default span may have: Config.SpanSize's
// default, at most 1/compactSpanShare of the limit, at most
// compactSpanSize when tight; at least one chunk.
func (p *pool) tightSpan() int {
	a := p.a
	n := p.spanLimit
	if c := int(a.limit.Load() / (compactSpanShare * a.gran)); c < n {
		n = c
	}
	if a.tight() {
		n = min(n, int(compactSpanSize/a.gran))
	}
	return max(n, 1)
}

// Growth: backing a placed block. Placement chose where a block goes
// (place.go); what its unmapped chunks get is decided here, above mapping
// (vm.go), which only performs it: how many chunks each new span takes
// (runEnd, spanMost: the span size, the frontier's bet, the tightening's
// smaller spans) and where its memory comes from (newSpan: a dormant
// mapping revived, the churn guard's slack, an empty span moved or
// stretched, under Config.ChunkHandles the pool's empty and free chunks
// (assemble, at the end of this file), a split under Defrag, empty spans
// released, then the device).

// back occupies b's chunks and gives every run of unmapped chunks under it
// a span (the growth step of ModeVirtual), and access to any span that
// lacks it, for a request of stream slot asker (stalls). On failure b's
// chunks are vacated and the spans this call made or moved stay where
// they are, empty, on the empty list: the retry that follows a shortage
// (pool.allocSlow) finds them mapped, where releasing them made it create
// them again, and under a tight limit made every pass give back and remake
// its spans (ckpt_grad_accum under Gather at 12,130 MiB: 32,021 creates in
// the later passes of ten, 1,736 now; docs/EXPERIMENTS.md, "A failed
// backing keeps its spans"). What a request that ends in an out-of-memory
// leaves is given back there (allocSlow). grew says whether it set out to
// map or grant anything: then chunks beside b may have become ready, which
// the caller tells placement (readyNear).
func (p *pool) back(b *block, asker slot) (grew bool, err error) {
	a := p.a
	seg := b.seg
	c0, c1 := seg.chunkSpan(b.addr, b.size, a.gran)
	ch := seg.chunks
	// Count b in the spans already under it first, so that making spans
	// for the rest cannot move or release them.
	p.occupy(b)
	missing := p.unmappedIn(seg, b.addr, b.size, c1-c0+1)
	if missing == 0 {
		return false, nil
	}
	if err := p.feasible(uint64(missing) * a.gran); err != nil {
		p.vacate(b)
		return false, err
	}
	p.made = p.made[:0] // place records the spans this call creates or moves here
	p.carried = p.carried[:0]
	p.backing = b
	defer func() { p.backing = nil }()
	p.ungranted = p.ungranted[:0]
	for i := c0; i <= c1 && err == nil; {
		c := &ch[i]
		switch {
		case c.ready:
			i++
		case c.span >= 0: // mapped, but without access (a failure, or mapped by this back)
			s := &p.spans[c.span]
			if !s.access {
				p.ungranted = append(p.ungranted, c.span)
			}
			i = int(s.c0 + s.n)
		default:
			r1 := p.runEnd(seg, i, c1)
			err = p.newSpan(seg, i, r1, c1, asker)
			i = r1
		}
	}
	// The spans mapped above get access together (grantAll), also after a
	// failure: they stay, empty, for the retry.
	if gerr := p.grantAll(); err == nil {
		err = gerr
	}
	if err != nil {
		p.vacate(b) // the spans made stay, empty (see above)
		for _, si := range p.made {
			if s := &p.spans[si]; s.inUse && s.occupied == 0 && !slices.Contains(p.carried, si) {
				// Made, or moved after a fence, for b, whose request
				// has not returned: no stream's work is on it, so
				// moving or releasing it waits for none (stalls). Not
				// a span moved without a fence (carried): the work of
				// the streams that used it may still be running; only
				// b's stream was ordered after it, and b is gone.
				s.clean = true
			}
		}
		return true, fmt.Errorf("gpumem: backing %d bytes at 0x%x: %w", b.size, b.addr, err)
	}
	return true, nil
}

// runEnd returns the end of the next span of a block whose chunks up to c1
// need backing, from its unmapped chunk i: the run of unmapped chunks from
// i, cut at the span size.
//
// Growth at the frontier (past every chunk any span has covered, in an
// allocator that already holds frontierAfter spans' worth) is where a
// program's first pass spends its driver time, so a span starting there may
// be twice the span size, and a span that ends the block there also takes
// the chunks ahead of it, up to the span size: the requests that follow at
// the frontier find memory mapped. The frontier holds at most one such
// partly used span, and the threshold keeps small programs, for which a few
// spans are a large share, on exact spans. Measured (docs/EXPERIMENTS.md,
// "Growth at the frontier"): about half the creates of a first pass on the
// shipped traces and five synthetic families, every shipped ratio at most
// 1.0153; the cost is fit on programs that free at random (up to 2%).
//
// Under Config.Compact the threshold is compactFrontierAfter: its user
// chose memory over driver calls, so the bet waits until it is a small
// share of what is held.
func (p *pool) runEnd(seg *segment, i, c1 int) int {
	a := p.a
	ch := seg.chunks
	base := p.spanMost()
	limit := base
	after := uint64(frontierAfter)
	if a.compact {
		after = compactFrontierAfter
	}
	grown := a.reserved.Load() >= after*uint64(a.spanChunks)*a.gran
	if grown && i > int(seg.hiSpan) && !a.tight() {
		limit *= 2
	}
	limit = max(limit, p.churnSpan())
	r1 := i + 1
	for r1 <= c1 && ch[r1].span < 0 && r1-i < limit {
		r1++
	}
	if grown && r1 == c1+1 && r1 > int(seg.hiSpan) {
		// Past hiSpan every chunk is unmapped and holds nothing. The
		// chunks ahead are a bet on the next requests, and a lost bet is
		// memory held idle beside a live chunk: near the limit it is what
		// fails a later block. So the bet takes at most 1/aheadShare of
		// the room left under the limit, and shrinks as the device fills.
		ahead := base
		if l, r := a.limit.Load(), a.reserved.Load(); l > r {
			ahead = min(ahead, int((l-r)/a.gran)/aheadShare)
		} else {
			ahead = 0
		}
		for r1 < len(ch) && r1-i < ahead {
			r1++
		}
	}
	return r1
}

// spanMost returns the most chunks a new span may have: Config.SpanSize,
// or under Compact without one, 4 MiB growing with the allocator: the
// largest power-of-two multiple of it up to 1/compactSpanShare of the most
// the allocator has reserved, at most compactSpanMax (p.spanLimit, which
// never shrinks).
//
// Compact's fit comes from small spans: a span partly under live blocks
// holds all of its memory, so what a layout strands is about the number
// of partly used spans times their size. Its cost is one create, map and
// access grant per span, tens of microseconds whatever the size
// (docs/BENCHMARKS.md, "What the driver costs"), so a fixed 4 MiB makes a
// large program pay a call per 4 MiB it grows. A span of at most 1/512 of
// what is held keeps the stranding a fixed share of the program's size:
// measured on 40 real programs (docs/EXPERIMENTS.md, "Compact: spans that
// grow with the allocator"), every one still within 1.02 of its peak on
// the first pass and over ten, with about a quarter fewer driver calls in
// a first pass (geometric mean; a third to two thirds on the largest
// programs), and a third of them on programs that free at random. Never shrinking
// keeps a program's later passes on the span sizes of its first.
//
// The default's base span (Config.SpanSize unset) is at most
// 1/compactSpanShare of the limit, and compactSpanSize once tight
// (pressure.go; runEnd may still double it while not tight, or take the
// churn guard's larger spans).
func (p *pool) spanMost() int {
	a := p.a
	if a.spanGrow {
		held := a.reserved.Load() / (compactSpanShare * a.gran)
		for uint64(p.spanLimit)*2 <= held && uint64(p.spanLimit)*2*a.gran <= compactSpanMax {
			p.spanLimit *= 2
		}
	}
	if a.tightens {
		return p.tightSpan()
	}
	return p.spanLimit
}

// compactSpanShare and compactSpanMax bound Compact's growing spans
// (spanMost): a span is at most 1/compactSpanShare of the most the
// allocator has held, and at most compactSpanMax bytes.
const (
	compactSpanShare = 512
	compactSpanMax   = 32 << 20
)

// frontierAfter is how many spans' worth an allocator must hold before
// growth at the frontier takes larger spans (runEnd).
const frontierAfter = 16

// compactFrontierAfter is frontierAfter under Config.Compact: 256 of its
// 4 MiB spans, 1 GiB. A frontier bet holds at most a doubled span and a
// span ahead (12 MiB; three of the grown spans past 2 GiB, at most 3/512
// of what is held: spanMost), so from there it is under 1.2% of what is
// held.
// With 16 (64 MiB) the bet was what the two smallest programs of the
// corpus held beyond 1.02 times their peak: infer_server (952 MiB live)
// 1.0221 and streaming_kv (604 MiB) 1.0338, against 1.0179 and 1.0173
// with 256. Of the 36 other real programs 33 held the same or less and
// none more than 0.0022 more (gpt2_generate), for 2-36% more driver calls
// in a first pass (docs/EXPERIMENTS.md, "Compact on small programs").
const compactFrontierAfter = 256

// aheadShare: the chunks a frontier span maps ahead of its block take at
// most 1/aheadShare of the room left under the limit (runEnd). Far from the
// limit it changes nothing; near it the bet shrinks to nothing. Measured
// with `gpumem fit` on gpt2_generate (docs/EXPERIMENTS.md, "A tight
// device"): 940 MiB without the bound, 930 MiB with 8 or 16.
const aheadShare = 16

// newSpan backs chunks [r0, r1) of seg, all unmapped, with one span (the
// chunks up to c1 lie under the block being backed and count it as live;
// those after, ahead of it at the frontier, are free): an empty span of
// exactly that size moved here (remap), else a larger empty span stretched
// over the unmapped chunks after r1, else new memory from the device after
// releasing what empty spans hold. asker is the requesting stream's slot
// (stalls).
func (p *pool) newSpan(seg *segment, r0, r1, c1 int, asker slot) error {
	a := p.a
	k := int32(r1 - r0)
	size := uint64(k) * a.gran
	if a.dormancy() {
		if i := p.revivableAt(seg, r0, k, asker); i >= 0 {
			return p.moveSpan(i, p, seg, r0, c1, asker, a.dormancy())
		}
	}
	if p.slack(size) {
		// New memory beside the empty spans, which stay where they are
		// (churn.go); if the device or the limit refuses it, an empty
		// span moves after all.
		var sh *shortage
		err := p.createSpan(seg, r0, r1, c1, size)
		if !errors.As(err, &sh) {
			if err == nil {
				p.churn.taken++
			}
			return err
		}
		p.churn.refused++
	}
	if q, i := p.findEmpty(k, asker); q != nil {
		err := q.moveSpan(i, p, seg, r0, c1, asker, a.dormancy())
		if q != p {
			q.mu.Unlock()
		}
		return err
	}
	if i := p.emptyToStretch(seg, r0, k, asker); i >= 0 {
		return p.moveSpan(i, p, seg, r0, c1, asker, a.dormancy())
	}
	if a.chunkHandles {
		// Empty chunks, and free chunks of partly used spans, to size;
		// new memory only for what they lack (assemble, below).
		if done, err := p.assemble(seg, r0, r1, c1, asker); done {
			return err
		}
	}
	if a.defrag && p.churn.level == 0 { // not against the churn guard's slack (defrag.go)
		if err := p.defrag(size, asker); err != nil {
			return err
		}
	}
	p.makeRoom(size, asker)
	return p.createSpan(seg, r0, r1, c1, size)
}

// Growth with a handle per chunk (Config.ChunkHandles): which chunks growth
// takes before new memory, and from where (the mechanics are chunks.go's).

// splitFree splits the free chunks of this pool's partly used spans off as
// empty spans, the sparsest spans first (the most free chunks), until want
// chunks are split or no such span is left: growth's last resort before the
// device (assemble). Not spans that are preallocated, shared (share.go),
// without access, or made by the current back (its undo list names them).
// It walks the blocks of each segment it splits in once: the chunk counts
// alone do not say which chunks a block covers whole.
func (p *pool) splitFree(want int) {
	cs := p.candBuf[:0]
	for k := range p.heaps {
		for _, seg := range p.heaps[k].segs {
			if !seg.virtual {
				continue
			}
			for c := 0; c <= int(seg.hiSpan); {
				si := seg.chunks[c].span
				if si < 0 {
					c++
					continue
				}
				s := &p.spans[si]
				if s.occupied > 0 && s.occupied < s.n && s.access && !s.prealloc && s.shares == 0 && p.chains[si] == 0 && !p.placedNow(si) {
					cs = append(cs, splitCand{si, s.n - s.occupied})
				}
				c = int(s.c0 + s.n)
			}
		}
	}
	slices.SortFunc(cs, func(x, y splitCand) int {
		if x.free != y.free {
			return cmp.Compare(y.free, x.free)
		}
		return cmp.Compare(x.si, y.si)
	})
	got := 0
	for n := range cs {
		if got >= want {
			cs = cs[:n]
			break
		}
		got += int(cs[n].free)
	}
	// By segment: each one's blocks walked once.
	slices.SortFunc(cs, func(x, y splitCand) int { return spanCompare(&p.spans[x.si], &p.spans[y.si]) })
	var occ []bool
	var occSeg *segment
	for _, c := range cs {
		seg := p.spans[c.si].seg
		if seg != occSeg {
			occ, occSeg = p.occupiedChunks(seg), seg
		}
		p.splitRuns(c.si, occ)
	}
	p.candBuf = cs
}

// assemble backs chunks [r0, r1) of seg (see newSpan) with the handles of
// this pool's empty spans that may move for asker, splitting free chunks off
// partly used spans first if those are too few, and creates only what they
// lack. It returns false, doing nothing, when no such chunk is held: the
// caller takes new memory as before. On a shortage (the limit or the device
// refuses what they lack) the chunks gathered are mapped from r0 all the
// same, as a failed back keeps the spans it made, and the shortage returned.
func (p *pool) assemble(seg *segment, r0, r1, c1 int, asker slot) (bool, error) {
	a := p.a
	k := r1 - r0
	have := p.movableChunks(asker)
	if have < k {
		p.splitFree(k - have)
		have = p.movableChunks(asker)
	}
	if have == 0 {
		return false, nil
	}
	hs := p.gbuf[:0]
	var err error
	for i := p.empty.head; i >= 0 && len(hs) < k && err == nil; {
		next := p.spans[i].next
		s := &p.spans[i]
		if s.prealloc || !p.movable(i, asker) {
			i = next
			continue
		}
		if want := int32(k - len(hs)); s.n > want {
			i = p.splitSpan(i, s.n-want, 0) // the tail, right after i on the list
		}
		at := len(hs)
		hs = p.spanHandles(i, hs)
		if err = p.unmapSpan(i); err != nil {
			hs = hs[:at] // (unmapChunks released what it unmapped)
		}
		i = next
	}
	if err == nil && len(hs) < k {
		rest := uint64(k-len(hs)) * a.gran
		p.makeRoom(rest, asker)
		if !a.takeBudget(rest) {
			err = &shortage{cause: CauseLimit}
		} else if hs, err = p.newHandles(hs, k-len(hs)); errors.Is(err, device.ErrOutOfMemory) {
			err = &shortage{cause: CauseDevice, err: err}
		}
	}
	p.gbuf = hs
	if len(hs) == 0 {
		return true, err
	}
	if perr := p.placeChunks(hs, seg, r0, c1, false); perr != nil {
		return true, errors.Join(err, perr)
	}
	return true, err
}

// movableChunks counts the chunks of this pool's empty spans that may move
// for asker.
func (p *pool) movableChunks(asker slot) int {
	n := 0
	for i := p.empty.head; i >= 0; i = p.spans[i].next {
		if s := &p.spans[i]; !s.prealloc && p.movable(i, asker) {
			n += int(s.n)
		}
	}
	return n
}
