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
	"github.com/gpumem/gpumem/internal/invariants"
)

// Allocator is a stream-ordered caching allocator over one device. It is
// safe for concurrent use; goroutines working on different streams contend
// only on the shared statistics.
type Allocator struct {
	dev   device.Device
	vm    device.VirtualMemory // nil in ModePlain
	ev    device.Events        // nil when the device has no events
	mk    device.Markers       // nil without events, markers (by type) or with Config.NoMarkers
	mode  Mode
	cfg   Config
	gran  uint64 // chunk size, the device's granularity (ModeVirtual), or segmentRound
	total uint64 // device capacity
	// limit caps reserved bytes (SetLimit may change it). overhang is what
	// was reserved when SetLimit last lowered the limit below it: memory
	// taken before, which reserved may still exceed the limit by.
	limit, overhang atomic.Uint64
	small           uint64 // SmallSize
	// spanChunks is the most chunks one span may have (Config.SpanSize).
	// Under Compact with no SpanSize it is where spans start, and
	// spanGrow lets them grow with the allocator (pool.spanMost).
	spanChunks int
	// tightens: the default tightens under pressure (tight,
	// pressure.go); false under Compact, Gather and Defrag, and with
	// Config.SpanSize set.
	tightens     bool
	spanGrow     bool
	compact      bool // Config.Compact, in ModeVirtual
	defrag       bool // Config.Defrag, in ModeVirtual with a Copier, not compact
	copier       device.Copier
	gather       bool // Config.Gather, with a copier
	chunkHandles bool // Config.ChunkHandles, in ModeVirtual: a handle per chunk (chunks.go)
	noChurn      bool // tests only: the policy without the churn guard (churn.go)
	check        bool // run the checker after every operation
	checkSearch  bool // compare every findBacked answer with findFewest's (check, or tests)

	pools atomic.Pointer[poolTable] // copy on write, under mu
	mu    sync.Mutex                // guards pool creation, closing, idle

	// The scratch address range that split copies through, scratch
	// mappings the driver refused to unmap, and the ranges they lie in
	// (defrag.go).
	scratchMu               sync.Mutex
	scratch, scratchSize    uint64
	lostScratch, lostRanges []scratchMapping

	// handles holds physical handles unmapped but not released (the driver
	// refused; retried by Trim and Close), guarded by handlesMu.
	handlesMu sync.Mutex
	handles   []heldHandle

	// reserved and its peak are exact (changed only on slow paths).
	// allocated and active are the pools' gauges as last flushed (see
	// pool.flush): exact with one stream, within flushBytes per stream with
	// several; Stats sums the pools' exact gauges.
	reserved, peakReserved atomic.Uint64
	// segments counts the heaps' segments (plain segments and virtual
	// arenas) of every pool, peakSegments its most since ResetPeaks
	// (Stats.PeakSegments).
	segments, peakSegments    atomic.Int64
	allocated, active         atomic.Int64
	peakAllocated, peakActive atomic.Uint64
	// counters of device work; see Stats.
	c counters

	// captures counts the stream captures underway on the device
	// (BeginCapture); shared by an allocator and its private pools
	// (capture.go).
	captures *atomic.Int32
	// family counts the bytes held from the device by an allocator and
	// its private pools: the measure of the limit (takeBudget). root is
	// the allocator whose limit applies: a itself, or the allocator a
	// private pool was made from. keep: a private pool, whose memory
	// stays where it is until Close (capture.go).
	family      *atomic.Uint64
	familyBytes atomic.Uint64 // what family points to, for a root
	familyPeak  atomic.Uint64 // for a root: the most family has held (FamilyPeakReserved)
	ownCaptures atomic.Int32  // what captures points to, for a root
	// reuse is what a root and its private pools share for reuse within
	// a capture (capture.go); ownReuse is a root's.
	reuse    *captureReuse
	ownReuse captureReuse
	root     *Allocator
	keep     bool
	// A private pool's PrivateConfig: segments from segs instead of the
	// device (nil: the device); noSplit: blocks never split (place.go).
	segs    SegmentSource
	noSplit bool

	closed      atomic.Bool
	closedClean bool                  // Close gave everything back (guarded by mu)
	broken      atomic.Bool           // the books no longer match the device (ErrBroken): an invariant violated, or a split that lost live memory
	multi       atomic.Bool           // more than one pool: frees publish at once
	gate        atomic.Pointer[Gate]  // SetGate (gate.go); nil: none
	gateErr     atomic.Pointer[error] // why the gate last refused to close; nil: it never did
	stopIdle    chan struct{}
	idleDone    chan struct{}
}

