package gpumem

// See doc.go for the overview.

import (
	"fmt"
	"slices"
	"sync"
	"sync/atomic"

	"github.com/gpumem/gpumem/device"
)

// CUDA graphs. A stream capture records the work enqueued on its streams
// into a graph instead of running it; the graph then replays that work, at
// the same addresses, as often as the program asks. Two things follow for
// an allocator.
//
// While a capture is underway (BeginCapture to EndCapture), the driver
// refuses an event recorded on a capturing stream, an event or stream of
// the capture queried or waited for, and a synchronize of the device, and a
// refused call breaks the capture. So does PyTorch's allocator, which
// processes no event while any capture is underway. The allocator then:
//
//   - records, queries and waits for no event: memory freed by another
//     stream is not handed over (advanceEpoch, handOff), frees named on
//     other streams by RecordStream stay pending (deferFree,
//     processPending), and the device is never synchronized (syncDevice);
//   - fences no stream, so it unmaps and frees no memory emptied since the
//     last fence: an empty span that would need one stalls (vm.go) and new
//     memory is taken instead; Trim fails, saying so; idle release, the
//     release threshold and Defrag wait for the capture to end;
//   - makes its driver calls in relaxed capture mode (device/cuda), which
//     the driver allows during a capture.
//
// The memory a captured graph uses must stay its own while the graph lives:
// replays write it. NewPrivate makes a private pool for it (PyTorch's graph
// pools): an allocator in the same family, over the same device, whose
// memory serves only the allocations made through it, counted against the
// root's limit, and never unmapped, moved or given back before Close. It
// takes plain segments (ModePlain), which stay at their addresses; a
// virtual span could move once empty. Which allocation goes to which pool
// is the caller's to decide (internal/host routes PyTorch's by capture id
// or thread, as PyTorch's filters do).
//
// A private pool's buffer can also be made again at an address it held
// (AllocAt): CUDA graph trees put a pool back to a checkpoint that way
// (internal/host/checkpoint.go).
//
// Invariant: a private pool never gives memory back before Close (keep;
// Trim, releaseTo and reclaim return early) unless its caller says that no
// graph will write its unused memory any more (ReleaseUnused: PyTorch's
// empty_cache after the pool's graphs are gone), and the bytes every
// member of a family holds add up to *family, at most the root's limit (or
// the overhang SetLimit left).

// Reuse within a capture (PyTorch's graph_capture_record_stream_reuse).
// A buffer freed during a capture after RecordStream named other streams
// would wait for events; none may be recorded, so it stays pending until
// the capture ends, and the capture takes more memory than it needs. With
// SetCaptureReuse on and a device that shows the capture's graph
// (device.CaptureGraph), the free records markers instead: the terminals
// of its own stream and of every stream that used it, the nodes that
// every later captured use of those streams follows. Before a request on
// stream s (freeJoined) the allocator walks the graph back from s's
// terminals; a pending block of s whose markers all lie on that walk is
// free: all new work of s comes after every use of it. No event is
// recorded or queried. A block one of whose streams does not capture, or
// with no marker (no stream had captured work yet), waits for the
// capture's end as before.
//
// Invariant: a pending block has markers only if it was freed during the
// capture markID; pool.nmarked counts them (checked). The walk's nodes are
// kept per stream and capture id, so each node is visited once per
// stream: a stream's terminals only ever follow its earlier ones, as work
// enqueued on a stream depends on the work before it. (A program that
// replaces a stream's dependencies, cudaStreamUpdateCaptureDependencies,
// breaks that; PyTorch's allocator assumes the same.)

// captureReuse is the state of reuse within a capture, shared by a root
// and its private pools.
type captureReuse struct {
	on atomic.Bool
	g  device.CaptureGraph // nil: the device does not show the graph

	mu      sync.Mutex
	visited map[device.Stream]*visitSet
	buf     []device.Node
}

// visitSet is the nodes found so far on the walk back from a stream's
// terminals in capture id.
type visitSet struct {
	id    uint64
	nodes map[device.Node]struct{}
}

