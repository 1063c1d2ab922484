package host

import (
	"cmp"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"

	"github.com/gpumem/gpumem"
	"github.com/gpumem/gpumem/device"
)

// Private pools: the memory of CUDA graphs, as PyTorch's allocator keeps
// it. A graph's replays write the memory its capture allocated, at the
// same addresses, for as long as the graph lives; so that memory must
// serve no other allocation. PyTorch tells its allocator when a capture
// begins (beginAllocateToPool, with a filter saying which allocations
// belong to the pool), when it ends (endAllocateToPool), and when a graph
// that used the pool is gone (releasePool). The Python package
// (python/gpumem/_torch_graphs.py) forwards these to BeginPool, EndPool and
// ReleasePool.
//
// A pool is a private allocator of the device's (gpumem.NewPrivate):
// memory of its own, counted against the device's limit, kept at its
// addresses until the pool is closed. A route sends allocations to it
// between BeginPool and EndPool: those made on a stream of the same capture
// (RouteCapture; PyTorch's graphs), by the thread that began it
// (RouteThread; torch.compile's CUDA graph trees, MemPool), or every one
// (RouteAll). The latest route that matches wins. A capture route also
// tells the device's allocators that a capture is underway
// (gpumem.Allocator.BeginCapture), until EndPool.
//
// A pool counts its uses: BeginPool and RetainPool (a MemPool object) add
// one, ReleasePool takes one. Once
// no use is left and its last buffer is freed, it is freeable: its memory
// goes back to the driver at the next Trim (torch.cuda.empty_cache) or
// when an allocation would otherwise run out of memory, as PyTorch frees
// its freeable graph pools. Not sooner: a graph captured later may still
// use a buffer of the pool that was freed during its capture (PyTorch's
// own test_graph_capture_reset_recapture does), and a replay may still
// run. Then too a pool with no use whose buffers still live (a graph's
// output kept) gives back the memory none of them uses. DropPool (a
// MemPool object collected) closes a freeable pool at once.
//
// A MemPool's options (RetainPoolWith, PoolOptions): an allocator of its
// own making the pool's segments (a CUDAPluggableAllocator's functions),
// no_split, and use_on_oom: an allocation of the device's own that would
// run out of memory is served from such a pool instead (AllocThread).
//
// Invariants, under pools.mu: n == len(routes); every route's pool is in
// byID; a pool with uses == 0 and live == 0 is not in byID (closed).

// PoolID names a private pool as PyTorch names it (MempoolId_t).
type PoolID struct{ Hi, Lo uint64 }

func (id PoolID) String() string { return fmt.Sprintf("(%d, %d)", id.Hi, id.Lo) }

// Route says which allocations a BeginPool sends to its pool (gpumem.h:
// GPUMEM_POOL_*).
type Route int

const (
	// RouteCapture: allocations made on any stream of the capture the
	// given stream is in (the stream must be capturing), or, on a device
	// that cannot tell captures, on that stream.
	RouteCapture Route = iota
	// RouteThread: allocations made by the calling thread.
	RouteThread
	// RouteAll: every allocation on the device.
	RouteAll
)

type privatePool struct {
	id       PoolID
	alloc    *gpumem.Allocator
	useOnOOM bool         // PoolOptions.UseOnOOM
	uses     int          // BeginPool calls not yet released (under pools.mu)
	live     atomic.Int64 // buffers of the pool in the host's table
}

// PoolOptions are a MemPool's options (PyTorch's MemPool(allocator,
// use_on_oom, no_split)), given when the pool is made (RetainPoolWith).
type PoolOptions struct {
	// Segments, if not nil, makes the pool's segments: PyTorch's MemPool
	// with an allocator of its own (gpumem.PrivateConfig.Segments).
	Segments gpumem.SegmentSource
	// NoSplit: one segment a buffer (gpumem.PrivateConfig.NoSplit).
	NoSplit bool
	// UseOnOOM: an allocation of the device's own that would otherwise
	// fail with out-of-memory is served by this pool, and its buffer
	// belongs to the pool from then on (PyTorch's use_on_oom): from the
	// pool's free memory, or from new memory of the pool's where the
	// limit and the pool's allocator still give it (PyTorch's takes only
	// free blocks; the two differ only where the pool's allocator has room
	// the device's has not).
	UseOnOOM bool
}

