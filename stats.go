package gpumem

// See doc.go for the overview.

// Stats is a snapshot of the allocator's numbers, returned by value. Gauges
// are bytes now with their peaks; counters only grow. Identities (tested;
// exact when no operation is in flight):
//
//	Reserved == Active + Cached
//	Allocated <= Active <= Reserved
//	Allocs - Frees == LiveBuffers
//	Reserved == PlainBytes + MappedBytes + SpareBytes
//	every Peak* >= its gauge
type Stats struct {
	// Gauges.
	Allocated uint64 // bytes requested by live buffers
	// PeakAllocated and PeakActive are exact with one stream; with several,
	// each stream publishes its allocations in steps of 4 MiB (so that
	// streams do not contend on one cache line), and the peaks may miss a
	// momentary high by up to 4 MiB per stream. They never overstate.
	PeakAllocated uint64
	Active        uint64 // bytes of the blocks behind live buffers (requests rounded to 512 B)
	PeakActive    uint64
	Reserved      uint64 // bytes held from the device: plain segments, spans, handles not yet released
	PeakReserved  uint64
	Cached        uint64 // Reserved - Active: held but not in use (includes frees pending on events)
	// Releasable is the part of Cached that Trim would give back now:
	// empty spans and wholly free segments. The rest lies in spans or
	// segments that also hold live buffers.
	Releasable  uint64
	PlainBytes  uint64 // bytes of plain segments
	MappedBytes uint64 // bytes of spans: physical memory mapped into address space
	// DormantMappings counts mappings that moved spans left behind
	// (dormant.go): address space mapped to a handle counted in MappedBytes
	// where it lies now, so they hold no memory of their own.
	DormantMappings int
	SpareBytes      uint64 // bytes of handles the driver refused to release, or to unmap from a split's scratch range (retried by Trim)
	AddressSpace    uint64 // bytes of virtual address space reserved
	LiveBuffers     uint64
	PeakLiveBuffers uint64 // the most live buffers since ResetPeaks: exact with one pool, else at least each pool's most (as PeakAllocated)
	Segments        int    // plain segments and virtual arenas
	PeakSegments    int    // the most segments since ResetPeaks
	PendingFrees    int    // freed buffers waiting for other streams' events
	Streams         int    // streams the allocator serves
	// LargestFree is the largest request that would be served now with no
	// device call.
	LargestFree uint64
	// Fragmentation is 1 - LargestFree/Cached: 0 when the cache is one
	// usable piece (or empty), near 1 when it is dust.
	Fragmentation float64

	// Counters.
	Allocs, Frees uint64 // successful Alloc and Free calls
	DeviceAllocs  uint64 // plain segments taken (cuMemAlloc)
	DeviceFrees   uint64 // plain segments given back (cuMemFree)
	Creates       uint64 // physical handles created, one per span (cuMemCreate)
	Releases      uint64 // physical handles released (cuMemRelease)
	Maps, Unmaps  uint64 // chunk mappings made and undone (cuMemMap, cuMemUnmap)
	Revived       uint64 // spans moved back onto a dormant mapping of their handle: no driver call (dormant.go)
	SlackCreates  uint64 // new memory taken by the churn guard where an empty span would have moved (churn.go)
	SetAccess     uint64 // access grants, one per contiguous run (cuMemSetAccess)
	Reserves      uint64 // address ranges reserved (cuMemAddressReserve)
	Fences        uint64 // host waits for a stream or the device before unmapping or freeing
	Handoffs      uint64 // free memory handed to another stream behind an event (a plain segment, or a virtual block another stream freed, once its work is done)
	Orders        uint64 // waits on the GPU for another stream's work, so that the memory it freed serves this stream at once instead of new memory (pool.orderAfter)
	OOMs          uint64 // requests that failed for want of memory (quota included)
	Retries       uint64 // allocations retried after releasing the cache
	Trims         uint64 // Trim calls
	// AllocBytes and FreeBytes are the bytes of the blocks of every Alloc
	// and Free so far (requests rounded to 512 B), AllocRequested and
	// FreeRequested the bytes asked for: AllocBytes - FreeBytes == Active,
	// AllocRequested - FreeRequested == Allocated (PyTorch's
	// active_bytes and requested_bytes .allocated and .freed).
	AllocBytes, FreeBytes, AllocRequested, FreeRequested uint64
	// Splits counts sparse spans whose live chunks moved to handles of
	// their own (Config.Defrag); Copies and CopiedBytes, the copies that
	// moved them (cuMemcpyDtoD): two per piece of a run staged in free
	// memory, one per run filled through the scratch range (defrag.go);
	// SplitNanos, the wall time the splits took, driver calls and device
	// synchronizes included.
	Splits, Copies, CopiedBytes, SplitNanos uint64
	// GateRefusals counts the splits not made because the gate refused to
	// close (SetGate: moves off in the process, or a call that did not
	// return in time).
	GateRefusals uint64
	// DriverNanos is the host time spent in the driver's memory calls
	// (those DeviceCalls counts, and address releases): what growth,
	// moves and releases cost the calling thread. WaitNanos is the host
	// time spent waiting for the GPU before memory changed hands (Fences,
	// and the wait for pending frees before a retry): time the host could
	// not run ahead. Both are wall time on the
	// calling thread, for telling where a slow step's time went; on the
	// simulated device they measure the simulation.
	DriverNanos, WaitNanos uint64
	// CreateNanos, MapNanos, SetAccessNanos, UnmapNanos and ReleaseNanos
	// are the parts of DriverNanos spent in each virtual-memory call
	// (cuMemCreate, cuMemMap, cuMemSetAccess, cuMemUnmap, cuMemRelease;
	// the counts are Creates, Maps, SetAccess, Unmaps and Releases): which
	// call a slow growth step waited in. (On four H200s under FSDP2 a span
	// cost 8 ms of driver time where alone it costs 60 us: while such a
	// job runs every process's calls there cost milliseconds, whatever
	// their size; docs/BENCHMARKS.md, "FSDP2 on four H200s, six rounds".
	// gpumem top shows the mean per call.)
	CreateNanos, MapNanos, SetAccessNanos, UnmapNanos, ReleaseNanos uint64
	// Misses counts the allocations the cache could not serve at once (the
	// slow path: a search over the fitting free blocks, other streams'
	// events queried, a stream wait, growth); MissNanos is their host time
	// (DriverNanos and WaitNanos within it). What the allocator costs the
	// host beyond its cache hits.
	Misses, MissNanos uint64
	// EventCalls counts the calls to the device's events (cuEventQuery,
	// cuEventRecord, cuStreamWaitEvent, creating and destroying events),
	// and EventNanos is their host time: what keeping the streams' order
	// costs the host (frees' work queried before their memory is reused,
	// other streams' epochs, stream waits). Waiting for an event to
	// complete is a fence, in WaitNanos. No cache hit makes one; most are
	// made on misses (MissNanos includes them), the rest on frees that
	// other streams used (Buffer.RecordStream) and in Trim.
	EventCalls, EventNanos uint64
	// MarkCalls and MarkNanos are the part of EventCalls and EventNanos
	// that are markers' writes (device.Markers: an epoch's write, where
	// events would record; creating and destroying markers too). Reading
	// a marker is a load, in neither.
	MarkCalls, MarkNanos uint64
}

