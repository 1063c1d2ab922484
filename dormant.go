package gpumem

// See doc.go for the overview.

import "github.com/gpumem/gpumem/device"

// Dormant mappings (Config.Compact, and the default while tight, see
// pressure.go): a moved span leaves its old mapping behind.
//
// Moving an empty span (newSpan's remap) unmaps its handle where it was,
// then maps it and grants access where it goes: three driver calls, about
// 50 us on an H100 (docs/EXPERIMENTS.md, "What the driver costs"). Under
// Config.Compact a request goes to its best fit whatever is mapped, so a
// program that repeats itself repeats its layout, and its moves: the same
// handles travel between the same places, pass after pass. So a move there
// leaves the handle mapped where it was, as a dormant mapping (CUDA maps
// one handle at several addresses at once, device/cuda's
// TestGPUMapOneHandleTwice; the physical memory is the handle's, counted
// once), and newSpan prefers the empty span whose handle has a dormant
// mapping exactly where it needs one (revivableAt).
//
// The allocator treats a dormant mapping's chunks as unmapped (chunk.span
// < 0, not ready), so placement sees exactly what it would have seen had
// the move unmapped them; only the driver calls change:
//
//   - a span moved back onto exactly the range of one of its handle's
//     dormant mappings revives it: no map, no access grant (access is a
//     property of the mapping and survives), no unmap where it leaves
//     (that mapping turns dormant in its turn);
//   - a span made or moved over chunks that another dormant mapping covers
//     unmaps that mapping first: the unmap the move deferred, not an extra
//     one;
//   - a handle keeps at most maxDormant dormant mappings (the oldest is
//     unmapped), and releasing a span unmaps its dormant mappings with it.
//
// So no sequence of operations makes more driver calls than unmapping at
// once would, and a move repeated from an earlier pass makes none. Under
// the default placement, which prefers mapped memory, later passes do not
// repeat their moves (3-14 revivals in 86-143 moves a pass on
// ckpt_grad_accum, docs/EXPERIMENTS.md, "Later passes: dormant mappings"),
// so the default unmaps at once and keeps no dormant mapping, until it
// tightens: it then places as Compact does, and keeps them too (on the 40
// traces at their fit figure, 28% fewer driver calls and 40% fewer fences;
// docs/BENCHMARKS.md, "Dormant mappings while tight").
//
// Why it is safe: a mapping turns dormant only after the fence its unmap
// would have needed (unmapSpan's rule: the streams that freed into the span
// have finished), or, in a pool that serves one stream, without it: that
// stream's later work on the handle, wherever it is mapped, is ordered
// after its earlier work, and the fence is taken before the dormant
// mapping is unmapped (dormant.seq), unless an event recorded on the
// stream when it turned dormant has completed by then (markDormant). No
// block lies over a dormant chunk (it is not ready, so neither a cache hit
// nor a search places anything there without first giving it a span).
// Nothing reads or writes through a dormant mapping until it is revived;
// then its chunks are the span's again, as if mapped anew
// (internal/gputest's TestGPUCompactDataReadsBack checks the data of every
// live buffer through moves and revivals on a GPU). A dormant mapping
// stays in its own pool: a span taken by another pool unmaps all of its
// handle's mappings first.
//
// Invariants (checked by checkPool):
//
//	seg.dormant[c] == k+1 ⇔ chunk c lies in dormants[k]'s range
//	seg.dormant[c] != 0 ⇒ chunk c's span < 0
//	dormants[k] in use ⇒ it is on the chain of span dormants[k].owner, which
//	    is in use, holds the same handle and has the same number of chunks
//	a span's chain holds at most maxDormant mappings
type dormant struct {
	seg    *segment
	c0, n  int32
	owner  int32 // the span that holds the handle (and this on its chain)
	next   int32 // the next older mapping of the handle, or the free list; -1 for none
	access bool  // granted: revived, it is ready at once
	inUse  bool
	seq    uint64       // the span's empty stamp (span.seq) when it turned dormant: unmapped only once fenced past it, or once ev has completed
	ev     device.Event // recorded on the moving stream when it turned dormant without a fence (hasEv; markDormant)
	hasEv  bool
}