type route struct {
	pool     *privatePool
	kind     Route
	capture  uint64 // RouteCapture: the capture's id (0: match stream)
	stream   uint64 // RouteCapture: the stream given
	thread   uint64 // RouteThread
	captured bool   // BeginCapture was called for it
}

type pools struct {
	mu       sync.Mutex
	n        atomic.Int32 // len(routes), read on every Alloc
	captures atomic.Int32 // capture routes among them
	holds    atomic.Int32 // HoldCapture calls not yet released
	routes   []route
	byID     map[PoolID]*privatePool
	onOOM    atomic.Int32 // pools in byID made with UseOnOOM
}

// ErrPool: a pool call that does not match the pool's state (EndPool or
// ReleasePool of a pool with no route or no use).
var ErrPool = errors.New("gpumem: private pool")

// BeginPool sends the allocations that route selects on device ordinal to
// pool id from now until EndPool(id), making the pool on first use, and
// counts a use of it. For RouteCapture, stream must be capturing; thread
// identifies the calling thread for RouteThread.
func (h *Host) BeginPool(ordinal int, id PoolID, kind Route, stream, thread uint64) error {
	if kind < RouteCapture || kind > RouteAll {
		return fmt.Errorf("%w %v: BeginPool: unknown route %d (want 0 capture, 1 thread or 2 all)", ErrPool, id, kind)
	}
	d, err := h.Device(ordinal)
	if err != nil {
		return err
	}
	r := route{kind: kind, stream: stream, thread: thread}
	if kind == RouteCapture {
		if c, ok := device.AsCapture(d.dev); ok {
			capturing, cid, err := c.CaptureInfo(device.Stream(stream))
			if err != nil {
				return fmt.Errorf("gpumem: BeginPool%v: %w", id, err)
			}
			if !capturing {
				return fmt.Errorf("%w %v: BeginPool: stream %#x is not capturing", ErrPool, id, stream)
			}
			r.capture = cid
		}
	}
	ps := &d.pools
	ps.mu.Lock()
	defer ps.mu.Unlock()
	p, err := d.retainLocked(id)
	if err != nil {
		return err
	}
	r.pool = p
	if kind == RouteCapture {
		d.Alloc.BeginCapture()
		r.captured = true
		ps.captures.Add(1)
	}
	ps.routes = append(ps.routes, r)
	ps.n.Store(int32(len(ps.routes)))
	return nil
}

// RetainPool counts one use of pool id on device ordinal, making the pool
// if need be, with no route (PyTorch's createOrIncrefPool: a MemPool
// object holds one use for as long as it lives).
func (h *Host) RetainPool(ordinal int, id PoolID) error {
	d, err := h.Device(ordinal)
	if err != nil {
		return err
	}
	d.pools.mu.Lock()
	defer d.pools.mu.Unlock()
	_, err = d.retainLocked(id)
	return err
}

// RetainPoolWith is RetainPool for a pool made with opts (a MemPool with
// options). The pool must not exist yet: its options are fixed when it is
// made.
func (h *Host) RetainPoolWith(ordinal int, id PoolID, opts PoolOptions) error {
	d, err := h.Device(ordinal)
	if err != nil {
		return err
	}
	d.pools.mu.Lock()
	defer d.pools.mu.Unlock()
	if d.pools.byID[id] != nil {
		return fmt.Errorf("%w %v: made again with options on device %d (a pool's options are fixed when it is made)", ErrPool, id, ordinal)
	}
	_, err = d.makeLocked(id, opts)
	return err
}

// PoolUses reports how many uses pool id has on device ordinal (0 for an
// unknown pool): MemPool.use_count.
func (h *Host) PoolUses(ordinal int, id PoolID) int {
	d := h.existing(ordinal)
	if d == nil {
		return 0
	}
	d.pools.mu.Lock()
	defer d.pools.mu.Unlock()
	if p := d.pools.byID[id]; p != nil {
		return p.uses
	}
	return 0
}

// retainLocked counts a use of pool id, making the pool if it does not
// exist, and returns it. Called with d.pools.mu held.
func (d *Device) retainLocked(id PoolID) (*privatePool, error) {
	ps := &d.pools
	if p := ps.byID[id]; p != nil {
		p.uses++
		return p, nil
	}
	return d.makeLocked(id, PoolOptions{})
}

