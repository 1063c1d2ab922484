package gpumem_test

// Tests of error paths that pin one behaviour each, most of them found by
// the conformance suite or FuzzOps. Each says what must hold.

import (
	"errors"
	"testing"

	"github.com/gpumem/gpumem"
	"github.com/gpumem/gpumem/device"
	"github.com/gpumem/gpumem/device/sim"
)

const (
	kiB = 1 << 10
	miB = 1 << 20
)

func newAlloc(t *testing.T, dev device.Device, cfg gpumem.Config) *gpumem.Allocator {
	t.Helper()
	cfg.CheckInvariants = true
	a, err := gpumem.New(dev, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.Close() })
	return a
}

func mustCheck(t *testing.T, a *gpumem.Allocator, after string) {
	t.Helper()
	if err := a.Check(); err != nil {
		t.Fatalf("after %s: %v", after, err)
	}
}

// TestBackFailureWithFailedUnmapKeepsHandleOnce: when backing a block fails
// (SetAccess) and undoing a mapping fails too (Unmap), the physical chunk
// that is still mapped must not also be kept as a spare handle: it would be
// counted twice and could be mapped at a second address.
func TestBackFailureWithFailedUnmapKeepsHandleOnce(t *testing.T) {
	dev := newSim(256 * miB)
	a := newAlloc(t, dev, gpumem.Config{Mode: gpumem.ModeVirtual})
	dev.FailNth("SetAccess", 1)
	dev.FailNth("Unmap", 1)
	if _, err := a.Alloc(4*miB, 0); !errors.Is(err, device.ErrInjected) {
		t.Fatalf("Alloc with SetAccess failing: %v, want the injected fault", err)
	}
	mustCheck(t, a, "a failed Alloc whose undo also failed")
	// The spare handles must all be unmapped: backing another block with
	// them must not map a chunk that is mapped already.
	dev.ClearFaults()
	b, err := a.Alloc(4*miB, 0)
	if err != nil {
		t.Fatal(err)
	}
	mustCheck(t, a, "Alloc")
	if err := a.Free(b); err != nil {
		t.Fatal(err)
	}
	if err := a.Trim(); err != nil {
		t.Fatal(err)
	}
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	if err := dev.Leaks(); err != nil {
		t.Fatal(err)
	}
}

// TestDeferFreeRecordFailureLeaksNoEvent: when recording the event of a
// deferred free fails (the free then falls back to a device synchronize),
// the event obtained for it must not be lost.
func TestDeferFreeRecordFailureLeaksNoEvent(t *testing.T) {
	dev := newSim(256 * miB)
	a := newAlloc(t, dev, gpumem.Config{})
	s1, _ := dev.NewStream()
	b, err := a.Alloc(64*kiB, 0)
	if err != nil {
		t.Fatal(err)
	}
	if err := a.RecordStream(b, s1); err != nil {
		t.Fatal(err)
	}
	dev.FailNth("Record", 1)
	if err := a.Free(b); err != nil {
		t.Fatal(err)
	}
	mustCheck(t, a, "Free")
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	if n := dev.Stats().LiveEvents; n != 0 {
		t.Fatalf("after Close %d events are live on the device: the event of the failed Record leaked", n)
	}
}

// TestFreeWithoutEventsSyncFailureKeepsStreamOrder: on a device without
// events, freeing a buffer used on another stream synchronizes the device;
// if that synchronize fails, the memory must still not be handed out while
// the other stream's work may be using it.
func TestFreeWithoutEventsSyncFailureKeepsStreamOrder(t *testing.T) {
	d := sim.MustNew(sim.Config{Capacity: 256 * miB})
	dev := newPlain(d)
	a := newAlloc(t, dev, gpumem.Config{})
	s1, _ := d.NewStream()
	b, err := a.Alloc(6*miB, 0)
	if err != nil {
		t.Fatal(err)
	}
	if err := a.RecordStream(b, s1); err != nil {
		t.Fatal(err)
	}
	d.Hold(s1)
	if err := d.Touch(s1, b.Ptr(), b.Size()); err != nil {
		t.Fatal(err)
	}
	d.FailNth("Synchronize", 1)
	if err := a.Free(b); err != nil {
		t.Fatal(err)
	}
	mustCheck(t, a, "Free")
	b2, err := a.Alloc(6*miB, 0)
	if err != nil {
		t.Fatal(err)
	}
	if err := d.CheckHandoff(b2.Ptr(), b2.Size(), 0); err != nil {
		t.Fatalf("a buffer freed while stream %d still used it was handed to stream 0: %v", s1, err)
	}
	d.Drain(s1)
}

// TestScopeAllocInvalidSize: an absurd size is a programming error
// (ErrInvalidSize) even in a scope with a quota, not a quota refusal.
func TestScopeAllocInvalidSize(t *testing.T) {
	a := newAlloc(t, newSim(256*miB), gpumem.Config{})
	sc := a.NewScope("s", miB)
	_, err := sc.Alloc(1<<60, 0)
	if !errors.Is(err, gpumem.ErrInvalidSize) {
		t.Fatalf("Scope.Alloc(1<<60) with a quota: %v, want ErrInvalidSize", err)
	}
	if st := a.Stats(); st.OOMs != 0 {
		t.Fatalf("an invalid size counted %d OOMs", st.OOMs)
	}
}

