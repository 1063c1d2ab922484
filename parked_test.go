package gpumem

import (
	"errors"
	"testing"

	"github.com/gpumem/gpumem/device/sim"
)

// TestAllocParked: a caller that parks buffers (the C library's front
// cache) keeps the program's peaks, gets ErrParked where the parked
// buffers must come back first, and its reuses count as allocations and
// frees.
func TestAllocParked(t *testing.T) {
	for _, mode := range []Mode{ModeVirtual, ModePlain} {
		dev, err := sim.New(sim.Config{Capacity: 4 << 30})
		if err != nil {
			t.Fatal(err)
		}
		a, err := New(dev, Config{Mode: mode})
		if err != nil {
			t.Fatal(err)
		}
		// Warm: 8 MiB allocated and freed, so that what follows is served
		// by the fast path.
		w, err := a.Alloc(8<<20, 0)
		if err != nil {
			t.Fatal(err)
		}
		if err := a.Free(w); err != nil {
			t.Fatal(err)
		}
		a.ResetPeaks()
		x, _, err := a.AllocParked(1<<20, 0, Parked{})
		if err != nil {
			t.Fatal(err)
		}
		// x is freed by the program but parked by the caller: live here.
		parked := Parked{Active: x.Block(), Allocated: x.Size()}
		y, g, err := a.AllocParked(1<<20, 0, parked)
		if err != nil {
			t.Fatalf("%v: %v", mode, err)
		}
		if g.Active != 2<<20 || g.PeakActive != 1<<20 || g.PeakAllocated != 1<<20 {
			t.Errorf("%v: gauges %+v: want Active 2 MiB (the parked buffer counted), peaks 1 MiB (the program's)", mode, g)
		}
		// A shortage with buffers parked: ErrParked, nothing allocated, no
		// retry or out-of-memory counted.
		before := a.Stats()
		if _, _, err := a.AllocParked(5<<30, 0, parked); !errors.Is(err, ErrParked) {
			t.Errorf("%v: a request past the device with buffers parked: %v, want ErrParked", mode, err)
		}
		if s := a.Stats(); s.Allocs != before.Allocs || s.Reserved != before.Reserved || s.OOMs != 0 || s.Retries != 0 {
			t.Errorf("%v: ErrParked allocated or counted (%d -> %d allocs, %d -> %d reserved, %d OOMs, %d retries)",
				mode, before.Allocs, s.Allocs, before.Reserved, s.Reserved, s.OOMs, s.Retries)
		}
		// A new stream in ModePlain would add a second pool.
		v, _, err := a.AllocParked(4096, 5, parked)
		if mode == ModePlain && !errors.Is(err, ErrParked) {
			t.Errorf("plain: a new stream with buffers parked: %v, want ErrParked", err)
		}
		want := uint64(1 << 20) // the program's peak: y, and v while it lived
		if err == nil {
			want += v.Block()
			if err := a.Free(v); err != nil {
				t.Fatal(err)
			}
		}
		before = a.Stats()
		// The caller reuses x once and then frees it: counted as a free and
		// an allocation.
		a.Reused(0, 1, x.Block(), x.Size())
		if s := a.Stats(); s.Reused != 1 || s.Allocs != before.Allocs+1 || s.Frees != before.Frees+1 ||
			s.AllocBytes-s.FreeBytes != s.Active {
			t.Errorf("%v: after Reused: %+v", mode, s)
		}
		// The caller frees x here at last (its drain): the peaks read are
		// the program's, though x was live here all along.
		if err := a.Free(x); err != nil {
			t.Fatal(err)
		}
		if s := a.Stats(); s.PeakActive != want || s.PeakAllocated != want {
			t.Errorf("%v: peaks %d, %d: want %d", mode, s.PeakActive, s.PeakAllocated, want)
		}
		if err := a.Free(y); err != nil {
			t.Fatal(err)
		}
		z, err := a.Alloc(4096, 5) // nothing parked: a second stream
		if err != nil {
			t.Fatal(err)
		}
		if err := a.Free(z); err != nil {
			t.Fatal(err)
		}
		if a.Lone() != (mode == ModeVirtual) {
			t.Errorf("%v: Lone() %v with two streams", mode, a.Lone())
		}
		if _, _, err := a.AllocParked(4096, 0, Parked{Active: 512, Allocated: 512}); mode == ModePlain && !errors.Is(err, ErrParked) {
			t.Errorf("plain: two pools, buffers parked: %v, want ErrParked", err)
		}
		a.Close()
	}
}