// makeLocked makes pool id with opts and one use. Called with d.pools.mu
// held.
func (d *Device) makeLocked(id PoolID, opts PoolOptions) (*privatePool, error) {
	ps := &d.pools
	a, err := d.Alloc.NewPrivateWith(gpumem.PrivateConfig{Segments: opts.Segments, NoSplit: opts.NoSplit})
	if err != nil {
		return nil, fmt.Errorf("gpumem: pool %v: %w", id, err)
	}
	p := &privatePool{id: id, alloc: a, uses: 1, useOnOOM: opts.UseOnOOM}
	if ps.byID == nil {
		ps.byID = make(map[PoolID]*privatePool)
	}
	ps.byID[id] = p
	if opts.UseOnOOM {
		ps.onOOM.Add(1)
	}
	return p, nil
}

// onOOM lists the pools made with UseOnOOM, each counted live (so that
// it cannot close while the caller tries it; freed undoes that), oldest
// id first.
func (d *Device) onOOM() []*privatePool {
	ps := &d.pools
	ps.mu.Lock()
	defer ps.mu.Unlock()
	var out []*privatePool
	for _, p := range ps.byID {
		if p.useOnOOM {
			p.live.Add(1)
			out = append(out, p)
		}
	}
	slices.SortFunc(out, func(x, y *privatePool) int {
		return cmp.Or(cmp.Compare(x.id.Hi, y.id.Hi), cmp.Compare(x.id.Lo, y.id.Lo))
	})
	return out
}

// EndPool ends the latest route to pool id on device ordinal. The pool and
// its memory stay (ReleasePool gives up the use).
func (h *Host) EndPool(ordinal int, id PoolID) error {
	d := h.existing(ordinal)
	if d == nil {
		return fmt.Errorf("%w %v: EndPool on device %d, where no pool was begun", ErrPool, id, ordinal)
	}
	ps := &d.pools
	ps.mu.Lock()
	defer ps.mu.Unlock()
	for i := len(ps.routes) - 1; i >= 0; i-- {
		r := ps.routes[i]
		if r.pool.id != id {
			continue
		}
		if r.captured {
			d.Alloc.EndCapture()
			ps.captures.Add(-1)
		}
		ps.routes = append(ps.routes[:i], ps.routes[i+1:]...)
		ps.n.Store(int32(len(ps.routes)))
		return nil
	}
	return fmt.Errorf("%w %v: EndPool with no route to the pool on device %d", ErrPool, id, ordinal)
}

// ReleasePool gives up one use of pool id on device ordinal (a graph that
// used it is gone). With no use left, the pool's memory goes back to the
// driver once its last buffer is freed. An unknown pool is not an error:
// PyTorch releases the pools of graphs that allocated nothing.
func (h *Host) ReleasePool(ordinal int, id PoolID) error { return h.releasePool(ordinal, id, false) }

// DropPool is ReleasePool for a MemPool object that is gone (PyTorch's
// ~MemPool empties the pool's cache): with no use, route or live buffer
// left, the pool's memory goes back at once, after a synchronize of the
// device, rather than at the next Trim. While a capture is underway, or
// while a buffer of the pool lives, it goes back later, as ReleasePool's.
func (h *Host) DropPool(ordinal int, id PoolID) error { return h.releasePool(ordinal, id, true) }

// releasePool gives up one use of pool id; with drop, it closes the pool
// at once if that leaves it freeable (DropPool).
func (h *Host) releasePool(ordinal int, id PoolID, drop bool) error {
	d := h.existing(ordinal)
	if d == nil {
		return nil
	}
	ps := &d.pools
	ps.mu.Lock()
	defer ps.mu.Unlock()
	p := ps.byID[id]
	if p == nil {
		return nil
	}
	if p.uses == 0 {
		return fmt.Errorf("%w %v: ReleasePool of a pool with no use left on device %d", ErrPool, id, ordinal)
	}
	p.uses--
	if !drop || !d.freeable(p) || d.Alloc.Capturing() {
		return nil
	}
	if err := d.dev.Synchronize(); err != nil {
		return fmt.Errorf("gpumem: closing pool %v: waiting for the device: %w", id, err)
	}
	return d.closeLocked(p)
}

