package sim

import (
	"fmt"
	"testing"

	"github.com/gpumem/gpumem/device"
)

func TestVirtualMemoryHappyPath(t *testing.T) {
	d := newDev(t, Config{Capacity: 16 * G})
	var vm device.VirtualMemory = d
	r := must1[device.Ptr](t)(vm.Reserve(8*G, 0))
	h1 := must1[device.Handle](t)(vm.Create(G))
	h2 := must1[device.Handle](t)(vm.Create(2 * G))
	if h1 == 0 || h2 == 0 || h1 == h2 {
		t.Fatalf("handles %d %d", h1, h2)
	}
	must(t, vm.Map(r, G, h1))
	must(t, vm.Map(r+G, 2*G, h2))
	if d.Accessible(r, G) {
		t.Error("mapped memory accessible before SetAccess")
	}
	must(t, vm.SetAccess(r, 3*G)) // one call for two mappings
	if !d.Accessible(r, 3*G) || !d.Accessible(r+G-1, 2) || d.Accessible(r, 3*G+1) || d.Accessible(r-1, 2) {
		t.Error("Accessible wrong after SetAccess")
	}
	st := d.Stats()
	if st.Used != 3*G || st.Mapped != 3*G || st.ReservedAddress != 8*G || st.Maps != 2 || st.SetAccessCalls != 1 ||
		st.Creates != 2 || st.Reserves != 1 || st.LiveMappings != 2 {
		t.Errorf("stats: %+v", st)
	}
	// Release while mapped defers the free until the last unmap.
	must(t, vm.Release(h2))
	if st := d.Stats(); st.Used != 3*G || st.LiveHandles != 2 {
		t.Errorf("Release of a mapped chunk freed it: %+v", st)
	}
	if !d.Accessible(r+G, 2*G) {
		t.Error("released-but-mapped chunk no longer accessible")
	}
	must(t, vm.Unmap(r+G, 2*G))
	if st := d.Stats(); st.Used != G || st.LiveHandles != 1 || st.Mapped != G {
		t.Errorf("last Unmap of a released chunk did not free it: %+v", st)
	}
	if d.Accessible(r+G, 1) {
		t.Error("unmapped memory accessible")
	}
	// Remapping the same range works and starts without access.
	h3 := must1[device.Handle](t)(vm.Create(2 * G))
	must(t, vm.Map(r+G, 2*G, h3))
	if d.Accessible(r+G, 1) {
		t.Error("a new mapping inherited access")
	}
	must(t, vm.SetAccess(r+G, 2*G))
	// A chunk may be mapped twice.
	must(t, vm.Map(r+4*G, G, h1))
	if st := d.Stats(); st.Used != 3*G {
		t.Errorf("a second mapping charged memory: Used %d", st.Used)
	}
	for _, m := range [][2]device.Ptr{{r, G}, {r + G, 2 * G}, {r + 4*G, G}} {
		must(t, vm.Unmap(m[0], uint64(m[1])))
	}
	must(t, vm.Release(h1))
	must(t, vm.Release(h3))
	must(t, vm.ReleaseAddress(r, 8*G))
	must(t, d.Leaks())
	st = d.Stats()
	if st.Used != 0 || st.Unmaps != 4 || st.Releases != 3 || st.AddressReleases != 1 || st.ReservedAddress != 0 || st.Mapped != 0 {
		t.Errorf("final stats: %+v", st)
	}
}

