package policy

import "fmt"

// cuda-async emulates CUDA's stream-ordered allocator (cudaMallocAsync on
// the device's default memory pool) as PyTorch's backend:cudaMallocAsync
// configures it (c10/cuda/CUDAMallocAsyncAllocator.cpp): the request's
// exact size goes to cudaMallocAsync; cudaMemPoolAttrReleaseThreshold is
// UINT64_MAX, so the pool keeps every byte it took; the three reuse flags
// (follow event dependencies, opportunistic, internal dependencies) are
// on. PyTorch's reserved figure is the pool's
// cudaMemPoolAttrReservedMemHigh.
//
// The pool's internals are not public. The model follows what its
// measured figures show (docs/EXPERIMENTS.md, "cuda-async: a segregated
// pool"): every reserved figure torch-async reached on the H100 (the six
// shipped traces, ten passes of them, the kv, serve and rand synthetic
// traces: 26 figures) is a multiple of 32 MiB, so the pool takes memory in
// units of asyncUnit; and the NVIDIA programming guide says the driver
// remaps unused memory of the pool to new addresses when a request does
// not fit. The model:
//
//   - a request rounds up to asyncRound;
//   - a request of asyncLarge or more gets a mapping of its own, the
//     request rounded up to asyncUnit, which it fills;
//   - a smaller one is served from chunks of asyncUnit kept per stream:
//     the smallest free block that fits (lowest address among equals),
//     split; freed blocks merge with free neighbours in their chunk, never
//     across chunks; failing that, a new chunk;
//   - a chunk or mapping left with nothing live is unmapped at once: its
//     memory stays in the pool as spare, mapped again (anywhere, for any
//     stream) before the pool takes more from the device. What the pool
//     holds, Reserved, is its high-water mark: mapped memory plus spare;
//   - the device full (spare used up), a request fails.
//
// Fitted: asyncUnit is read off the measured figures, not fitted;
// asyncLarge was swept (1, 2, 4, 8, 12, 16, 20, 24, 32 MiB) on the six
// shipped traces' first passes, where ResNet-50 decides it (12 MiB: 1.418,
// 16: 1.278, 20: 1.267; the real pool 1.278), and checked on the 15 kv,
// serve and rand synthetic traces. NOT MET: the model is within 2% of
// torch-async on ResNet-50 only; +5.1% on gpt2_train_varlen, +8.0% on
// bert, -6.0% on t5, -2.9% on gpt2_generate, -2.4% on sweep; 0 to +12% on
// kv and serve and -11 to -13% on rand (the real pool 1.28-1.30); and,
// like every model tried, it does not grow over later passes as the real
// pool does (bert 1.067 to 1.362 over ten passes): a pool left wholly free
// after a pass holds nothing a later pass cannot reuse, so the real one
// keeps state this model lacks (policy/anchors_test.go's misses,
// TestCudaAsyncTargets).
var (
	asyncRound uint64 = 512
	asyncUnit  uint64 = 32 << 20
	asyncLarge uint64 = 16 << 20
)

// Segment kinds of the cuda-async pool.
const (
	asyncChunk = iota // a chunk of asyncUnit, shared by a stream's small requests
	asyncOwn          // the mapping of one large request
)

// spareAddr is where Segments shows the pool's spare memory: far above
// any address books gives a mapping.
const spareAddr = 1 << 62

// Invariants, besides the books' (checked by check):
//
//	every segment holds a live block (one left with none is unmapped at once)
//	an asyncOwn segment is one live block
//	reserved + spare <= capacity
type cudaAsync struct {
	books
	free  map[uint64]*freeSet // free blocks of each stream's chunks
	spare uint64              // held by the pool, mapped nowhere
}

func newCudaAsync(capacity uint64) *cudaAsync {
	return &cudaAsync{books: newBooks(capacity), free: make(map[uint64]*freeSet)}
}

func (c *cudaAsync) Alloc(size, stream uint64) (uint64, error) {
	n := roundTo(max(size, 1), asyncRound)
	if n >= asyncLarge {
		s, err := c.mapNew(roundTo(n, asyncUnit), stream, asyncOwn, size)
		if err != nil {
			return 0, err
		}
		return c.take(s.first, size), nil
	}
	fs := c.free[stream]
	if fs == nil {
		fs = &freeSet{}
		c.free[stream] = fs
	}
	b := fs.bestFit(n)
	if b != nil {
		fs.remove(b)
	} else {
		s, err := c.mapNew(asyncUnit, stream, asyncChunk, size)
		if err != nil {
			return 0, err
		}
		b = s.first
	}
	if b.size-n >= asyncRound {
		fs.insert(split(b, n))
	}
	return c.take(b, size), nil
}

// mapNew maps a new segment of want bytes, from the spare memory first and
// then from the device.
func (c *cudaAsync) mapNew(want, stream uint64, kind int, size uint64) (*seg, error) {
	fromSpare := min(want, c.spare)
	held := c.reserved + c.spare
	if more := want - fromSpare; held > c.capacity || more > c.capacity-held {
		return nil, fmt.Errorf("%w: cuda-async: a request of %d bytes needs %d more from the device, which has %d of %d left",
			ErrOutOfMemory, size, more, c.capacity-min(held, c.capacity), c.capacity)
	}
	c.spare -= fromSpare
	return c.newSeg(want, stream, kind), nil
}

func (c *cudaAsync) Free(addr uint64) error {
	b, err := c.release(addr)
	if err != nil {
		return err
	}
	s := b.seg
	if s.kind == asyncChunk {
		fs := c.free[s.stream]
		b = coalesce(fs, b)
		if b.prev != nil || b.next != nil {
			fs.insert(b)
			return nil
		}
	}
	// Nothing live is left in s: unmap it, its memory spare.
	c.dropSegs(func(t *seg) bool { return t == s })
	c.spare += s.size
	return nil
}

func (c *cudaAsync) Reserved() uint64 { return c.reserved + c.spare }

// Segments reports the mapped segments and, last, the spare memory as one
// free segment at spareAddr, stream 0: memory the pool holds from the
// device and has mapped nowhere.
func (c *cudaAsync) Segments() []Segment {
	out := c.segments()
	if c.spare > 0 {
		out = append(out, Segment{Addr: spareAddr, Size: c.spare, Blocks: []Block{{Addr: spareAddr, Size: c.spare}}})
	}
	return out
}

func (c *cudaAsync) check() error {
	sets := make([]*freeSet, 0, len(c.free))
	for _, f := range c.free {
		sets = append(sets, f)
	}
	if err := c.books.check(sets); err != nil {
		return err
	}
	if c.reserved+c.spare > c.capacity || c.nextAddr > spareAddr {
		return fmt.Errorf("policy: cuda-async holds %d mapped and %d spare bytes on a device of %d (mappings up to %#x)", c.reserved, c.spare, c.capacity, c.nextAddr)
	}
	for _, s := range c.segs {
		live := false
		for b := s.first; b != nil; b = b.next {
			live = live || b.live
		}
		if !live {
			return fmt.Errorf("policy: cuda-async: segment at %#x (%d bytes) holds nothing live and is still mapped", s.addr, s.size)
		}
		if s.kind == asyncOwn && (s.first.next != nil || !s.first.live) {
			return fmt.Errorf("policy: cuda-async: the mapping at %#x of a large request is not one live block", s.addr)
		}
	}
	return nil
}
