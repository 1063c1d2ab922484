package gpumem

// See doc.go for the overview.

import (
	"errors"
	"fmt"
	"time"

	"github.com/gpumem/gpumem/device"
)

// Moving live chunks (Config.Defrag).
//
// A span is one physical handle, and CUDA maps and unmaps only whole
// handles, so a span that still has one live chunk holds all of its chunks
// (vm.go). Under the default placement those empty chunks are most of what
// a program holds beyond its peak, and they pile up over a long run: the
// layout drifts, and each pass strands a little more (docs/EXPERIMENTS.md,
// "Ten passes: where the drift comes from"). Placement cannot undo that
// without the driver calls of compact placement. Moving what is live can:
// a sparse span is split into spans of its live runs alone, each a new
// handle holding a copy of the run's bytes, mapped at the same addresses, so
// its empty chunks go back to the device and no pointer changes.
//
// When: only when growth would take the allocator past its bound, a
// hundredth over the peak of active bytes (defragShare; the bar of issue
// 11), and no empty span is left to release. Then the sparse span that
// gives back the most for the least copying is split, again until the
// growth fits or no span is sparse. Not while the churn guard holds a
// slack (churn.go): a program that frees at random is held above that
// bound on purpose, and splits there only undid the slack, four driver
// calls a run (bench/synth's rand: three times the default's time on an
// H100 at the same ratio).
//
// How (split): the live runs get new handles, and the device is
// synchronized (every stream: no kernel may use the live bytes while they
// move). The live bytes are copied to free memory of the pool that is
// mapped with access (whole free chunks outside the span: staging), the
// old span is unmapped, the new handles are mapped at the old addresses
// and granted access, the bytes are copied back, and the old handle is
// released. Where the pool has too little such free memory, the new
// handles are filled at a scratch address range instead (mapped, granted,
// filled, unmapped) and then mapped at the old addresses. Until the old
// span is unmapped any failure leaves everything as it was; after, a
// failure maps the old handle back, and if even that fails the allocator
// is marked broken (as the checker does): a live buffer has lost its
// memory, and the error says so.
//
// The cost: a device synchronize and, per live run, a create, a map and a
// grant, and two copies per staged piece (through the scratch range: two
// maps, two grants, an unmap and one copy), plus an unmap and a release.
// The grants and unmaps are most of it (tens of microseconds each on an
// H100, docs/EXPERIMENTS.md "What the driver costs"), so staging halves
// them. A split is done only when the bound needs it, and copies while the
// device is full are taken only where the new handles fit under
// max(bound, peak reserved): moving bytes must not raise the peak it is
// meant to cut.
//
// The contract: while an allocation runs, no other thread may enqueue work
// that uses this allocator's memory (the synchronize would not cover it,
// and a kernel could find its memory unmapped). Single-threaded programs,
// and frameworks that launch from one thread at a time, meet it; that is
// why Defrag is a choice, not the default.

// Gathering (Config.Gather) is the same move at another moment: not
// against a bound while the program grows, but on the way to an
// out-of-memory, after the reclaim (pool.allocSlow): the sparse span that
// gives back the most is split, the request tried again, until it fits or
// no span is left to split. Where memory is plentiful no request gets that
// far, so it costs nothing there. At a shortage there may be no room
// beside a span for its live runs' new handles; if the pool has free
// memory mapped elsewhere to park the live bytes in, the span is then
// unmapped and given back first, and the handles are made from what it
// gave back (splitReleasing). Were another process to take that memory in
// between, each run is tried again alone, and if that fails too the
// allocator is marked broken, the error saying where the bytes wait.

// scratchMin is the least address space the scratch range reserves.
const scratchMin = 64 << 20

// split moves the live runs of sparse span i to handles of their own at the
// same addresses and releases the span's handle (see the overview above).
// runs and moves are placement's plan for it (splitPlan, place.go): the
// calls go down, and the split reads no block.
func (p *pool) split(i int32, runs [][2]int, moves []stagedMove) error {
	a := p.a
	s := &p.spans[i]
	if len(runs) == 0 {
		return fmt.Errorf("gpumem: span at 0x%x counts %d live chunks but no live block overlaps it", s.seg.chunkAddr(int(s.c0), a.gran), s.occupied)
	}
	if moves != nil && p.a.gathers() && p.tooTight(runs) {
		err := p.splitReleasing(i, runs, moves)
		if err == nil {
			a.c.splits.Add(1)
		}
		return err
	}
	hs, err := p.runHandles(runs)
	if err != nil {
		return err
	}
	if moves != nil {
		err = p.splitStaged(i, runs, hs, moves)
	} else {
		err = p.splitScratch(i, runs, hs)
	}
	if err == nil {
		a.c.splits.Add(1)
	}
	return err
}

