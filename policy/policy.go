// Package policy replays allocation traces under the policies of other
// allocators, emulated on the simulated device's accounting, and under
// gpumem's own: XLA's and TensorFlow's BFC allocator (growth and
// preallocated), PyTorch's caching allocator as shipped and with expandable
// segments, and CUDA's stream-ordered pool. Each emulation is written from
// how that allocator works (rounding, bins, splitting, segment sizes,
// per-stream pools, when it returns memory), and is checked against the
// ratio its real allocator reached on an H100 on the shipped traces.
//
// An emulation holds no device memory: it keeps the addresses, segments
// and blocks its real allocator would have, on a device of a given
// capacity, so that `gpumem replay --policy`, `gpumem fit` and
// `gpumem report` can say what each framework would hold and whether a
// program fits.
package policy

import (
	"errors"

	"github.com/gpumem/gpumem/trace"
)

// ErrOutOfMemory: the emulated allocator could not serve a request on a
// device of its capacity. Errors of Alloc match it with errors.Is.
var ErrOutOfMemory = errors.New("policy: out of memory")

// An Allocator is one allocation policy replaying a trace. It is not safe
// for concurrent use: a replay drives it from one goroutine.
//
// Invariants, checked by Check:
//
//	Reserved() == sum of Size over Segments()
//	sum of Size over live blocks <= Reserved()
//	blocks of a segment tile it: sorted, adjacent, within its bounds
type Allocator interface {
	// Alloc serves size bytes on stream and returns the request's address,
	// unique among live requests. An error matches ErrOutOfMemory when the
	// device (of the capacity given to New) could not give more.
	Alloc(size uint64, stream uint64) (addr uint64, err error)
	// Free gives back the request at addr.
	Free(addr uint64) error
	// Reserved is what the allocator holds from the device now.
	Reserved() uint64
	// Segments is the map of what it holds now: each piece of memory taken
	// from the device, with its blocks in address order.
	Segments() []Segment
}

// Synchronizer is an Allocator whose state a device synchronize changes:
// CUDA's pool completes the frees still pending on their streams
// (cuda_async.go). Replays of several passes synchronize between passes, as
// the harness that measured the real allocators did.
type Synchronizer interface {
	Synchronize()
}

// CacheEmptier is an Allocator that can give its cached memory back, as
// the program's torch.cuda.empty_cache asks (a trace's "t" lines,
// trace.Trace.Trims). A policy without it models none: XLA's BFC never
// gives memory back; CUDA's pool is modelled by its high-water mark.
type CacheEmptier interface {
	EmptyCache()
}

// EmptyCaches empties a's cache (if it is a CacheEmptier) once for each of
// tr's trims that falls before event i, from trims[*k] on, and moves *k
// past them. i == len(tr.Events) takes those after the last event.
func EmptyCaches(tr *trace.Trace, a Allocator, i int, k *int) {
	for *k < len(tr.Trims) && int(tr.Trims[*k]) <= i {
		if e, ok := a.(CacheEmptier); ok {
			e.EmptyCache()
		}
		*k++
	}
}

// synchronize synchronizes a if it is a Synchronizer.
func synchronize(a Allocator) {
	if s, ok := a.(Synchronizer); ok {
		s.Synchronize()
	}
}

// A Segment is one piece of memory an allocator took from the device (a
// cudaMalloc'd segment, a BFC region, a mapped range of virtual memory).
type Segment struct {
	Addr   uint64
	Size   uint64
	Stream uint64 // the stream whose pool it belongs to
	Blocks []Block
}

// A Block is a piece of a segment: live (serving a request) or free
// (cached). Requested is the size the program asked for; Size - Requested
// of a live block is lost to rounding.
type Block struct {
	Addr      uint64
	Size      uint64
	Requested uint64
	Live      bool
}