// SetCaptureReuse turns reuse within a capture on or off for a and its
// private pools (see above). Off by default, as in PyTorch. It reports
// whether the device shows capture graphs; without them, on changes
// nothing.
func (a *Allocator) SetCaptureReuse(on bool) bool {
	a.reuse.on.Store(on)
	return a.reuse.g != nil
}

// markFree records b's capture markers as it goes pending during a
// capture (under p.mu), if reuse within a capture is on.
func (p *pool) markFree(b *block) {
	r := p.a.reuse
	x := b.x
	if !r.on.Load() || r.g == nil {
		return
	}
	var id uint64
	ok := true
	mark := func(s device.Stream) {
		if !ok {
			return
		}
		nodes, cid, capturing, err := r.g.CaptureTerminals(s, x.markers)
		if err != nil || !capturing || id != 0 && cid != id {
			ok = false
			return
		}
		id, x.markers = cid, nodes
	}
	mark(b.stream())
	for _, s := range x.uses {
		mark(s)
	}
	if !ok || len(x.markers) == 0 {
		x.markers = x.markers[:0]
		return
	}
	slices.Sort(x.markers)
	x.markers = slices.Compact(x.markers)
	x.markID = id
	p.nmarked++
}

// freeJoined frees the pending blocks of stream slot si whose markers the
// stream's captured work now follows (under p.mu; p.nmarked > 0).
func (p *pool) freeJoined(si slot) {
	if !p.a.capturing() {
		// The captures are over: the markers are of no more use (the next
		// processPending records these blocks' events).
		for b := p.pending; b != nil; b = b.fnext {
			p.dropMarkers(b)
		}
		return
	}
	r := p.a.reuse
	s := p.streams[si].s
	r.mu.Lock()
	defer r.mu.Unlock()
	vs, err := r.walk(s)
	if err != nil || vs == nil {
		return // not capturing, or the graph unreadable: wait for the end
	}
	link := &p.pending
	for b := p.pending; b != nil; {
		next := b.fnext
		x := b.x
		if len(x.markers) == 0 || x.markID != vs.id || b.si != si || !vs.hasAll(x.markers) {
			link = &b.fnext
			b = next
			continue
		}
		*link = next
		p.unpend(b)
		b = next
	}
}

// walk extends the walk back from s's terminals to the nodes added since
// the last one (under r.mu). It returns nil when s does not capture.
func (r *captureReuse) walk(s device.Stream) (*visitSet, error) {
	terms, id, capturing, err := r.g.CaptureTerminals(s, r.buf[:0])
	r.buf = terms[:0]
	if err != nil || !capturing {
		return nil, err
	}
	if r.visited == nil {
		r.visited = make(map[device.Stream]*visitSet)
	}
	vs := r.visited[s]
	if vs == nil || vs.id != id {
		vs = &visitSet{id: id, nodes: make(map[device.Node]struct{})}
		r.visited[s] = vs
	}
	stack := terms
	for len(stack) > 0 {
		n := stack[len(stack)-1]
		stack = stack[:len(stack)-1]
		if _, seen := vs.nodes[n]; seen {
			continue
		}
		vs.nodes[n] = struct{}{}
		if stack, err = r.g.NodeParents(n, stack); err != nil {
			// Nodes marked found may have parents not walked yet: start
			// over next time.
			delete(r.visited, s)
			return nil, err
		}
	}
	r.buf = stack[:0]
	return vs, nil
}

// hasAll reports whether every node of ns was found on the walk.
func (vs *visitSet) hasAll(ns []device.Node) bool {
	for _, n := range ns {
		if _, ok := vs.nodes[n]; !ok {
			return false
		}
	}
	return true
}

// endReuse forgets the walks of captures that have ended: called when no
// capture is underway any more.
func (r *captureReuse) endReuse() {
	r.mu.Lock()
	clear(r.visited)
	r.mu.Unlock()
}