// runHandles creates a handle for each run (chunk offsets [r0, r1)),
// within the limit; on failure it releases those it made.
func (p *pool) runHandles(runs [][2]int) ([]device.Handle, error) {
	a := p.a
	hs := make([]device.Handle, 0, len(runs))
	for _, r := range runs {
		size := uint64(r[1]-r[0]) * a.gran
		if !a.takeBudget(size) {
			p.dropHandles(runs, hs)
			return nil, &shortage{cause: CauseLimit}
		}
		h, err := a.vm.Create(size)
		if err != nil {
			a.giveBudget(size)
			p.dropHandles(runs, hs)
			return nil, err
		}
		a.c.creates.Add(1)
		hs = append(hs, h)
	}
	return hs, nil
}

// dropHandles releases hs, the unmapped handles of the first len(hs) runs.
func (p *pool) dropHandles(runs [][2]int, hs []device.Handle) {
	for k, h := range hs {
		p.a.dropHandle(h, uint64(runs[k][1]-runs[k][0])*p.a.gran)
	}
}

// A stagedMove is a piece of a live run and the free memory that holds
// its bytes while the run's addresses are remapped (splitStaged).
type stagedMove struct {
	at, stage, n uint64
}

// splitStaged moves span i's live runs to the new handles hs through free
// memory of the pool: their bytes are copied there, the span's addresses are
// remapped to hs, and the bytes are copied back. Per run: a create, a map
// and a grant, and two copies per piece; the span: an unmap and a release.
func (p *pool) splitStaged(i int32, runs [][2]int, hs []device.Handle, moves []stagedMove) error {
	a := p.a
	if err := a.syncDevice(); err != nil {
		p.dropHandles(runs, hs)
		return err
	}
	if err := p.copyMoves(moves, false); err != nil {
		p.dropHandles(runs, hs)
		return err
	}
	return p.remap(i, runs, hs, func() error { return p.copyMoves(moves, true) })
}

// copyMoves copies every piece of moves to its stage, or back, and waits.
func (p *pool) copyMoves(moves []stagedMove, back bool) error {
	for _, m := range moves {
		dst, src := m.stage, m.at
		if back {
			dst, src = src, dst
		}
		if err := p.copy(dst, src, m.n); err != nil {
			_ = p.a.syncDevice() // no copy may still run when the caller undoes
			return err
		}
	}
	return p.a.syncDevice()
}

// tooTight reports whether new handles for runs would not fit beside what
// is reserved now, under the limit and in the device's free memory.
func (p *pool) tooTight(runs [][2]int) bool {
	var need int64
	for _, r := range runs {
		need += int64(r[1]-r[0]) * int64(p.a.gran)
	}
	return need > p.a.headroom()
}

// timedSplit splits span i as placement planned it (splitPlan), with the
// allocator's gate closed where it has one (gate.go: no split where it
// refuses), counting the time in Stats.SplitNanos. A failed split changes
// nothing and reports false; only one that left a live span without memory
// returns its error (the allocator is broken).
func (p *pool) timedSplit(i int32, runs [][2]int, moves []stagedMove) (bool, error) {
	a := p.a
	open, ok := a.closeGate()
	if !ok {
		return false, nil
	}
	t0 := time.Now()
	err := p.split(i, runs, moves)
	a.c.splitNanos.Add(uint64(time.Since(t0)))
	open()
	if err != nil && a.broken.Load() {
		return false, err
	}
	return err == nil, nil
}

