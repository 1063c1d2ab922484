package gpumem

import (
	"strings"
	"testing"

	"github.com/gpumem/gpumem/device/sim"
)

// TestRestWakesWithoutCalls frees everything a first run allocated: the
// spans stay mapped but rest (their chunks not ready), the next run's
// blocks land where the first run's did and wake the spans under them with
// no driver call, and checkPool holds throughout.
func TestRestWakesWithoutCalls(t *testing.T) {
	a, err := New(sim.MustNew(sim.Config{Capacity: 4 << 30}), Config{Mode: ModeVirtual, CheckInvariants: true})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	sizes := []uint64{40 << 20, 3 << 20, 17 << 20, 1 << 20, 64 << 20}
	run := func() []uint64 {
		var addrs []uint64
		var bufs []Buffer
		for _, n := range sizes {
			b, err := a.Alloc(n, 0)
			if err != nil {
				t.Fatal(err)
			}
			addrs, bufs = append(addrs, uint64(b.Ptr())), append(bufs, b)
		}
		if err := a.Free(bufs[1]); err != nil { // a hole the next request may take
			t.Fatal(err)
		}
		b, err := a.Alloc(2<<20, 0)
		if err != nil {
			t.Fatal(err)
		}
		addrs, bufs = append(addrs, uint64(b.Ptr())), append(bufs[:1], append(bufs[2:], b)...)
		for _, b := range bufs {
			if err := a.Free(b); err != nil {
				t.Fatal(err)
			}
		}
		return addrs
	}
	first := run()
	st := a.Stats()
	p := a.allPools()[0]
	if st.Rests != 1 || p.rested == 0 || p.rested != p.empty.n {
		t.Fatalf("after the first run: %d rests, %d spans rested of %d empty; want 1 rest, every empty span", st.Rests, p.rested, p.empty.n)
	}
	for _, seg := range p.heaps[heapLarge].segs {
		if n := seg.ready.count(0, len(seg.chunks)-1); n != 0 {
			t.Fatalf("%d chunks ready with nothing live; want none", n)
		}
		if seg.mapped.count(0, len(seg.chunks)-1) != p.mappedChunks {
			t.Fatalf("the mapped map counts %d chunks, the pool %d", seg.mapped.count(0, len(seg.chunks)-1), p.mappedChunks)
		}
	}
	if st.LargestFree == 0 {
		t.Fatal("LargestFree is 0: rested memory serves with no device call")
	}
	second := run()
	st2 := a.Stats()
	for i := range first {
		if second[i] != first[i] {
			t.Fatalf("request %d of the second run at %#x, the first's at %#x", i, second[i], first[i])
		}
	}
	if c := st2.Creates + st2.Maps + st2.SetAccess + st2.Unmaps - st.Creates - st.Maps - st.SetAccess - st.Unmaps; c != 0 || st2.Woken == 0 {
		t.Fatalf("second run: %d driver calls, %d spans woken; want none, some", c, st2.Woken)
	}
	if st2.Rests != 2 || st2.PeakReserved != st.PeakReserved {
		t.Fatalf("second run: %d rests, peak %d; want 2, the first's %d", st2.Rests, st2.PeakReserved, st.PeakReserved)
	}
}

// TestRestNotWhileLive: a pool with a live block does not rest, nor one
// under Compact (whose placement ignores what is mapped).
func TestRestNotWhileLive(t *testing.T) {
	for _, cfg := range []Config{{Mode: ModeVirtual}, {Mode: ModeVirtual, Compact: true}} {
		a, err := New(sim.MustNew(sim.Config{Capacity: 4 << 30}), cfg)
		if err != nil {
			t.Fatal(err)
		}
		keep, err := a.Alloc(1<<20, 0)
		if err != nil {
			t.Fatal(err)
		}
		b, err := a.Alloc(32<<20, 0)
		if err != nil {
			t.Fatal(err)
		}
		if err := a.Free(b); err != nil {
			t.Fatal(err)
		}
		if n := a.Stats().Rests; n != 0 {
			t.Fatalf("compact %v: %d rests with a block live", cfg.Compact, n)
		}
		if err := a.Free(keep); err != nil {
			t.Fatal(err)
		}
		if n, want := a.Stats().Rests, map[bool]uint64{false: 1, true: 0}[cfg.Compact]; n != want {
			t.Fatalf("compact %v: %d rests with nothing live; want %d", cfg.Compact, n, want)
		}
		a.Close()
	}
}

// TestCheckSeesRestedReady: checkPool fails on a rested span whose chunks
// are shown ready, and on a miscount of rested spans.
func TestCheckSeesRestedReady(t *testing.T) {
	a, err := New(sim.MustNew(sim.Config{Capacity: 1 << 30}), Config{Mode: ModeVirtual})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	b, err := a.Alloc(32<<20, 0)
	if err != nil {
		t.Fatal(err)
	}
	if err := a.Free(b); err != nil {
		t.Fatal(err)
	}
	if err := a.Check(); err != nil {
		t.Fatalf("rested: %v", err)
	}
	p := a.allPools()[0]
	i := p.empty.head
	s := &p.spans[i]
	s.seg.chunks[s.c0].ready = true
	s.seg.ready.set(int(s.c0), int(s.c0)+1, true)
	if err := a.Check(); err == nil || !strings.Contains(err.Error(), "rested true") {
		t.Fatalf("Check with a rested chunk ready: %v", err)
	}
	s.seg.chunks[s.c0].ready = false
	s.seg.ready.set(int(s.c0), int(s.c0)+1, false)
	p.rested++
	if err := a.Check(); err == nil || !strings.Contains(err.Error(), "spans rested") {
		t.Fatalf("Check with the count off: %v", err)
	}
	p.rested--
	if err := a.Check(); err != nil {
		t.Fatal(err)
	}
}
