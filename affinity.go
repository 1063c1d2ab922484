package gpumem

// See doc.go for the overview.

import (
	"os"
	"strconv"
)

// affMode selects the experiment (temporary): 0 off, 1 only in the index's
// choice, 2 anywhere, 3 anywhere unless the index's choice fits exactly.
var affDbg = os.Getenv("GPUMEM_AFFDBG") != ""

var affMode = func() int {
	n, _ := strconv.Atoi(os.Getenv("GPUMEM_AFF"))
	return n
}()

// Address affinity: a program that repeats a step of one shape should get
// the same addresses in it again (XLA's command buffers replay only steps
// whose buffers are where they were when traced). Coalescing defeats the
// index's own choice: a small block freed next to a large free run moves
// the run's start, and the best fit then carves the next step's buffers
// from the new start. So each pool remembers, for a request size and
// stream, the address of the last block of that size the stream freed, in
// a direct-mapped table (affSlots entries, no Go map, nothing allocated),
// and a later request of that size on that stream is carved at that
// address when the free block around it may serve it there at once.
const affSlots = 256

// An affinity remembers where a block of size bytes was freed by stream
// slot si: at addr, in the free block hint (after coalescing; hint may have
// been merged, carved or recycled since, so it is only a place to start a
// short walk from).
type affinity struct {
	size uint64
	addr uint64
	hint *block
	si   slot
}

// affIndex is the table entry of a size and stream slot.
func affIndex(size uint64, si slot) int {
	return int(((size>>minShift)*0x9E3779B97F4A7C15 + uint64(si)*0xBF58476D1CE4E5B9) >> 56)
}

// noteFreed remembers that b (not yet coalesced) was freed, now lying in
// free block f.
func (p *pool) noteFreed(addr, size uint64, si slot, f *block) {
	e := &p.aff[affIndex(size, si)]
	e.size, e.addr, e.si, e.hint = size, addr, si, f
}

// affWalk bounds the steps from an entry's hint to the block at its
// address.
const affWalk = 8

// affine returns the free block of heap h and the offset in it where stream
// slot si should get rounded bytes by address affinity, or nil: the block
// must contain [addr, addr+rounded), be usable by si now and be ready
// there. b is the index's choice.
func (p *pool) affine(h *heap, b *block, rounded uint64, si slot) (*block, uint64) {
	e := &p.aff[affIndex(rounded, si)]
	if e.size != rounded || e.si != si || e.hint == nil {
		if affDbg {
			println("aff none", rounded, e.size, e.si, si)
		}
		return nil, 0
	}
	if affDbg {
		println("aff try", rounded, e.addr, b.addr, b.size)
	}
	a := e.addr
	fb := b
	if affMode == 1 || (affMode == 3 && b.size == rounded) {
		if a < b.addr || a+rounded > b.end() {
			return nil, 0
		}
	} else if !(b.addr <= a && a+rounded <= b.end()) {
		fb = e.hint
		seg := fb.seg
		if seg == nil || seg.heap != h || a < seg.base || a+rounded > seg.base+seg.size {
			return nil, 0
		}
		for n := 0; fb != nil && n < affWalk; n++ {
			switch {
			case fb.end() <= a:
				fb = fb.next
			case fb.addr > a:
				fb = fb.prev
			default:
				n = affWalk
			}
		}
		if fb == nil || fb.addr > a || fb.end() < a+rounded || fb.state != blockFree || fb.bin < 0 || !p.usable(fb, si) {
			return nil, 0
		}
	}
	if fb.seg.virtual && p.unmappedIn(fb.seg, a, rounded, 0) > 0 {
		return nil, 0
	}
	return fb, a - fb.addr
}

// Context affinity (mode 4): the place a request got last time, keyed by
// its size and the address the stream's request before it got.
const ctxSlots = 1024

type ctxEntry struct {
	size, ctx, addr uint64
	hint            *block
}

func ctxIndex(size, ctx uint64) int {
	return int(((size>>minShift)*0x9E3779B97F4A7C15 ^ (ctx>>minShift)*0xBF58476D1CE4E5B9) >> (64 - 10))
}

// noteServed records that stream slot si got block b for rounded bytes.
func (p *pool) noteServed(rounded uint64, si slot, b *block) {
	st := &p.streams[si]
	e := &p.ctx[ctxIndex(rounded, st.lastAddr)]
	e.size, e.ctx, e.addr, e.hint = rounded, st.lastAddr, b.addr, b
	st.lastAddr = b.addr
}

// ctxAffine is affine for mode 4.
func (p *pool) ctxAffine(h *heap, b *block, rounded uint64, si slot) (*block, uint64) {
	last := p.streams[si].lastAddr
	e := &p.ctx[ctxIndex(rounded, last)]
	if e.size != rounded || e.ctx != last || e.hint == nil {
		if affDbg {
			println("ctx nokey")
		}
		return nil, 0
	}
	a := e.addr
	fb := b
	if affMode == 5 && (b.size == rounded || !(b.addr <= a && a+rounded <= b.end())) {
		return nil, 0
	}
	if !(b.addr <= a && a+rounded <= b.end()) {
		fb = e.hint
		for n := 0; fb != nil && fb.seg == nil && n < 4; n++ {
			fb = fb.prev // recycled by absorb: forwarded to the block that took it in
		}
		if fb == nil {
			return nil, 0
		}
		seg := fb.seg
		if seg == nil || seg.heap != h || a < seg.base || a+rounded > seg.base+seg.size {
			return nil, 0
		}
		for n := 0; fb != nil && n < affWalk; n++ {
			switch {
			case fb.end() <= a:
				fb = fb.next
			case fb.addr > a:
				fb = fb.prev
			default:
				n = affWalk
			}
		}
		if fb == nil || fb.addr > a || fb.end() < a+rounded || fb.state != blockFree || fb.bin < 0 || !p.usable(fb, si) {
			if affDbg {
				if fb == nil || fb.addr > a || fb.end() <= a {
					println("ctx lost")
				} else {
					println("ctx busy", fb.state, fb.end() < a+rounded)
				}
			}
			return nil, 0
		}
	}
	if fb.seg.virtual && p.unmappedIn(fb.seg, a, rounded, 0) > 0 {
		if affDbg {
			println("ctx unmapped")
		}
		return nil, 0
	}
	if affDbg {
		println("ctx hit", fb == b)
	}
	return fb, a - fb.addr
}