// splitReleasing splits span i where its live runs' new handles do not fit
// beside it (Config.Gather, at a shortage): the live runs are copied to
// their stages, the span is unmapped and its handle released, and only
// then are the runs' handles created (from the memory just given back:
// they need less), mapped at the old addresses and filled from the stages.
// If a run's handle cannot be had or mapped after the release (another
// process took the memory meanwhile, a driver failure), that run alone is
// tried once more; if that fails too, the allocator is marked broken and
// the error says where the run's bytes wait.
func (p *pool) splitReleasing(i int32, runs [][2]int, moves []stagedMove) error {
	a := p.a
	s := &p.spans[i]
	seg, c0, n, old := s.seg, int(s.c0), int(s.n), s.h
	base := seg.chunkAddr(c0, a.gran)
	if err := a.syncDevice(); err != nil {
		return err
	}
	if err := p.copyMoves(moves, false); err != nil {
		return err
	}
	if err := a.vm.Unmap(device.Ptr(base), uint64(n)*a.gran); err != nil {
		return err
	}
	a.c.unmaps.Add(1)
	a.dropHandle(old, uint64(n)*a.gran)
	p.forgetSpan(i)

	// mapAt maps h over chunks [r0, r1) of seg as a new span with access.
	mapAt := func(h device.Handle, r0, r1 int) error {
		at, size := seg.chunkAddr(r0, a.gran), uint64(r1-r0)*a.gran
		if err := a.vm.Map(device.Ptr(at), size, h); err != nil {
			a.dropHandle(h, size)
			return err
		}
		a.c.maps.Add(1)
		if err := a.vm.SetAccess(device.Ptr(at), size); err != nil {
			if a.vm.Unmap(device.Ptr(at), size) == nil {
				a.c.unmaps.Add(1)
				a.dropHandle(h, size)
			}
			return err
		}
		a.c.setAccess.Add(1)
		si := p.newSlot()
		p.spans[si] = span{h: h, n: int32(r1 - r0)}
		return p.attach(si, seg, r0, r1-1, true) // (with access: no driver call)
	}
	hs, err := p.runHandles(runs)
	if err == nil {
		for k, r := range runs {
			if err = mapAt(hs[k], c0+r[0], c0+r[1]); err != nil {
				// The runs mapped so far stay (their bytes are copied back
				// below); the others are tried again one by one.
				p.dropHandles(runs[k+1:], hs[k+1:])
				break
			}
		}
	}
	if err != nil {
		// Each run not mapped yet: a handle of its own once more, or the
		// allocator is broken.
		for _, r := range runs {
			if seg.chunks[c0+r[0]].span >= 0 {
				continue
			}
			h, cerr := p.runHandles([][2]int{r})
			if cerr == nil {
				cerr = mapAt(h[0], c0+r[0], c0+r[1])
			}
			if cerr != nil {
				a.broken.Store(true)
				return fmt.Errorf("%w: gathering free chunks, the live run at 0x%x (%d bytes) could not be mapped again after its span was given back; its bytes are at 0x%x: %w",
					ErrBroken, seg.chunkAddr(c0+r[0], a.gran), uint64(r[1]-r[0])*a.gran, stageOf(moves, seg.chunkAddr(c0+r[0], a.gran)), errors.Join(err, cerr))
			}
		}
	}
	return p.copyMoves(moves, true)
}

// forgetSpan takes split span i, already unmapped, off its chunks and
// frees its slot; its handle is the caller's to release.
func (p *pool) forgetSpan(i int32) {
	s := &p.spans[i]
	seg, c0, n := s.seg, int(s.c0), int(s.n)
	for j := c0; j < c0+n; j++ {
		c := &seg.chunks[j]
		c.span, c.ready = -1, false
	}
	seg.ready.set(c0, c0+n, false) // (which voids no ready cache: see block.nzFrom)
	p.mappedChunks -= n
	p.freeSlot(i)
}

// stageOf returns where the staged bytes of address at wait.
func stageOf(moves []stagedMove, at uint64) uint64 {
	for _, m := range moves {
		if at >= m.at && at < m.at+m.n {
			return m.stage + (at - m.at)
		}
	}
	return 0
}

// copy enqueues a copy of n bytes from src to dst and counts it; it is
// complete once the device is synchronized.
func (p *pool) copy(dst, src, n uint64) error {
	if err := p.a.copier.Copy(device.Ptr(dst), device.Ptr(src), n); err != nil {
		return err
	}
	p.a.c.copies.Add(1)
	p.a.c.copiedBytes.Add(n)
	return nil
}

