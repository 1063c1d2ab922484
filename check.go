package gpumem

// See doc.go for the overview.

import (
	"errors"
	"fmt"
)

// Check verifies every invariant of the allocator (see block.go, index.go,
// vm.go, scope.go, stats.go) and returns the violations found. It locks
// every pool for its duration; it is meant for tests and debugging.
func (a *Allocator) Check() error {
	pools := a.allPools()
	for _, p := range pools {
		p.mu.Lock()
	}
	defer func() {
		for _, p := range pools {
			p.mu.Unlock()
		}
	}()
	var errs []error
	var plain, mappedBytes, active, allocated uint64
	for _, p := range pools {
		if err := p.check(); err != nil {
			errs = append(errs, err)
		}
		for k := range p.heaps {
			for _, seg := range p.heaps[k].segs {
				if !seg.virtual {
					plain += seg.size
				}
				for b := seg.first; b != nil; b = b.next {
					if b.state == blockAllocated {
						active += b.size
						allocated += b.req
					}
				}
			}
		}
		mappedBytes += uint64(p.nmapped) * a.gran
	}
	a.handlesMu.Lock()
	spare := uint64(len(a.handles)) * a.gran
	a.handlesMu.Unlock()
	if r := a.reserved.Load(); r != plain+mappedBytes+spare {
		errs = append(errs, fmt.Errorf("reserved %d != plain %d + mapped %d + spare %d", r, plain, mappedBytes, spare))
	}
	if r := a.reserved.Load(); r > a.limit {
		errs = append(errs, fmt.Errorf("reserved %d > limit %d", r, a.limit))
	}
	var pa, pr uint64
	var flushedAct, flushedReq int64
	for _, p := range pools {
		pa += p.active
		pr += p.allocated
		flushedAct += int64(p.active) - p.dActive
		flushedReq += int64(p.allocated) - p.dAllocated
	}
	if pa != active || pr != allocated {
		errs = append(errs, fmt.Errorf("pools' gauges active %d, allocated %d != Σ allocated block sizes %d, requested %d", pa, pr, active, allocated))
	}
	if v := a.active.Load(); v != flushedAct {
		errs = append(errs, fmt.Errorf("flushed active %d != Σ pools' active less unflushed %d", v, flushedAct))
	}
	if v := a.allocated.Load(); v != flushedReq {
		errs = append(errs, fmt.Errorf("flushed allocated %d != Σ pools' allocated less unflushed %d", v, flushedReq))
	}
	if active > a.reserved.Load() {
		errs = append(errs, fmt.Errorf("active %d > reserved %d", active, a.reserved.Load()))
	}
	return errors.Join(errs...)
}

func (a *Allocator) mustCheckPool(p *pool) {
	if err := p.check(); err != nil {
		panic(fmt.Sprintf("gpumem: invariant violated after an operation on stream %d:\n%v", p.stream, err))
	}
}

