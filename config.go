package gpumem

// See doc.go for the overview.

import (
	"fmt"
	"time"
)

// Mode selects how the allocator takes memory from the device.
type Mode int

const (
	// ModeAuto uses virtual memory where the device supports it, plain
	// segments otherwise.
	ModeAuto Mode = iota
	// ModePlain takes whole segments with Device.Alloc, as PyTorch's
	// caching allocator does: a 2 MiB segment for small requests, 20 MiB
	// for requests under 10 MiB, the request rounded up to 2 MiB above.
	ModePlain
	// ModeVirtual reserves address space per stream and backs it with
	// physical memory only where live blocks lie, in spans of at most
	// Config.SpanSize that are reused or given back once empty (vm.go).
	// Holes in the address space hold no memory once their spans empty.
	ModeVirtual
)

func (m Mode) String() string {
	switch m {
	case ModeAuto:
		return "auto"
	case ModePlain:
		return "plain"
	case ModeVirtual:
		return "virtual"
	}
	return fmt.Sprintf("Mode(%d)", int(m))
}

// ParseMode parses "auto", "plain" or "virtual".
func ParseMode(s string) (Mode, error) {
	for _, m := range []Mode{ModeAuto, ModePlain, ModeVirtual} {
		if m.String() == s {
			return m, nil
		}
	}
	return 0, fmt.Errorf("gpumem: unknown mode %q (want auto, plain or virtual)", s)
}

