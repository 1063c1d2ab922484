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