// check verifies one pool's structure. Called with p.mu held.
func (p *pool) check() error {
	a := p.a
	var errs []error
	bad := func(format string, args ...any) {
		if len(errs) < 20 {
			errs = append(errs, fmt.Errorf("stream %d: "+format, append([]any{p.stream}, args...)...))
		}
	}
	pending := 0
	nmapped := 0
	for k := range p.heaps {
		h := &p.heaps[k]
		if h.pool != p || h.kind != k {
			bad("heap %d has wrong pool or kind", k)
		}
		nfree, freeBytes := 0, uint64(0)
		for _, seg := range h.segs {
			if seg.heap != h {
				bad("segment 0x%x in heap %s points to another heap", seg.base, heapName(k))
			}
			var live []int32
			if seg.virtual {
				live = make([]int32, len(seg.chunks))
			}
			addr := seg.base
			var prev *block
			for b := seg.first; b != nil; prev, b = b, b.next {
				switch {
				case b.pool != p || b.seg != seg:
					bad("block 0x%x: wrong pool or segment", b.addr)
				case b.prev != prev:
					bad("block 0x%x: prev link broken", b.addr)
				case b.addr != addr:
					bad("block 0x%x: expected at 0x%x (gap or overlap)", b.addr, addr)
				case b.size == 0 || b.size%minBlock != 0:
					bad("block 0x%x: size %d not a positive multiple of %d", b.addr, b.size, minBlock)
				case b.req > b.size:
					bad("block 0x%x: requested %d > size %d", b.addr, b.req, b.size)
				}
				addr = b.addr + b.size
				switch b.state {
				case blockFree:
					nfree++
					freeBytes += b.size
					if b.req != 0 || b.scope != nil {
						bad("free block 0x%x still has a request or a scope", b.addr)
					}
					if prev != nil && prev.state == blockFree {
						bad("free blocks 0x%x and 0x%x are neighbours (not coalesced)", prev.addr, b.addr)
					}
					if int(b.bin) != binOf(b.size) {
						bad("free block 0x%x of %d bytes is in bin %d, want %d", b.addr, b.size, b.bin, binOf(b.size))
					}
				case blockAllocated, blockPending:
					if b.state == blockAllocated && b.req == 0 {
						bad("allocated block 0x%x has no request", b.addr)
					}
					if b.state == blockPending {
						pending++
					}
					if seg.virtual {
						c0, c1 := seg.chunkSpan(b.addr, b.size, a.gran)
						for i := c0; i <= c1; i++ {
							live[i]++
						}
					}
				default:
					bad("block 0x%x: invalid state %d", b.addr, b.state)
				}
			}
			if addr != seg.base+seg.size {
				bad("segment 0x%x: blocks end at 0x%x, segment at 0x%x", seg.base, addr, seg.base+seg.size)
			}
			for i := range seg.chunks {
				c := &seg.chunks[i]
				if c.mapped {
					nmapped++
				}
				if c.live != live[i] {
					bad("chunk %d of segment 0x%x: live %d, blocks say %d", i, seg.base, c.live, live[i])
				}
				if c.live > 0 && (!c.mapped || !c.access) {
					bad("chunk %d of segment 0x%x holds live blocks but is not mapped with access (mapped %v)", i, seg.base, c.mapped)
				}
				if c.live < 0 {
					bad("chunk %d of segment 0x%x: negative live count", i, seg.base)
				}
			}
		}
		if nfree != h.free.count || freeBytes != h.free.bytes {
			bad("heap %s: %d free blocks (%d bytes) in segments, %d (%d bytes) in the index", heapName(k), nfree, freeBytes, h.free.count, h.free.bytes)
		}
		n := 0
		for i := range h.free.heads {
			set := h.free.words[i/64]&(1<<(i%64)) != 0
			if set != (h.free.heads[i] != nil) {
				bad("heap %s: bin %d bitmap %v disagrees with its list", heapName(k), i, set)
			}
			var prev *block
			for b := h.free.heads[i]; b != nil; prev, b = b, b.fnext {
				n++
				if b.state != blockFree || int(b.bin) != i || b.fprev != prev || b.seg.heap != h {
					bad("heap %s: bin %d holds block 0x%x (state %s, bin %d) wrongly", heapName(k), i, b.addr, b.state, b.bin)
				}
			}
		}
		for w := 0; w < numWords; w++ {
			if (h.free.words[w] != 0) != (h.free.top&(1<<w) != 0) {
				bad("heap %s: top bitmap bit %d disagrees with word", heapName(k), w)
			}
		}
		if n != h.free.count {
			bad("heap %s: index lists %d blocks, counts %d", heapName(k), n, h.free.count)
		}
	}
	if nmapped != p.nmapped {
		bad("%d chunks mapped, pool counts %d", nmapped, p.nmapped)
	}
	// The empty lists hold exactly the mapped chunks with no live block,
	// oldest first.
	total := 0
	for k := range p.heaps {
		for _, seg := range p.heaps[k].segs {
			ne, want := 0, 0
			prev, lastSeq := int32(-1), uint64(0)
			for i := seg.empty.head; i >= 0; prev, i = i, seg.chunks[i].next {
				c := &seg.chunks[i]
				ne++
				if c.prev != prev || !c.mapped || c.live != 0 {
					bad("empty list of 0x%x: chunk %d wrongly listed (mapped %v live %d)", seg.base, i, c.mapped, c.live)
				}
				if c.seq < lastSeq {
					bad("empty list of 0x%x: chunk %d out of age order", seg.base, i)
				}
				lastSeq = c.seq
				if ne > len(seg.chunks) {
					bad("empty list of 0x%x: cycle", seg.base)
					break
				}
			}
			if seg.empty.tail != prev {
				bad("empty list of 0x%x: tail %d, last %d", seg.base, seg.empty.tail, prev)
			}
			for i := range seg.chunks {
				if seg.chunks[i].mapped && seg.chunks[i].live == 0 {
					want++
				}
			}
			if ne != seg.empty.n || ne != want {
				bad("empty list of 0x%x has %d chunks, counts %d, mapped empty chunks %d", seg.base, ne, seg.empty.n, want)
			}
			total += ne
		}
	}
	if total != p.nempty {
		bad("pool counts %d empty chunks, lists hold %d", p.nempty, total)
	}
	np := 0
	for b := p.pending; b != nil; b = b.fnext {
		np++
		if b.state != blockPending {
			bad("pending list holds block 0x%x in state %s", b.addr, b.state)
		}
	}
	if np != p.npending || np != pending {
		bad("pending: list %d, count %d, blocks %d", np, p.npending, pending)
	}
	return errors.Join(errs...)
}