// counters are the allocator's event counts, all atomics.
type counters struct {
	deviceAllocs, deviceFrees              atomic.Uint64
	creates, releases, maps, unmaps        atomic.Uint64
	setAccess, reserves, fences            atomic.Uint64
	handoffs, orders, ooms, retries, trims atomic.Uint64
	splits, copies, copiedBytes            atomic.Uint64
	splitNanos, gateRefusals               atomic.Uint64
	driverNanos, waitNanos                 atomic.Uint64
	createNanos, mapNanos, accessNanos     atomic.Uint64
	unmapNanos, releaseNanos               atomic.Uint64
	misses, missNanos                      atomic.Uint64
	eventCalls, eventNanos                 atomic.Uint64
	markCalls, markNanos                   atomic.Uint64 // within eventCalls, eventNanos
}

// New makes an allocator over dev.
func New(dev device.Device, cfg Config) (*Allocator, error) {
	if dev == nil {
		return nil, errors.New("gpumem: New: nil device")
	}
	a := &Allocator{dev: dev, cfg: cfg, check: cfg.CheckInvariants || invariants.Enabled}
	a.checkSearch = a.check
	a.root, a.family, a.captures = a, &a.familyBytes, &a.ownCaptures
	a.reuse = &a.ownReuse
	a.reuse.g, _ = device.AsCaptureGraph(dev)
	a.total = dev.Info().Total
	if a.total == 0 {
		_, t, err := dev.MemInfo()
		if err != nil {
			return nil, fmt.Errorf("gpumem: New: reading device memory: %w", err)
		}
		a.total = t
	}
	a.limit.Store(a.capLimit(cfg.Limit))
	a.small = cfg.SmallSize
	if a.small == 0 {
		a.small = defaultSmallSize
	}
	vm, hasVM := device.AsVirtualMemory(dev)
	switch cfg.Mode {
	case ModeAuto:
		a.mode = ModePlain
		if hasVM {
			a.mode = ModeVirtual
		}
	case ModePlain:
		a.mode = ModePlain
	case ModeVirtual:
		if !hasVM {
			return nil, fmt.Errorf("gpumem: New: mode virtual: %w", device.ErrUnsupported)
		}
		a.mode = ModeVirtual
	default:
		return nil, fmt.Errorf("gpumem: New: unknown mode %d", cfg.Mode)
	}
	a.gran = segmentRound
	if a.mode == ModeVirtual {
		a.vm = timedVM{vm, &a.c}
		a.gran = vm.Granularity()
		if a.gran == 0 || a.gran&(a.gran-1) != 0 || a.gran < minBlock {
			return nil, fmt.Errorf("gpumem: New: device granularity %d is not a power of two ≥ %d", a.gran, minBlock)
		}
	}
	a.compact = cfg.Compact && a.mode == ModeVirtual
	a.chunkHandles = cfg.ChunkHandles && a.mode == ModeVirtual
	if a.chunkHandles && (cfg.Compact || cfg.Defrag || cfg.Gather) {
		return nil, errors.New("gpumem: New: ChunkHandles cannot be combined with Compact, Defrag or Gather")
	}
	if c, ok := device.AsCopier(dev); ok && a.mode == ModeVirtual && !a.compact {
		a.defrag, a.gather, a.copier = cfg.Defrag, cfg.Gather, c // a copier for a gate too (SetGate)
	}
	span := cfg.SpanSize
	if span == 0 {
		span = defaultSpanSize
		if a.compact {
			span, a.spanGrow = compactSpanSize, true
		} else if a.mode == ModeVirtual && !a.gather && !a.defrag {
			// pressure.go; Gather and Defrag move memory instead, and
			// their figures (calls at the fit) are those of the default's
			// spans.
			a.tightens = true
		}
	}
	a.spanChunks = int(max(span/a.gran, 1))
	if ev, ok := device.AsEvents(dev); ok {
		a.ev = timedEvents{ev, &a.c}
		if mk, ok := device.AsMarkers(dev); ok && !cfg.NoMarkers {
			a.mk = timedMarkers{mk, &a.c}
		}
	}
	a.pools.Store(&poolTable{})
	if err := a.preallocate(); err != nil {
		a.Close()
		return nil, err
	}
	if cfg.IdleRelease > 0 {
		a.stopIdle = make(chan struct{})
		a.idleDone = make(chan struct{})
		go a.idleLoop(cfg.IdleRelease)
	}
	return a, nil
}

