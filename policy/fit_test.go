package policy

import (
	"fmt"
	"github.com/gpumem/gpumem/internal/longtest"
	"testing"
)

// TestFitGpumem holds gpumem's fit to within 3% of each shipped trace's peak
// live bytes, and checks what Fit promises: the capacity found fits, so
// does every granule of the window above it, and the bisection's least
// capacity fits where one granule less does not. gpt2_generate is the
// tightest: +2.27% (928 MiB of 907.4 live) since the arena spans twice the
// device (vm.go, arenaDevices); +3.37% before, when its arena ran out of
// address space at the live peak.
func TestFitGpumem(t *testing.T) {
	longtest.Skip(t, "a bisection of every shipped trace")
	if testing.Short() {
		t.Skip("bisects every shipped trace")
	}
	for _, tr := range shipped(t) {
		f, err := Fit(tr, "gpumem", 1, nil)
		if err != nil {
			t.Fatalf("%s: %v", tr.Name, err)
		}
		over := float64(f.Capacity)/float64(tr.PeakLiveBytes) - 1
		t.Logf("%-22s fits %d bytes (least found %d), %+.2f%% over peak live, %d replays", tr.Name, f.Capacity, f.Least, 100*over, f.Replays)
		if f.Least > f.Capacity {
			t.Errorf("%s: least %d above the capacity %d", tr.Name, f.Least, f.Capacity)
		}
		if ok, _ := Fits(tr, "gpumem", f.Least-FitGranularity, 1); ok && f.Least-FitGranularity >= tr.PeakLiveBytes {
			t.Errorf("%s: fits on %d bytes too: the bisection did not stop at a boundary", tr.Name, f.Least-FitGranularity)
		}
		if over < 0 || over > 0.03 {
			t.Errorf("%s: gpumem fits on %d bytes, %+.2f%% from the peak live %d; want within 3%%", tr.Name, f.Capacity, 100*over, tr.PeakLiveBytes)
		}
		if tr.Name == "gpt2_generate" {
			// The default placement's layout drifted over passes here
			// (docs/EXPERIMENTS.md, "Ten passes: where the drift comes
			// from"): three passes failed on the capacity one fits in.
			// Tightening past half the device (pressure.go) places as
			// compact placement does at the pressure point, which repeats
			// its first pass: three fit there now.
			if ok, err := Fits(tr, "gpumem", f.Capacity, 3); !ok || err != nil {
				t.Errorf("gpumem: three passes do not fit on the one-pass capacity %d (%v): the drift is back at the pressure point", f.Capacity, err)
			}
		}
	}
}

func TestFitEmulations(t *testing.T) {
	// tiny trace: 14 MiB live at the peak.
	tr := mustTrace(t, "a 0 1048576 0 0\na 1 4194304 0 10\na 2 3000000 0 20\nf 1 30\na 3 4194304 0 40\nf 0 50\nf 2 60\na 4 10485760 0 70\n")
	for _, n := range Names() {
		calls, last, lastTotal := 0, 0, 0
		f, err := Fit(tr, n, 1, func(done, total int) {
			if done < last || total < done {
				t.Errorf("%s: progress %d of %d after %d", n, done, total, last)
			}
			calls, last, lastTotal = calls+1, done, total
		})
		if err != nil {
			t.Fatalf("%s: %v", n, err)
		}
		c := f.Capacity
		if ok, _ := Fits(tr, n, c, 1); !ok || c < tr.PeakLiveBytes || c%FitGranularity != 0 {
			t.Errorf("%s: fit %d does not fit, or is below the peak live %d, or not a multiple of 2 MiB", n, c, tr.PeakLiveBytes)
		}
		if ok, _ := Fits(tr, n, f.Least-FitGranularity, 1); ok {
			t.Errorf("%s: fits on %d too", n, f.Least-FitGranularity)
		}
		// Once per replay of the bisection, per batch of the window's, and
		// once at the end with the whole count.
		if calls < 2 || calls > f.Replays+1 || last != f.Replays || lastTotal != f.Replays {
			t.Errorf("%s: progress reported %d times, last %d of %d, for %d replays", n, calls, last, lastTotal, f.Replays)
		}
		t.Logf("%s: %d MiB (least %d MiB)", n, c>>20, f.Least>>20)
	}
	// torch-native holds 22 MiB at its peak (the CLI's test works it out);
	// tf-bfc-prealloc needs a device whose 75% holds its pool.
	if f, _ := Fit(tr, "torch-native", 1, nil); f.Capacity != 22<<20 || f.Least != 22<<20 {
		t.Errorf("torch-native fits %+v, want 22 MiB", f)
	}
}

// banded is torch-native made non-monotone on purpose: it refuses every
// request on a device of capacity in [lo, hi).
type banded struct {
	Allocator
	refuse bool
}

func (b *banded) Alloc(size, stream uint64) (uint64, error) {
	if b.refuse {
		return 0, fmt.Errorf("%w: banded: refused", ErrOutOfMemory)
	}
	return b.Allocator.Alloc(size, stream)
}

