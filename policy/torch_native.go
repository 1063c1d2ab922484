package policy

// torch-native emulates PyTorch's CUDA caching allocator as shipped
// (c10/cuda/CUDACachingAllocator.cpp, DeviceCachingAllocator, default
// PYTORCH_CUDA_ALLOC_CONF). What it follows:
//
//   - round_size: requests round up to kMinBlockSize, 512 B (0 B too).
//   - get_pool: rounded sizes up to kSmallSize (1 MiB) go to the small pool,
//     others to the large pool; each pool keeps its blocks per stream
//     (BlockComparatorSize orders by stream, size, address).
//   - get_free_block: the smallest free block of the request's stream and
//     pool of at least the rounded size, lowest address among equals.
//   - get_allocation_size: a new segment (cudaMalloc) is kSmallBuffer (2 MiB)
//     for the small pool, kLargeBuffer (20 MiB) for requests under
//     kMinLargeAlloc (10 MiB), else the size rounded up to kRoundLarge
//     (2 MiB).
//   - should_split: the small pool splits when at least kMinBlockSize
//     (512 B) remains, the large pool when more than kSmallSize (1 MiB)
//     remains; the request takes the front of the block.
//   - free_block / try_merge_blocks: a freed block merges with free
//     neighbours of its segment at once.
//   - malloc's retry: when cudaMalloc fails, release_cached_blocks gives
//     back every wholly free segment of every stream and pool, then
//     alloc_block tries again; otherwise memory goes back only with
//     empty_cache, which traces do not contain.
//
// Left out: max_split_size_mb, roundup_power2_divisions and
// garbage_collection_threshold (all off by default), the oversize pool
// they enable, events of record_stream (a trace's frees are final),
// expandable segments (torch_expandable.go), the per-process memory
// fraction, and the CUDA context's own memory.

const (
	torchMinBlock      = 512      // kMinBlockSize
	torchSmallSize     = 1 << 20  // kSmallSize
	torchSmallBuffer   = 2 << 20  // kSmallBuffer
	torchLargeBuffer   = 20 << 20 // kLargeBuffer
	torchMinLargeAlloc = 10 << 20 // kMinLargeAlloc
	torchRoundLarge    = 2 << 20  // kRoundLarge
)

// The two pools of PyTorch's allocator, as seg.kind.
const (
	poolSmall = 0
	poolLarge = 1
)

type torchNative struct {
	books
	free map[poolKey]*freeSet
}

// poolKey names one free list: a pool of one stream.
type poolKey struct {
	stream uint64
	kind   int
}

func newTorchNative(capacity uint64) *torchNative {
	return &torchNative{books: newBooks(capacity), free: make(map[poolKey]*freeSet)}
}

// torchRound is round_size.
func torchRound(size uint64) uint64 {
	if size < torchMinBlock {
		return torchMinBlock
	}
	return roundUp(size, torchMinBlock)
}

// torchSegmentSize is get_allocation_size.
func torchSegmentSize(rounded uint64) uint64 {
	switch {
	case rounded <= torchSmallSize:
		return torchSmallBuffer
	case rounded < torchMinLargeAlloc:
		return torchLargeBuffer
	}
	return roundUp(rounded, torchRoundLarge)
}

func (t *torchNative) set(k poolKey) *freeSet {
	f := t.free[k]
	if f == nil {
		f = &freeSet{}
		t.free[k] = f
	}
	return f
}

func (t *torchNative) Alloc(size, stream uint64) (uint64, error) {
	n := torchRound(size)
	kind := poolLarge
	if n <= torchSmallSize {
		kind = poolSmall
	}
	fs := t.set(poolKey{stream, kind})
	b := fs.bestFit(n)
	if b != nil {
		fs.remove(b)
	} else {
		want := torchSegmentSize(n)
		if !t.room(want) {
			t.releaseCached()
			if !t.room(want) {
				return 0, t.oom("torch-native", size, want)
			}
		}
		b = t.newSeg(want, stream, kind).first
	}
	rest := b.size - n
	if kind == poolSmall && rest >= torchMinBlock || kind == poolLarge && rest > torchSmallSize {
		fs.insert(split(b, n))
	}
	return t.take(b, size), nil
}

func (t *torchNative) Free(addr uint64) error {
	b, err := t.release(addr)
	if err != nil {
		return err
	}
	fs := t.set(poolKey{b.seg.stream, b.seg.kind})
	fs.insert(coalesce(fs, b))
	return nil
}

// releaseCached is release_cached_blocks: every wholly free segment goes
// back to the device.
func (t *torchNative) releaseCached() {
	t.dropSegs(func(s *seg) bool {
		b := s.first
		if b.live || b.next != nil {
			return false
		}
		t.free[poolKey{s.stream, s.kind}].remove(b)
		return true
	})
}

// EmptyCache is torch.cuda.empty_cache(): the same release.
func (t *torchNative) EmptyCache() { t.releaseCached() }

func (t *torchNative) Reserved() uint64    { return t.reserved }
func (t *torchNative) Segments() []Segment { return t.segments() }

// check verifies the books against the free lists.
func (t *torchNative) check() error {
	sets := make([]*freeSet, 0, len(t.free))
	for _, f := range t.free {
		sets = append(sets, f)
	}
	return t.books.check(sets)
}
