package gpumem_test

import (
	"testing"

	"github.com/gpumem/gpumem"
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
