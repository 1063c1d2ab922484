package gpumem

// See doc.go for the overview.

import (
	"errors"
	"fmt"

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
// When: only when growth would take the allocator past defragBound, a
// hundredth over the peak of active bytes (the bar of issue 11), and no
// empty span is left to release. Then the sparse span that gives back the
// most for the least copying is split, again until the growth fits or no
// span is sparse.
//
// How (split): the live runs get new handles, mapped at a scratch address
// range; the device is synchronized (every stream: no kernel may use the
// live bytes while they move), the runs are copied there, the scratch
// mappings are undone, the old span is unmapped, the new handles are mapped
// at the old addresses and granted access, and the old handle is released.
// Until the old span is unmapped any failure leaves everything as it was;
// after, a failure maps the old handle back, and if even that fails the
// allocator is marked broken (as the checker does): a live buffer has lost
// its memory, and the error says so.
//
// The cost: a device synchronize and, per live run, a create, two maps, two
// grants, two unmaps and a copy, plus an unmap and a release; so a split is
// done only when the bound needs it, and copies while the device is full
// are taken only where they fit under max(bound, peak reserved): moving
// bytes must not raise the peak it is meant to cut.
//
// The contract: while an allocation runs, no other thread may enqueue work
// that uses this allocator's memory (the synchronize would not cover it,
// and a kernel could find its memory unmapped). Single-threaded programs,
// and frameworks that launch from one thread at a time, meet it; that is
// why Defrag is a choice, not the default.

// defragShare: growth past peak active bytes plus 1/defragShare of them
// moves live chunks first (Config.Defrag).
const defragShare = 100

// scratchMin is the least address space the scratch range reserves.
const scratchMin = 64 << 20

// defrag frees physical memory by splitting sparse spans of p before size
// bytes are taken from the device, while growth would take the allocator
// past its bound: first empty spans go (makeRoom, as newSpan does again
// before it creates, for size bytes each time), then live chunks move.
// Errors from a split stop it (the growth goes on); only a split that
// could not restore a live span returns its error.
func (p *pool) defrag(size uint64) error {
	a := p.a
	live := max(a.peakActive.Load(), p.peakActive, p.active)
	bound := min(live+live/defragShare, a.limit.Load())
	if a.reserved.Load()+size <= bound {
		return nil
	}
	p.makeRoom(size)
	for a.reserved.Load()+size > bound {
		// Bytes in flight during a copy stay under the peak already
		// reached, or the bound.
		room := int64(max(bound, a.peakReserved.Load())) - int64(a.reserved.Load())
		i := p.sparsest(room)
		if i < 0 {
			return nil
		}
		if err := p.split(i); err != nil {
			if a.broken.Load() {
				return err
			}
			return nil
		}
	}
	return nil
}

// sparsest picks the span to split: among the sparse spans (some chunks
// live, some empty) whose live chunks fit in room bytes, the one that gives
// back the most net of what it copies; if none fits, the one that copies
// least. -1 if no span is sparse. Spans the current back placed are left
// alone (its undo list names them).
func (p *pool) sparsest(room int64) int32 {
	best, bestScore := int32(-1), int64(-1<<62)
	g := int64(p.a.gran)
	for i := range p.spans {
		s := &p.spans[i]
		if !s.inUse || s.prealloc || s.occupied == 0 || s.occupied == s.n || !s.access || p.placedNow(int32(i)) {
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

// liveRuns returns the runs of occupied chunks of span i, as chunk offsets
// [r0, r1) from its start: a chunk is occupied when a block that is not
// free overlaps it (see the invariants in vm.go), or the block being
// backed, which is not marked allocated yet.
func (p *pool) liveRuns(i int32) [][2]int {
	s := &p.spans[i]
	seg, c0, n := s.seg, int(s.c0), int(s.n)
	occ := make([]bool, n)
	for b := seg.first; b != nil; b = b.next {
		b0, b1 := seg.chunkSpan(b.addr, b.size, p.a.gran)
		if b1 < c0 {
			continue
		}
		if b0 >= c0+n {
			break
		}
		if b.state != blockFree || b == p.backing {
			for j := max(b0, c0); j <= min(b1, c0+n-1); j++ {
				occ[j-c0] = true
			}
		}
	}
	var runs [][2]int
	for j := 0; j < n; {
		if !occ[j] {
			j++
			continue
		}
		k := j
		for k < n && occ[k] {
			k++
		}
		runs = append(runs, [2]int{j, k})
		j = k
	}
	return runs
}

// split moves the live runs of sparse span i to handles of their own at the
// same addresses and releases the span's handle (see the overview above).
func (p *pool) split(i int32) error {
	a := p.a
	s := &p.spans[i]
	seg, c0, n, old := s.seg, int(s.c0), int(s.n), s.h
	base := seg.chunkAddr(c0, a.gran)
	runs := p.liveRuns(i)
	if len(runs) == 0 {
		return fmt.Errorf("gpumem: span at 0x%x counts %d live chunks but no live block overlaps it", base, s.occupied)
	}
	a.scratchMu.Lock()
	defer a.scratchMu.Unlock()
	scratch, err := a.scratchRange(uint64(n) * a.gran)
	if err != nil {
		return err
	}
	size := func(r [2]int) uint64 { return uint64(r[1]-r[0]) * a.gran }
	at := func(r [2]int) uint64 { return base + uint64(r[0])*a.gran }
	tmp := func(r [2]int) uint64 { return scratch + uint64(r[0])*a.gran }

	// New handles, mapped at the scratch range, with the live bytes.
	hs := make([]device.Handle, 0, len(runs))
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
	for _, r := range runs {
		if !a.takeBudget(size(r)) {
			undo()
			return &shortage{cause: CauseLimit}
		}
		h, err := a.vm.Create(size(r))
		if err != nil {
			a.giveBudget(size(r))
			undo()
			return err
		}
		a.c.creates.Add(1)
		hs = append(hs, h)
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
		if err := a.copier.Copy(device.Ptr(tmp(r)), device.Ptr(at(r)), size(r)); err != nil {
			undo()
			return err
		}
		a.c.copies.Add(1)
		a.c.copiedBytes.Add(size(r))
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
	if err := a.vm.Unmap(device.Ptr(base), uint64(n)*a.gran); err != nil {
		undo()
		return err
	}
	a.c.unmaps.Add(1)

	// Past here the old addresses are unmapped: map the new handles there,
	// or the old one back.
	final := 0
	for k, r := range runs {
		err := a.vm.Map(device.Ptr(at(r)), size(r), hs[k])
		if err == nil {
			a.c.maps.Add(1)
			final++
			if err = a.vm.SetAccess(device.Ptr(at(r)), size(r)); err == nil {
				a.c.setAccess.Add(1)
			}
		}
		if err != nil {
			return p.restore(i, runs, final, hs, err)
		}
	}
	// Books: the old span's chunks are unmapped, each run is a span of
	// its own, wholly occupied, with access.
	for j := c0; j < c0+n; j++ {
		c := &seg.chunks[j]
		c.span, c.ready = -1, false
	}
	seg.ready.set(c0, c0+n, false) // (which voids no ready cache: see block.nzFrom)
	p.mappedChunks -= n
	p.freeSlot(i)
	a.dropHandle(old, uint64(n)*a.gran)
	for k, r := range runs {
		si := p.newSlot()
		p.spans[si] = span{h: hs[k], n: int32(r[1] - r[0])}
		if err := p.attach(si, seg, c0+r[0], c0+r[1]-1, true); err != nil {
			return err // (attach with access makes no driver call)
		}
	}
	a.c.splits.Add(1)
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
		return fmt.Errorf("gpumem: moving the live chunks of the span at 0x%x failed and its memory could not be mapped back; buffers in [0x%x, 0x%x) have lost their memory: %w",
			base, base, base+uint64(s.n)*a.gran, errors.Join(errs...))
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