// Mode reports the mode in use (never ModeAuto).
func (a *Allocator) Mode() Mode { return a.mode }

// Device returns the device the allocator manages.
func (a *Allocator) Device() device.Device { return a.dev }

// Buffer is device memory handed out by Alloc. It is a small value; copy it
// freely. Free it exactly once, through the allocator or scope it came
// from.
type Buffer struct {
	ptr  device.Ptr
	size uint64
	b    *block
	gen  uint32
}

// Ptr is the buffer's device address.
func (b Buffer) Ptr() device.Ptr { return b.ptr }

// Size is the size that was asked for.
func (b Buffer) Size() uint64 { return b.size }

// IsZero reports whether b is the zero Buffer.
func (b Buffer) IsZero() bool { return b.b == nil }

// Alloc returns size bytes of device memory, valid for work on stream s.
// See doc.go for the stream contract.
func (a *Allocator) Alloc(size uint64, s device.Stream) (Buffer, error) {
	return a.alloc(size, s, nil)
}

// Lone reports whether the allocator has at most one pool (ModeVirtual,
// or one stream so far): only then are its peaks exact under one lock.
func (a *Allocator) Lone() bool { return !a.multi.Load() }

func (a *Allocator) alloc(size uint64, s device.Stream, sc *Scope) (Buffer, error) {
	if size == 0 || size > maxRequest {
		return Buffer{}, fmt.Errorf("%w: Alloc(%d): want 1 to %d bytes", ErrInvalidSize, size, uint64(maxRequest))
	}
	if a.closed.Load() {
		return Buffer{}, fmt.Errorf("%w: Alloc(%d) on a closed allocator", ErrClosed, size)
	}
	p, si, err := a.poolFor(s)
	if err != nil {
		return Buffer{}, err
	}
	rounded := (size + minBlock - 1) &^ (minBlock - 1)
	p.mu.Lock()
	if p.nmarked > 0 {
		p.freeJoined(si) // only while frees of a capture wait (capture.go)
	}
	p.settle()
	b := p.allocFast(rounded, si)
	if b == nil {
		t0 := time.Now()
		var err error
		b, err = p.allocSlow(rounded, size, si)
		a.c.misses.Add(1)
		addSince(&a.c.missNanos, t0)
		if err != nil {
			p.mu.Unlock()
			return Buffer{}, err
		}
	}
	buf := p.hand(b, size, si, sc)
	p.mu.Unlock()
	return buf, nil
}

// hand makes allocated block b of pool p the Buffer of a request of size
// bytes on stream slot si (under p.mu): its books, the pool's gauges and
// counters, and its call site when recorded.
func (p *pool) hand(b *block, size uint64, si slot, sc *Scope) Buffer {
	a := p.a
	b.si = si
	b.req = size
	b.scope = sc
	b.gen++
	p.nallocs++
	b.id = p.nallocs
	p.peakLive = max(p.peakLive, p.nallocs-p.nfrees)
	p.noteAlloc(b.size, size)
	if a.cfg.RecordSites {
		x := b.extra()
		x.site = callers()
		x.created = time.Now().UnixNano()
		p.countSite(x.site, size)
	}
	if a.check {
		a.mustCheckPool(p)
	}
	return Buffer{ptr: device.Ptr(b.addr), size: size, b: b, gen: b.gen}
}