// TestVirtualMemoryPreconditions checks that every precondition violation is
// an *OpError wrapping ErrInvalid that says what was wrong, and changes
// nothing.
func TestVirtualMemoryPreconditions(t *testing.T) {
	d := newDev(t, Config{Capacity: 16 * G})
	r := must1[device.Ptr](t)(d.Reserve(8*G, 0))
	r2 := must1[device.Ptr](t)(d.Reserve(2*G, 0))
	h := must1[device.Handle](t)(d.Create(G))
	h2 := must1[device.Handle](t)(d.Create(2 * G))
	hFree := must1[device.Handle](t)(d.Create(G))
	must(t, d.Release(hFree))
	must(t, d.Map(r+2*G, G, h))
	must(t, d.Map(r+4*G, 2*G, h2))
	hex := func(p device.Ptr) string { return fmt.Sprintf("%#x", uint64(p)) }

	snapshot := func() string { return fmt.Sprintf("%+v %v", d.Stats(), d.Leaks()) }
	before := snapshot()

	cases := []struct {
		name string
		op   string
		err  error
		subs []string
	}{
		// Reserve.
		{"reserve size 0", "sim.Reserve", func() error { _, err := d.Reserve(0, 0); return err }(), []string{"size is 0"}},
		{"reserve unaligned size", "sim.Reserve", func() error { _, err := d.Reserve(G/2, 0); return err }(), []string{"not a multiple of the granularity"}},
		{"reserve bad align", "sim.Reserve", func() error { _, err := d.Reserve(G, 3<<20); return err }(), []string{"not a power of two"}},
		// Create.
		{"create size 0", "sim.Create", func() error { _, err := d.Create(0); return err }(), []string{"size is 0"}},
		{"create unaligned", "sim.Create", func() error { _, err := d.Create(G + 4096); return err }(), []string{"not a multiple of the granularity"}},
		// Release.
		{"release unknown", "sim.Release", d.Release(99), []string{"unknown handle 99"}},
		{"release 0", "sim.Release", d.Release(0), []string{"unknown handle 0"}},
		{"double release", "sim.Release", d.Release(hFree), []string{"already released"}},
		// Map.
		{"map unknown handle", "sim.Map", d.Map(r, G, 77), []string{"unknown handle 77"}},
		{"map released handle", "sim.Map", d.Map(r, G, hFree), []string{"already released"}},
		{"map wrong size", "sim.Map", d.Map(r, 2*G, h), []string{"not the size", "whole chunks"}},
		{"map unaligned address", "sim.Map", d.Map(r+4096, G, h), []string{"address", "not a multiple of the granularity"}},
		{"map unaligned size", "sim.Map", d.Map(r, 4096, h), []string{"size", "not a multiple of the granularity"}},
		{"map size 0", "sim.Map", d.Map(r, 0, h), []string{"size is 0"}},
		{"map outside reservation", "sim.Map", d.Map(r-4*G, G, h), []string{"outside any reservation"}},
		{"map in the gap after a reservation", "sim.Map", d.Map(r+8*G, G, h), []string{"outside any reservation"}},
		{"map past reservation end", "sim.Map", d.Map(r+7*G, 2*G, h2), []string{"runs past the end of the reservation"}},
		{"map over mapped", "sim.Map", d.Map(r+2*G, G, h), []string{"over the mapped range", hex(r + 2*G)}},
		{"map overlapping the end of a mapping", "sim.Map", d.Map(r+3*G, 2*G, h2), []string{"over the mapped range", hex(r + 4*G)}},
		{"map overlapping the start of a mapping", "sim.Map", d.Map(r+G, 2*G, h2), []string{"over the mapped range", hex(r + 2*G)}},
		{"map overflowing", "sim.Map", d.Map(device.Ptr(^uint64(0)&^(G-1)), 2*G, h2), []string{"overflows"}},
		// SetAccess.
		{"setaccess unmapped", "sim.SetAccess", d.SetAccess(r, G), []string{"unmapped memory at " + hex(r)}},
		{"setaccess with a hole", "sim.SetAccess", d.SetAccess(r+2*G, 4*G), []string{"unmapped memory at " + hex(r+3*G)}},
		{"setaccess past the mappings", "sim.SetAccess", d.SetAccess(r+4*G, 3*G), []string{"unmapped memory at " + hex(r+6*G)}},
		{"setaccess part of a mapping", "sim.SetAccess", d.SetAccess(r+4*G, G), []string{"ends inside the mapping", "whole mappings"}},
		{"setaccess from inside a mapping", "sim.SetAccess", d.SetAccess(r+5*G, G), []string{"starts inside the mapping", "whole mappings"}},
		{"setaccess unaligned", "sim.SetAccess", d.SetAccess(r+2*G, 4096), []string{"not a multiple of the granularity"}},
		{"setaccess size 0", "sim.SetAccess", d.SetAccess(r+2*G, 0), []string{"size is 0"}},
		// Unmap.
		{"unmap unmapped", "sim.Unmap", d.Unmap(r, G), []string{"not exactly one mapping", "nothing is mapped"}},
		{"unmap part of a mapping", "sim.Unmap", d.Unmap(r+4*G, G), []string{"not exactly one mapping", "the mapping at"}},
		{"unmap from inside a mapping", "sim.Unmap", d.Unmap(r+5*G, G), []string{"not exactly one mapping", "starts inside the mapping"}},
		{"unmap two mappings", "sim.Unmap", d.Unmap(r+2*G, 4*G), []string{"not exactly one mapping"}},
		{"unmap unaligned", "sim.Unmap", d.Unmap(r+2*G+4096, G), []string{"not a multiple of the granularity"}},
		// ReleaseAddress.
		{"release address with mappings", "sim.ReleaseAddress", d.ReleaseAddress(r, 8*G), []string{"with 2 mapping(s) still in it"}},
		{"release part of a reservation", "sim.ReleaseAddress", d.ReleaseAddress(r2, G), []string{"has size", "whole reservations"}},
		{"release address from inside", "sim.ReleaseAddress", d.ReleaseAddress(r2+G, G), []string{"inside the reservation", "not its start"}},
		{"release unknown address", "sim.ReleaseAddress", d.ReleaseAddress(r-16*G, G), []string{"no reservation starts at"}},
		{"release unaligned address", "sim.ReleaseAddress", d.ReleaseAddress(r2+1, G), []string{"not a multiple of the granularity"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) { wantErr(t, c.err, c.op, device.ErrInvalid, c.subs...) })
	}
	if after := snapshot(); after != before {
		t.Errorf("failed calls changed state:\n%s\n%s", before, after)
	}

	// Double release of an address range, and of a handle that is still
	// mapped (its release is deferred).
	must(t, d.ReleaseAddress(r2, 2*G))
	wantErr(t, d.ReleaseAddress(r2, 2*G), "sim.ReleaseAddress", device.ErrInvalid, "already released")
	must(t, d.Release(h2))
	wantErr(t, d.Release(h2), "sim.Release", device.ErrInvalid, "already released", "1 mapping(s)")
	wantErr(t, d.Map(r, 2*G, h2), "sim.Map", device.ErrInvalid, "released")
	must(t, d.Unmap(r+4*G, 2*G))
	wantErr(t, d.Unmap(r+4*G, 2*G), "sim.Unmap", device.ErrInvalid, "nothing is mapped")
	wantErr(t, d.Release(h2), "sim.Release", device.ErrInvalid, "already released")
}

