package gpumem

// See doc.go for the overview.

import "github.com/gpumem/gpumem/device"

// blockState is the life cycle of a block:
//
//	free ──Alloc──▶ allocated ──Free──▶ free
//	                     │
//	                     └─Free with uses on other streams──▶ pending ──events done──▶ free
type blockState uint8

const (
	blockFree      blockState = iota // in the heap's free index
	blockAllocated                   // owned by a caller through a Buffer
	blockPending                     // freed, waiting for events on other streams
)

func (s blockState) String() string {
	switch s {
	case blockFree:
		return "free"
	case blockAllocated:
		return "allocated"
	case blockPending:
		return "pending"
	}
	return "invalid"
}

// A block is a contiguous range of a segment. Blocks tile their segment in
// address order (prev/next). A block node belongs to one pool for its whole
// life (pool never changes), so a stale Buffer can always find the lock that
// guards it; nodes are recycled through the pool's spare list.
//
// Invariants (checked by checkPool):
//
//	b.prev.addr + b.prev.size == b.addr, and the blocks of a segment cover it exactly
//	no two free blocks are neighbours (free blocks coalesce at once)
//	b.state == blockFree  ⇔  b is linked in heap.free under bin(b.size)
//	b.req <= b.size; b.req == 0 ⇔ b.state == blockFree
//	free, b.nzFrom > 0 ⇒ placement finds no place over ready chunks only
//	  in b for any request from b.nzFrom up to b.size (readyPlace)
//
// All fields but pool are guarded by pool.mu.
type block struct {
	pool *pool // owner; immutable
	seg  *segment
	addr uint64
	size uint64 // multiple of minBlock
	req  uint64 // bytes the caller asked for (0 when free)

	prev, next   *block // address order within seg
	fprev, fnext *block // free-bin list, or the pool's spare/pending list
	bin          int32

	state blockState
	// si is a stream slot of the pool (pool.streams): for a non-free block
	// the stream it was allocated on; for a free block, with freed, its
	// tag: the memory is reusable at once on stream si, and on every
	// stream once tagSettled(si, freed). -1: no stream reuses it at once.
	// (16 bits: it fills padding; the node is 144 bytes.)
	si  slot
	gen uint32 // bumped at every allocation; a Buffer carries the gen it saw
	// batch: free, the pool's batch (pool.batch) in which release put it in
	// the free index; 0 for a block no release made free (a carve's piece,
	// a new segment). One batch's frees are ordered by id within their bin
	// (freeIndex.insertFresh). (It fills the padding after gen.)
	batch uint32

	id    uint64 // allocated: its allocation sequence number in its pool (snapshots); free with a batch, the latest request freed into it in that batch (release)
	freed uint64 // free: the pool's freeSeq of the tag's latest free (0: never used)
	// nzFrom is the ready cache of a free virtual block (readyPlace): no
	// request of nzFrom bytes or more has a place in b over ready chunks
	// only; 0 for not known. What can make it false clears it: a change of
	// the block's range (release, absorb; carve's new pieces are fresh or
	// recycled nodes, zeroed by putBlock), or chunks under it becoming
	// ready, which happens only in back, to the free blocks beside the one
	// it backs (see back). Chunks becoming not ready (unmapSpan) only make
	// it truer. Beside freed, which release writes too.
	nzFrom uint64
	scope  *Scope // owning scope, or nil
	sprev  *block // scope list, guarded by scope.mu
	snext  *block
	x      *blockExtra // rarely used state, kept out of the hot cache lines
}

// blockExtra holds what only some blocks need. It is allocated on first
// use and kept with the node when the node is recycled.
type blockExtra struct {
	uses   []device.Stream // other streams that used this buffer (RecordStream)
	events []device.Event  // pending: events to wait for before reuse
	// pending, freed during capture markID: the graph nodes that ended its
	// uses, which its stream's captured work must follow before it is
	// reused (capture.go, "Reuse within a capture")
	markers []device.Node
	markID  uint64
	site    []uintptr // allocation call stack, when recorded
	created int64     // allocation time, UnixNano, when sites are recorded
}

func (b *block) extra() *blockExtra {
	if b.x == nil {
		b.x = new(blockExtra)
	}
	return b.x
}

// hasUses reports whether RecordStream named other streams.
func (b *block) hasUses() bool { return b.x != nil && len(b.x.uses) > 0 }

// stream is the stream of b's slot: for a non-free block the stream it
// was allocated on; for a free block its tag's stream, or the pool's first
// stream for a block no stream holds (si -1).
func (b *block) stream() device.Stream {
	if b.si >= 0 {
		return b.pool.streams[b.si].s
	}
	return b.pool.stream
}

// site returns the recorded allocation stack, or nil.
func (b *block) site() []uintptr {
	if b.x == nil {
		return nil
	}
	return b.x.site
}

func (b *block) end() uint64 { return b.addr + b.size }