// Free returns a buffer. Memory freed on the buffer's stream is reusable on
// that stream at once; if RecordStream named other streams, it is reusable
// only after their work up to now has completed.
func (a *Allocator) Free(buf Buffer) error {
	return a.free(buf, "Free", nil)
}

func (a *Allocator) free(buf Buffer, op string, closing *Scope) error {
	b := buf.b
	if b == nil || b.pool == nil || b.pool.a != a {
		return &BufferError{Op: op, Ptr: uint64(buf.ptr), Size: buf.size, Err: ErrForeign, Why: "not allocated by this allocator"}
	}
	p := b.pool
	p.mu.Lock()
	if b.gen != buf.gen || b.state != blockAllocated || b.addr != uint64(buf.ptr) {
		p.mu.Unlock()
		return &BufferError{Op: op, Ptr: uint64(buf.ptr), Size: buf.size, Err: ErrDoubleFree, Why: "already freed"}
	}
	if sc := b.scope; sc != nil {
		sc.unlink(b, closing)
		b.scope = nil
	}
	p.nfrees++
	p.noteFree(b.size, b.req)
	p.freeBlock(b)
	t := a.cfg.ReleaseThreshold
	over := false
	if t > 0 {
		p.flush() // this pool's part of cached() exact
		over = a.cached() > t
	}
	if a.check {
		a.mustCheckPool(p)
	}
	p.mu.Unlock()
	if over {
		a.releaseTo(t)
	}
	return nil
}

// lockLive locks the pool of live buffer buf and returns it, or, with
// nothing locked, a BufferError for op: ErrForeign where another allocator
// made buf, ErrDoubleFree (saying freed) where it is no longer live.
func (a *Allocator) lockLive(op string, buf Buffer, freed string) (*pool, error) {
	b := buf.b
	if b == nil || b.pool == nil || b.pool.a != a {
		return nil, &BufferError{Op: op, Ptr: uint64(buf.ptr), Size: buf.size, Err: ErrForeign, Why: "not allocated by this allocator"}
	}
	p := b.pool
	p.mu.Lock()
	if b.gen != buf.gen || b.state != blockAllocated {
		p.mu.Unlock()
		return nil, &BufferError{Op: op, Ptr: uint64(buf.ptr), Size: buf.size, Err: ErrDoubleFree, Why: freed}
	}
	return p, nil
}

// RecordStream tells the allocator that buf is also used by work on stream
// s. When buf is freed, its memory is not reused until the work enqueued on
// s up to the free has completed (as torch.Tensor.record_stream).
func (a *Allocator) RecordStream(buf Buffer, s device.Stream) error {
	p, err := a.lockLive("RecordStream", buf, "buffer was freed")
	if err != nil {
		return err
	}
	defer p.mu.Unlock()
	b := buf.b
	if s == b.stream() { // the stream it was allocated on
		return nil
	}
	x := b.extra()
	for _, u := range x.uses {
		if u == s {
			return nil
		}
	}
	x.uses = append(x.uses, s)
	return nil
}

// poolTable maps streams to pools and their slots in them: immutable
// slices, replaced whole when a stream comes or goes. The lookup scans
// streams, which sit in the table itself: reading a pool's fields would
// share the cache line of its mutex with the goroutine working on that
// pool. In ModeVirtual every stream maps to the one shared pool; all lists
// each pool once.
type poolTable struct {
	streams []device.Stream
	pools   []*pool
	slots   []slot
	all     []*pool
}

func (t *poolTable) with(s device.Stream, p *pool, si slot) *poolTable {
	n := &poolTable{
		streams: append(slices.Clone(t.streams), s),
		pools:   append(slices.Clone(t.pools), p),
		slots:   append(slices.Clone(t.slots), si),
		all:     slices.Clone(t.all),
	}
	if !slices.Contains(n.all, p) {
		n.all = append(n.all, p)
	}
	return n
}

