package report

// See doc.go for the overview.

import (
	"fmt"

	"github.com/gpumem/gpumem/policy"
)

// Map is a policy's segments and blocks at one moment, and where its
// reserved bytes went:
//
//	Used + Rounding + Split + Cached == Reserved == sum of Size over Segments
//
// Used is what the live requests asked for; Rounding what their blocks
// hold beyond that; Split the free blocks of segments that also hold live
// blocks (memory the allocator cannot give back, lost to splitting);
// Cached the free blocks of segments with no live block (whole segments
// kept for later). newMap checks the equation and the tiling.
type Map struct {
	Reserved uint64       `json:"reserved"`
	Used     uint64       `json:"used"`
	Rounding uint64       `json:"rounding"`
	Split    uint64       `json:"split"`
	Cached   uint64       `json:"cached"`
	Segments []MapSegment `json:"segments"`
}

// A MapSegment is one segment of a Map. Its blocks tile it in address
// order; Blocks holds two numbers per block: its size and the bytes
// requested of it, 0 for a free block.
type MapSegment struct {
	Addr   string   `json:"addr"` // hexadecimal: JSON numbers lose the low bits of addresses
	Size   uint64   `json:"size"`
	Stream uint64   `json:"stream"`
	Blocks []uint64 `json:"blocks"`
}

// newMap builds the map of segs, which an allocator reserving reserved
// bytes returned. It fails if the segments do not add up to reserved or a
// segment's blocks do not tile it: the allocator's map is wrong.
func newMap(segs []policy.Segment, reserved uint64) (Map, error) {
	m := Map{Reserved: reserved, Segments: make([]MapSegment, 0, len(segs))}
	var total uint64
	for _, s := range segs {
		ms := MapSegment{Addr: fmt.Sprintf("%#x", s.Addr), Size: s.Size, Stream: s.Stream, Blocks: make([]uint64, 0, 2*len(s.Blocks))}
		var free, live uint64
		at := s.Addr
		for j, b := range s.Blocks {
			if b.Addr != at {
				return m, fmt.Errorf("segment %#x (%d bytes): block %d is at %#x, want %#x (the blocks must tile the segment in order)", s.Addr, s.Size, j, b.Addr, at)
			}
			if b.Size == 0 || b.Size > s.Addr+s.Size-at {
				return m, fmt.Errorf("segment %#x (%d bytes): block %d at %#x of %d bytes goes past its end", s.Addr, s.Size, j, b.Addr, b.Size)
			}
			at += b.Size
			req := uint64(0)
			if b.Live {
				if b.Requested == 0 || b.Requested > b.Size {
					return m, fmt.Errorf("segment %#x: live block %d at %#x holds %d bytes for a request of %d", s.Addr, j, b.Addr, b.Size, b.Requested)
				}
				req = b.Requested
				m.Used += b.Requested
				m.Rounding += b.Size - b.Requested
				live++
			} else {
				free += b.Size
			}
			ms.Blocks = append(ms.Blocks, b.Size, req)
		}
		if at != s.Addr+s.Size {
			return m, fmt.Errorf("segment %#x (%d bytes): its blocks cover %d bytes", s.Addr, s.Size, at-s.Addr)
		}
		if live > 0 {
			m.Split += free
		} else {
			m.Cached += free
		}
		total += s.Size
		m.Segments = append(m.Segments, ms)
	}
	if total != reserved {
		return m, fmt.Errorf("its %d segments add up to %d bytes, but it reserves %d", len(segs), total, reserved)
	}
	return m, nil
}
