package gpumem

// See doc.go for the overview.

import (
	"errors"
	"fmt"

	"github.com/gpumem/gpumem/device"
)

// Memory pressure: what the allocator does as memory gets short, in the
// order it does it. This file holds the steps that act only when memory
// is short; the others live beside the structure they change, and are
// named here so that the whole policy can be read from one place.
//
// While memory is plentiful:
//   - placement prefers memory already mapped (place.go), and growth at
//     the frontier takes spans ahead of the request (runEnd, vm.go);
//   - a program that moves spans every few requests gets a slack of
//     memory beside its empty spans instead (churn.go).
// As the allocator nears its limit:
//   - the frontier's bet ahead shrinks with the room left under the limit
//     (runEnd, aheadShare);
//   - a request that could never fit is refused before anything is taken
//     (feasible, below);
//   - growth first moves an empty span of the right size, or releases
//     empty spans, oldest first, this pool's and then others', before the
//     device is asked for memory (newSpan in vm.go, makeRoom below);
//   - under Config.Defrag, growth past peak active + 1% splits sparse
//     spans first (defrag.go).
// When a request does not fit (a shortage, pool.allocSlow below):
//  1. pending frees are waited for and the streams fenced
//     (Allocator.makeRoomFor; with several pools every pool's cache goes
//     back to the device, Allocator.reclaim) and the request is tried
//     again. The spans a failed attempt mapped stay, empty (back, vm.go):
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
	b, err := p.allocate(rounded, si)
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
	a.c.ooms.Add(1)
	s := p.streams[si].s // under mu: addStream may grow the slice meanwhile
	p.mu.Unlock()
	oom := a.oomError(size, s, sh)
	p.mu.Lock()
	return nil, oom
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
// not tight the frontier may still double it, and the churn guard's large
// spans, churnSpan, apply up to 0.8 of the limit, tight or not; the fit
// figures in docs/BENCHMARKS.md were measured so.)
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
// (dormant.go): under Compact, and in the default while tight.
func (a *Allocator) dormancy() bool { return a.compact || a.tight() }

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