// without drops stream i, and its pool from all when dropPool is set.
func (t *poolTable) without(i int, dropPool bool) *poolTable {
	n := &poolTable{
		streams: slices.Delete(slices.Clone(t.streams), i, i+1),
		pools:   slices.Delete(slices.Clone(t.pools), i, i+1),
		slots:   slices.Delete(slices.Clone(t.slots), i, i+1),
		all:     slices.Clone(t.all),
	}
	if dropPool {
		n.all = slices.DeleteFunc(n.all, func(q *pool) bool { return q == t.pools[i] })
	}
	return n
}

// poolFor returns the pool of stream s and its slot there, making them on
// first use. The lookup is a scan of a short immutable slice: no map, no
// lock, no allocation.
func (a *Allocator) poolFor(s device.Stream) (*pool, slot, error) {
	t := a.pools.Load()
	for i, st := range t.streams {
		if st == s {
			return t.pools[i], t.slots[i], nil
		}
	}
	return a.addPool(s)
}

// addPool is poolFor's slow path: the stream's first use.
func (a *Allocator) addPool(s device.Stream) (*pool, slot, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	t := a.pools.Load()
	for i, st := range t.streams {
		if st == s {
			return t.pools[i], t.slots[i], nil
		}
	}
	if a.mode == ModeVirtual && len(t.all) > 0 {
		// One arena for every stream (see pool).
		p := t.all[0]
		p.mu.Lock()
		defer p.mu.Unlock()
		if p.live >= maxStreams {
			return nil, 0, fmt.Errorf("gpumem: stream %d: the allocator already serves %d streams, the most it can; ReleaseStream the ones done with", s, p.live)
		}
		si := p.addStream(s)
		a.pools.Store(t.with(s, p, si))
		return p, si, nil
	}
	old := t.all
	p := newPool(a, s)
	if len(old) > 0 && !a.multi.Load() {
		// From now on frees publish at once; publish what is held back
		// (a lone pool's allocated bytes and peaks included: see flush).
		a.multi.Store(true)
		for _, q := range old {
			q.mu.Lock()
			q.flush()
			maxTo(&a.peakAllocated, q.peakAllocated)
			maxTo(&a.peakActive, q.peakActive)
			q.mu.Unlock()
		}
	}
	a.pools.Store(t.with(s, p, 0))
	return p, 0, nil
}

func (a *Allocator) allPools() []*pool { return a.pools.Load().all }

// Held returns what the allocator holds from the device and what its live
// buffers' blocks take of it (Usage's Reserved and Active, exact when no
// operation runs concurrently): for questions asked often (Host.MemInfo,
// which PyTorch's cacheInfo asks at every cuDNN attention call).
func (a *Allocator) Held() (reserved, active uint64) {
	u := a.Usage()
	return u.Reserved, u.Active
}

// flushBytes is how far a pool's gauges may drift from the allocator's
// shared figures before the pool publishes them: one shared atomic update
// per operation would bounce a cache line between the goroutines of
// different streams and stop throughput from growing with them.
const flushBytes = 4 << 20

// noteAlloc and noteFree keep the pool's gauges (under p.mu). A pool's own
// peaks are exact, and with one stream they are the allocator's; the
// allocator's shared peaks are taken at each flush, within flushBytes per
// stream of the exact ones.
func (p *pool) noteAlloc(size, req uint64) {
	p.allocated += req
	p.active += size
	p.allocBytes += size
	p.allocReq += req
	p.peakAllocated = max(p.peakAllocated, p.allocated)
	p.peakActive = max(p.peakActive, p.active)
	p.dAllocated += int64(req)
	p.dActive += int64(size)
	if p.dActive >= flushBytes {
		p.flush()
	}
}

func (p *pool) noteFree(size, req uint64) {
	p.allocated -= req
	p.active -= size
	p.freeBytes += size
	p.freeReq += req
	p.dAllocated -= int64(req)
	p.dActive -= int64(size)
	if p.dActive <= -flushBytes {
		p.flush()
		return
	}
	if h := -p.dActive; h > p.heldBound && p.a.multi.Load() {
		// Another stream's flush must not count this free as still live
		// (a peak that never was): publish a bound on what is held back,
		// in this pool's own cache line. A bound above the truth only
		// lowers others' peak candidates, so it is raised in 1 MiB steps
		// and never lowered until the next flush: an alloc/free loop
		// publishes nothing.
		p.heldBound = (h + heldStep - 1) &^ (heldStep - 1)
		p.held.Store(p.heldBound)
	}
}