// Config is an allocator's configuration. The zero value is the default:
// virtual memory where available, growth on demand, no limit, cache kept
// until Trim, memory pressure or Close.
type Config struct {
	// Mode: see Mode.
	Mode Mode
	// Limit caps the bytes held from the device (Stats.Reserved); 0 means
	// the device's capacity. A request that would need more fails with an
	// *OutOfMemoryError whose Cause is CauseLimit (or CauseFragmentation).
	Limit uint64
	// Preallocate takes this many bytes from the device at New and keeps
	// them until Trim or Close (TensorFlow's default behaviour, made
	// explicit), or, in ModeVirtual, until a request that the limit or the
	// device would otherwise refuse needs the memory in another place. PreallocateFraction does the same with a fraction of the
	// device's total memory; the larger of the two wins.
	Preallocate         uint64
	PreallocateFraction float64
	// ReleaseThreshold bounds the cached bytes (Stats.Cached): after a free
	// leaves more cached than this, the allocator returns empty spans and
	// free segments to the device at once, oldest first, until it is under
	// the threshold or nothing releasable is left (Stats.Releasable). 0
	// keeps the cache (no release on free).
	ReleaseThreshold uint64
	// IdleRelease returns all cached memory to the device once the
	// allocator has seen no Alloc or Free for this long. 0 disables it.
	IdleRelease time.Duration
	// SmallSize: in ModePlain, requests of at most this many bytes are
	// served from the small pool, whose 2 MiB segments are kept apart from
	// large ones so that small long-lived buffers do not pin large
	// segments. Default 1 MiB. ModeVirtual has one heap (see doc.go).
	SmallSize uint64
	// SpanSize caps the physical memory taken from the device in one piece
	// in ModeVirtual (rounded to the device's granularity); growth at the
	// frontier of an allocator holding at least 16 spans' worth takes up to
	// twice it. Larger spans mean fewer driver calls when memory grows or
	// moves; smaller spans let idle memory be given back more finely.
	// Default 16 MiB (see vm.go).
	SpanSize uint64
	// Compact trades driver calls for memory, in ModeVirtual: every
	// request goes to the start of its best-fitting free range, whether
	// memory is mapped there or not (by default the allocator looks among
	// the fitting ranges for one already mapped, to spare driver calls),
	// spans start at 4 MiB and grow with the allocator, to at most 1/512
	// of the most it has held and 32 MiB (unless SpanSize is set, which
	// fixes them), and a span moved elsewhere leaves its old
	// mapping in place, dormant, to come back to at no cost (dormant.go).
	// Placement then does not depend on what is mapped, so a program that
	// repeats itself repeats its layout. Measured on 40 real programs
	// (simulated device): 1.0001-1.0185 times peak live on the first pass
	// (the default: up to 1.0977), ten passes within 0.003 of the first;
	// on an H100 its first pass is within PyTorch's expandable segments'
	// time on 15 of them and up to 10.4 times it on the rest, where the
	// default's is within it on all but three (docs/BENCHMARKS.md,
	// "Compact with spans that grow"). For programs that run out of
	// memory; the default is for speed.
	Compact bool
	// ChunkHandles backs every chunk of a span (the device's granularity,
	// 2 MiB on NVIDIA) with a physical handle of its own, in ModeVirtual,
	// so that a span's free chunks can be given up while other chunks of
	// it are live, without a copy: where the allocator would otherwise
	// take new memory from the device, it first splits the free chunks
	// off partly used spans and maps them where they are needed
	// (chunks.go). A span then costs a create and a map per chunk (one
	// access grant per span still). Measured on 40 real programs
	// (simulated device): ten passes within 1.05 of peak live and below
	// the best emulated peer (PyTorch's two, cudaMallocAsync, XLA's BFC)
	// on 39 (the default: 29), and five real runs agree; but some
	// programs hold more (ppo_rollouts 1.7%, bench/synth's KV-cache
	// families up to 6%), first passes make 9 times the driver calls,
	// steady states may move chunks every step (2.5-9% longer steps on
	// resnet50_train), and programs that free at random grow mostly by
	// moving chunks (docs/EXPERIMENTS.md, "One handle per chunk, built").
	// Experimental; not with Compact, Defrag or Gather (New refuses them
	// together), a moved span keeps no dormant mapping, and
	// Allocator.Share exports one descriptor per chunk (512 for a 1 GiB
	// buffer: mind the process's open-file limit).
	ChunkHandles bool
	// Defrag lets the allocator move live memory, in ModeVirtual on a
	// device that can copy: when growth would take it past its peak of
	// active bytes plus 1%, and no empty span is left to give back, it
	// splits a sparsely used span into new handles for its live chunks
	// alone, copies their bytes over, maps them at the same addresses and
	// gives the rest back (defrag.go). Pointers do not change. Each move
	// synchronizes the device, so while an Alloc runs no other thread may
	// enqueue work on this allocator's memory. Ignored under Compact.
	Defrag bool
	// Gather lets the allocator move live memory on the way to an
	// out-of-memory, in ModeVirtual on a device that can copy: when a
	// request still does not fit after the cache was given back, sparse
	// spans are split as under Defrag (and, where their live chunks'
	// new handles would not fit beside them, given back before those
	// handles are made, the live bytes parked in free memory of the pool)
	// until the request fits or no span is left to split (defrag.go).
	// Where memory is plentiful it changes nothing: no request that fits
	// without it moves a byte. Measured on 40 real programs (simulated
	// device), the least capacity on which ten passes run falls from up
	// to 1.110 times peak live to at most 1.027 (39 of 40 within 1.02;
	// docs/EXPERIMENTS.md, "Gathering before an out-of-memory"). Same
	// contract as Defrag: while an Alloc runs no other thread may enqueue
	// work on this allocator's memory. Ignored under Compact.
	Gather bool
	// NoStreamWaits keeps a stream from waiting on the GPU for other
	// streams' work (pool.orderAfter): where it finds no memory ready for
	// it while their frees are pending, it maps more instead, so what a
	// program holds depends on how far its host runs ahead of the GPU
	// (on FSDP's streams, up to 2.4 times the peak live bytes on the
	// simulated device). For programs with work queued on a stream that
	// waits for work another stream is given later (a kernel spinning on
	// a flag, a stream memory operation), which an added wait would
	// deadlock; CUDA's stream-ordered pools have the same hazard
	// (cudaMemPoolReuseAllowInternalDependencies).
	NoStreamWaits bool
	// NoMarkers makes the allocator ask the driver how far another stream
	// has run (an event query, about 1.3 us on an H200, more on a busy
	// one) rather than read it from a word of pinned host memory that the
	// stream writes when it gets there (device.Markers: a load). The
	// decisions are the same; only the time differs: on FSDP2 over two
	// H200s markers cut a steady step's event calls from 769-1,540 to
	// 64-103 and its misses' host time by 27%, and cost its streams
	// 2.8 us of GPU time a write (0.2-0.3 ms a step); the steps were within
	// noise both ways (docs/BENCHMARKS.md, "Stream markers on an H200").
	// Where the device has no markers (no 64-bit stream memory operations)
	// the allocator keeps to events anyway.
	NoMarkers bool
	// RecordSites captures the call stack of every allocation, so leak
	// reports from Scope.Close and Close say where each leaked buffer was
	// allocated. It costs an allocation per Alloc.
	RecordSites bool
	// CheckInvariants runs the whole-structure checker after every
	// operation and panics on a violation (slow; for tests). Building with
	// the gpumem_invariants tag turns it on everywhere.
	CheckInvariants bool
}

const (
	defaultSmallSize = 1 << 20
	defaultSpanSize  = 16 << 20
	compactSpanSize  = 4 << 20  // Config.Compact's default span
	smallSegment     = 2 << 20  // plain mode: segment for small requests
	midSegment       = 20 << 20 // plain mode: segment for requests under midLimit
	midLimit         = 10 << 20
	segmentRound     = 2 << 20 // plain mode: large segments round to this
	// maxRequest is the largest request considered at all: anything above
	// is a programming error (an absurd size), not memory pressure.
	maxRequest = 1 << 50
)
