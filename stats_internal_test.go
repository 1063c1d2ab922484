package gpumem

import (
	"math/rand/v2"
	"testing"

	"github.com/gpumem/gpumem/device/sim"
)

// TestLargestFreeRuns checks largestFree, which visits the free index's
// bins from the largest down and steps over runs of ready chunks a bitmap
// word at a time, against a walk of every chunk of every free block, over
// random allocations and frees (some spans released, so that free blocks
// hold ready and unmapped chunks in turn): requests up to 24 MiB, then up
// to 1 MiB (many small free blocks in many bins).
func TestLargestFreeRuns(t *testing.T) {
	for _, most := range []int{24 << 20, 1 << 20} {
		testLargestFreeRuns(t, most)
	}
}

func testLargestFreeRuns(t *testing.T, most int) {
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
		} else if b, err := a.Alloc(uint64(1+rng.IntN(most)), 0); err == nil {
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
					t.Fatalf("requests up to %d, iter %d: largestFree = %d, a walk of every chunk says %d", most, iter, got, want)
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

// TestSoloPoolPublishing follows the allocator's shared gauges while it
// has one pool (flush publishes Active alone, Allocated and the peaks stay
// with the pool) and after a second stream's pool appears in ModePlain:
// the first pool then publishes what it held back, and Stats, the shared
// gauges and the checker agree throughout.
func TestSoloPoolPublishing(t *testing.T) {
	const mib = 1 << 20
	dev := sim.MustNew(sim.Config{Capacity: 1 << 30})
	a, err := New(dev, Config{Mode: ModePlain})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	var bufs []Buffer
	for range 3 {
		b, err := a.Alloc(8*mib-100, 0) // flushes: past flushBytes
		if err != nil {
			t.Fatal(err)
		}
		bufs = append(bufs, b)
	}
	if err := a.Free(bufs[2]); err != nil {
		t.Fatal(err)
	}
	if a.multi.Load() {
		t.Fatal("a fresh allocator with one pool counts as several")
	}
	st := a.Stats()
	if want := uint64(2 * (8*mib - 100)); st.Allocated != want || st.PeakAllocated != 3*(8*mib-100) {
		t.Fatalf("solo: Allocated %d, PeakAllocated %d; want %d and %d", st.Allocated, st.PeakAllocated, want, 3*(8*mib-100))
	}
	if got := a.allocated.Load(); got != 0 {
		t.Errorf("solo: shared Allocated %d: a solo pool publishes only Active", got)
	}
	if got, want := a.active.Load(), int64(st.Active); got < want-flushBytes || got > want+flushBytes {
		t.Errorf("solo: shared Active %d, more than flushBytes from the exact %d", got, want)
	}
	if err := a.Check(); err != nil {
		t.Fatal(err)
	}

	s1, err := dev.NewStream()
	if err != nil {
		t.Fatal(err)
	}
	b1, err := a.Alloc(mib, s1) // a second pool: the first stops being solo
	if err != nil {
		t.Fatal(err)
	}
	if !a.multi.Load() || len(a.allPools()) != 2 {
		t.Fatalf("two streams in ModePlain: %d pools, several %v", len(a.allPools()), a.multi.Load())
	}
	if got, want := a.allocated.Load(), int64(2*(8*mib-100)); got != want {
		t.Errorf("after the second pool: shared Allocated %d, want the first pool's %d", got, want)
	}
	if got := a.peakAllocated.Load(); got != 3*(8*mib-100) {
		t.Errorf("after the second pool: shared PeakAllocated %d, want the solo peak %d", got, 3*(8*mib-100))
	}
	st = a.Stats()
	if want := uint64(2*(8*mib-100) + mib); st.Allocated != want || st.PeakAllocated != 3*(8*mib-100) {
		t.Fatalf("two pools: Allocated %d, PeakAllocated %d; want %d and %d", st.Allocated, st.PeakAllocated, want, 3*(8*mib-100))
	}
	if err := a.Check(); err != nil {
		t.Fatal(err)
	}
	for _, b := range []Buffer{bufs[0], bufs[1], b1} {
		if err := a.Free(b); err != nil {
			t.Fatal(err)
		}
	}
	a.ResetPeaks()
	if st := a.Stats(); st.Allocated != 0 || st.PeakAllocated != 0 {
		t.Fatalf("all freed, peaks reset: Allocated %d, PeakAllocated %d", st.Allocated, st.PeakAllocated)
	}
	if err := a.Check(); err != nil {
		t.Fatal(err)
	}
}