// maxDormant bounds the dormant mappings one handle keeps. A later pass
// revives a mapping only if its handle has not moved more than maxDormant
// times since; each dormant mapping makes the handle's release an unmap
// dearer.
const maxDormant = 4

// newDormant returns a free dormant slot.
func (p *pool) newDormant() int32 {
	if k := p.freeDormant - 1; k >= 0 {
		p.freeDormant = p.dormants[k].next + 1
		return k
	}
	p.dormants = append(p.dormants, dormant{})
	return int32(len(p.dormants) - 1)
}

// retire turns span i's current mapping dormant, at the head of its chain,
// and detaches the span from its chunks (they read as unmapped). The span
// must be off the empty list, fenced, and have room on its chain
// (trimChain).
func (p *pool) retire(i int32) {
	s := &p.spans[i]
	k := p.newDormant()
	p.dormants[k] = dormant{seg: s.seg, c0: s.c0, n: s.n, owner: i, next: p.chains[i] - 1, access: s.access, inUse: true, seq: s.seq}
	p.chains[i] = k + 1
	for j := s.c0; j < s.c0+s.n; j++ {
		c := &s.seg.chunks[j]
		c.span, c.ready = -1, false
		s.seg.dormant[j] = k + 1
	}
	s.seg.ready.set(int(s.c0), int(s.c0+s.n), false) // (which voids no ready cache: see block.nzFrom)
	p.mappedChunks -= int(s.n)
	p.nDormant++
}

// trimChain unmaps the oldest dormant mappings of span i until fewer than
// maxDormant are left besides keep (a mapping about to be revived, or -1).
func (p *pool) trimChain(i, keep int32) error {
	for {
		n, last, prev := 0, int32(-1), int32(-1)
		for d, pd := p.chains[i]-1, int32(-1); d >= 0; pd, d = d, p.dormants[d].next {
			if d != keep {
				n++
				last, prev = d, pd
			}
		}
		if n < maxDormant {
			return nil
		}
		if err := p.unlinkAndUnmap(last, prev); err != nil {
			return err
		}
	}
}

// revivable returns the dormant mapping of span i's handle over exactly
// chunks [r0, r0+n) of seg; -1 for none.
func (p *pool) revivable(i int32, seg *segment, r0 int) int32 {
	for d := p.chains[i] - 1; d >= 0; d = p.dormants[d].next {
		if dm := &p.dormants[d]; dm.seg == seg && int(dm.c0) == r0 && dm.n == p.spans[i].n {
			return d
		}
	}
	return -1
}

// revivableAt returns the empty span whose handle has a dormant mapping
// starting at chunk r0 of seg that newSpan may use for k chunks there: of
// exactly k chunks, or larger and fitting the unmapped room (as
// emptyToStretch would stretch one); -1 for none. Moving it there revives
// the mapping: the handle goes back where it was, at no driver cost. asker
// is the requesting slot (stalls).
func (p *pool) revivableAt(seg *segment, r0 int, k int32, asker slot) int32 {
	if seg.dormant == nil {
		return -1
	}
	d := seg.dormant[r0] - 1
	if d < 0 {
		return -1
	}
	dm := &p.dormants[d]
	o := &p.spans[dm.owner]
	if int(dm.c0) != r0 || o.occupied != 0 || o.prealloc || !p.movable(dm.owner, asker) {
		return -1
	}
	if dm.n == k || (dm.n > k && dm.n <= p.roomAt(seg, r0)) {
		return dm.owner
	}
	return -1
}

