// Package gpumem is a stream-ordered caching allocator for GPU memory: it
// grows only as needed, holds hard limits, returns memory promptly and
// predictably, keeps fragmentation near zero, is fast on a cache hit, and
// accounts for every byte.
//
// # Structures
//
//	Allocator   one per device: configuration, the pool table, the shared
//	            gauges and counters (atomics), handles the driver would not
//	            release yet.
//	pool        pool.go: heaps, spans, pending frees, stream slots, a
//	            mutex, exact gauges. In ModeVirtual one pool serves every
//	            stream (one arena, one lock per device); in ModePlain one
//	            per stream, so that goroutines on different streams take
//	            different locks and write no shared cache line.
//	heap        a pool's large heap, and in ModePlain its small heap:
//	            segments and a freeIndex of their free blocks (index.go).
//	segment     a contiguous address range: a plain allocation from the
//	            device, or a virtual arena backed span by span (vm.go).
//	block       a piece of a segment, free, allocated or pending (block.go).
//	            Blocks tile their segment; free neighbours coalesce at once.
//	chunk       one granule (2 MiB on NVIDIA) of a virtual arena: the unit of
//	            placement accounting (vm.go).
//	span        one physical handle mapped whole over a run of chunks: the
//	            unit of growth, reuse elsewhere and release (vm.go).
//	Scope       owns buffers, charges a quota, frees all it owns on Close.
//
// # Layers
//
// One request goes down through four layers, each in files of its own,
// and the calls go one way, down:
//
//	placement   which free block, and where in it: pool.go (allocate,
//	            carve, release, coalescing), index.go (the free index),
//	            block.go, place.go (where in a virtual arena, and a
//	            split's plan).
//	growth and  what the chosen range's unmapped chunks get, and what
//	pressure    happens as memory gets short: pressure.go (back: the
//	            span sizes, the frontier's bet, the tightening; newSpan:
//	            revive, slack, move, stretch, assemble, split, release,
//	            create; feasible, makeRoom, allocSlow's ladder, gather).
//	mapping     the mechanics it orders: vm.go (chunks, spans, handles:
//	            occupy, createSpan, moveSpan, grant, releaseSpan),
//	            readymap.go, dormant.go, defrag.go (splitting a span),
//	            chunks.go (a handle per chunk: splits with no copy).
//	device      package device: the driver, or the simulated one.
//
// Beside them, stream ordering (pool.go: stream slots, tags, events,
// fences), which all use; the churn guard (churn.go), which growth asks.
// A shortage goes back up as an error (*shortage) to pool.allocSlow,
// which decides; what backing made ready goes back up as back's result,
// and pool.allocate voids placement's caches (readyNear). The requesting
// stream comes down with the request (back's asker, for stalls), and
// whether a moved span's mapping turns dormant comes down to moveSpan
// from growth's policy. A split of a span (Defrag, Gather) is planned by
// placement (splitPlan in place.go: the chunks live blocks cover, and the
// free memory their bytes may wait in) and the plan handed down to
// mapping's split by the policy that chose the span: no call goes up.
//
// # Modes
//
// ModeVirtual (the default where the device has virtual memory) reserves one
// arena of address space for all streams, twice as large as the device
// (another only when it is exhausted; see arenaDevices in vm.go), and backs
// only
// the chunks under live blocks, in spans of at most Config.SpanSize (twice
// that, and filled ahead, where a grown allocator extends its arena: see
// runEnd in pressure.go). When a block is freed, a span left without live chunks
// stays mapped on the pool's empty list: reused in place it costs nothing.
// When a block needs backing, the allocator first looks for a free place
// already backed (a cache hit, or on a miss a search over every fitting free
// block); then it moves an empty span of exactly the size needed, or a
// larger one of its own stream over the free address space after the run,
// or releases empty spans (oldest first) and only then asks the device for
// a new one. So the device is asked for memory only when no empty span is
// held, and a hole in the address space holds no memory once its spans have
// emptied. Peak reserved memory is the peak of what the spans touched by
// live blocks hold. The one exception is a program whose requests move
// spans every few allocations (one that frees at random): a guard sees it
// and holds up to a quarter more than is in use, mapped, instead of moving
// (churn.go); no program of the corpus comes near it.
//
// Config.Compact trades driver calls for memory in ModeVirtual: a request
// goes to the start of its best fit whether memory is mapped there or not,
// spans start at 4 MiB and grow with the allocator (at most 1/512 of
// what it has held, up to 32 MiB; spanMost in pressure.go), and moved spans
// leave dormant mappings to come back to at no cost (dormant.go).
// Placement no longer depends on what is mapped, so a program that repeats
// itself repeats its layout and holds no more over many passes than over
// one; measured on 40 real programs it holds 1.0001-1.0185 times peak live
// where the default holds up to 1.0977, and on an H100 its first pass is
// within PyTorch's expandable segments' time on 15 of them, the default's
// on all but three (docs/BENCHMARKS.md, "Compact with spans that grow").
//
// Config.Defrag keeps the default placement and moves live memory instead:
// before growth would take the allocator past its peak of active bytes plus
// 1%, it splits sparsely used spans, copying their live chunks to new
// handles mapped at the same addresses, and gives the rest back
// (defrag.go). Each move synchronizes the device, so it is for programs
// that launch from one thread at a time (docs/EXPERIMENTS.md, "Moving live
// chunks").
//
// Config.Gather makes the same moves only on the way to an out-of-memory,
// when nothing else is left: where memory is plentiful it changes
// nothing, and near a limit it turns a fragmentation failure into a
// program that fits within 1.027 times its peak live bytes (measured on
// 40 real programs over ten passes, docs/EXPERIMENTS.md). The same
// one-launching-thread contract applies.
//
// Config.ChunkHandles (experimental) gives every chunk a physical handle of
// its own, so that the free chunks of partly used spans can be given up
// with no copy: where growth would take new memory it takes them first
// (chunks.go). Over ten passes of the 40 corpus traces it meets the
// unlimited memory bar on 39 (Defrag 36, the default 29) without moving a
// live byte, but pays for it in driver calls and, on some programs, in
// steady-state moves and memory (docs/EXPERIMENTS.md, "One handle per
// chunk, built").
//
// ModePlain takes segments with Device.Alloc, as PyTorch's caching
// allocator does (plainSegmentSize), for devices without virtual memory.
//
// # Rounding and pools
//
// In ModePlain, requests up to Config.SmallSize (1 MiB) have a pool of their
// own, in 2 MiB segments, as in PyTorch: otherwise a small long-lived buffer
// left in a large segment keeps the whole segment from being freed or
// reused for a large request. In ModeVirtual that cost mostly disappears
// (the spans of a split free range empty and are reused elsewhere), and one
// best-fit heap for all streams does better: small blocks fill the partly used
// chunks at the edges of large ones. Measured on the six shipped traces
// against a separate small arena and against small pages carved out of the
// large arena, the single heap gave the lowest ratio on four traces, within
// 0.0013 of it on the others, and the fewest remaps on five, so ModeVirtual
// uses it (docs/EXPERIMENTS.md, "Small requests").
//
// Every request is rounded up to 512 bytes (minBlock): the alignment CUDA
// kernels assume, and small enough that rounding costs under 0.1% on real
// traces. A block is split whenever the rest is at least 512 bytes: in a
// virtual arena a split-off rest is still usable memory, never waste. A
// free block is found by the freeIndex in O(1), best fit to within 1/64 of
// the size.
//
// The order of frees that come together (between two allocations) is not
// the program's to choose: Python's collector, a list of tensors dropped.
// So it never decides anything: the next allocation first puts such a
// batch in the order of its requests in the free index and by address on
// the list of empty spans (pool.settle, pool.batch), and the same program
// holds the same memory in every run (replay/order_test.go).
//
// # The alloc path
//
//  1. Find the stream's pool and slot (a scan of a short immutable slice)
//     and lock the pool; put the frees since the last allocation in their
//     order if they came out of it (pool.settle: a flag test otherwise).
//  2. Cache hit (allocFast): the freeIndex gives the best-fitting free
//     block of the heap; if the stream may use it now (its tag, see the
//     stream contract) and its chunks are ready (always, for plain
//     segments), carve the request off it, count it in its chunks, done: no
//     device call, no map, no Go allocation.
//  3. Otherwise (allocSlow): a request larger than the limit fails at
//     once (step 8), before an arena is reserved for it; else free the
//     pending blocks whose events have completed, move the other streams'
//     horizons (advanceEpoch) and look again.
//  4. Grow: a virtual heap reserves another arena if its address space is
//     exhausted; a plain heap adopts a wholly free segment of another stream
//     behind an event wait (adoptSegment), or allocates a segment.
//  5. Place and back the block (virtual): choose, among the fitting free
//     blocks this stream may use, the place with the fewest chunks not yet
//     backed (findBacked); in a block of another stream whose work is not
//     known done, only a place over unmapped chunks. The first candidate
//     with a place over ready chunks wins; a free block remembers the
//     smallest request it had none for (block.nzFrom), so later searches
//     pass it by. If none is ready and other streams' frees are pending,
//     order this stream after them on the GPU (orderAfter, see the stream
//     contract) and search again. Give each run of missing chunks a span
//     (back, newSpan), and the spans mapped side by side access in one
//     call (grantAll).
//  6. If the limit or the device refused (a shortage), unlock, wait for
//     every pending free (with several pools, return every pool's cache to
//     the device), lock and retry once (makeRoomFor in pressure.go).
//  7. Still short, under Config.Gather: split sparse spans one at a time
//     (the one that gives back the most first), retrying after each; then
//     every pool's cache back to the device and one last retry.
//  8. Still short: fail with an *OutOfMemoryError, the verdict (oom.go):
//     which of the limit, the device or fragmentation bit, with the
//     numbers, and what would have fit: after a trim, with virtual-memory
//     spans, a smaller request.
//
// # The free path
//
//  1. Check the Buffer against its block (generation, state, address):
//     a double free or a foreign buffer is an error, and nothing changes.
//  2. Detach it from its scope.
//  3. If RecordStream named other streams, record an event on each and park
//     the block as pending; it is freed when they complete (step 3 above).
//  4. Otherwise uncount it from its chunks (spans left empty join the
//     pool's empty list), coalesce it with free neighbours, tag it with
//     the free (its stream and the pool's free count), and index it.
//  5. If Config.ReleaseThreshold is set and more is cached, release the
//     oldest empty spans and free segments down to it.
//
// # The stream contract
//
// Memory returned by Alloc(n, s) is valid for work on stream s. Freeing it
// makes it reusable on s at once: later work on s is ordered after earlier
// work, so a block freed while kernels on s still use it can be handed to
// the next Alloc on s. Memory is never given to another stream before the
// work that used it has completed, or the other stream has been made to wait
// for it: plain segments move between streams only with an event recorded on
// the old stream and waited on by the new (adoptSegment). In the one virtual
// arena every free block carries a tag (block.si, block.freed): the stream
// that freed it and the pool's free count then. Stream s may use it at once
// if s freed it; another stream once an event recorded on the tag's
// stream after that free has completed (advanceEpoch records one per
// stream and queries it on the slow path, a few times within 20 us when
// it has just recorded it (pollEpochs), since a GPU reaches a record
// microseconds later; where the device has markers the epoch is instead a
// number the stream writes to pinned host memory, read with a load, the
// same decisions for no driver call: device.Markers, Config.NoMarkers),
// or once s has been ordered after that stream on the
// GPU: where s finds no place ready for it and would map memory while
// other streams' frees are pending, s's stream waits (cuStreamWaitEvent)
// for events recorded on those streams now, and their free memory is s's
// (orderAfter, streamState.after; CUDA's stream-ordered pools do the same
// by default). So how far the host runs ahead of the GPU does not decide
// what a program holds; the price is that s's later work waits for the
// other streams' work enqueued so far. Coalesced pieces of two
// streams, neither done, are tagged with no stream (mergeTags) and used by
// either only once the other's frees in them are done. A place over
// unmapped chunks is any stream's: spans are unmapped only after a fence
// (an event waited on by the host) on every stream that freed memory since
// its last fence, because unmapping is not stream-ordered; and an empty
// span is moved or released for one stream only if that needs no host wait
// for another stream's work (stalls), or, for a move where moved spans
// leave dormant mappings, behind an order: the stream waits for that work
// on the GPU and the old mapping is unmapped only after a fence
// (orderedMove). Buffers used on several streams are
// reused only after RecordStream's events.
//
// The allocator records events on the streams it holds memory for, so a
// stream must outlive that memory: call ReleaseStream (or Close) before
// destroying a stream.
//
// # CUDA graphs
//
// While a stream captures work into a CUDA graph, the driver forbids event
// records, queries and synchronizes that touch the capture; BeginCapture
// and EndCapture tell the allocator, which then defers whatever needs
// them (capture.go). A graph replays into the memory its capture
// allocated, so that memory comes from a private pool (NewPrivate): plain
// segments kept at their addresses until the pool is closed, counted
// against the same limit, serving no other allocation. internal/host
// routes a program's allocations to pools as PyTorch's graph pools do.
// PyTorch's MemPool options are a private pool's too (NewPrivateWith): its
// segments made by another allocator (PrivateConfig.Segments) and never
// split (PrivateConfig.NoSplit); its memory given back once no graph can
// write it (ReleaseUnused).
//
// # Invariants
//
// Each structure states its invariants beside its type. Allocator.Check
// verifies them all; Config.CheckInvariants (or the gpumem_invariants build
// tag) runs the per-pool part after every operation.
package gpumem
