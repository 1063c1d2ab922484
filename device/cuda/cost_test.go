package cuda

import (
	"fmt"
	"os"
	"testing"

	"github.com/gpumem/gpumem/device"
)

// BenchmarkDriverCost measures what each driver call the allocator makes
// costs on this GPU, at the sizes it makes them: the figures that decide
// how gpumem batches its work (docs/EXPERIMENTS.md). Run with
// -test.bench DriverCost -test.benchtime 50x.
func BenchmarkDriverCost(b *testing.B) {
	d, err := Open(0)
	if err != nil {
		if os.Getenv("GPUMEM_REQUIRE_GPU") != "" {
			b.Fatalf("Open(0): %v", err)
		}
		b.Skipf("no NVIDIA GPU: %v", err)
	}
	defer d.Close()
	g := d.Granularity()
	for _, size := range []uint64{2 * MiB, 64 * MiB, 1 * GiB} {
		b.Run(fmt.Sprintf("AllocFree/%s", mib(size)), func(b *testing.B) {
			for i := 0; i < b.N; i++ {
				p, err := d.Alloc(size)
				if err != nil {
					b.Fatal(err)
				}
				if err := d.Free(p); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
	for _, size := range []uint64{g, 32 * g, 512 * g} {
		b.Run(fmt.Sprintf("CreateRelease/%s", mib(size)), func(b *testing.B) {
			for i := 0; i < b.N; i++ {
				h, err := d.Create(size)
				if err != nil {
					b.Fatal(err)
				}
				if err := d.Release(h); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
	// Map, SetAccess and Unmap of n chunks, each its own mapping (how
	// gpumem maps), with one SetAccess over the run.
	for _, n := range []uint64{1, 32, 512} {
		b.Run(fmt.Sprintf("MapAccessUnmap/%dchunks", n), func(b *testing.B) {
			base, err := d.Reserve(n*g, 0)
			if err != nil {
				b.Fatal(err)
			}
			defer d.ReleaseAddress(base, n*g)
			hs := make([]device.Handle, n)
			for i := range hs {
				if hs[i], err = d.Create(g); err != nil {
					b.Fatal(err)
				}
			}
			defer func() {
				for _, h := range hs {
					d.Release(h)
				}
			}()
			b.ResetTimer()
			for it := 0; it < b.N; it++ {
				for i, h := range hs {
					if err := d.Map(base+device.Ptr(uint64(i)*g), g, h); err != nil {
						b.Fatal(err)
					}
				}
				if err := d.SetAccess(base, n*g); err != nil {
					b.Fatal(err)
				}
				for i := range hs {
					if err := d.Unmap(base+device.Ptr(uint64(i)*g), g); err != nil {
						b.Fatal(err)
					}
				}
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/float64(n)/1000, "us/chunk")
		})
	}
	// One mapping of a whole multi-chunk handle, for comparison.
	for _, n := range []uint64{32, 512} {
		b.Run(fmt.Sprintf("MapAccessUnmapWhole/%dchunks", n), func(b *testing.B) {
			base, err := d.Reserve(n*g, 0)
			if err != nil {
				b.Fatal(err)
			}
			defer d.ReleaseAddress(base, n*g)
			h, err := d.Create(n * g)
			if err != nil {
				b.Fatal(err)
			}
			defer d.Release(h)
			b.ResetTimer()
			for it := 0; it < b.N; it++ {
				if err := d.Map(base, n*g, h); err != nil {
					b.Fatal(err)
				}
				if err := d.SetAccess(base, n*g); err != nil {
					b.Fatal(err)
				}
				if err := d.Unmap(base, n*g); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
	b.Run("EventRecordQuery", func(b *testing.B) {
		e, err := d.NewEvent()
		if err != nil {
			b.Fatal(err)
		}
		defer d.DestroyEvent(e)
		for i := 0; i < b.N; i++ {
			if err := d.Record(e, 0); err != nil {
				b.Fatal(err)
			}
			if _, err := d.Query(e); err != nil {
				b.Fatal(err)
			}
		}
	})
}

func mib(n uint64) string { return fmt.Sprintf("%dMiB", n>>20) }