func TestReservationsNeverReusedOrAdjacent(t *testing.T) {
	d := newDev(t, Config{})
	seen := map[device.Ptr]bool{}
	var prevEnd uint64
	for i := 0; i < 100; i++ {
		r := must1[device.Ptr](t)(d.Reserve(G*uint64(i%3+1), 0))
		if seen[r] || uint64(r) <= prevEnd {
			t.Fatalf("reservation %#x reused or adjacent to the previous one (ending %#x)", r, prevEnd)
		}
		seen[r] = true
		prevEnd = uint64(r) + G*uint64(i%3+1)
		must(t, d.ReleaseAddress(r, G*uint64(i%3+1)))
	}
	// Adjacent mappings in two reservations are never contiguous.
	r1 := must1[device.Ptr](t)(d.Reserve(G, 0))
	r2 := must1[device.Ptr](t)(d.Reserve(G, 0))
	if r2 == r1+G {
		t.Fatal("reservations are adjacent")
	}
	// Address space runs out eventually (a device has 1/64 of the
	// virtual range, 2^57 bytes).
	for i := 0; ; i++ {
		if _, err := d.Reserve(1<<55, 0); err != nil {
			wantErr(t, err, "sim.Reserve", device.ErrOutOfMemory, "exhausted")
			break
		}
		if i > 4 {
			t.Fatal("reserved more than 2^57 bytes")
		}
	}
}

func TestAccessibleEdges(t *testing.T) {
	d := newDev(t, Config{})
	if d.Accessible(0, 1) || d.Accessible(1<<40, 1) {
		t.Error("nothing allocated, yet accessible")
	}
	p := must1[device.Ptr](t)(d.Alloc(4096))
	if d.Accessible(p, 0) || d.Accessible(p, ^uint64(0)) {
		t.Error("size 0 or overflowing range reported accessible")
	}
	r := must1[device.Ptr](t)(d.Reserve(4*G, 0))
	for i := 0; i < 3; i++ {
		h := must1[device.Handle](t)(d.Create(G))
		must(t, d.Map(r+device.Ptr(i)*G, G, h))
		must(t, d.Release(h))
	}
	must(t, d.SetAccess(r, G))
	must(t, d.SetAccess(r+2*G, G))
	if !d.Accessible(r, G) || d.Accessible(r, 2*G) || !d.Accessible(r+2*G, G) || d.Accessible(r+G, 1) {
		t.Error("access must follow SetAccess per mapping")
	}
	must(t, d.SetAccess(r, 3*G)) // again, overlapping: fine
	if !d.Accessible(r+G/2, 2*G) || d.Accessible(r, 3*G+1) {
		t.Error("access after the second SetAccess")
	}
}

// TestOrdinalsDisjoint: devices of different ordinals hand out addresses
// from disjoint ranges, as under CUDA's unified addressing, so an address
// names its device.
func TestOrdinalsDisjoint(t *testing.T) {
	d0 := MustNew(Config{Capacity: 1 << 30})
	d1 := MustNew(Config{Capacity: 1 << 30, Ordinal: 1})
	if d1.Info().Ordinal != 1 {
		t.Errorf("Info().Ordinal = %d, want 1", d1.Info().Ordinal)
	}
	p0 := must1[device.Ptr](t)(d0.Alloc(G))
	p1 := must1[device.Ptr](t)(d1.Alloc(G))
	r0 := must1[device.Ptr](t)(d0.Reserve(G, 0))
	r1 := must1[device.Ptr](t)(d1.Reserve(G, 0))
	if p0 == p1 || r0 == r1 {
		t.Errorf("two devices handed out the same address: plain %#x %#x, reserved %#x %#x", p0, p1, r0, r1)
	}
	if _, err := New(Config{Ordinal: 64}); err == nil {
		t.Error("New with ordinal 64: no error")
	}
}
