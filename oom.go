package gpumem

// See doc.go for the overview.

import "github.com/gpumem/gpumem/device"

// The out-of-memory verdict. A request fails only after the reclaim and
// retry of the alloc path (doc.go, steps 6-7), so the numbers read here are
// those of an allocator that has already given back every empty span and
// wholly free segment it could. They decide:
//
//  1. The cause. CauseLimit: live buffers and the request pass the limit
//     even perfectly packed (Allocated + Requested > Limit). CauseDevice:
//     the device refused and the cache could not have covered the request.
//     CauseFragmentation: the limit refused growth although perfect packing
//     would fit, or the device refused although the cache alone held the
//     request's bytes: enough free bytes, no piece large enough.
//     CauseQuota: a scope's quota (scope.go), decided before any memory is
//     looked at.
//  2. What a trim would give (AfterTrim): the reclaim keeps preallocated
//     memory and handles the driver refused before (Releasable); Trim gives
//     them back too. The request fits after it if its Growth fits both
//     under the limit, with Releasable no longer held, and on the device,
//     with Releasable free again. Everything else cached is Pinned: free
//     pieces of segments or spans that also hold live buffers.
//  3. What virtual-memory spans would do (WithVirtual). In ModePlain, a
//     device with virtual memory could have placed the request with spans,
//     which map memory wherever the address space has room, if the live
//     blocks (Active) and the request rounded to the granule fit within the
//     limit and within what the device could give (its free memory and what
//     gpumem holds). An estimate: it counts no chunk shared by two live
//     blocks, which costs ModeVirtual under 2% on the shipped traces. In
//     ModeVirtual the question is moot; Pinned, split into PinnedInChunks
//     (free space in chunks that hold live buffers) and the rest (idle
//     chunks of spans that hold live buffers), says what blocks it.
//  4. A smaller request: WouldFit, the largest that fits now (a free piece,
//     or room to grow within the limit and the device), and FreeTotal, the
//     bytes free in all pieces.
//
// The replay of a trace adds the last question, under which policy the
// program would have run (cli, with package policy).

// oomError builds the error of a request that still had no memory after the
// reclaim and retry. Called with no pool locked.
func (a *Allocator) oomError(size uint64, s device.Stream, sh *shortage) *OutOfMemoryError {
	st := a.Stats()
	free, _, err := a.dev.MemInfo()
	if err != nil {
		free = 0
	}
	e := &OutOfMemoryError{Requested: size, Stream: uint64(s), Limit: a.root.limit.Load(), DeviceFree: free, Total: a.total,
		Reserved: st.Reserved, Allocated: st.Allocated, Active: st.Active, Cached: st.Cached, LargestFree: st.LargestFree,
		Releasable: min(st.Releasable, st.Cached), Mode: a.mode, Err: sh.err}
	e.Pinned = e.Cached - e.Releasable
	e.Family = sub(a.family.Load(), st.Reserved)
	if used := st.Reserved + e.Family + free; a.total > used {
		e.Others = a.total - used
	}
	room := sub(e.Limit, st.Reserved+e.Family)
	room = min(room, free)
	e.FreeTotal = st.Cached + room
	e.WouldFit = max(st.LargestFree, room&^(a.gran-1))
	rounded := (size + minBlock - 1) &^ (minBlock - 1)
	e.Growth = (rounded + a.gran - 1) &^ (a.gran - 1)

	// 1. The cause.
	switch {
	case sh.cause == CauseLimit && st.Allocated+e.Family+size > e.Limit:
		e.Cause = CauseLimit
	case sh.cause == CauseLimit:
		e.Cause = CauseFragmentation
	case st.Cached >= size:
		e.Cause = CauseFragmentation
	default:
		e.Cause = CauseDevice
	}

	// 2. After a trim.
	e.AfterTrim = AnswerNo
	if e.Releasable > 0 && e.Growth <= sub(e.Limit, st.Reserved+e.Family-e.Releasable) && e.Growth <= free+e.Releasable {
		e.AfterTrim = AnswerYes
	}

	// 3. With virtual-memory spans.
	if a.mode == ModeVirtual {
		e.WithVirtual = AnswerNotApplicable
		e.PinnedInChunks = e.Pinned - min(a.idleInLiveSpans(), e.Pinned)
		e.suggestC = e.Cause == CauseFragmentation && !a.compact
		e.suggestG = e.suggestC && !a.gathers() && e.Pinned > e.PinnedInChunks
		if ge := a.gateErr.Load(); ge != nil && a.gated() && e.Pinned > e.PinnedInChunks {
			e.gateRefused = (*ge).Error()
		}
	} else if vm, ok := device.AsVirtualMemory(a.dev); !ok || vm.Granularity() == 0 {
		e.WithVirtual, e.noVM = AnswerNo, true
	} else {
		g := vm.Granularity()
		need := st.Active + (rounded+g-1)&^(g-1)
		e.WithVirtual = AnswerNo
		if need <= e.Limit && need <= free+st.Reserved {
			e.WithVirtual = AnswerYes
		}
	}
	return e
}

// quotaError is the verdict of a request that scope x's quota refused: x
// held used bytes of it.
func (a *Allocator) quotaError(size uint64, x *Scope, used uint64) *OutOfMemoryError {
	return &OutOfMemoryError{Requested: size, Limit: x.quota, Allocated: used, Scope: x.Name(),
		Reserved: a.reserved.Load(), Cached: a.cached(), WouldFit: sub(x.quota, used), Mode: a.mode,
		AfterTrim: AnswerNotApplicable, WithVirtual: AnswerNotApplicable, Cause: CauseQuota}
}

// idleInLiveSpans is the memory of the chunks that hold no live block in
// spans that hold one: what a span's live chunks keep from being given back
// or moved (vm.go).
func (a *Allocator) idleInLiveSpans() uint64 {
	var n uint64
	for _, p := range a.allPools() {
		p.mu.Lock()
		for i := range p.spans {
			if s := &p.spans[i]; s.inUse && s.occupied > 0 {
				n += uint64(s.n-s.occupied) * a.gran
			}
		}
		p.mu.Unlock()
	}
	return n
}

// sub is a - b, or 0 when b > a.
func sub(a, b uint64) uint64 {
	if b > a {
		return 0
	}
	return a - b
}
