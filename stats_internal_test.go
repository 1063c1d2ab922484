package gpumem

import (
	"math/rand/v2"
	"testing"

	"github.com/gpumem/gpumem/device/sim"
)

// TestLargestFreeRuns checks largestFree, which steps over runs of ready
// chunks a bitmap word at a time, against a walk of every chunk, over
// random allocations and frees (some spans released, so that free blocks
// hold ready and unmapped chunks in turn).
func TestLargestFreeRuns(t *testing.T) {
	dev, err := sim.New(sim.Config{Capacity: 4 << 30})
	if err != nil {
		t.Fatal(err)
	}
	a, err := New(dev, Config{Mode: ModeVirtual})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	rng := rand.New(rand.NewPCG(3, 4))
	var live []Buffer
	checked := 0
	for iter := range 3000 {
		if len(live) > 0 && rng.IntN(5) < 2 {
			k := rng.IntN(len(live))
			if err := a.Free(live[k]); err != nil {
				t.Fatal(err)
			}
			live[k] = live[len(live)-1]
			live = live[:len(live)-1]
		} else if b, err := a.Alloc(uint64(1+rng.IntN(24<<20)), 0); err == nil {
			live = append(live, b)
		}
		if iter%97 == 0 {
			a.Trim() // empty spans go back: free blocks over unmapped chunks
		}
		if iter%10 != 0 {
			continue
		}
		for _, p := range a.allPools() {
			p.mu.Lock()
			for k := range p.heaps {
				h := &p.heaps[k]
				if got, want := h.largestFree(), largestFreeByChunk(h); got != want {
					p.mu.Unlock()
					t.Fatalf("iter %d: largestFree = %d, a walk of every chunk says %d", iter, got, want)
				}
				checked++
			}
			p.mu.Unlock()
		}
	}
	if checked == 0 {
		t.Fatal("no heap checked")
	}
}

// largestFreeByChunk is largestFree's definition, chunk by chunk.
func largestFreeByChunk(h *heap) uint64 {
	var best uint64
	gran := h.pool.a.gran
	for _, seg := range h.segs {
		if !seg.virtual {
			continue
		}
		for b := seg.first; b != nil; b = b.next {
			if b.state != blockFree {
				continue
			}
			c0, c1 := seg.chunkSpan(b.addr, b.size, gran)
			var run uint64
			for i := c0; i <= c1; i++ {
				if !seg.chunks[i].ready {
					run = 0
					continue
				}
				lo, hi := max(seg.chunkAddr(i, gran), b.addr), min(seg.chunkAddr(i, gran)+gran, b.end())
				run += hi - lo
				best = max(best, run)
			}
		}
	}
	if l := h.free.largest(); l > best && !h.anyVirtual() {
		best = l
	}
	return best
}