// withPolicy registers a policy for the length of a test.
func withPolicy(t *testing.T, name string, mk func(capacity uint64) (Allocator, error)) {
	saved := policies
	policies = append(policies[:len(policies):len(policies)], struct {
		name string
		new  func(capacity uint64) (Allocator, error)
	}{name, mk})
	t.Cleanup(func() { policies = saved })
}

// TestFitNotMonotone: a policy that fits on 22-28 MiB, fails on 30 and
// 32 MiB and fits from 34 MiB up. Bisection from the doubling (14 MiB
// fails, 28 fits) lands on 22 MiB; the answer is 34 MiB, the least above
// which every capacity of the window fits.
// The window's replays run fitWorkers at a time: with one, two, three or
// eight the answer and the replays are the same.
func TestFitNotMonotone(t *testing.T) {
	withPolicy(t, "banded", func(c uint64) (Allocator, error) {
		return &banded{Allocator: newTorchNative(c), refuse: c >= 30<<20 && c < 34<<20}, nil
	})
	tr := mustTrace(t, "a 0 1048576 0 0\na 1 4194304 0 10\na 2 3000000 0 20\nf 1 30\na 3 4194304 0 40\nf 0 50\nf 2 60\na 4 10485760 0 70\n")
	saved := fitWorkers
	t.Cleanup(func() { fitWorkers = saved })
	for _, w := range []int{1, 2, 3, 8} {
		fitWorkers = w
		f, err := Fit(tr, "banded", 1, nil)
		if err != nil {
			t.Fatal(err)
		}
		if f.Least != 22<<20 || f.Capacity != 34<<20 || f.Replays != 2+3+(50-22)/2 {
			t.Fatalf("%d at a time: fit %d MiB, least %d MiB, %d replays; want 34, 22, %d", w, f.Capacity>>20, f.Least>>20, f.Replays, 2+3+(50-22)/2)
		}
	}
	f, err := Fit(tr, "banded", 1, nil)
	if err != nil {
		t.Fatal(err)
	}
	if f.Least != 22<<20 || f.Capacity != 34<<20 {
		t.Fatalf("fit %d MiB, least %d MiB; want 34 and 22", f.Capacity>>20, f.Least>>20)
	}
	for c := f.Capacity; c <= f.Capacity+FitWindow(f.Capacity); c += FitGranularity {
		if ok, _ := Fits(tr, "banded", c, 1); !ok {
			t.Errorf("does not fit on %d MiB, in the window above the answer", c>>20)
		}
	}
	if ok, _ := Fits(tr, "banded", f.Capacity-FitGranularity, 1); ok {
		t.Errorf("fits on %d MiB: the answer is not the least", (f.Capacity-FitGranularity)>>20)
	}
	// Doubling (14, 28), bisection (20, 24, 22), then the scan from 24 MiB
	// to 34+16 MiB: the failures at 30 and 32 moved the window up.
	if want := 2 + 3 + (50-22)/2; f.Replays != want {
		t.Errorf("%d replays, want %d", f.Replays, want)
	}
}

// TestFitsPasses: with several passes a trace fits only if every pass does,
// and what the trace never frees stays live, allocated once. The trace keeps
// 4 MiB live to its end and peaks at 14 MiB. gpumem (either placement)
// fits three passes on 16 MiB (had pass 2 allocated the 4 MiB again beside
// pass 1's, it would need 18), and on 12 MiB the 10 MiB request fails once
// in each pass. Every
// policy fits three passes of this trace where it fits one (no layout to
// drift in three requests).
func TestFitsPasses(t *testing.T) {
	tr := mustTrace(t, "a 0 4194304 0 0\na 1 10485760 0 10\nf 1 20\n")
	for _, n := range []string{"gpumem", "gpumem-compact"} {
		if ok, err := Fits(tr, n, 16<<20, 3); !ok || err != nil {
			t.Errorf("%s: 3 passes on 16 MiB: fits %v, %v; want fits (the leftover freed between passes)", n, ok, err)
		}
		r, err := Repeat(tr, n, 12<<20, 3)
		if r.oomsFirst != 1 || r.OOMsLater != 2 || err != nil {
			t.Errorf("%s: 3 passes on 12 MiB: %d OOMs in the first pass and %d later, %v; want one a pass", n, r.oomsFirst, r.OOMsLater, err)
		}
		if ok, _ := Fits(tr, n, 12<<20, 3); ok {
			t.Errorf("%s: 3 passes fit on 12 MiB", n)
		}
	}
	for _, n := range Names() {
		f, err := Fit(tr, n, 1, nil)
		if err != nil {
			t.Fatalf("%s: %v", n, err)
		}
		if ok, err := Fits(tr, n, f.Capacity, 3); !ok || err != nil {
			t.Errorf("%s: 3 passes do not fit on %d, where one does: %v", n, f.Capacity, err)
		}
	}
}
