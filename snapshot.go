package gpumem

// See doc.go for the overview.

import (
	"encoding/binary"
	"encoding/json"
	"io"
	"sort"
)

// Snapshot is every segment and block of the allocator at one moment, for
// humans and tools. It marshals to JSON as written here.
type Snapshot struct {
	Mode        string            `json:"mode"`
	Granularity uint64            `json:"granularity"`
	Limit       uint64            `json:"limit"`
	Stats       Stats             `json:"stats"`
	Segments    []SegmentSnapshot `json:"segments"`
}

// SegmentSnapshot is one segment: a plain allocation or a virtual arena.
type SegmentSnapshot struct {
	Address     uint64          `json:"address"`
	Size        uint64          `json:"size"`
	Stream      uint64          `json:"stream"`
	Pool        string          `json:"pool"` // "small" or "large"
	Kind        string          `json:"kind"` // "plain" or "virtual"
	Preallocate bool            `json:"preallocated,omitempty"`
	MappedBytes uint64          `json:"mapped_bytes"`    // plain: Size
	Spans       []SpanSnapshot  `json:"spans,omitempty"` // virtual: physical memory mapped in it
	Blocks      []BlockSnapshot `json:"blocks"`          // tile the segment, in address order
	// PrivatePool names the private pool the segment belongs to (PyTorch's
	// pool id: hi, lo) where a host lists its pools' segments beside the
	// allocator's own (internal/host); absent for the allocator's own.
	PrivatePool []uint64 `json:"private_pool,omitempty"`
}

// SpanSnapshot is one span: a piece of physical memory mapped whole.
type SpanSnapshot struct {
	Address     uint64 `json:"address"`
	Size        uint64 `json:"size"`
	LiveBytes   uint64 `json:"live_chunk_bytes"` // bytes of its chunks holding live blocks
	Preallocate bool   `json:"preallocated,omitempty"`
}

// BlockSnapshot is one block of a segment.
type BlockSnapshot struct {
	Address   uint64 `json:"address"`
	Size      uint64 `json:"size"`
	Requested uint64 `json:"requested,omitempty"`
	State     string `json:"state"` // "free", "allocated", "pending"
	Stream    uint64 `json:"stream"`
	Scope     string `json:"scope,omitempty"`
	Seq       uint64 `json:"seq,omitempty"` // allocation number in its pool (one per stream in ModePlain; all streams share one in ModeVirtual)
	Site      string `json:"site,omitempty"`
	// Stack is the allocation's call stack (program counters, innermost
	// first) when Config.RecordSites is set: what a pprof profile is made of.
	Stack []uintptr `json:"-"`
}

// Snapshot captures every segment and block. Free blocks of a virtual arena
// are included: the tail block of an arena is its unused address space.
func (a *Allocator) Snapshot() Snapshot {
	s := Snapshot{Mode: a.mode.String(), Granularity: a.gran, Limit: a.limit.Load()}
	s.Stats = a.Stats()
	for _, p := range a.allPools() {
		p.mu.Lock()
		for k := range p.heaps {
			for _, seg := range p.heaps[k].segs {
				ss := SegmentSnapshot{Address: seg.base, Size: seg.size, Stream: uint64(p.stream),
					Pool: heapName(k), Kind: "plain", Preallocate: seg.prealloc, MappedBytes: seg.size}
				if seg.virtual {
					ss.Kind, ss.MappedBytes = "virtual", 0
					for i := range p.spans {
						sp := &p.spans[i]
						if !sp.inUse || sp.seg != seg {
							continue
						}
						ss.MappedBytes += uint64(sp.n) * a.gran
						ss.Spans = append(ss.Spans, SpanSnapshot{Address: seg.chunkAddr(int(sp.c0), a.gran),
							Size: uint64(sp.n) * a.gran, LiveBytes: uint64(sp.occupied) * a.gran, Preallocate: sp.prealloc})
					}
					sort.Slice(ss.Spans, func(i, j int) bool { return ss.Spans[i].Address < ss.Spans[j].Address })
				}
				for b := seg.first; b != nil; b = b.next {
					bs := BlockSnapshot{Address: b.addr, Size: b.size, Requested: b.req, State: b.state.String(), Stream: uint64(b.stream())}
					if b.state != blockFree {
						bs.Seq = b.id
					}
					if b.scope != nil {
						bs.Scope = b.scope.Name()
					}
					if site := b.site(); site != nil {
						bs.Site = formatSite(site)
						bs.Stack = site
					}
					ss.Blocks = append(ss.Blocks, bs)
				}
				s.Segments = append(s.Segments, ss)
			}
		}
		p.mu.Unlock()
	}
	sort.Slice(s.Segments, func(i, j int) bool { return s.Segments[i].Address < s.Segments[j].Address })
	return s
}

// SiteTotal is what one call stack has allocated since the allocator
// began, freed or not: the alloc_objects and alloc_space of a heap profile.
// Kept only with Config.RecordSites.
type SiteTotal struct {
	Stack  []uintptr // program counters, innermost first
	Allocs uint64    // allocations made from this stack
	Bytes  uint64    // bytes they requested
}

// SiteTotals returns every recorded call stack's totals, in no set order;
// nil without Config.RecordSites.
func (a *Allocator) SiteTotals() []SiteTotal {
	merged := map[string]*SiteTotal{}
	var out []SiteTotal
	for _, p := range a.allPools() {
		p.mu.Lock()
		for k, t := range p.sites {
			if m := merged[k]; m != nil {
				m.Allocs += t.Allocs
				m.Bytes += t.Bytes
				continue
			}
			c := *t
			merged[k] = &c
		}
		p.mu.Unlock()
	}
	for _, t := range merged {
		out = append(out, *t)
	}
	return out
}

// countSite adds one allocation of size bytes to the totals of stack pcs
// (under p.mu; RecordSites only).
func (p *pool) countSite(pcs []uintptr, size uint64) {
	k := StackKey(pcs)
	t := p.sites[k]
	if t == nil {
		if p.sites == nil {
			p.sites = map[string]*SiteTotal{}
		}
		t = &SiteTotal{Stack: pcs}
		p.sites[k] = t
	}
	t.Allocs++
	t.Bytes += size
}

// StackKey is a map key for a call stack: its program counters as bytes.
func StackKey(pcs []uintptr) string {
	b := make([]byte, 0, 8*len(pcs))
	for _, pc := range pcs {
		b = binary.LittleEndian.AppendUint64(b, uint64(pc))
	}
	return string(b)
}

// WriteJSON writes the snapshot as indented JSON.
func (s Snapshot) WriteJSON(w io.Writer) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(s)
}
