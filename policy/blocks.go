package policy

import (
	"fmt"
	"slices"
	"sort"
)

// The emulations share the structures of a caching allocator: segments taken
// from the device, each tiled by a doubly linked list of blocks (free
// neighbours merged on free), free blocks kept in sets ordered by (size,
// address) for best fit, and a map from the address of each live block to
// the block. Addresses come from a counter and are never reused: they only
// need to be unique and to place blocks within their segments.
//
// Invariants (Check verifies what Segments reports; books.check the rest):
//
//	books.reserved == sum of seg.size over books.segs
//	books.reserved <= books.capacity
//	a block is in exactly one free set iff it is free; live[b.addr] == b iff b is live
//	no two free blocks are neighbours in one segment (merged on free)

// blk is a block: a piece of a segment, live or free.
type blk struct {
	addr, size uint64
	req        uint64 // bytes requested; 0 when free
	live       bool
	seg        *seg
	prev, next *blk   // neighbours in the segment, by address
	stamp      uint64 // order among free blocks, for policies that keep one
	pending    bool   // cuda-async: freed on its stream, the free not yet completed
}

// seg is a segment: memory taken from the device in one piece.
type seg struct {
	addr, size uint64
	stream     uint64
	first      *blk
	kind       int // which of the allocator's pools it belongs to
}

// freeSet is a set of free blocks ordered by (size, address): a best-fit
// search is a binary search. The free lists of a caching allocator hold
// hundreds to a few thousand blocks, for which a sorted slice beats a tree.
type freeSet struct {
	b []*blk
}

func less(a *blk, size, addr uint64) bool {
	return a.size < size || a.size == size && a.addr < addr
}

// search returns the index of the first block not before (size, addr).
func (f *freeSet) search(size, addr uint64) int {
	return sort.Search(len(f.b), func(i int) bool { return !less(f.b[i], size, addr) })
}

func (f *freeSet) insert(b *blk) {
	i := f.search(b.size, b.addr)
	f.b = slices.Insert(f.b, i, b)
}

func (f *freeSet) remove(b *blk) {
	i := f.search(b.size, b.addr)
	if i == len(f.b) || f.b[i] != b {
		panic(fmt.Sprintf("policy: free block at %#x (%d bytes) is not in its free set", b.addr, b.size))
	}
	f.b = slices.Delete(f.b, i, i+1)
}

// bestFit returns the smallest free block of at least size bytes (the lowest
// address among equals), or nil.
func (f *freeSet) bestFit(size uint64) *blk {
	i := f.search(size, 0)
	if i == len(f.b) {
		return nil
	}
	return f.b[i]
}

// books is what every emulation keeps: its capacity, its segments, what
// they add up to, and the live blocks by address.
type books struct {
	capacity uint64
	reserved uint64
	nextAddr uint64
	segs     []*seg // in address order (addresses only grow)
	live     map[uint64]*blk
}

func newBooks(capacity uint64) books {
	// Addresses start high enough that 0 is never one.
	return books{capacity: capacity, nextAddr: 1 << 32, live: make(map[uint64]*blk)}
}

// room reports whether n more bytes fit on the device.
func (k *books) room(n uint64) bool { return k.reserved <= k.capacity && n <= k.capacity-k.reserved }

// newSeg takes a segment of size bytes on stream, its one block free. The
// caller checked room. Segments are 2 MiB aligned apart, as the driver's
// allocations are; the gap between them is address space only.
func (k *books) newSeg(size, stream uint64, kind int) *seg {
	s := &seg{addr: k.nextAddr, size: size, stream: stream, kind: kind}
	s.first = &blk{addr: s.addr, size: size, seg: s}
	k.nextAddr += (size + 2<<20 - 1) &^ (2<<20 - 1)
	k.reserved += size
	k.segs = append(k.segs, s)
	return s
}

// dropSegs gives back every segment for which drop is true.
func (k *books) dropSegs(drop func(*seg) bool) {
	k.segs = slices.DeleteFunc(k.segs, func(s *seg) bool {
		if drop(s) {
			k.reserved -= s.size
			return true
		}
		return false
	})
}