const heldStep = 1 << 20

// flush publishes the pool's gauge changes to the allocator's figures. A
// new peak is counted net of the frees other pools hold back, so peaks may
// lag (by up to flushBytes per stream) but never overstate.
func (p *pool) flush() {
	a := p.a
	if !a.multi.Load() {
		// The allocator's only pool (ModeVirtual always: one arena for all
		// streams): its own peaks are the allocator's, exact (Stats takes
		// them), so only Active is published, for cached() to read without
		// locks; Allocated accumulates in dAllocated until a second pool
		// appears (addPool sets multi and flushes every pool). One locked
		// instruction per flush instead of two, and no peak updates.
		if p.dActive != 0 {
			a.active.Add(p.dActive)
			p.dActive = 0
		}
		return
	}
	// Frees held back count against both gauges (a request is at most
	// its block: held allocated bytes <= held active bytes).
	if p.dAllocated != 0 {
		v := a.allocated.Add(p.dAllocated)
		if p.dAllocated > 0 {
			maxTo(&a.peakAllocated, p.netOfHeld(v))
		}
	}
	if p.dActive != 0 {
		v := a.active.Add(p.dActive)
		if p.dActive > 0 {
			maxTo(&a.peakActive, p.netOfHeld(v))
		}
	}
	p.dAllocated, p.dActive = 0, 0
	if p.heldBound != 0 {
		p.heldBound = 0
		p.held.Store(0)
	}
}

// netOfHeld is v less (a bound on) the frees the other pools hold back.
func (p *pool) netOfHeld(v int64) uint64 {
	for _, q := range p.a.allPools() {
		if q != p {
			v -= q.held.Load()
		}
	}
	return uint64(max(v, 0))
}

// cached is Reserved - Active, read without locks: approximate (within
// flushBytes per stream), for release decisions.
func (a *Allocator) cached() uint64 {
	r, act := int64(a.reserved.Load()), a.active.Load()
	if act > r {
		return 0
	}
	return uint64(r - act)
}

func maxTo(peak *atomic.Uint64, v uint64) {
	for {
		p := peak.Load()
		if v <= p || peak.CompareAndSwap(p, v) {
			return
		}
	}
}

// takeBudget reserves n bytes of the limit for memory about to be taken from
// the device; false if that would pass the limit.
// The limit counts what the allocator's private pools hold too (family).
func (a *Allocator) takeBudget(n uint64) bool {
	for {
		r := a.family.Load()
		if r+n > a.root.limit.Load() {
			return false
		}
		if a.family.CompareAndSwap(r, r+n) {
			maxTo(&a.peakReserved, a.reserved.Add(n))
			maxTo(&a.root.familyPeak, r+n)
			return true
		}
	}
}

func (a *Allocator) giveBudget(n uint64) {
	a.reserved.Add(-n)
	a.family.Add(-n)
}

// capLimit is the limit that n asks for: the device's capacity for 0 or
// anything larger.
func (a *Allocator) capLimit(n uint64) uint64 {
	if n == 0 || n > a.total {
		return a.total
	}
	return n
}

// Limit reports the cap on the bytes held from the device (Config.Limit,
// or the device's capacity).
func (a *Allocator) Limit() uint64 { return a.limit.Load() }