// unlink takes dormant mapping k (prev before it on its owner's chain, or
// -1 when k is the head) off its chain and its chunks, and frees its slot.
// It does not unmap.
func (p *pool) unlink(k, prev int32) {
	d := &p.dormants[k]
	if prev >= 0 {
		p.dormants[prev].next = d.next
	} else {
		p.chains[d.owner] = d.next + 1
	}
	for j := d.c0; j < d.c0+d.n; j++ {
		d.seg.dormant[j] = 0
	}
	if d.hasEv {
		p.spareEvents = append(p.spareEvents, d.ev)
	}
	*d = dormant{next: p.freeDormant - 1}
	p.freeDormant = k + 1
	p.nDormant--
}

// unlinkAndUnmap unmaps dormant mapping k and unlinks it. If the driver
// refuses, it stays as it was.
func (p *pool) unlinkAndUnmap(k, prev int32) error {
	d := &p.dormants[k]
	if d.seq > p.fencedSeq {
		// Turned dormant without a fence (moveSpan, one stream, or a
		// stream ordered after the others): its work may still read it.
		if err := p.waitDormant(d); err != nil {
			return err
		}
	}
	if err := p.a.vm.Unmap(device.Ptr(d.seg.chunkAddr(int(d.c0), p.a.gran)), uint64(d.n)*p.a.gran); err != nil {
		return err
	}
	p.a.c.unmaps.Add(1)
	p.unlink(k, prev)
	return nil
}

// markDormant records an event on stream slot asker's stream for span i's
// newest dormant mapping, which turned dormant without a fence: the work
// that used it was enqueued before the event (on asker's stream, or on
// streams asker was just ordered after, orderAfter), so once the event has
// completed the mapping is unmapped with no host wait (waitDormant): by
// the time a later request wants its chunks the GPU has often passed it.
// Without events, during a capture, or if the record fails, the mapping
// waits for a fence, as before.
func (p *pool) markDormant(i int32, asker slot) {
	a := p.a
	k := p.chains[i] - 1
	if k < 0 || asker < 0 || a.ev == nil || a.capturing() {
		return
	}
	e, err := p.event()
	if err != nil {
		return
	}
	if a.ev.Record(e, p.streams[asker].s) != nil {
		p.spareEvents = append(p.spareEvents, e)
		return
	}
	p.dormants[k].ev, p.dormants[k].hasEv = e, true
}

// waitDormant waits until the work that may read dormant mapping d, which
// turned dormant without a fence, has completed, so that it may be
// unmapped: nothing to wait for once its event (markDormant) has
// completed, else a fence. (Waiting for that event alone leaves the work
// enqueued since on the GPU, but covers no other mapping: on the corpus
// under Compact at 5 ms run-ahead it made three times the host waits and
// raised two peaks, since a fence is what lets empty spans move freely,
// stalls; docs/EXPERIMENTS.md, "Dormant mappings wait for their own
// work".)
func (p *pool) waitDormant(d *dormant) error {
	if d.hasEv && !p.a.capturing() {
		if done, err := p.a.ev.Query(d.ev); err == nil && done {
			return nil
		}
	}
	return p.fence()
}

// evictOver unmaps every dormant mapping over chunks [r0, r1) of seg, so
// that a span can be mapped there.
func (p *pool) evictOver(seg *segment, r0, r1 int) error {
	if seg.dormant == nil {
		return nil
	}
	for j := r0; j < r1; j++ {
		if k := seg.dormant[j] - 1; k >= 0 {
			if err := p.unlinkAndUnmap(k, p.chainPrev(k)); err != nil {
				return err
			}
		}
	}
	return nil
}

// chainPrev returns the mapping before dormant k on its owner's chain, -1
// when k is the head.
func (p *pool) chainPrev(k int32) int32 {
	prev := int32(-1)
	for d := p.chains[p.dormants[k].owner] - 1; d != k; prev, d = d, p.dormants[d].next {
	}
	return prev
}

// dropDormant unmaps every dormant mapping of span i (before its handle is
// released or leaves the pool).
func (p *pool) dropDormant(i int32) error {
	for p.chains[i] != 0 {
		if err := p.unlinkAndUnmap(p.chains[i]-1, -1); err != nil {
			return err
		}
	}
	return nil
}