// split cuts b into its first n bytes, which it returns as b, and the rest,
// a new block after it, which it returns.
func split(b *blk, n uint64) *blk {
	rest := &blk{addr: b.addr + n, size: b.size - n, seg: b.seg, prev: b, next: b.next}
	if b.next != nil {
		b.next.prev = rest
	}
	b.next = rest
	b.size = n
	return rest
}

// absorbNext merges b's next neighbour into b.
func absorbNext(b *blk) {
	n := b.next
	b.size += n.size
	b.next = n.next
	if n.next != nil {
		n.next.prev = b
	}
}

// coalesce merges the free block b with its free neighbours, taking them
// out of fs, and returns the merged block, which the caller inserts.
func coalesce(fs *freeSet, b *blk) *blk {
	if p := b.prev; p != nil && !p.live {
		fs.remove(p)
		absorbNext(p)
		b = p
	}
	if n := b.next; n != nil && !n.live {
		fs.remove(n)
		absorbNext(b)
	}
	return b
}

// take marks b live for a request of req bytes.
func (k *books) take(b *blk, req uint64) uint64 {
	b.live, b.req = true, req
	k.live[b.addr] = b
	return b.addr
}

// release finds the live block at addr and marks it free.
func (k *books) release(addr uint64) (*blk, error) {
	b := k.live[addr]
	if b == nil {
		return nil, fmt.Errorf("policy: free of %#x, which is not a live request", addr)
	}
	delete(k.live, addr)
	b.live, b.req = false, 0
	return b, nil
}

// segments reports the segments and their blocks.
func (k *books) segments() []Segment {
	out := make([]Segment, 0, len(k.segs))
	for _, s := range k.segs {
		sg := Segment{Addr: s.addr, Size: s.size, Stream: s.stream}
		for b := s.first; b != nil; b = b.next {
			sg.Blocks = append(sg.Blocks, Block{Addr: b.addr, Size: b.size, Requested: b.req, Live: b.live})
		}
		out = append(out, sg)
	}
	return out
}

// oom is the error of a request the device could not serve.
func (k *books) oom(policy string, size, want uint64) error {
	return fmt.Errorf("%w: %s: a request of %d bytes needs %d more from the device, which has %d of %d left",
		ErrOutOfMemory, policy, size, want, k.capacity-min(k.reserved, k.capacity), k.capacity)
}

// roundUp rounds n up to a multiple of the power of two g.
func roundUp(n, g uint64) uint64 { return (n + g - 1) &^ (g - 1) }

// check verifies the invariants of the books against the free sets the
// allocator keeps (every free block of every segment must be in exactly one
// of them).
func (k *books) check(sets []*freeSet) error {
	var sum uint64
	inSet := make(map[*blk]int)
	for _, f := range sets {
		for i, b := range f.b {
			inSet[b]++
			if i > 0 && !less(f.b[i-1], b.size, b.addr) {
				return fmt.Errorf("policy: free set out of order at the block at %#x", b.addr)
			}
		}
	}
	live := 0
	for _, s := range k.segs {
		sum += s.size
		for b := s.first; b != nil; b = b.next {
			if b.seg != s || b.next != nil && b.next.prev != b {
				return fmt.Errorf("policy: block at %#x: broken links in the segment at %#x", b.addr, s.addr)
			}
			if b.live {
				live++
				if k.live[b.addr] != b {
					return fmt.Errorf("policy: live block at %#x is not in the live map", b.addr)
				}
				if inSet[b] != 0 {
					return fmt.Errorf("policy: live block at %#x is in a free set", b.addr)
				}
				continue
			}
			if inSet[b] != 1 {
				return fmt.Errorf("policy: free block at %#x (%d bytes) is in %d free sets, want 1", b.addr, b.size, inSet[b])
			}
			if b.next != nil && !b.next.live {
				return fmt.Errorf("policy: free blocks at %#x and %#x are neighbours, not merged", b.addr, b.next.addr)
			}
		}
	}
	if live != len(k.live) {
		return fmt.Errorf("policy: %d live blocks in the segments, %d in the live map", live, len(k.live))
	}
	if sum != k.reserved || k.reserved > k.capacity {
		return fmt.Errorf("policy: reserved %d, segments add up to %d, capacity %d", k.reserved, sum, k.capacity)
	}
	return nil
}

// roundTo rounds n up to a multiple of g, any g > 0.
func roundTo(n, g uint64) uint64 { return (n + g - 1) / g * g }
