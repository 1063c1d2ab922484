package gpumem_test

import (
	"bytes"
	"errors"
	"testing"

	"github.com/gpumem/gpumem"
	"github.com/gpumem/gpumem/device/sim"
	"github.com/gpumem/gpumem/trace"
)

// The recorder's trace of a replay reads back as the same requests.
func TestRecorderRoundTrip(t *testing.T) {
	src, err := trace.Load("testdata/traces/sweep_create_dispose.trace.gz")
	if err != nil {
		t.Skipf("shipped trace not available: %v", err)
	}
	a, err := gpumem.New(sim.MustNew(sim.Config{}), gpumem.Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	var out bytes.Buffer
	w, err := trace.NewWriter(&out)
	if err != nil {
		t.Fatal(err)
	}
	rec := gpumem.NewRecorder(a, w)
	bufs := make([]gpumem.Buffer, src.Requests)
	for i, ev := range src.Events {
		if ev.Kind == trace.Alloc {
			if bufs[src.Slot[i]], err = rec.Alloc(ev.Size, 0); err != nil {
				t.Fatal(err)
			}
		} else if err := rec.Free(bufs[src.Slot[i]]); err != nil {
			t.Fatal(err)
		}
	}
	if err := rec.Flush(); err != nil {
		t.Fatal(err)
	}
	got, err := trace.Read(&out, "recorded")
	if err != nil {
		t.Fatalf("recorded trace does not read back: %v", err)
	}
	if len(got.Events) != len(src.Events) || got.PeakLiveBytes != src.PeakLiveBytes {
		t.Fatalf("recorded %d events, peak %d; source %d events, peak %d", len(got.Events), got.PeakLiveBytes, len(src.Events), src.PeakLiveBytes)
	}
	for i := range src.Events {
		s, g := src.Events[i], got.Events[i]
		if s.Kind != g.Kind || s.Size != g.Size || src.Slot[i] != got.Slot[i] {
			t.Fatalf("event %d: recorded %v, source %v", i, g, s)
		}
	}
}

type failingWriter struct{}

func (failingWriter) Write(p []byte) (int, error) { return 0, errors.New("disk full") }

// A failing trace writer never fails the program's allocations; the error
// surfaces at Flush.
func TestRecorderWriteErrorDoesNotFailAllocs(t *testing.T) {
	a, err := gpumem.New(sim.MustNew(sim.Config{Capacity: 64 << 20}), gpumem.Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	w, err := trace.NewWriter(failingWriter{})
	if err != nil {
		t.Fatal(err)
	}
	rec := gpumem.NewRecorder(a, w)
	for i := 0; i < 2000; i++ { // enough to overflow any write buffer
		b, err := rec.Alloc(4096, 0)
		if err != nil {
			t.Fatalf("alloc %d failed because of the trace writer: %v", i, err)
		}
		if err := rec.Free(b); err != nil {
			t.Fatal(err)
		}
	}
	if err := rec.Flush(); err == nil {
		t.Fatal("Flush reported no error after the writer failed")
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