// TestOOMCauseWhenDeviceRefuses: when the device refuses both the request
// and its retry, the cause is the device, even if the device's MemInfo
// claims room (another process, or device-side fragmentation): the
// allocator caches nothing that could have served the request.
func TestOOMCauseWhenDeviceRefuses(t *testing.T) {
	for _, mode := range []gpumem.Mode{gpumem.ModeVirtual, gpumem.ModePlain} {
		t.Run(mode.String(), func(t *testing.T) {
			dev := newSim(256 * miB)
			a := newAlloc(t, dev, gpumem.Config{Mode: mode})
			op := map[gpumem.Mode]string{gpumem.ModeVirtual: "Create", gpumem.ModePlain: "Alloc"}[mode]
			dev.FailOOM(op, 1)
			dev.FailOOM(op, 2)
			_, err := a.Alloc(16*miB, 0)
			var oe *gpumem.OutOfMemoryError
			if !errors.As(err, &oe) {
				t.Fatalf("want an *OutOfMemoryError, got %v", err)
			}
			if oe.Cause != gpumem.CauseDevice {
				t.Fatalf("the device refused twice and the allocator caches %d bytes: cause %v, want %v", oe.Cached, oe.Cause, gpumem.CauseDevice)
			}
		})
	}
}

// TestCloseAfterUnmapFailureRespectsDevice: a transient failure while Close
// unmaps a chunk is reported, and Close does not go on to break a device
// precondition (releasing address space that still has mappings in it).
func TestCloseAfterUnmapFailureRespectsDevice(t *testing.T) {
	dev := newSim(256 * miB)
	a, err := gpumem.New(dev, gpumem.Config{Mode: gpumem.ModeVirtual})
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range []uint64{4 * miB, 64 * kiB} {
		b, err := a.Alloc(n, 0)
		if err != nil {
			t.Fatal(err)
		}
		if err := a.Free(b); err != nil {
			t.Fatal(err)
		}
	}
	dev.FailNth("Unmap", 1)
	err = a.Close()
	if !errors.Is(err, device.ErrInjected) {
		t.Fatalf("Close with Unmap failing: %v, want the injected fault", err)
	}
	if errors.Is(err, device.ErrInvalid) {
		t.Fatalf("Close broke a device precondition after the fault: %v", err)
	}
}

// TestScopeAllocClosedSaysClosed: a closed scope refuses with ErrClosed,
// whatever its quota says about the size.
func TestScopeAllocClosedSaysClosed(t *testing.T) {
	a := newAlloc(t, newSim(256*miB), gpumem.Config{})
	sc := a.NewScope("s", 4*miB)
	if err := sc.Close(); err != nil {
		t.Fatal(err)
	}
	before := a.Stats()
	_, err := sc.Alloc(5*miB, 0)
	if !errors.Is(err, gpumem.ErrClosed) {
		t.Fatalf("Alloc over the quota in a closed scope: %v, want ErrClosed", err)
	}
	if after := a.Stats(); after.OOMs != before.OOMs || after.Allocs != before.Allocs {
		t.Fatalf("Alloc in a closed scope counted OOMs %d → %d, allocs %d → %d", before.OOMs, after.OOMs, before.Allocs, after.Allocs)
	}
}

// TestStaleBufferCannotFreePage: a stale Buffer (already freed) whose block
// node was since reused as a page of the small heap must be refused as a
// double free, not free the page under the small heap's live buffers.
func TestStaleBufferCannotFreePage(t *testing.T) {
	dev := newSim(256 * miB)
	// Without CheckInvariants: the checker would panic inside Free with a
	// pool locked; Check below reports the damage instead.
	a, err := gpumem.New(dev, gpumem.Config{Mode: gpumem.ModeVirtual})
	if err != nil {
		t.Fatal(err)
	}
	big, err := a.Alloc(2*miB, 0)
	if err != nil {
		t.Fatal(err)
	}
	if err := a.Free(big); err != nil {
		t.Fatal(err)
	}
	small, err := a.Alloc(4*kiB, 0) // the small heap takes a page of the large arena
	if err != nil {
		t.Fatal(err)
	}
	if err := a.Free(big); !errors.Is(err, gpumem.ErrDoubleFree) {
		t.Errorf("Free of a stale buffer: %v, want ErrDoubleFree", err)
	}
	mustCheck(t, a, "Free of a stale buffer")
	if err := a.Free(small); err != nil {
		t.Fatal(err)
	}
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
}

// TestSizeDown: the largest request that would have fit is written rounded
// down, so that asking for the figure written never asks for more than
// fits (%.2f wrote 14.795 MiB as 14.80 MiB).
func TestSizeDown(t *testing.T) {
	for _, tc := range []struct {
		n    uint64
		want string
	}{
		{512, "512 B"},
		{15513354, "14.79 MiB"}, // 14.7947 MiB
		{132 << 20, "132.00 MiB"},
		{(2 << 30) - 1, "1.99 GiB"},
	} {
		if got := gpumem.SizeDown(tc.n); got != tc.want {
			t.Errorf("sizeDown(%d) = %q, want %q", tc.n, got, tc.want)
		}
	}
}