// closeLocked closes freeable pool p, giving its memory back, once the
// device is synchronized. Called with d.pools.mu held.
func (d *Device) closeLocked(p *privatePool) error {
	delete(d.pools.byID, p.id)
	if p.useOnOOM {
		d.pools.onOOM.Add(-1)
	}
	if err := p.alloc.Close(); err != nil {
		return fmt.Errorf("gpumem: closing private pool %v: %w", p.id, err)
	}
	return nil
}

// freeable reports whether p has no use, no route and no live buffer.
// Called with d.pools.mu held.
func (d *Device) freeable(p *privatePool) bool {
	return p.uses == 0 && p.live.Load() == 0 && !d.routed(p)
}

// routed reports whether a route sends allocations to p. Called with
// d.pools.mu held.
func (d *Device) routed(p *privatePool) bool {
	for _, r := range d.pools.routes {
		if r.pool == p {
			return true
		}
	}
	return false
}

// closeFreeable closes the freeable pools, giving their memory back, after
// a synchronize of the device (a replay of a released graph may still
// run; PyTorch synchronizes before it frees them too), and reports whether
// it closed any. While a capture is underway it closes none: a synchronize
// would break the capture.
//
// A pool with no use and no route whose buffers still live (a graph gone,
// its output kept) gives back the memory none of them uses, as PyTorch's
// empty_cache frees such a pool's free segments: no replay can write it
// any more.
func (d *Device) closeFreeable() (bool, error) {
	ps := &d.pools
	ps.mu.Lock()
	defer ps.mu.Unlock()
	var done, unused []*privatePool
	for _, p := range ps.byID {
		switch {
		case d.freeable(p):
			done = append(done, p)
		case p.uses == 0 && !d.routed(p) && caches(p.alloc):
			unused = append(unused, p)
		}
	}
	if len(done)+len(unused) == 0 || d.Alloc.Capturing() {
		return false, nil
	}
	if err := d.dev.Synchronize(); err != nil {
		return false, fmt.Errorf("gpumem: closing private pools: waiting for the device: %w", err)
	}
	var errs []error
	for _, p := range done {
		errs = append(errs, d.closeLocked(p))
	}
	gave := len(done) > 0
	for _, p := range unused {
		before := p.alloc.Usage().Reserved
		if err := p.alloc.ReleaseUnused(); err != nil {
			errs = append(errs, fmt.Errorf("gpumem: private pool %v: %w", p.id, err))
		}
		gave = gave || p.alloc.Usage().Reserved < before
	}
	return gave, errors.Join(errs...)
}

// PoolLive lists the addresses of pool id's live buffers on device
// ordinal (none for an unknown pool): what torch.compile's graph trees
// check against the tensors they hold.
func (h *Host) PoolLive(ordinal int, id PoolID) []uint64 {
	d := h.existing(ordinal)
	if d == nil {
		return nil
	}
	d.pools.mu.Lock()
	p := d.pools.byID[id]
	d.pools.mu.Unlock()
	if p == nil {
		return nil
	}
	return d.tab.addrsOf(p)
}

// route returns the pool an allocation on stream by thread goes to, with
// the allocation counted live in it (so that it cannot close meanwhile;
// freed undoes that if the allocation fails), or nil for the device's own
// allocator. Called when routes exist.
func (d *Device) route(stream, thread uint64) *privatePool {
	ps := &d.pools
	var capturing bool
	var cid uint64
	if ps.captures.Load() > 0 {
		if c, ok := device.AsCapture(d.dev); ok {
			capturing, cid, _ = c.CaptureInfo(device.Stream(stream))
		}
	}
	ps.mu.Lock()
	defer ps.mu.Unlock()
	for i := len(ps.routes) - 1; i >= 0; i-- {
		r := &ps.routes[i]
		if r.matches(stream, thread, capturing, cid) {
			r.pool.live.Add(1)
			return r.pool
		}
	}
	return nil
}

func (r *route) matches(stream, thread uint64, capturing bool, cid uint64) bool {
	switch r.kind {
	case RouteAll:
		return true
	case RouteThread:
		return thread != 0 && thread == r.thread
	case RouteCapture:
		if r.capture != 0 {
			return capturing && cid == r.capture
		}
		return stream == r.stream
	}
	return false
}

// freed notes that a buffer of p was freed.
func (d *Device) freed(p *privatePool) { p.live.Add(-1) }