// splitScratch moves span i's live runs to the new handles hs through a
// scratch address range, where the pool has too little free memory mapped
// with access to stage them: hs are mapped and granted there, filled, and
// unmapped, then remapped at the span's addresses. Per run: a create, two
// maps, two grants, an unmap and a copy; the span: an unmap and a release.
func (p *pool) splitScratch(i int32, runs [][2]int, hs []device.Handle) error {
	a := p.a
	s := &p.spans[i]
	base := s.seg.chunkAddr(int(s.c0), a.gran)
	a.scratchMu.Lock()
	defer a.scratchMu.Unlock()
	scratch, err := a.scratchRange(uint64(s.n) * a.gran)
	if err != nil {
		p.dropHandles(runs, hs)
		return err
	}
	size := func(r [2]int) uint64 { return uint64(r[1]-r[0]) * a.gran }
	at := func(r [2]int) uint64 { return base + uint64(r[0])*a.gran }
	tmp := func(r [2]int) uint64 { return scratch + uint64(r[0])*a.gran }

	mapped := 0 // runs mapped at scratch
	undo := func() {
		for k, h := range hs {
			if k < mapped {
				if a.vm.Unmap(device.Ptr(tmp(runs[k])), size(runs[k])) != nil {
					// Left mapped, with its handle, its bytes counted,
					// and the range, for Close (releaseScratch).
					a.lostScratch = append(a.lostScratch, scratchMapping{tmp(runs[k]), size(runs[k]), h})
					continue
				}
				a.c.unmaps.Add(1)
			}
			a.dropHandle(h, size(runs[k]))
		}
		if len(a.lostScratch) > 0 && a.scratchSize > 0 {
			a.lostRanges = append(a.lostRanges, scratchMapping{p: a.scratch, size: a.scratchSize})
			a.scratch, a.scratchSize = 0, 0
		}
	}
	for k, r := range runs {
		if err := a.vm.Map(device.Ptr(tmp(r)), size(r), hs[k]); err != nil {
			undo()
			return err
		}
		a.c.maps.Add(1)
		mapped++
		if err := a.vm.SetAccess(device.Ptr(tmp(r)), size(r)); err != nil {
			undo()
			return err
		}
		a.c.setAccess.Add(1)
	}
	if err := a.syncDevice(); err != nil {
		undo()
		return err
	}
	for _, r := range runs {
		if err := p.copy(tmp(r), at(r), size(r)); err != nil {
			_ = a.syncDevice() // no copy may still run when undo unmaps
			undo()
			return err
		}
	}
	if err := a.syncDevice(); err != nil {
		undo()
		return err
	}
	// The copies are done: the scratch mappings go, the handles stay.
	for mapped > 0 {
		r := runs[mapped-1]
		if err := a.vm.Unmap(device.Ptr(tmp(r)), size(r)); err != nil {
			undo()
			return err
		}
		a.c.unmaps.Add(1)
		mapped--
	}
	return p.remap(i, runs, hs, nil)
}

// remap unmaps span i, maps the unmapped handles hs at its live runs with
// access, calls fill (which puts the live bytes in them; nil if they hold
// them already), and does the books: each run a span of its own, wholly
// occupied, with access; the old handle released. Before the span is
// unmapped a failure releases hs and leaves span i as it was; after, the
// old handle is mapped back (restore).
func (p *pool) remap(i int32, runs [][2]int, hs []device.Handle, fill func() error) error {
	a := p.a
	s := &p.spans[i]
	seg, c0, n, old := s.seg, int(s.c0), int(s.n), s.h
	base := seg.chunkAddr(c0, a.gran)
	if err := a.vm.Unmap(device.Ptr(base), uint64(n)*a.gran); err != nil {
		p.dropHandles(runs, hs)
		return err
	}
	a.c.unmaps.Add(1)

	// Past here the old addresses are unmapped: map the new handles there,
	// or the old one back.
	final := 0
	for k, r := range runs {
		at, size := base+uint64(r[0])*a.gran, uint64(r[1]-r[0])*a.gran
		err := a.vm.Map(device.Ptr(at), size, hs[k])
		if err == nil {
			a.c.maps.Add(1)
			final++
			if err = a.vm.SetAccess(device.Ptr(at), size); err == nil {
				a.c.setAccess.Add(1)
			}
		}
		if err != nil {
			return p.restore(i, runs, final, hs, err)
		}
	}
	if fill != nil {
		if err := fill(); err != nil {
			return p.restore(i, runs, final, hs, err)
		}
	}
	p.forgetSpan(i)
	a.dropHandle(old, uint64(n)*a.gran)
	for k, r := range runs {
		si := p.newSlot()
		p.spans[si] = span{h: hs[k], n: int32(r[1] - r[0])}
		if err := p.attach(si, seg, c0+r[0], c0+r[1]-1, true); err != nil {
			return err // (attach with access makes no driver call)
		}
	}
	return nil
}