// DeviceCalls is the number of memory-management calls made to the driver.
func (s Stats) DeviceCalls() uint64 {
	return s.DeviceAllocs + s.DeviceFrees + s.Creates + s.Releases + s.Maps + s.Unmaps + s.SetAccess + s.Reserves
}

// Stats returns the allocator's numbers. It locks each pool in turn; the
// result is exact when no operation runs concurrently.
func (a *Allocator) Stats() Stats {
	var s Stats
	var u Usage
	var largest uint64
	for _, p := range a.allPools() {
		p.mu.Lock()
		p.addUsage(&u)
		s.Allocs += p.nallocs
		s.Frees += p.nfrees
		s.PeakLiveBuffers = max(s.PeakLiveBuffers, p.peakLive)
		s.AllocBytes += p.allocBytes
		s.FreeBytes += p.freeBytes
		s.AllocRequested += p.allocReq
		s.FreeRequested += p.freeReq
		s.PendingFrees += p.npending
		s.Streams += p.live
		s.MappedBytes += uint64(p.mappedChunks) * a.gran
		s.DormantMappings += p.nDormant
		s.Revived += p.nRevived
		s.SlackCreates += p.churn.taken
		for i := p.empty.head; i >= 0; i = p.spans[i].next {
			s.Releasable += uint64(p.spans[i].n) * a.gran
		}
		for k := range p.heaps {
			h := &p.heaps[k]
			s.Segments += len(h.segs)
			for _, seg := range h.segs {
				if seg.virtual {
					s.AddressSpace += seg.size
				} else {
					s.PlainBytes += seg.size
					if seg.isFree() {
						s.Releasable += seg.size
					}
				}
			}
			if l := h.largestFree(); l > largest {
				largest = l
			}
		}
		p.mu.Unlock()
	}
	a.handlesMu.Lock()
	for _, hh := range a.handles {
		s.SpareBytes += hh.size
	}
	a.handlesMu.Unlock()
	a.scratchMu.Lock()
	for _, m := range a.lostScratch {
		s.SpareBytes += m.size
	}
	a.scratchMu.Unlock()
	s.Releasable += s.SpareBytes
	a.settleUsage(&u)
	s.Allocated, s.Active, s.Reserved = u.Allocated, u.Active, u.Reserved
	s.PeakAllocated, s.PeakActive, s.PeakReserved = u.PeakAllocated, u.PeakActive, u.PeakReserved
	if s.Reserved > s.Active {
		s.Cached = s.Reserved - s.Active
	}
	s.LiveBuffers = s.Allocs - s.Frees
	s.PeakLiveBuffers = max(s.PeakLiveBuffers, s.LiveBuffers)
	s.PeakSegments = max(int(a.peakSegments.Load()), s.Segments)
	s.LargestFree = largest
	if s.LargestFree > s.Cached {
		s.LargestFree = s.Cached
	}
	if s.Cached > 0 {
		s.Fragmentation = 1 - float64(s.LargestFree)/float64(s.Cached)
	}
	c := &a.c
	s.DeviceAllocs, s.DeviceFrees = c.deviceAllocs.Load(), c.deviceFrees.Load()
	s.Creates, s.Releases = c.creates.Load(), c.releases.Load()
	s.Maps, s.Unmaps, s.SetAccess = c.maps.Load(), c.unmaps.Load(), c.setAccess.Load()
	s.Reserves, s.Fences, s.Handoffs, s.Orders = c.reserves.Load(), c.fences.Load(), c.handoffs.Load(), c.orders.Load()
	s.Splits, s.Copies, s.CopiedBytes, s.SplitNanos = c.splits.Load(), c.copies.Load(), c.copiedBytes.Load(), c.splitNanos.Load()
	// Each call's part before the total: a call adds to the total first
	// (timedVM.since), so the parts read never exceed the total read.
	s.CreateNanos, s.MapNanos, s.SetAccessNanos = c.createNanos.Load(), c.mapNanos.Load(), c.accessNanos.Load()
	s.UnmapNanos, s.ReleaseNanos = c.unmapNanos.Load(), c.releaseNanos.Load()
	s.DriverNanos, s.WaitNanos = c.driverNanos.Load(), c.waitNanos.Load()
	s.Misses, s.MissNanos = c.misses.Load(), c.missNanos.Load()
	// The markers' part before the events' total, which a write adds to
	// first (timedMarkers.since): the part read never exceeds the total.
	s.MarkCalls, s.MarkNanos = c.markCalls.Load(), c.markNanos.Load()
	s.EventCalls, s.EventNanos = c.eventCalls.Load(), c.eventNanos.Load()
	s.GateRefusals = c.gateRefusals.Load()
	s.OOMs, s.Retries, s.Trims = c.ooms.Load(), c.retries.Load(), c.trims.Load()
	return s
}