// SetLimit changes the cap on the bytes held from the device (0: the
// device's capacity), as torch.cuda.set_per_process_memory_fraction does.
// Lowering it below what is held first returns cached memory to the device,
// preallocated memory included; if live buffers still hold more than the
// new limit, the limit is set all the same (nothing more is taken from the
// device until enough is freed) and SetLimit reports how much is over.
func (a *Allocator) SetLimit(n uint64) error {
	if a.closed.Load() {
		return fmt.Errorf("%w: SetLimit on a closed allocator", ErrClosed)
	}
	n = a.capLimit(n)
	a.limit.Store(n)
	r := a.family.Load() // private pools count too (capture.go)
	if r <= n {
		return nil
	}
	err := a.Trim()
	if r = a.family.Load(); r > n {
		a.overhang.Store(r)
		return errors.Join(err, fmt.Errorf("%w: SetLimit(%s): live buffers hold %s, more than the new limit; nothing more is taken from the device until they are freed",
			ErrOverLimit, fmtBytes(n), fmtBytes(r)))
	}
	return err
}

// Trim returns every cached byte it can to the device now: pending frees
// are waited for, empty spans unmapped and released, free segments freed,
// preallocated memory included. What stays is memory that shares a span
// (ModeVirtual) or a segment (ModePlain) with a live buffer: Stats.Cached
// minus Stats.Releasable before the call. With no buffer live, Trim leaves
// nothing. Config.SpanSize bounds what a live buffer can hold back.
func (a *Allocator) Trim() error {
	if a.keep {
		return nil // a private pool's memory stays until Close (capture.go)
	}
	return a.trimAll()
}

// ReleaseUnused gives back the memory of private pool a that no buffer
// uses: the Trim a private pool refuses, for a pool whose users are all
// gone while some of its buffers still live (PyTorch's allocator frees a
// released graph pool's free segments at empty_cache while a graph's
// output lives on). Only its caller knows that no graph will write that
// memory any more, and it must have waited for the device to finish the
// pool's work. On an allocator that is not a private pool it is Trim.
func (a *Allocator) ReleaseUnused() error { return a.trimAll() }

func (a *Allocator) trimAll() error {
	if a.capturing() {
		return fmt.Errorf("gpumem: Trim: %w: nothing was given back", errCapturing)
	}
	a.c.trims.Add(1)
	var errs []error
	for _, p := range a.allPools() {
		p.mu.Lock()
		if err := p.trim(true); err != nil {
			errs = append(errs, err)
		}
		if a.check {
			a.mustCheckPool(p)
		}
		p.mu.Unlock()
	}
	if err := a.releaseHandles(); err != nil {
		errs = append(errs, err)
	}
	a.scratchMu.Lock()
	if err := a.releaseLost(); err != nil {
		errs = append(errs, err)
	}
	a.scratchMu.Unlock()
	return errors.Join(errs...)
}

// releaseTo releases cached memory until at most target bytes are cached,
// taking from each pool's oldest empty memory. Preallocated memory is kept.
func (a *Allocator) releaseTo(target uint64) {
	if a.keep || a.capturing() {
		return
	}
	for _, p := range a.allPools() {
		if a.cached() <= target {
			return
		}
		if !p.mu.TryLock() {
			continue
		}
		p.flush()
		p.settle()
		p.releaseExcess(target)
		p.mu.Unlock()
	}
}

// Close frees every buffer still allocated, returns all memory and address
// space to the device and makes further calls fail with ErrClosed. If
// buffers were still allocated it returns a *LeakError describing them.
func (a *Allocator) Close() error {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.broken.Load() {
		a.closed.Store(true)
		return fmt.Errorf("%w: Close: the allocator's books cannot be trusted (an invariant was violated, or a split lost live memory), so nothing is given back", ErrBroken)
	}
	if a.closed.Swap(true) {
		if a.closedClean {
			return nil
		}
		// An earlier Close failed part way: try again to give back what is
		// left (no buffer is live any more).
		return a.giveBackAll(nil)
	}
	if a.stopIdle != nil {
		close(a.stopIdle)
		<-a.idleDone
	}
	var leaks []LeakedBuffer
	for _, p := range a.allPools() {
		p.mu.Lock()
		leaks = append(leaks, p.leaks()...)
		p.mu.Unlock()
	}
	for _, l := range leaks {
		_ = a.free(l.buf, "Close", nil)
	}
	var first error
	if len(leaks) > 0 {
		first = &LeakError{Owner: "allocator", Buffers: leaks}
	}
	return a.giveBackAll(first)
}

