package gpumem

import (
	"math/rand/v2"
	"testing"
)

// TestReadyMapOps checks every readyMap operation against a plain []bool
// over random ranges, across word boundaries.
func TestReadyMapOps(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	const n = 300
	r, want := newReadyMap(n), make([]bool, n)
	for iter := range 20000 {
		c0 := rng.IntN(n)
		c1 := c0 + rng.IntN(n-c0)
		switch rng.IntN(4) {
		case 0, 1:
			on := rng.IntN(2) == 0
			r.set(c0, c1+1, on)
			for i := c0; i <= c1; i++ {
				want[i] = on
			}
		case 2:
			cnt, first := 0, -1
			for i := c0; i <= c1; i++ {
				if want[i] {
					cnt++
					if first < 0 {
						first = i
					}
				}
			}
			if got := r.count(c0, c1); got != cnt {
				t.Fatalf("iter %d: count(%d, %d) = %d, want %d", iter, c0, c1, got, cnt)
			}
			if got := r.nextReady(c0, c1); got != first {
				t.Fatalf("iter %d: nextReady(%d, %d) = %d, want %d", iter, c0, c1, got, first)
			}
		case 3:
			var off []int
			for i := c0; i <= c1; i++ {
				if !want[i] {
					off = append(off, i)
				}
			}
			firstOff := -1
			if len(off) > 0 {
				firstOff = off[0]
			}
			if got := r.nextNotReady(c0, c1); got != firstOff {
				t.Fatalf("iter %d: nextNotReady(%d, %d) = %d, want %d", iter, c0, c1, got, firstOff)
			}
			for k := 1; k <= len(off); k += 1 + rng.IntN(4) {
				if got := r.kthNotReady(c0, c1, k); got != off[k-1] {
					t.Fatalf("iter %d: kthNotReady(%d, %d, %d) = %d, want %d", iter, c0, c1, k, got, off[k-1])
				}
			}
		}
		for i := range n {
			if r.get(i) != want[i] {
				t.Fatalf("iter %d: bit %d = %v, want %v", iter, i, r.get(i), want[i])
			}
		}
	}
	if got := r.nextReady(5, 4); got != -1 {
		t.Fatalf("nextReady over an empty range = %d, want -1", got)
	}
}

// placementByChunk is placement as it was before the ready map (at
// 1c99aba): every window stepped one chunk at a time over chunk.ready.
func placementByChunk(seg *segment, g uint64, b *block, rounded uint64, limit int) (off uint64, missing int) {
	unmapped := func(addr, size uint64, limit int) int {
		c0, c1 := seg.chunkSpan(addr, size, g)
		n := 0
		for i := c0; i <= c1 && n <= limit; i++ {
			if !seg.chunks[i].ready {
				n++
			}
		}
		return n
	}
	missing = unmapped(b.addr, rounded, limit)
	if missing == 0 || b.size == rounded {
		return 0, missing
	}
	if lo, _ := seg.chunkSpan(b.end()-rounded, rounded, g); lo > int(seg.hiSpan) {
	} else if m := unmapped(b.end()-rounded, rounded, missing-1); m < missing {
		off, missing = b.size-rounded, m
		if m == 0 {
			return off, 0
		}
	}
	notReady := func(i int) int {
		if seg.chunks[i].ready {
			return 0
		}
		return 1
	}
	s0 := (b.addr-seg.base+g-1)/g*g + seg.base
	if s0+rounded <= b.end() {
		lo, hi := seg.chunkSpan(s0, rounded, g)
		m := 0
		for i := lo; i <= hi; i++ {
			m += notReady(i)
		}
		for n := 0; ; n++ {
			if m < missing {
				off, missing = s0-b.addr, m
				if m == 0 {
					return off, 0
				}
			}
			if s0+g+rounded > b.end() || n == maxSlide || lo+1 > int(seg.hiSpan) {
				break
			}
			m += notReady(hi+1) - notReady(lo)
			lo, hi, s0 = lo+1, hi+1, s0+g
		}
	}
	return off, missing
}

// TestPlacementSkipsExactly checks that placement, which skips windows
// that cannot beat the best so far, chooses the same place and count as
// stepping one chunk at a time, over random readiness (runs of ready
// chunks, as spans leave them, and scattered ones), blocks, requests,
// limits and hiSpan.
func TestPlacementSkipsExactly(t *testing.T) {
	const g, n = 2 << 20, 600
	rng := rand.New(rand.NewPCG(3, 4))
	p := &pool{a: &Allocator{gran: g}}
	for iter := range 20000 {
		seg := &segment{base: 1 << 40, size: n * g, virtual: true, chunks: make([]chunk, n), ready: newReadyMap(n)}
		density := rng.Float64()
		for i := 0; i < n; {
			run := 1 + rng.IntN(1+rng.IntN(40))
			on := rng.Float64() < density
			for j := i; j < min(i+run, n); j++ {
				seg.chunks[j].ready = on
			}
			seg.ready.set(i, min(i+run, n), on)
			i += run
		}
		seg.hiSpan = int32(rng.IntN(n+1) - 1)
		addr := seg.base + uint64(rng.IntN(n/2))*g + uint64(rng.IntN(4))*minBlock*uint64(rng.IntN(1000))
		size := (1 + uint64(rng.IntN(int(seg.base+seg.size-addr)/minBlock))) * minBlock
		b := &block{seg: seg, addr: addr, size: size}
		rounded := (1 + uint64(rng.IntN(int(min(size, 64*g)/minBlock)))) * minBlock
		if rng.IntN(4) == 0 {
			rounded = size
		}
		limit := 1 << 30
		if rng.IntN(2) == 0 {
			limit = rng.IntN(8)
		}
		wantOff, wantMissing := placementByChunk(seg, g, b, rounded, limit)
		off, missing := p.placement(b, rounded, limit)
		if off != wantOff || missing != wantMissing {
			t.Fatalf("iter %d: block [0x%x, +0x%x), %d bytes, limit %d, hiSpan %d: placement = (0x%x, %d), stepping chunk by chunk = (0x%x, %d)",
				iter, b.addr, b.size, rounded, limit, seg.hiSpan, off, missing, wantOff, wantMissing)
		}
	}
}
