package sim

import (
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"

	"github.com/gpumem/gpumem/device"
	"github.com/gpumem/gpumem/internal/faults"
)

const (
	G   = 2 << 20
	GiB = 1 << 30
)

func newDev(t testing.TB, cfg Config) *Device {
	t.Helper()
	d, err := New(cfg)
	if err != nil {
		t.Fatalf("New(%+v): %v", cfg, err)
	}
	return d
}

// wantErr checks that err is an *device.OpError for op, matches kind with
// errors.Is, and mentions every one of subs.
func wantErr(t testing.TB, err error, op string, kind error, subs ...string) {
	t.Helper()
	if err == nil {
		t.Fatalf("%s: got nil error, want %v", op, kind)
	}
	var oe *device.OpError
	if !errors.As(err, &oe) {
		t.Fatalf("%s: error %q (%T) is not an *device.OpError", op, err, err)
	}
	if oe.Op != op {
		t.Errorf("error %q: Op = %q, want %q", err, oe.Op, op)
	}
	if !errors.Is(err, kind) {
		t.Errorf("error %q does not match %v", err, kind)
	}
	for _, s := range subs {
		if !strings.Contains(err.Error(), s) {
			t.Errorf("error %q does not mention %q", err, s)
		}
	}
}

func must(t testing.TB, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func must1[T any](t testing.TB) func(T, error) T {
	return func(v T, err error) T {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
}

func TestNewDefaultsAndValidation(t *testing.T) {
	d := newDev(t, Config{})
	if got := d.Info(); got != (device.Info{Name: "sim", Ordinal: 0, Total: 80 << 30}) {
		t.Errorf("Info() = %+v", got)
	}
	if d.Granularity() != 2<<20 {
		t.Errorf("Granularity() = %d", d.Granularity())
	}
	free, total, err := d.MemInfo()
	if err != nil || free != 80<<30 || total != 80<<30 {
		t.Errorf("MemInfo() = %d, %d, %v", free, total, err)
	}
	if _, err := New(Config{Capacity: MaxCapacity}); err != nil {
		t.Errorf("New at MaxCapacity: %v", err)
	}
	d2 := newDev(t, Config{Capacity: 1 << 30, Granularity: 4096, Name: "small"})
	if got := d2.Info(); got.Name != "small" || got.Total != 1<<30 {
		t.Errorf("Info() = %+v", got)
	}
	for _, cfg := range []Config{
		{Granularity: 4095},
		{Granularity: 2048},
		{Granularity: 3 << 20},
		{Capacity: 1 << 20},             // smaller than one 2 MiB granule
		{Capacity: MaxCapacity + 1<<21}, // more than a simulated device models
	} {
		if _, err := New(cfg); err == nil {
			t.Errorf("New(%+v) succeeded", cfg)
		}
	}
	defer func() {
		if recover() == nil {
			t.Error("MustNew of a bad config did not panic")
		}
	}()
	MustNew(Config{Granularity: 1000})
}

func TestAllocFree(t *testing.T) {
	d := newDev(t, Config{Capacity: 10 * G})
	p1 := must1[device.Ptr](t)(d.Alloc(1))
	p2 := must1[device.Ptr](t)(d.Alloc(G + 1))
	if p1 == 0 || p2 == 0 || p1 == p2 {
		t.Fatalf("addresses %#x %#x", p1, p2)
	}
	if p1%512 != 0 || p2%G != 0 || p1%G != 0 {
		t.Errorf("misaligned: %#x %#x", p1, p2)
	}
	st := d.Stats()
	if st.Used != 3*G || st.Allocs != 2 || st.LiveAllocs != 2 {
		t.Errorf("stats after allocs: %+v", st)
	}
	free, _, _ := d.MemInfo()
	if free != 7*G {
		t.Errorf("free = %d, want %d", free, 7*G)
	}
	if !d.Accessible(p1, 1) || d.Accessible(p1, 2) || !d.Accessible(p2+G, 1) || d.Accessible(p2, G+2) {
		t.Error("Accessible does not follow the requested sizes")
	}
	must(t, d.Free(p1))
	if d.Accessible(p1, 1) {
		t.Error("freed memory still accessible")
	}
	wantErr(t, d.Free(p1), "sim.Free", device.ErrInvalid, "no live allocation", "already freed")
	wantErr(t, d.Free(0), "sim.Free", device.ErrInvalid, "no live allocation")
	wantErr(t, d.Free(p2+512), "sim.Free", device.ErrInvalid, "inside the allocation", "not its start")
	wantErr(t, d.Free(device.Ptr(vaBase)), "sim.Free", device.ErrInvalid, "virtual-memory address")
	_, err := d.Alloc(0)
	wantErr(t, err, "sim.Alloc", device.ErrInvalid, "size is 0")
	must(t, d.Free(p2))
	st = d.Stats()
	if st.Used != 0 || st.PeakUsed != 3*G || st.Frees != 2 || st.LiveAllocs != 0 {
		t.Errorf("stats after frees: %+v", st)
	}
	// Never reused.
	p3 := must1[device.Ptr](t)(d.Alloc(1))
	if p3 == p1 || p3 == p2 {
		t.Errorf("address %#x reused", p3)
	}
	d.ResetPeak()
	if st := d.Stats(); st.PeakUsed != G {
		t.Errorf("PeakUsed after ResetPeak = %d, want %d", st.PeakUsed, G)
	}
	must(t, d.Synchronize())
}

func TestOOMAndShrink(t *testing.T) {
	d := newDev(t, Config{Capacity: 8 * G})
	a := must1[device.Ptr](t)(d.Alloc(3 * G))
	h := must1[device.Handle](t)(d.Create(4 * G))
	_, err := d.Alloc(G + 1) // rounds to 2 granules; 1 free
	wantErr(t, err, "sim.Alloc", device.ErrOutOfMemory, "need 4194304 bytes")
	_, err = d.Create(2 * G)
	wantErr(t, err, "sim.Create", device.ErrOutOfMemory)
	_, err = d.Alloc(1 << 63) // absurd sizes are OOM, not overflow
	wantErr(t, err, "sim.Alloc", device.ErrOutOfMemory)
	if st := d.Stats(); st.Used != 7*G || st.Allocs != 1 || st.Creates != 1 {
		t.Fatalf("failed allocations changed state: %+v", st)
	}
	last := must1[device.Ptr](t)(d.Alloc(G))
	free, total, _ := d.MemInfo()
	if free != 0 || total != 8*G {
		t.Errorf("MemInfo = %d, %d", free, total)
	}
	must(t, d.Free(last))

	// Shrink: another process takes the last free granule.
	wantErr(t, d.Shrink(2*G), "sim.Shrink", device.ErrOutOfMemory)
	must(t, d.Shrink(G))
	free, total, _ = d.MemInfo()
	if free != 0 || total != 8*G {
		t.Errorf("MemInfo after Shrink = %d, %d", free, total)
	}
	if st := d.Stats(); st.Shrunk != G {
		t.Errorf("Stats.Shrunk = %d", st.Shrunk)
	}
	_, err = d.Alloc(1)
	wantErr(t, err, "sim.Alloc", device.ErrOutOfMemory, "shrunk 2097152")
	must(t, d.Free(a))
	// Used memory plus shrunk memory never exceed capacity.
	_, err = d.Create(4 * G)
	wantErr(t, err, "sim.Create", device.ErrOutOfMemory)
	h2 := must1[device.Handle](t)(d.Create(3 * G))
	wantErr(t, d.Grow(2*G), "sim.Grow", device.ErrInvalid, "only 2097152 bytes")
	must(t, d.Grow(G))
	free, _, _ = d.MemInfo()
	if free != G {
		t.Errorf("free after Grow = %d", free)
	}
	must(t, d.Shrink(G))
	d.ClearFaults() // gives Shrink back too
	free, _, _ = d.MemInfo()
	if free != G {
		t.Errorf("free after ClearFaults = %d", free)
	}
	must(t, d.Release(h))
	must(t, d.Release(h2))
	must(t, d.Leaks())
}

func TestFaultInjection(t *testing.T) {
	d := newDev(t, Config{Capacity: 16 * G})
	for _, name := range faults.DeviceOps {
		d.FailNth(name, 1)
		d.ClearFaults()
	}
	func() {
		defer func() {
			if recover() == nil {
				t.Error("FailNth of an unknown op did not panic")
			}
		}()
		d.FailNth("Malloc", 1)
	}()
	func() {
		defer func() {
			if recover() == nil {
				t.Error("FailNth(op, 0) did not panic")
			}
		}()
		d.FailNth("Alloc", 0)
	}()

	// The 2nd Alloc fails, the 1st and 3rd succeed; nothing else counts.
	d.FailNth("Alloc", 2)
	p1 := must1[device.Ptr](t)(d.Alloc(G))
	h := must1[device.Handle](t)(d.Create(G))
	before := d.Stats()
	_, err := d.Alloc(G)
	wantErr(t, err, "sim.Alloc", device.ErrInjected, "FailNth(\"Alloc\", 2)", "size=2097152")
	if errors.Is(err, device.ErrOutOfMemory) {
		t.Error("FailNth error matches ErrOutOfMemory")
	}
	after := d.Stats()
	after.Injected = before.Injected
	if after != before {
		t.Errorf("injected failure changed state:\n%+v\n%+v", before, after)
	}
	p2 := must1[device.Ptr](t)(d.Alloc(G))

	// The injected failure is invisible in the addresses that follow.
	ref := newDev(t, Config{Capacity: 16 * G})
	r1 := must1[device.Ptr](t)(ref.Alloc(G))
	must1[device.Handle](t)(ref.Create(G))
	r2 := must1[device.Ptr](t)(ref.Alloc(G))
	if r1 != p1 || r2 != p2 {
		t.Errorf("addresses differ after an injected failure: %#x %#x vs %#x %#x", p1, p2, r1, r2)
	}

	// FailOOM wraps ErrOutOfMemory (and ErrInjected).
	d.FailOOM("Create", 1)
	_, err = d.Create(G)
	wantErr(t, err, "sim.Create", device.ErrOutOfMemory, "FailOOM")
	if !errors.Is(err, device.ErrInjected) {
		t.Error("FailOOM error does not match ErrInjected")
	}

	// "" counts every call; the failure comes before argument checks, and
	// a failed Free or Release leaves the object live.
	d.FailNth("", 3)
	must1[bool](t)(d.Query(must1[device.Event](t)(d.NewEvent())))
	wantErr(t, d.Free(p1), "sim.Free", device.ErrInjected)
	must(t, d.Free(p1))
	d.FailNth("Release", 1)
	wantErr(t, d.Release(h), "sim.Release", device.ErrInjected)
	must(t, d.Release(h))

	// Several faults at once, and ClearFaults disarms them.
	d.FailNth("Map", 1)
	d.FailNth("Free", 3)
	d.ClearFaults()
	must(t, d.Free(p2))
	if st := d.Stats(); st.Injected != 4 {
		t.Errorf("Injected = %d, want 4", st.Injected)
	}

	// Every faultable operation fails cleanly on an injected fault.
	vm := newDev(t, Config{Capacity: 16 * G})
	r := must1[device.Ptr](t)(vm.Reserve(4*G, 0))
	hh := must1[device.Handle](t)(vm.Create(G))
	e := must1[device.Event](t)(vm.NewEvent())
	s := must1[device.Stream](t)(vm.NewStream())
	calls := []struct {
		op  string
		run func() error
	}{
		{"Alloc", func() error { _, err := vm.Alloc(G); return err }},
		{"Free", func() error { return vm.Free(1) }},
		{"MemInfo", func() error { _, _, err := vm.MemInfo(); return err }},
		{"Synchronize", vm.Synchronize},
		{"Reserve", func() error { _, err := vm.Reserve(G, 0); return err }},
		{"ReleaseAddress", func() error { return vm.ReleaseAddress(r, 4*G) }},
		{"Create", func() error { _, err := vm.Create(G); return err }},
		{"Release", func() error { return vm.Release(hh) }},
		{"Map", func() error { return vm.Map(r, G, hh) }},
		{"SetAccess", func() error { return vm.SetAccess(r, G) }},
		{"Unmap", func() error { return vm.Unmap(r, G) }},
		{"NewEvent", func() error { _, err := vm.NewEvent(); return err }},
		{"DestroyEvent", func() error { return vm.DestroyEvent(e) }},
		{"Record", func() error { return vm.Record(e, s) }},
		{"Query", func() error { _, err := vm.Query(e); return err }},
		{"Wait", func() error { return vm.Wait(e) }},
		{"StreamWait", func() error { return vm.StreamWait(s, e) }},
		{"NewStream", func() error { _, err := vm.NewStream(); return err }},
		{"DestroyStream", func() error { return vm.DestroyStream(s) }},
		{"SynchronizeStream", func() error { return vm.SynchronizeStream(s) }},
	}
	for _, c := range calls {
		st := vm.Stats()
		leaks := fmt.Sprint(vm.Leaks())
		vm.FailNth(c.op, 1)
		wantErr(t, c.run(), "sim."+c.op, device.ErrInjected)
		st2 := vm.Stats()
		st2.Injected--
		if st2 != st || fmt.Sprint(vm.Leaks()) != leaks {
			t.Errorf("injected %s failure changed state", c.op)
		}
	}
	// With no fault armed, the same calls succeed.
	must(t, vm.ReleaseAddress(r, 4*G))
	must(t, vm.Release(hh))
	must(t, vm.DestroyEvent(e))
	must(t, vm.DestroyStream(s))
	must(t, vm.Leaks())
}

func TestLeaks(t *testing.T) {
	d := newDev(t, Config{})
	must(t, d.Leaks())
	p := must1[device.Ptr](t)(d.Alloc(100))
	r := must1[device.Ptr](t)(d.Reserve(4*G, 0))
	h := must1[device.Handle](t)(d.Create(G))
	h2 := must1[device.Handle](t)(d.Create(G))
	must(t, d.Map(r, G, h))
	must(t, d.Map(r+G, G, h2))
	must(t, d.Release(h2)) // released but still mapped: still live
	err := d.Leaks()
	if err == nil {
		t.Fatal("Leaks() = nil with everything live")
	}
	for _, s := range []string{"1 allocation(s)", fmt.Sprintf("%#x (100 bytes)", uint64(p)), "2 handle(s)", "released",
		"2 mapping(s)", fmt.Sprintf("[%#x, %#x) of handle 1", uint64(r), uint64(r)+G), "1 reservation(s)"} {
		if !strings.Contains(err.Error(), s) {
			t.Errorf("Leaks() = %q, does not mention %q", err, s)
		}
	}
	must(t, d.Free(p))
	must(t, d.Unmap(r, G))
	must(t, d.Unmap(r+G, G))
	must(t, d.Release(h))
	must(t, d.ReleaseAddress(r, 4*G))
	must(t, d.Leaks())
	if st := d.Stats(); st.Used != 0 || st.LiveHandles != 0 {
		t.Errorf("after teardown: %+v", st)
	}
	// Many leaks are abbreviated.
	for i := 0; i < 20; i++ {
		must1[device.Ptr](t)(d.Alloc(1))
	}
	if err := d.Leaks(); err == nil || !strings.Contains(err.Error(), "20 allocation(s)") || !strings.Contains(err.Error(), "and 12 more") {
		t.Errorf("Leaks() = %v", err)
	}
}

// script drives a device through a fixed mix of calls and returns every
// address and id it got back.
func script(d *Device) []uint64 {
	var out []uint64
	add := func(v uint64, err error) {
		if err != nil {
			panic(err)
		}
		out = append(out, v)
	}
	var ptrs []device.Ptr
	for i := 0; i < 50; i++ {
		p, err := d.Alloc(uint64(i*4096 + 1))
		add(uint64(p), err)
		ptrs = append(ptrs, p)
		if i%3 == 0 {
			_ = d.Free(ptrs[i/2])
		}
		r, err := d.Reserve(uint64(i%4+1)*G, uint64(1)<<(21+i%3))
		add(uint64(r), err)
		h, err := d.Create(G)
		add(uint64(h), err)
		if err := d.Map(r, G, h); err != nil {
			panic(err)
		}
		e, err := d.NewEvent()
		add(uint64(e), err)
		s, err := d.NewStream()
		add(uint64(s), err)
	}
	return out
}

func TestDeterminism(t *testing.T) {
	a := script(newDev(t, Config{}))
	b := script(newDev(t, Config{}))
	if fmt.Sprint(a) != fmt.Sprint(b) {
		t.Fatal("two devices given the same calls returned different addresses")
	}
	// Plain and reserved ranges are disjoint and never overlap.
	d := newDev(t, Config{})
	p := must1[device.Ptr](t)(d.Alloc(1))
	r := must1[device.Ptr](t)(d.Reserve(G, 0))
	if uint64(p) >= vaBase || uint64(r) < vaBase {
		t.Errorf("plain %#x and reserved %#x ranges are not disjoint", p, r)
	}
}

func TestReserveAlignment(t *testing.T) {
	d := newDev(t, Config{})
	for _, align := range []uint64{0, 4096, G, 4 * G, 1 << 30, 1 << 40} {
		p := must1[device.Ptr](t)(d.Reserve(G, align))
		want := max(align, G)
		if uint64(p)%want != 0 {
			t.Errorf("Reserve(align=%d) = %#x, not aligned to %#x", align, p, want)
		}
	}
	_, err := d.Reserve(G, 3*G)
	wantErr(t, err, "sim.Reserve", device.ErrInvalid, "not a power of two")
	_, err = d.Reserve(0, 0)
	wantErr(t, err, "sim.Reserve", device.ErrInvalid, "size is 0")
	_, err = d.Reserve(G+4096, 0)
	wantErr(t, err, "sim.Reserve", device.ErrInvalid, "not a multiple of the granularity")
	_, err = d.Reserve(1<<63, 0)
	wantErr(t, err, "sim.Reserve", device.ErrOutOfMemory, "virtual address space")
	_, err = d.Reserve(G, 1<<63)
	wantErr(t, err, "sim.Reserve", device.ErrOutOfMemory, "virtual address space")
	if st := d.Stats(); st.Reserves != 6 || st.ReservedAddress != 6*G {
		t.Errorf("stats: %+v", st)
	}
}

// TestConcurrent exercises every capability from several goroutines; run it
// under -race.
func TestConcurrent(t *testing.T) {
	d := newDev(t, Config{Capacity: 64 * GiB})
	var wg sync.WaitGroup
	for w := 0; w < 8; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			s, err := d.NewStream()
			if err != nil {
				t.Error(err)
				return
			}
			e, _ := d.NewEvent()
			r, _ := d.Reserve(16*G, 0)
			for i := 0; i < 300; i++ {
				p, err := d.Alloc(uint64(i%7+1) * 4096)
				if err != nil {
					t.Error(err)
					return
				}
				h, err := d.Create(G)
				if err != nil {
					t.Error(err)
					return
				}
				off := device.Ptr(i%16) * G
				if err := d.Map(r+off, G, h); err != nil {
					t.Error(err)
					return
				}
				if err := d.SetAccess(r+off, G); err != nil {
					t.Error(err)
				}
				if i%10 == 0 {
					d.Hold(s)
				}
				if err := d.Touch(s, r+off, G); err != nil {
					t.Error(err)
				}
				_ = d.Touch(s, p, 4096)
				_ = d.Record(e, s)
				_ = d.StreamWait(0, e)
				_, _ = d.Query(e)
				_ = d.CheckHandoff(r+off, G, 0)
				if i%10 == 5 {
					d.Drain(s)
				}
				_ = d.Wait(e)
				_ = d.Release(h)
				if err := d.Unmap(r+off, G); err != nil {
					t.Error(err)
				}
				if err := d.Free(p); err != nil {
					t.Error(err)
				}
				_, _, _ = d.MemInfo()
				_ = d.Stats()
			}
			d.Drain(s)
			_ = d.DestroyEvent(e)
			_ = d.ReleaseAddress(r, 16*G)
			_ = d.DestroyStream(s)
		}()
	}
	wg.Wait()
	must(t, d.Synchronize())
	must(t, d.Leaks())
	if st := d.Stats(); st.Used != 0 || st.Pending != 0 || st.LiveStreams != 1 {
		t.Errorf("after the workers: %+v", st)
	}
}
