package cuda

import (
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gpumem/gpumem/device"
)

// openForTiming opens the GPU for a driver measurement, which runs only with
// GPUMEM_DRIVER_PHASES=1 (it checks nothing; scripts/gpu.sh sets it).
func openForTiming(t *testing.T) *Device {
	t.Helper()
	if os.Getenv("GPUMEM_DRIVER_PHASES") == "" {
		t.Skip("set GPUMEM_DRIVER_PHASES=1 to time the driver's calls")
	}
	return openGPU(t)
}

// TestDriverPhases times each virtual-memory call on its own, at the sizes
// and in the patterns gpumem uses, and prints one line per measurement. It
// is a measurement, not a check: it runs only with GPUMEM_DRIVER_PHASES=1.
func TestDriverPhases(t *testing.T) {
	d := openForTiming(t)
	g := d.Granularity()
	const reps = 5
	report := func(what string, n int, took time.Duration) {
		t.Logf("%-52s %10.1f us/call", what, float64(took.Microseconds())/float64(n))
	}
	rawMap := func(p device.Ptr, size uint64, h device.Handle, off uint64) {
		if r := d.call(d.drv.cuMemMap, uintptr(p), uintptr(size), uintptr(off), uintptr(h), 0); r != cudaSuccess {
			t.Fatal(d.fail("cuMemMap", r, "off=%d", off))
		}
	}
	rawUnmap := func(p device.Ptr, size uint64) {
		if r := d.call(d.drv.cuMemUnmap, uintptr(p), uintptr(size)); r != cudaSuccess {
			t.Fatal(d.fail("cuMemUnmap", r, ""))
		}
	}
	for _, size := range []uint64{g, 16 * g, 128 * g, 512 * g} {
		var c, r time.Duration
		for i := 0; i < reps; i++ {
			t0 := time.Now()
			h, err := d.Create(size)
			if err != nil {
				t.Fatal(err)
			}
			c += time.Since(t0)
			t0 = time.Now()
			d.Release(h)
			r += time.Since(t0)
		}
		report(fmt.Sprintf("Create %d MiB", size>>20), reps, c)
		report(fmt.Sprintf("Release %d MiB", size>>20), reps, r)
	}
	// Mapping a piece of a larger handle (offset, or size below the
	// handle's) is refused by the driver: on an H100 with driver 580,
	// cuMemMap of 2 MiB at offset 0 of a 32 MiB handle returns
	// CUDA_ERROR_NOT_SUPPORTED. A mapping is always a whole handle, so the
	// unit of remapping is the unit of creation.
	func() {
		base, _ := d.Reserve(16*g, 0)
		defer d.ReleaseAddress(base, 16*g)
		big, _ := d.Create(16 * g)
		defer d.Release(big)
		r := d.call(d.drv.cuMemMap, uintptr(base), uintptr(g), 0, uintptr(big), 0)
		t.Logf("map 2 MiB piece of a 32 MiB handle: %v", d.fail("cuMemMap", r, "piece"))
	}()
	for _, n := range []uint64{1, 16, 128} {
		base, err := d.Reserve(n*g, 0)
		if err != nil {
			t.Fatal(err)
		}
		// n separate 1-chunk handles mapped side by side.
		hs := make([]device.Handle, n)
		for i := range hs {
			if hs[i], err = d.Create(g); err != nil {
				t.Fatal(err)
			}
		}
		var m, a, u, u1 time.Duration
		for rep := 0; rep < reps; rep++ {
			t0 := time.Now()
			for i, h := range hs {
				rawMap(base+device.Ptr(uint64(i)*g), g, h, 0)
			}
			m += time.Since(t0)
			t0 = time.Now()
			if err := d.SetAccess(base, n*g); err != nil {
				t.Fatal(err)
			}
			a += time.Since(t0)
			t0 = time.Now()
			if rep%2 == 0 {
				for i := uint64(0); i < n; i++ {
					rawUnmap(base+device.Ptr(i*g), g)
				}
				u += time.Since(t0)
			} else {
				rawUnmap(base, n*g) // one call over the run of mappings
				u1 += time.Since(t0)
			}
		}
		for _, h := range hs {
			d.Release(h)
		}
		report(fmt.Sprintf("Map 1-chunk handle, %d side by side, per call", n), reps*int(n), m)
		report(fmt.Sprintf("SetAccess over %d 1-chunk mappings, per call", n), reps, a)
		report(fmt.Sprintf("Unmap each of %d 1-chunk mappings, per call", n), (reps+1)/2*int(n), u)
		report(fmt.Sprintf("Unmap a run of %d mappings in one call, per call", n), reps/2, u1)
		big, err := d.Create(n * g)
		if err != nil {
			t.Fatal(err)
		}
		var wm, wa, wu time.Duration
		for rep := 0; rep < reps; rep++ {
			t0 := time.Now()
			rawMap(base, n*g, big, 0)
			wm += time.Since(t0)
			t0 = time.Now()
			d.SetAccess(base, n*g)
			wa += time.Since(t0)
			t0 = time.Now()
			rawUnmap(base, n*g)
			wu += time.Since(t0)
		}
		report(fmt.Sprintf("Map whole %d-chunk handle, per call", n), reps, wm)
		report(fmt.Sprintf("SetAccess whole %d-chunk mapping, per call", n), reps, wa)
		report(fmt.Sprintf("Unmap whole %d-chunk mapping, per call", n), reps, wu)
		d.Release(big)
		d.ReleaseAddress(base, n*g)
	}
	e, _ := d.NewEvent()
	t0 := time.Now()
	for i := 0; i < 100; i++ {
		d.Record(e, 0)
		d.Wait(e)
	}
	report("Record + Wait (idle stream)", 100, time.Since(t0))
	d.DestroyEvent(e)
}