// largestFree is the largest free range of the heap that is backed by
// memory: a whole free block of a plain segment, or the longest mapped run
// inside a free block of a virtual one. Called with the pool locked.
//
// The free blocks are visited from the free index's largest bin down, and
// the visit stops at the first bin none of whose blocks could hold a run
// longer than the best found: a few bins' blocks, where a walk of every
// segment visited every live and free block (0.33-0.38 ms with 40,000
// blocks, BenchmarkManyBlocks/Stats before; TestLargestFreeRuns checks it
// against a walk of every chunk).
func (h *heap) largestFree() uint64 {
	if !h.anyVirtual() {
		return h.free.largest()
	}
	var best uint64
	gran := h.pool.a.gran
	x := &h.free
	for k := x.prevBin(numBins - 1); k >= 0; k = x.prevBin(k - 1) {
		if k+1 < numBins && binFloor(k+1) <= best {
			break // every block of bin k and below is smaller than best
		}
		for b := x.heads[k]; b != nil; b = b.fnext {
			seg := b.seg
			if b.size <= best || !seg.virtual {
				continue
			}
			// Runs of ready chunks, found a word of the bitmap at a time:
			// the arena's free tail alone spans twice the device's chunks.
			c0, c1 := seg.chunkSpan(b.addr, b.size, gran)
			for i := seg.ready.nextReady(c0, c1); i >= 0; {
				j := seg.ready.nextNotReady(i, c1) // the run is [i, j)
				if j < 0 {
					j = c1 + 1
				}
				lo := max(seg.chunkAddr(i, gran), b.addr)
				hi := min(seg.chunkAddr(j, gran), b.end())
				best = max(best, hi-lo)
				i = seg.ready.nextReady(j, c1)
			}
		}
	}
	return best
}

