// Package sim is a simulated GPU: a deterministic, in-process backend that
// implements every capability of package device (Device, VirtualMemory,
// Events, Markers, Streams, Capture) with the same preconditions as the
// CUDA driver, checked strictly, so that tests can run an allocator
// against it and capacity planning can replay allocation traces without a
// GPU.
//
// # What is simulated
//
// Memory is accounting only; no bytes are stored. The device has a capacity
// (Config.Capacity) of which some may be taken by "another process"
// (Shrink). Alloc consumes its size rounded up to Config.Granularity, as the
// driver effectively does for segments; Create consumes the chunk size. A
// chunk released with Release while still mapped keeps its memory until its
// last mapping is unmapped, as in CUDA. A request that does not fit fails
// with an *device.OpError wrapping device.ErrOutOfMemory; MemInfo reports
// (capacity - shrunk - used, capacity).
//
// Addresses are fake but realistic: never 0, aligned to the granularity
// (plain allocations) or to the requested alignment (reservations), and
// never reused during the life of a Device, so a stale pointer is always
// detected. Plain allocations and reservations are carved from disjoint
// address ranges, and consecutive objects are separated by a gap of one
// granule, so two objects are never adjacent and a range can never run from
// one into the next by accident. Addresses depend only on the sequence of
// calls: two Devices given the same calls return the same addresses.
//
// Virtual memory is tracked exactly: reservations, physical chunks
// (handles), mappings and which mappings have had SetAccess. Every
// precondition of package device is checked; a violation returns an
// *device.OpError wrapping device.ErrInvalid whose message says what was
// wrong. One check is stricter than the interface text and follows the CUDA
// documentation of cuMemSetAccess: SetAccess must cover whole, contiguous
// mappings ("a fully mapped address range containing all allocations").
//
// # Streams, events and pending work
//
// Each stream is a FIFO queue of work items. Work is either a Touch (a kernel
// reading and writing a memory range), a StreamWait (work on this stream may
// not proceed until an event of another stream has completed), or the marker
// left by Record. Normally work completes the moment it is enqueued, so a
// program that never holds a stream sees a device that is always idle.
//
// Work is pending when it has been enqueued but has not completed. Work
// becomes pending in two ways: its stream is held (Hold: everything enqueued
// on the stream from then on stays pending until Drain), or it is queued
// behind a StreamWait on an event whose work is itself pending. Items of one
// stream complete in order; a StreamWait item completes only after the work
// before its event has completed.
//
// An event completes when all work enqueued on its stream before its last
// Record has completed; an event never recorded is complete. Query only
// looks. The host-blocking calls (Wait, SynchronizeStream, Synchronize, and
// the test hook Drain) model the GPU finishing work while the host waits:
// they complete the requested work at once, together with whatever work on
// other streams it depends on through StreamWait, even on held streams. They
// therefore never block, which keeps single-goroutine tests deterministic and
// free of deadlocks. A held stream stays held for work enqueued after a
// Wait, SynchronizeStream or Synchronize; only Drain lifts the hold.
//
// A marker's write (Mark) lands as an event recorded at the same point
// completes, and Reached sees it under the same rules as Query sees the
// event, read for read (markers.go), so an allocator that reads markers
// decides as one that queries events. Config.NoMarkers makes a device
// without them.
//
// Stream 0 always exists and behaves like any other stream (like a
// per-thread default stream: it does not implicitly synchronize with
// others). A destroyed stream accepts no new work, but work already pending
// on it stays pending, as in CUDA, until it is completed.
//
// # Catching allocator bugs
//
// Memory used by pending Touch work may not be given back: Free and Unmap of
// such memory fail with ErrInvalid, "in use by pending work on stream N".
// (The real cuMemFree synchronizes; the simulation treats the attempt as the
// bug it usually is.) CheckHandoff proves that memory last used on one stream
// may be used on another: it fails if pending work on another stream touches
// the range and the new stream's future work is not ordered after that work
// by StreamWait on an event recorded after it. Accessible reports whether a
// range may be touched; Leaks reports what is still live at teardown.
//
// # Fault injection
//
// FailNth and FailOOM make a chosen future call fail (with ErrInjected or
// ErrOutOfMemory); Shrink and Grow change the usable capacity; ClearFaults
// undoes all of them. A call that fails, injected or not, changes no state.
//
// # Cost
//
// A Device is safe for concurrent use (one mutex). Bookkeeping is O(1) or
// O(log n) per call (ordered maps are arena-backed treaps), and successful
// calls allocate no garbage in steady state (see the benchmarks). Only work
// that is actually pending costs more: Free, Unmap and CheckHandoff scan the
// pending Touch items, and the host-blocking calls complete it.
package sim