// restore undoes a split whose new handles could not all be mapped at the
// old addresses: it unmaps the first `final` of them, which were, maps the
// old handle of span i back with access, and releases the new handles. If
// the old handle cannot be mapped back, the live buffers over it have no
// memory any more: the allocator is marked broken and the error says so.
func (p *pool) restore(i int32, runs [][2]int, final int, hs []device.Handle, cause error) error {
	a := p.a
	s := &p.spans[i]
	base := s.seg.chunkAddr(int(s.c0), a.gran)
	errs := []error{cause}
	for _, r := range runs[:final] {
		if err := a.vm.Unmap(device.Ptr(base+uint64(r[0])*a.gran), uint64(r[1]-r[0])*a.gran); err != nil {
			errs = append(errs, err)
		} else {
			a.c.unmaps.Add(1)
		}
	}
	if len(errs) == 1 {
		if err := a.vm.Map(device.Ptr(base), uint64(s.n)*a.gran, s.h); err != nil {
			errs = append(errs, err)
		} else {
			a.c.maps.Add(1)
			if err := a.vm.SetAccess(device.Ptr(base), uint64(s.n)*a.gran); err != nil {
				errs = append(errs, err)
			} else {
				a.c.setAccess.Add(1)
			}
		}
	}
	if len(errs) > 1 {
		a.broken.Store(true)
		return fmt.Errorf("%w: moving the live chunks of the span at 0x%x failed and its memory could not be mapped back; buffers in [0x%x, 0x%x) have lost their memory: %w",
			ErrBroken, base, base, base+uint64(s.n)*a.gran, errors.Join(errs...))
	}
	for k, r := range runs {
		a.dropHandle(hs[k], uint64(r[1]-r[0])*a.gran)
	}
	return cause
}

// scratchMapping is a scratch mapping whose unmap the driver refused, with
// its handle (Close unmaps it, then releases the handle), or a scratch
// range that held one (Close releases it once nothing is mapped there).
type scratchMapping struct {
	p, size uint64
	h       device.Handle
}

// scratchRange returns the scratch address range for split, at least size
// bytes, reserving it (again, larger) if need be. Called with a.scratchMu.
func (a *Allocator) scratchRange(size uint64) (uint64, error) {
	if a.scratchSize >= size {
		return a.scratch, nil
	}
	if a.scratchSize > 0 {
		if err := a.vm.ReleaseAddress(device.Ptr(a.scratch), a.scratchSize); err != nil {
			return 0, err
		}
		a.scratch, a.scratchSize = 0, 0
	}
	size = max(size, scratchMin)
	size = (size + a.gran - 1) &^ (a.gran - 1)
	ptr, err := a.vm.Reserve(size, 0)
	if err != nil {
		return 0, fmt.Errorf("gpumem: reserving %d bytes of scratch address space: %w", size, err)
	}
	a.c.reserves.Add(1)
	a.scratch, a.scratchSize = uint64(ptr), size
	return a.scratch, nil
}

// releaseLost retries the scratch mappings a failed split left mapped
// (their handles count in Stats.SpareBytes), releases their handles, and
// once none is left, the ranges they lay in (Trim, Close). Called with
// a.scratchMu.
func (a *Allocator) releaseLost() error {
	var errs []error
	kept := a.lostScratch[:0]
	for _, m := range a.lostScratch {
		if err := a.vm.Unmap(device.Ptr(m.p), m.size); err != nil {
			errs = append(errs, err)
			kept = append(kept, m)
			continue
		}
		a.c.unmaps.Add(1)
		a.dropHandle(m.h, m.size)
	}
	a.lostScratch = kept
	if len(kept) == 0 {
		for _, r := range a.lostRanges {
			if err := a.vm.ReleaseAddress(device.Ptr(r.p), r.size); err != nil {
				errs = append(errs, err)
			}
		}
		a.lostRanges = nil
	}
	return errors.Join(errs...)
}

// releaseScratch gives back what releaseLost does and the scratch range
// (Close). Called with a.scratchMu.
func (a *Allocator) releaseScratch() error {
	err := a.releaseLost()
	if a.scratchSize > 0 {
		if rerr := a.vm.ReleaseAddress(device.Ptr(a.scratch), a.scratchSize); rerr != nil {
			return errors.Join(err, rerr)
		}
		a.scratch, a.scratchSize = 0, 0
	}
	return err
}
