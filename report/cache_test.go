package report

import (
	"fmt"
	"slices"

	"github.com/gpumem/gpumem/policy"
)

// cache is a small caching allocator for the tests, behind
// policy.Allocator: sizes rounded up to 512 bytes, requests of at most
// 1 MiB served from 2 MiB segments and larger ones from segments of their
// size rounded up to 2 MiB, best fit among the free blocks, blocks split
// when 512 bytes or more are left over and merged with free neighbours on
// free, segments kept forever. So its maps have rounding, split free blocks
// and cached segments, as real policies' do.
type cache struct {
	capacity uint64
	next     uint64 // address of the next segment
	reserved uint64
	segs     []*policy.Segment
	live     map[uint64]*policy.Segment // live request address to its segment
}

func newCache(capacity uint64) *cache {
	return &cache{capacity: capacity, next: 1 << 40, live: map[uint64]*policy.Segment{}}
}

func cachePolicy(name string, capacity uint64) Policy {
	return Policy{Name: name, New: func() (policy.Allocator, error) { return newCache(capacity), nil }}
}

const mib = 1 << 20

func (c *cache) Alloc(size, stream uint64) (uint64, error) {
	rounded := (size + 511) &^ 511
	var best *policy.Segment
	bi := -1
	for _, s := range c.segs {
		for i, b := range s.Blocks {
			if !b.Live && b.Size >= rounded && (bi < 0 || b.Size < best.Blocks[bi].Size) {
				best, bi = s, i
			}
		}
	}
	if bi < 0 {
		segSize := uint64(2 * mib)
		if rounded > mib {
			segSize = (rounded + 2*mib - 1) &^ (2*mib - 1)
		}
		if c.reserved+segSize > c.capacity {
			return 0, fmt.Errorf("%w: %d bytes asked, %d of %d reserved", policy.ErrOutOfMemory, size, c.reserved, c.capacity)
		}
		best = &policy.Segment{Addr: c.next, Size: segSize, Stream: stream, Blocks: []policy.Block{{Addr: c.next, Size: segSize}}}
		c.next += segSize + 2*mib
		c.reserved += segSize
		c.segs = append(c.segs, best)
		bi = 0
	}
	b := &best.Blocks[bi]
	if rest := b.Size - rounded; rest >= 512 {
		b.Size = rounded
		best.Blocks = slices.Insert(best.Blocks, bi+1, policy.Block{Addr: b.Addr + rounded, Size: rest})
		b = &best.Blocks[bi]
	}
	b.Live, b.Requested = true, size
	c.live[b.Addr] = best
	return b.Addr, nil
}

func (c *cache) Free(addr uint64) error {
	s, ok := c.live[addr]
	if !ok {
		return fmt.Errorf("cache: free of %#x, not a live request", addr)
	}
	delete(c.live, addr)
	i := slices.IndexFunc(s.Blocks, func(b policy.Block) bool { return b.Addr == addr })
	s.Blocks[i].Live, s.Blocks[i].Requested = false, 0
	if i+1 < len(s.Blocks) && !s.Blocks[i+1].Live {
		s.Blocks[i].Size += s.Blocks[i+1].Size
		s.Blocks = slices.Delete(s.Blocks, i+1, i+2)
	}
	if i > 0 && !s.Blocks[i-1].Live {
		s.Blocks[i-1].Size += s.Blocks[i].Size
		s.Blocks = slices.Delete(s.Blocks, i, i+1)
	}
	return nil
}

func (c *cache) Reserved() uint64 { return c.reserved }

func (c *cache) Segments() []policy.Segment {
	out := make([]policy.Segment, len(c.segs))
	for i, s := range c.segs {
		out[i] = *s
		out[i].Blocks = slices.Clone(s.Blocks)
	}
	return out
}

// reserve adds a free segment of n bytes, as an allocator that preallocates
// does when it is made.
func (c *cache) reserve(n uint64) {
	c.segs = append(c.segs, &policy.Segment{Addr: c.next, Size: n, Blocks: []policy.Block{{Addr: c.next, Size: n}}})
	c.next += n + 2*mib
	c.reserved += n
}

// broken is a cache whose Segments or Reserved lie, or whose decisions
// change from one allocator to the next: what Build must catch.
type broken struct {
	*cache
	fault string
}

func (b *broken) Reserved() uint64 {
	if b.fault == "reserved" {
		return b.cache.Reserved() + 512
	}
	return b.cache.Reserved()
}

func (b *broken) Segments() []policy.Segment {
	segs := b.cache.Segments()
	if b.fault == "gap" && len(segs) > 0 && len(segs[0].Blocks) > 1 {
		segs[0].Blocks = segs[0].Blocks[1:]
	}
	return segs
}