// poolStats adds the device's private pools' numbers to st: gauges and
// counters add up; the reserved peak is the whole family's, exact; the
// allocated and active peaks add the pools' own, an upper bound of the
// peak of the whole.
// poolsReserved is what the device's private pools hold from the device
// (their Stats' Reserved), without their Stats.
func (d *Device) poolsReserved() uint64 {
	d.pools.mu.Lock()
	defer d.pools.mu.Unlock()
	var n uint64
	for _, p := range d.pools.byID {
		r, _ := p.alloc.Held()
		n += r
	}
	return n
}

func (d *Device) poolStats(st *gpumem.Stats) {
	d.pools.mu.Lock()
	defer d.pools.mu.Unlock()
	for _, p := range d.pools.byID {
		ps := p.alloc.Stats()
		st.Allocated += ps.Allocated
		st.PeakAllocated += ps.PeakAllocated
		st.Active += ps.Active
		st.PeakActive += ps.PeakActive
		st.Reserved += ps.Reserved
		st.Cached += ps.Cached
		st.PlainBytes += ps.PlainBytes
		st.LiveBuffers += ps.LiveBuffers
		st.Segments += ps.Segments
		st.Allocs += ps.Allocs
		st.Frees += ps.Frees
		st.AllocBytes += ps.AllocBytes
		st.FreeBytes += ps.FreeBytes
		st.AllocRequested += ps.AllocRequested
		st.FreeRequested += ps.FreeRequested
		st.Retries += ps.Retries
		st.DeviceAllocs += ps.DeviceAllocs
		st.DeviceFrees += ps.DeviceFrees
		st.OOMs += ps.OOMs
	}
	// What the device's allocator and its pools held together at most:
	// exact, unlike a sum of their own peaks.
	st.PeakReserved = max(d.Alloc.FamilyPeakReserved(), st.Reserved)
}

// PoolReserved is what device ordinal's private pools hold from the driver.
func (h *Host) PoolReserved(ordinal int) uint64 {
	d := h.existing(ordinal)
	if d == nil {
		return 0
	}
	d.pools.mu.Lock()
	defer d.pools.mu.Unlock()
	var n uint64
	for _, p := range d.pools.byID {
		n += p.alloc.Stats().Reserved
	}
	return n
}

// closePools closes every private pool (Host.Close). Called with no route
// in use any more.
func (d *Device) closePools() error {
	d.pools.mu.Lock()
	defer d.pools.mu.Unlock()
	var errs []error
	for id, p := range d.pools.byID {
		if err := p.alloc.Close(); err != nil && !errors.Is(err, gpumem.ErrLeak) {
			errs = append(errs, err)
		}
		delete(d.pools.byID, id)
	}
	d.pools.onOOM.Store(0)
	for _, r := range d.pools.routes {
		if r.captured {
			d.Alloc.EndCapture()
		}
	}
	d.pools.routes = nil
	d.pools.n.Store(0)
	d.pools.captures.Store(0)
	return errors.Join(errs...)
}

// HoldCapture tells device ordinal's allocators that a capture is about to
// begin, before its capture id exists (PyTorch's capture_begin begins the
// stream capture, and only then can BeginPool route it): from now until
// ReleaseCapture they record, query and wait for no event and synchronize
// nothing (gpumem.Allocator.BeginCapture), so that no free on another
// thread in between breaks the capture. Holds nest.
func (h *Host) HoldCapture(ordinal int) error {
	d, err := h.Device(ordinal)
	if err != nil {
		return err
	}
	d.pools.holds.Add(1)
	d.Alloc.BeginCapture()
	return nil
}

// ReleaseCapture ends what HoldCapture began (the capture's own route, if
// BeginPool made one meanwhile, keeps the allocators careful until
// EndPool). ErrPool if device ordinal holds none.
func (h *Host) ReleaseCapture(ordinal int) error {
	d := h.existing(ordinal)
	if d == nil || d.pools.holds.Add(-1) < 0 {
		if d != nil {
			d.pools.holds.Add(1)
		}
		return fmt.Errorf("%w: ReleaseCapture on device %d with no capture held", ErrPool, ordinal)
	}
	d.Alloc.EndCapture()
	return nil
}

// caches reports whether a holds memory it does not use (Stats.Cached > 0),
// from its counts.
func caches(a *gpumem.Allocator) bool {
	u := a.Usage()
	return u.Reserved > u.Active
}
