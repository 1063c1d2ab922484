package sim

import (
	"testing"

	"github.com/gpumem/gpumem/device"
)

// BenchmarkMapUnmap measures one Map+SetAccess+Unmap cycle with 4096 other
// mappings live, so the ordered maps are not trivially small.
func BenchmarkMapUnmap(b *testing.B) {
	const n = 4096
	d := MustNew(Config{Capacity: MaxCapacity})
	r, _ := d.Reserve(2*n*G, 0)
	for i := 0; i < n; i++ {
		h, err := d.Create(G)
		if err != nil {
			b.Fatal(err)
		}
		if err := d.Map(r+device.Ptr(2*i)*G, G, h); err != nil {
			b.Fatal(err)
		}
	}
	h, _ := d.Create(G)
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		p := r + device.Ptr(2*(i%n)+1)*G
		if err := d.Map(p, G, h); err != nil {
			b.Fatal(err)
		}
		if err := d.SetAccess(p, G); err != nil {
			b.Fatal(err)
		}
		if err := d.Unmap(p, G); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkAllocFree measures one Alloc+Free with 4096 other allocations
// live.
func BenchmarkAllocFree(b *testing.B) {
	d := MustNew(Config{Capacity: MaxCapacity})
	for i := 0; i < 4096; i++ {
		if _, err := d.Alloc(uint64(i+1) * 512); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		p, err := d.Alloc(1 << 20)
		if err != nil {
			b.Fatal(err)
		}
		if err := d.Free(p); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkRecordQuery measures the event calls a replay makes per free.
func BenchmarkRecordQuery(b *testing.B) {
	d := MustNew(Config{})
	s, _ := d.NewStream()
	e, _ := d.NewEvent()
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if err := d.Record(e, s); err != nil {
			b.Fatal(err)
		}
		if done, err := d.Query(e); err != nil || !done {
			b.Fatal(done, err)
		}
	}
}

// BenchmarkHeldTouchDrain measures pending work: Touch on a held stream,
// Record, StreamWait, CheckHandoff, Wait.
func BenchmarkHeldTouchDrain(b *testing.B) {
	d := MustNew(Config{})
	s1, _ := d.NewStream()
	s2, _ := d.NewStream()
	e, _ := d.NewEvent()
	p, _ := d.Alloc(G)
	d.Hold(s1)
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		_ = d.Touch(s1, p, G)
		_ = d.Record(e, s1)
		_ = d.StreamWait(s2, e)
		if err := d.CheckHandoff(p, G, s2); err != nil {
			b.Fatal(err)
		}
		_ = d.Wait(e)
	}
}