// errCapturing is what the operations a capture forbids return while one
// is underway.
var errCapturing = fmt.Errorf("a stream capture is underway on the device: %w", device.ErrCapturing)

// BeginCapture tells the allocator that a stream capture has begun on its
// device: until the matching EndCapture it does nothing the driver forbids
// during one (see above). Captures nest: each BeginCapture needs its
// EndCapture. A private pool shares its root's count.
func (a *Allocator) BeginCapture() { a.captures.Add(1) }

// EndCapture ends what BeginCapture began. It panics on an EndCapture with
// no capture underway (a caller's bug that would otherwise hide the next
// capture).
func (a *Allocator) EndCapture() {
	n := a.captures.Add(-1)
	if n < 0 {
		a.captures.Add(1)
		panic("gpumem: EndCapture without BeginCapture")
	}
	if n == 0 {
		a.reuse.endReuse()
	}
}

// Capturing reports whether a capture is underway (BeginCapture).
func (a *Allocator) Capturing() bool { return a.capturing() }

func (a *Allocator) capturing() bool { return a.captures.Load() > 0 }

// NewPrivate makes a private pool of a (see above): its buffers come from
// memory no other allocator of the family uses, counted against the
// root's limit, kept at their addresses until Close. Close it once nothing
// uses its memory any more (the graphs replaying into it are gone); Close
// reports the buffers still live as leaks and frees them.
func (a *Allocator) NewPrivate() (*Allocator, error) {
	return a.NewPrivateWith(PrivateConfig{})
}

// SegmentSource is where a private pool's segments come from when not from
// the device: PyTorch's MemPool with an allocator of its own (a
// CUDAPluggableAllocator; ncclMemAlloc, say). Alloc returns an error
// matching device.ErrOutOfMemory when it has no room; Free gets back the
// size Alloc was given and the stream whose pool holds the segment then (a
// wholly free segment may pass to another stream's pool). Both must be
// safe for concurrent use.
type SegmentSource interface {
	Alloc(size uint64, s device.Stream) (device.Ptr, error)
	Free(p device.Ptr, size uint64, s device.Stream) error
}

// PrivateConfig is what a private pool does differently from NewPrivate's.
type PrivateConfig struct {
	// Segments, if not nil, makes the pool's segments (in the place of
	// the device's Alloc and Free). Their bytes count against the root's
	// limit as the device's would.
	Segments SegmentSource
	// NoSplit never splits a block (PyTorch's MemPool(no_split=True), for
	// memory registered whole, with NCCL say): each buffer gets a segment
	// of its own, the request rounded up to 2 MiB (small requests to 512
	// bytes), and a free segment serves a later request only whole, and
	// only one of at least half its size, so that at most half a
	// segment's bytes go unused.
	NoSplit bool
}

// NewPrivateWith is NewPrivate with cfg's differences.
func (a *Allocator) NewPrivateWith(pc PrivateConfig) (*Allocator, error) {
	if a.closed.Load() {
		return nil, fmt.Errorf("%w: NewPrivate on a closed allocator", ErrClosed)
	}
	root := a.root
	cfg := Config{Mode: ModePlain, SmallSize: root.cfg.SmallSize, RecordSites: root.cfg.RecordSites, CheckInvariants: root.cfg.CheckInvariants}
	p, err := New(root.dev, cfg)
	if err != nil {
		return nil, err
	}
	p.root, p.family, p.captures, p.keep = root, root.family, root.captures, true
	p.reuse = root.reuse
	p.segs, p.noSplit = pc.Segments, pc.NoSplit
	p.limit.Store(root.limit.Load())
	return p, nil
}

// Private reports whether a is a private pool (NewPrivate).
func (a *Allocator) Private() bool { return a.keep }