// TestDriverParallel times the growth step (Create, Map, SetAccess of one
// span) and the release step (Unmap, Release) of many spans done by 1 to
// 16 threads at once, whole and phase by phase: whether the driver lets
// independent virtual-memory calls run side by side decides whether a
// many-span growth can be spread over threads. A measurement: it runs only
// with GPUMEM_DRIVER_PHASES=1.
func TestDriverParallel(t *testing.T) {
	d := openForTiming(t)
	g := d.Granularity()
	const n = 128
	for _, spanChunks := range []uint64{1, 8} {
		size := spanChunks * g
		base, err := d.Reserve(n*size, 0)
		if err != nil {
			t.Fatal(err)
		}
		hs := make([]device.Handle, n)
		each := func(threads int, f func(i int) error) time.Duration {
			var next atomic.Int64
			var wg sync.WaitGroup
			errs := make(chan error, threads)
			t0 := time.Now()
			for w := 0; w < threads; w++ {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for {
						i := int(next.Add(1) - 1)
						if i >= n {
							return
						}
						if err := f(i); err != nil {
							errs <- err
							return
						}
					}
				}()
			}
			wg.Wait()
			took := time.Since(t0)
			select {
			case err := <-errs:
				t.Fatal(err)
			default:
			}
			return took
		}
		at := func(i int) device.Ptr { return base + device.Ptr(uint64(i)*size) }
		grow := func(i int) error {
			h, err := d.Create(size)
			if err != nil {
				return err
			}
			hs[i] = h
			if err := d.Map(at(i), size, h); err != nil {
				return err
			}
			return d.SetAccess(at(i), size)
		}
		shrink := func(i int) error {
			if err := d.Unmap(at(i), size); err != nil {
				return err
			}
			return d.Release(hs[i])
		}
		per := func(took time.Duration) float64 { return float64(took.Nanoseconds()) / 1e3 / n }
		for _, threads := range []int{1, 2, 4, 8, 16} {
			g1 := each(threads, grow)
			s1 := each(threads, shrink)
			// Phase by phase: creates, then maps, then grants, then
			// unmaps, then releases, each phase spread over the threads.
			c := each(threads, func(i int) (err error) { hs[i], err = d.Create(size); return })
			m := each(threads, func(i int) error { return d.Map(at(i), size, hs[i]) })
			a := each(threads, func(i int) error { return d.SetAccess(at(i), size) })
			u := each(threads, func(i int) error { return d.Unmap(at(i), size) })
			r := each(threads, func(i int) error { return d.Release(hs[i]) })
			t.Logf("%2d MiB spans, %2d threads: grow %6.1f  shrink %6.1f | create %6.1f map %5.1f access %6.1f unmap %6.1f release %6.1f us/span (wall/%d)",
				size>>20, threads, per(g1), per(s1), per(c), per(m), per(a), per(u), per(r), n)
		}
		if err := d.ReleaseAddress(base, n*size); err != nil {
			t.Fatal(err)
		}
	}
}
