package policy

import (
	"fmt"
	"slices"
)

// Check verifies the invariants written on Allocator, on what a's methods
// report: Reserved equals the sum of the segments' sizes; each segment's
// blocks are sorted, adjacent and tile it exactly; no two segments
// overlap; a block's Requested is at most its Size and is zero for a free
// block; the live blocks add up to at most Reserved. It returns the first
// violation found, saying which segment and block, or nil.
func Check(a Allocator) error {
	segs := a.Segments()
	reserved := a.Reserved()
	var total, live uint64
	order := make([]int, len(segs))
	for i := range order {
		order[i] = i
	}
	slices.SortFunc(order, func(i, j int) int {
		switch {
		case segs[i].Addr < segs[j].Addr:
			return -1
		case segs[i].Addr > segs[j].Addr:
			return 1
		}
		return 0
	})
	for k, i := range order {
		s := &segs[i]
		if s.Size == 0 {
			return fmt.Errorf("policy: segment at %#x is empty", s.Addr)
		}
		if s.Addr+s.Size < s.Addr {
			return fmt.Errorf("policy: segment at %#x of %d bytes wraps around the address space", s.Addr, s.Size)
		}
		if k > 0 {
			p := &segs[order[k-1]]
			if p.Addr+p.Size > s.Addr {
				return fmt.Errorf("policy: segment at %#x (%d bytes) overlaps the segment at %#x", p.Addr, p.Size, s.Addr)
			}
		}
		total += s.Size
		if len(s.Blocks) == 0 {
			return fmt.Errorf("policy: segment at %#x (%d bytes) has no blocks: blocks must tile it", s.Addr, s.Size)
		}
		at := s.Addr
		for j, b := range s.Blocks {
			if b.Addr != at {
				return fmt.Errorf("policy: segment at %#x: block %d starts at %#x, want %#x (blocks must be sorted and adjacent)", s.Addr, j, b.Addr, at)
			}
			if b.Size == 0 {
				return fmt.Errorf("policy: segment at %#x: block %d at %#x is empty", s.Addr, j, b.Addr)
			}
			if b.Requested > b.Size {
				return fmt.Errorf("policy: segment at %#x: block at %#x serves %d bytes in %d", s.Addr, b.Addr, b.Requested, b.Size)
			}
			if !b.Live && b.Requested != 0 {
				return fmt.Errorf("policy: segment at %#x: free block at %#x has %d bytes requested", s.Addr, b.Addr, b.Requested)
			}
			if b.Live {
				live += b.Size
			}
			at += b.Size
			if at > s.Addr+s.Size || at < b.Addr {
				return fmt.Errorf("policy: segment at %#x (%d bytes): block at %#x of %d bytes runs past its end", s.Addr, s.Size, b.Addr, b.Size)
			}
		}
		if at != s.Addr+s.Size {
			return fmt.Errorf("policy: segment at %#x (%d bytes): its blocks end at %#x, want %#x (blocks must tile it)", s.Addr, s.Size, at, s.Addr+s.Size)
		}
	}
	if total != reserved {
		return fmt.Errorf("policy: Reserved() is %d bytes but the %d segments add up to %d", reserved, len(segs), total)
	}
	if live > reserved {
		return fmt.Errorf("policy: the live blocks add up to %d bytes, more than the %d reserved", live, reserved)
	}
	return nil
}
