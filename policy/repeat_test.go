package policy

import (
	"errors"
	"strings"
	"testing"
)

// bumpAllocator never reuses an address: a policy without any address
// repetition. It refuses requests larger than refuse.
type bumpAllocator struct {
	next, reserved, refuse uint64
	live                   map[uint64]uint64
}

func (b *bumpAllocator) Alloc(size, _ uint64) (uint64, error) {
	if size > b.refuse {
		return 0, ErrOutOfMemory
	}
	b.next += size + 4096
	b.live[b.next] = size
	b.reserved += size
	return b.next, nil
}

func (b *bumpAllocator) Free(addr uint64) error {
	size, ok := b.live[addr]
	if !ok {
		return errors.New("free of an address not live")
	}
	delete(b.live, addr)
	b.reserved -= size
	return nil
}
func (b *bumpAllocator) Reserved() uint64    { return b.reserved }
func (b *bumpAllocator) Segments() []Segment { return nil }

// repeatTrace: three requests freed within the trace, one left live at its
// end (kept live across passes, allocated once: a program's workspace) and
// one of 4 GiB.
const repeatTrace = "a 0 1048576 0 1\na 1 2097152 0 2\nf 0 3\na 2 524288 0 4\nf 1 5\nf 2 6\na 3 1048576 0 7\na 4 4294967296 0 8\nf 4 9\n"

func TestRepeatCounts(t *testing.T) {
	tr := mustTrace(t, repeatTrace)
	// tf-bfc comes back to the same addresses once its layout is steady:
	// the four requests freed within the trace are compared in passes 2
	// and 3 (the 4 GiB one too: the device has room); in pass 2, which
	// starts with the kept request live where pass 1 began with nothing,
	// two of them land elsewhere; in pass 3 all four where pass 2 put them.
	r, err := Repeat(tr, "tf-bfc", 16<<30, 3)
	if err != nil {
		t.Fatal(err)
	}
	if r.Passes != 3 || r.Compared != 8 || r.Same != 6 || r.OOMsLater != 0 {
		t.Errorf("tf-bfc: %+v, want 6 of 8 compared requests at the same address, no OOM", r)
	}
	if r.PeakReservedBytes < tr.PeakLiveBytes || r.Ratio < 1 {
		t.Errorf("tf-bfc: peak %d (ratio %v) below the trace's peak live %d", r.PeakReservedBytes, r.Ratio, tr.PeakLiveBytes)
	}
	// An allocator that never reuses an address repeats none; the request
	// it refuses is not compared.
	b := &bumpAllocator{refuse: 1 << 30, live: map[uint64]uint64{}}
	r, err = repeatOn(tr, b, 3)
	if err != nil {
		t.Fatal(err)
	}
	if r.Compared != 6 || r.Same != 0 || r.SameFraction != 0 || r.OOMsLater != 2 {
		t.Errorf("bump allocator: %+v, want 6 compared, none at the same address, and the refused request counted in passes 2 and 3", r)
	}
	if len(b.live) != 1 {
		t.Errorf("bump allocator: %d requests live after the last pass, want 1 (the one the trace leaves live)", len(b.live))
	}
}

// syncCounter is a bumpAllocator that counts its synchronizes.
type syncCounter struct {
	*bumpAllocator
	syncs int
}

func (s *syncCounter) Synchronize() { s.syncs++ }

// TestRepeatSynchronizes: the passes are separated by a synchronize, as in
// the harness that measured the real pools (bench/peers/async_probe.py), so
// that CUDA's pool starts each pass with its frees completed.
func TestRepeatSynchronizes(t *testing.T) {
	tr := mustTrace(t, repeatTrace)
	s := &syncCounter{bumpAllocator: &bumpAllocator{refuse: 1 << 40, live: map[uint64]uint64{}}}
	if _, err := repeatOn(tr, s, 3); err != nil {
		t.Fatal(err)
	}
	if s.syncs != 2 {
		t.Errorf("%d synchronizes over 3 passes, want 2 (between passes)", s.syncs)
	}
	var _ Synchronizer = newCudaAsync(1 << 30)
}

func TestRepeatErrors(t *testing.T) {
	tr := mustTrace(t, repeatTrace)
	if _, err := Repeat(tr, "tf-bfc", 16<<30, 1); err == nil || !strings.Contains(err.Error(), "at least 2 passes") {
		t.Errorf("one pass: error %v, want one saying at least 2 passes", err)
	}
	if _, err := Repeat(tr, "jemalloc", 16<<30, 2); err == nil {
		t.Error("unknown policy: no error")
	}
	b := &bumpAllocator{refuse: 1 << 40, live: map[uint64]uint64{}}
	bad := &failingFree{b}
	if _, err := repeatOn(tr, bad, 2); err == nil || !strings.Contains(err.Error(), "pass 1, event 2 (f 0)") {
		t.Errorf("failing free: error %v, want one naming pass 1, event 2", err)
	}
}

// failingFree refuses every free.
type failingFree struct{ *bumpAllocator }

func (f *failingFree) Free(uint64) error { return errors.New("refused") }