// AllocAt makes a buffer of size bytes at address ptr of private pool a
// (NewPrivate), in memory the pool holds that no buffer uses now. It is
// how a checkpoint is put back (PyTorch's setCheckpointPoolState: CUDA
// graph trees return a pool to the state it had after a recording, each
// buffer at the address its graph writes; internal/host RestorePool). The
// buffer belongs to the stream of the pool's memory at ptr.
//
// Frees still waiting for other streams (RecordStream) are waited for
// first if they cover the range. ErrForeign if the range lies outside the
// pool's memory or on an allocator that is not a private pool; an error
// naming the block in the way if a live buffer overlaps the range.
func (a *Allocator) AllocAt(ptr device.Ptr, size uint64) (Buffer, error) {
	if size == 0 || size > maxRequest {
		return Buffer{}, fmt.Errorf("%w: AllocAt(%#x, %d): want 1 to %d bytes", ErrInvalidSize, uint64(ptr), size, uint64(maxRequest))
	}
	if !a.keep {
		return Buffer{}, &BufferError{Op: "AllocAt", Ptr: uint64(ptr), Size: size, Err: ErrForeign, Why: "AllocAt serves private pools only (NewPrivate)"}
	}
	if a.closed.Load() {
		return Buffer{}, fmt.Errorf("%w: AllocAt(%#x, %d) on a closed allocator", ErrClosed, uint64(ptr), size)
	}
	rounded := (size + minBlock - 1) &^ (minBlock - 1)
	addr := uint64(ptr)
	for _, p := range a.allPools() {
		p.mu.Lock()
		h, b := p.blockAt(addr)
		if b == nil {
			p.mu.Unlock()
			continue
		}
		if (b.state != blockFree || addr+rounded > b.end()) && p.npending > 0 {
			// Part of the range may wait for other streams' work.
			if a.capturing() {
				p.mu.Unlock()
				return Buffer{}, errCapturing
			}
			err := p.processPending(true, true)
			if err != nil {
				p.mu.Unlock()
				return Buffer{}, fmt.Errorf("gpumem: AllocAt(%#x, %d): waiting for earlier frees: %w", addr, size, err)
			}
			h, b = p.blockAt(addr)
		}
		if b.state != blockFree || addr+rounded > b.end() {
			why := fmt.Sprintf("its segment ends at %#x", b.seg.base+b.seg.size)
			if b.state == blockFree {
				b = b.next // free blocks are never neighbours: b.next is in use
			}
			if b != nil {
				why = fmt.Sprintf("block [%#x, %#x) is %s", b.addr, b.end(), b.state)
			}
			p.mu.Unlock()
			return Buffer{}, fmt.Errorf("gpumem: AllocAt(%#x, %d): the range is not free: %s", addr, size, why)
		}
		b = p.carve(h, b, rounded, addr-b.addr)
		b.state = blockAllocated
		buf := p.hand(b, size, 0, nil) // slot 0: a plain pool serves one stream
		p.mu.Unlock()
		return buf, nil
	}
	return Buffer{}, &BufferError{Op: "AllocAt", Ptr: addr, Size: size, Err: ErrForeign, Why: "not in the memory of this private pool"}
}

// blockAt returns the block of p that holds addr and its heap, or nils
// (under p.mu). A scan of p's segments: AllocAt's, off the hot path.
func (p *pool) blockAt(addr uint64) (*heap, *block) {
	for k := range p.heaps {
		h := &p.heaps[k]
		for _, seg := range h.segs {
			if addr < seg.base || addr >= seg.base+seg.size {
				continue
			}
			for b := seg.first; b != nil; b = b.next {
				if addr < b.end() {
					return h, b
				}
			}
		}
	}
	return nil, nil
}

// Holds reports whether [ptr, ptr+size) lies within one segment of a's
// memory, in use or not.
func (a *Allocator) Holds(ptr device.Ptr, size uint64) bool {
	addr := uint64(ptr)
	for _, p := range a.allPools() {
		p.mu.Lock()
		_, b := p.blockAt(addr)
		in := b != nil && addr+size <= b.seg.base+b.seg.size
		p.mu.Unlock()
		if in {
			return true
		}
	}
	return false
}
