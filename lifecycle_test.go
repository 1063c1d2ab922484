package gpumem_test

import (
	"errors"
	"testing"

	"github.com/gpumem/gpumem"
	"github.com/gpumem/gpumem/device/sim"
)

// A Close that a device failure stopped part way can be called again, and
// then gives back everything.
func TestCloseRetriesAfterFailure(t *testing.T) {
	dev := newSim(256 * miB)
	a, err := gpumem.New(dev, gpumem.Config{Mode: gpumem.ModeVirtual})
	if err != nil {
		t.Fatal(err)
	}
	b, err := a.Alloc(8*miB, 0)
	if err != nil {
		t.Fatal(err)
	}
	if err := a.Free(b); err != nil {
		t.Fatal(err)
	}
	dev.FailNth("Unmap", 1)
	if err := a.Close(); err == nil {
		t.Fatal("Close with a failing Unmap reported no error")
	}
	if dev.Leaks() == nil {
		t.Fatal("the failed Close left nothing behind: the test injects no fault")
	}
	dev.ClearFaults()
	if err := a.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	if err := dev.Leaks(); err != nil {
		t.Fatalf("after the second Close: %v", err)
	}
	if err := a.Close(); err != nil {
		t.Fatalf("third Close of a cleanly closed allocator: %v", err)
	}
}

// Preallocated plain memory serves other streams too: under a limit that
// leaves no room for another segment, a second stream adopts the free
// preallocated segment (behind an event) instead of failing.
func TestPlainPreallocServesOtherStreams(t *testing.T) {
	dev := newSim(256 * miB)
	a := newAlloc(t, dev, gpumem.Config{Mode: gpumem.ModePlain, Preallocate: 64 * miB, Limit: 64 * miB})
	s1, err := dev.NewStream()
	if err != nil {
		t.Fatal(err)
	}
	b, err := a.Alloc(32*miB, s1)
	if err != nil {
		t.Fatalf("Alloc on another stream with all memory preallocated: %v", err)
	}
	st := a.Stats()
	if st.Handoffs != 1 || st.Reserved != 64*miB {
		t.Fatalf("handoffs %d, reserved %d: want the preallocated segment moved, nothing more taken", st.Handoffs, st.Reserved)
	}
	if err := a.Free(b); err != nil {
		t.Fatal(err)
	}
	if err := a.Check(); err != nil {
		t.Fatal(err)
	}
}

// ReleaseStream refuses while buffers live on the stream, and afterwards the
// stream's memory is back on the device and the stream can be used anew.
func TestReleaseStream(t *testing.T) {
	dev := sim.MustNew(sim.Config{Capacity: 256 << 20})
	a, err := gpumem.New(dev, gpumem.Config{CheckInvariants: true})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	s, _ := dev.NewStream()
	b, err := a.Alloc(8<<20, s)
	if err != nil {
		t.Fatal(err)
	}
	if err := a.ReleaseStream(s); err == nil {
		t.Fatal("ReleaseStream succeeded with a live buffer on the stream")
	}
	if err := a.Free(b); err != nil {
		t.Fatal(err)
	}
	if err := a.ReleaseStream(s); err != nil {
		t.Fatal(err)
	}
	if st := a.Stats(); st.Reserved != 0 || st.Streams != 0 || st.AddressSpace != 0 {
		t.Fatalf("after ReleaseStream the allocator still holds %d bytes, %d streams, %d bytes of address space", st.Reserved, st.Streams, st.AddressSpace)
	}
	if err := dev.DestroyStream(s); err != nil {
		t.Fatal(err)
	}
	if err := dev.Leaks(); err != nil {
		t.Fatal(err)
	}
	if err := a.Check(); err != nil {
		t.Fatal(err)
	}
}

// A request the device refuses part way through leaves nothing reserved:
// the spans it had already created are given back.
func TestFailedGrowthLeavesNothing(t *testing.T) {
	dev := sim.MustNew(sim.Config{Capacity: 1 << 30})
	a, err := gpumem.New(dev, gpumem.Config{CheckInvariants: true})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	if err := dev.Shrink(512 << 20); err != nil {
		t.Fatal(err)
	}
	_, err = a.Alloc(768<<20, 0) // more than is left: fails after several spans
	if !errors.Is(err, gpumem.ErrOutOfMemory) {
		t.Fatalf("Alloc beyond the device: %v", err)
	}
	if st := a.Stats(); st.Reserved != 0 {
		t.Fatalf("a failed request left %d bytes reserved", st.Reserved)
	}
	if err := a.Check(); err != nil {
		t.Fatal(err)
	}
}