func (h *heap) anyVirtual() bool {
	for _, seg := range h.segs {
		if seg.virtual {
			return true
		}
	}
	return false
}

// ResetPeaks starts the peaks over from what is held now, as
// torch.cuda.reset_peak_memory_stats does: PeakAllocated, PeakActive and
// PeakReserved become the current gauges. Counters are kept.
func (a *Allocator) ResetPeaks() {
	var allocated, active int64
	for _, p := range a.allPools() {
		p.mu.Lock()
		p.flush()
		p.peakAllocated, p.peakActive = p.allocated, p.active
		p.peakLive = p.nallocs - p.nfrees
		allocated += int64(p.allocated)
		active += int64(p.active)
		p.mu.Unlock()
	}
	a.peakAllocated.Store(uint64(max(allocated, 0)))
	a.peakActive.Store(uint64(max(active, 0)))
	a.peakReserved.Store(a.reserved.Load())
	a.peakSegments.Store(a.segments.Load())
	if a.root == a {
		a.familyPeak.Store(a.family.Load())
	}
}

// FamilyPeakReserved is the most a and its private pools (NewPrivate) have
// held from the device together, since it was made or its ResetPeaks:
// exact, where adding each one's PeakReserved gives only an upper bound
// (their peaks need not coincide). On a private pool, its root's.
func (a *Allocator) FamilyPeakReserved() uint64 {
	return max(a.root.familyPeak.Load(), a.family.Load())
}

// Usage is the part of Stats that the allocator keeps as running counts:
// what PyTorch's memory_allocated and memory_reserved and their peaks
// read, and what a CUDA memory pool answers for its used and reserved
// attributes. Each field is Stats' field of the same name, computed the
// same way.
type Usage struct {
	Allocated, Active, Reserved             uint64
	PeakAllocated, PeakActive, PeakReserved uint64
}

// Usage returns the allocator's Usage: a lock of each pool and its
// counts, where Stats walks the segments, the empty spans and the largest
// free blocks (LargestFree, Releasable, Segments) with each pool locked:
// 21-28 ns against Stats' 0.9-1.0 us with 20,000 live and 20,000 free
// blocks on the dev machine (BenchmarkManyBlocks;
// Stats was 330-380 us there while LargestFree walked every block).
func (a *Allocator) Usage() Usage {
	var u Usage
	for _, p := range a.allPools() {
		p.mu.Lock()
		p.addUsage(&u)
		p.mu.Unlock()
	}
	a.settleUsage(&u)
	return u
}

// addUsage adds the pool's counts to u (the pool locked).
func (p *pool) addUsage(u *Usage) {
	u.Allocated += p.allocated
	u.Active += p.active
	u.PeakAllocated = max(u.PeakAllocated, p.peakAllocated)
	u.PeakActive = max(u.PeakActive, p.peakActive)
}

// settleUsage completes u from the pools' counts: the allocator's peaks
// and reserved bytes.
func (a *Allocator) settleUsage(u *Usage) {
	// A flushed peak can lag the exact sum by flushBytes per stream; never
	// report a peak below what is live now.
	u.PeakAllocated = max(u.PeakAllocated, a.peakAllocated.Load(), u.Allocated)
	// Active is at least Allocated at every moment, so its exact peak is at
	// least the exact peak of Allocated, of which PeakAllocated is a lower
	// bound; the two lag independently, so raising PeakActive to it keeps
	// both lower bounds and keeps PeakAllocated <= PeakActive (seen broken
	// by 0.6 MB under TestStress's concurrent streams without this).
	u.PeakActive = max(u.PeakActive, a.peakActive.Load(), u.Active, u.PeakAllocated)
	u.Reserved, u.PeakReserved = a.reserved.Load(), a.peakReserved.Load()
}