// giveBackAll trims every pool and releases its address space and events,
// then retries handles the driver refused to release. closedClean records
// whether everything went back, so that a later Close can try again.
// Called with a.mu held.
func (a *Allocator) giveBackAll(first error) error {
	var errs []error
	if first != nil {
		errs = append(errs, first)
	}
	clean := true
	for _, p := range a.allPools() {
		p.mu.Lock()
		if err := p.trim(true); err != nil {
			errs = append(errs, err)
			clean = false
		}
		if err := p.teardown(); err != nil {
			errs = append(errs, err)
			clean = false
		}
		p.mu.Unlock()
	}
	if err := a.releaseHandles(); err != nil {
		errs = append(errs, err)
		clean = false
	}
	a.scratchMu.Lock()
	if err := a.releaseScratch(); err != nil {
		errs = append(errs, err)
		clean = false
	}
	a.scratchMu.Unlock()
	a.closedClean = clean
	return errors.Join(errs...)
}

// opCount is the number of allocs and frees so far, read pool by pool (the
// hot path keeps its counts under the pool's lock, not in a shared atomic).
func (a *Allocator) opCount() uint64 {
	var n uint64
	for _, p := range a.allPools() {
		p.mu.Lock()
		n += p.nallocs + p.nfrees
		p.mu.Unlock()
	}
	return n
}

func (a *Allocator) idleLoop(d time.Duration) {
	defer close(a.idleDone)
	// Checked every d/100 (at least 5 ms): the release comes at most that
	// long after the idle time is up (gpumem run promises the release delay
	// plus 100 ms); a check locks each pool once, nothing more.
	tick := time.NewTicker(max(d/100, 5*time.Millisecond))
	defer tick.Stop()
	last, since := a.opCount(), time.Now()
	for {
		select {
		case <-a.stopIdle:
			return
		case now := <-tick.C:
			if n := a.opCount(); n != last {
				last, since = n, now
				continue
			}
			if now.Sub(since) >= d && a.cached() > 0 && !a.capturing() {
				a.reclaim() // keeps preallocated memory; Trim does not
				since = now
			}
		}
	}
}

// ReleaseStream gives back everything the allocator holds for stream s and
// forgets the stream. Call it before destroying a stream: the allocator
// records events on the streams it holds memory for, and recording on a
// destroyed stream is undefined in CUDA. It fails, changing nothing, while
// buffers allocated on s, or named on s by RecordStream, are still live.
// In ModeVirtual, where all streams share one arena, the memory s freed
// stays cached for the other streams (after a wait for s's work); the
// arena goes back with the last stream.
func (a *Allocator) ReleaseStream(s device.Stream) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	t := a.pools.Load()
	idx := -1
	for i, st := range t.streams {
		if st == s {
			idx = i
		}
	}
	if idx < 0 {
		return nil
	}
	p, si := t.pools[idx], t.slots[idx]
	for _, q := range t.all {
		q.mu.Lock()
		used := q.lentTo(s)
		q.mu.Unlock()
		if used > 0 {
			return fmt.Errorf("gpumem: ReleaseStream(%d): %d live buffers allocated on other streams are used on the stream (named by RecordStream)", s, used)
		}
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if live := p.liveOn(si); live > 0 {
		return fmt.Errorf("gpumem: ReleaseStream(%d): %d buffers allocated on the stream are still live", s, live)
	}
	if p.live > 1 {
		if err := p.dropStream(si); err != nil {
			return fmt.Errorf("gpumem: ReleaseStream(%d): %w", s, err)
		}
		a.pools.Store(t.without(idx, false))
		return nil
	}
	if err := p.trim(true); err != nil {
		return fmt.Errorf("gpumem: ReleaseStream(%d): %w", s, err)
	}
	if p.npending > 0 {
		return fmt.Errorf("gpumem: ReleaseStream(%d): %d frees still wait for other streams", s, p.npending)
	}
	if err := p.teardown(); err != nil {
		return fmt.Errorf("gpumem: ReleaseStream(%d): %w", s, err)
	}
	a.pools.Store(t.without(idx, true))
	return nil
}
