// Package torchsnapshot reads PyTorch memory snapshots and writes the
// allocation history they hold as gpumem traces (package trace), so that a
// program recorded under PyTorch can be replayed through gpumem.
//
// # What it reads
//
// torch.cuda.memory._record_memory_history() makes PyTorch's caching
// allocator record what it does, and torch.cuda.memory._dump_snapshot(path)
// writes the record as a pickle (protocol 4) of a dict. Of its keys, two are
// read:
//
//   - device_traces: one list per device index, of the allocator's last
//     entries (a ring buffer: the oldest are gone once it is full). Each
//     entry is a dict with action (alloc, free_requested, free_completed,
//     segment_alloc, segment_free, snapshot, oom, ...), addr, size,
//     stream, time_us (microseconds, absolute) and frames, the Python call
//     stack innermost first, each frame a dict of name, filename and line.
//   - segments: the memory the allocator held when the snapshot was taken,
//     each with its device, stream and blocks; a block has address, size,
//     requested_size, state and frames.
//
// The pickle is decoded by github.com/nlpodyssey/gopickle. Before that,
// Read walks its opcodes once, decoding nothing, to check that no length in
// it claims more bytes than the input has (gopickle allocates what a length
// says before it reads, so a few corrupt bytes could ask for gigabytes) and
// that its integers and nesting stay within what any snapshot needs. After
// it, Read checks the fields a trace needs and nothing else; a fault is a
// *FormatError that says where it is, in Python's indexing:
//
//	torchsnapshot: device_traces[0][17]: action is int, want a string
//
// # How a history becomes a trace
//
// Each device with at least one alloc or free_requested entry gets its own
// trace (Snapshot.Devices, Snapshot.WriteTrace):
//
//  1. alloc becomes "a ID SIZE STREAM T_US SITE": IDs count up from 0,
//     SIZE is the entry's size (what the program asked for, before
//     rounding), STREAM its stream, T_US its time_us less that of the
//     device's first alloc or free_requested entry, and SITE its frames
//     as a trace site ("name filename:line", innermost first, joined by
//     " < "; none for no frames). Identical stacks share a site. A stack
//     longer than trace.MaxSiteText is cut after the frames that fit, and
//     the cut marked " < ...".
//  2. free_requested, the moment the program let go, becomes "f ID T_US"
//     for the request live at its address. free_completed, when the
//     memory became reusable after the work of other streams, is not
//     written, and neither are segment_* and every other action.
//  3. A free_requested whose request the history does not hold (allocated
//     before recording began, or before the ring buffer's oldest entry)
//     was live from the start: its alloc is written first, at T_US 0,
//     with the free's size and stream and no site.
//  4. So is every block that segments lists as active_allocated at an
//     address the history never allocates: it was live throughout, and is
//     never freed. Its SIZE is requested_size (size where that is absent
//     or 0), its STREAM its segment's, its SITE its frames.
//  5. An alloc at the address of a request still live means the history
//     lost that request's free: it is freed at the time of the alloc.
//  6. Time never goes backwards in a trace: an entry recorded before the
//     one preceding it is written at that one's time.
//
// Steps 3 to 6 keep the trace valid, and steps 3 and 4 keep its peak of
// live bytes from falling below the program's. Summary counts what each
// added, so that a caller can say how much of the trace is inferred rather
// than recorded.
package torchsnapshot
