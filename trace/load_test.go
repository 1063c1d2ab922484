package trace

import (
	"bytes"
	"compress/gzip"
	"io"
	"os"
	"path/filepath"
	"slices"
	"testing"
)

const traceDir = "../testdata/traces"

// shipped are the figures of the table in testdata/traces/README.md.
var shipped = []struct {
	name     string
	requests int
	peak     uint64
}{
	{"gpt2_train_varlen", 43119, 13064770840},
	{"bert_mlm_varlen", 45082, 12174453316},
	{"t5_train_varlen", 71739, 5051313220},
	{"resnet50_train", 15821, 3124435472},
	{"gpt2_generate", 262171, 951473616},
	{"sweep_create_dispose", 3884, 10772283396},
}

// tracePath returns the path of a shipped trace, or skips the test.
func tracePath(tb testing.TB, name string) string {
	tb.Helper()
	path := filepath.Join(traceDir, name+".trace.gz")
	if _, err := os.Stat(path); err != nil {
		tb.Skipf("shipped trace %s not found (run from the trace package directory of a full checkout): %v", path, err)
	}
	return path
}

func TestLoadShipped(t *testing.T) {
	for _, tt := range shipped {
		t.Run(tt.name, func(t *testing.T) {
			tr, err := Load(tracePath(t, tt.name))
			if err != nil {
				t.Fatal(err)
			}
			if tr.Name != tt.name {
				t.Errorf("Name %q, want %q", tr.Name, tt.name)
			}
			if tr.Requests != tt.requests {
				t.Errorf("Requests %d, want %d", tr.Requests, tt.requests)
			}
			if tr.PeakLiveBytes != tt.peak {
				t.Errorf("PeakLiveBytes %d, want %d", tr.PeakLiveBytes, tt.peak)
			}
			if !slices.Equal(tr.Streams, []uint64{0}) {
				t.Errorf("Streams %v, want [0]", tr.Streams)
			}
			if len(tr.Slot) != len(tr.Events) {
				t.Fatalf("%d slots for %d events", len(tr.Slot), len(tr.Events))
			}
			// Slots agree with IDs: every free names the slot of its alloc.
			idOfSlot := make([]uint64, 0, tr.Requests)
			for i, e := range tr.Events {
				s := tr.Slot[i]
				if e.Kind == Alloc {
					if int(s) != len(idOfSlot) {
						t.Fatalf("event %d (%v): slot %d, want %d", i, e, s, len(idOfSlot))
					}
					idOfSlot = append(idOfSlot, e.ID)
				} else if idOfSlot[s] != e.ID {
					t.Fatalf("event %d (%v): slot %d is request %d", i, e, s, idOfSlot[s])
				}
			}
		})
	}
}

// TestShippedRoundTrip writes a shipped trace back out and reads it again.
func TestShippedRoundTrip(t *testing.T) {
	tr, err := Load(tracePath(t, "resnet50_train"))
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	w, _ := NewWriter(&buf)
	writeEvents(t, w, tr.Events)
	if err := w.Flush(); err != nil {
		t.Fatal(err)
	}
	// The shipped file is byte for byte what Writer writes.
	f, err := os.Open(tracePath(t, "resnet50_train"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	zr, err := gzip.NewReader(f)
	if err != nil {
		t.Fatal(err)
	}
	orig, err := io.ReadAll(zr)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(buf.Bytes(), orig) {
		t.Errorf("Writer output (%d bytes) differs from the shipped file (%d bytes)", buf.Len(), len(orig))
	}
	tr2, err := Read(&buf, "copy")
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(tr.Events, tr2.Events) || !slices.Equal(tr.Slot, tr2.Slot) || tr.PeakLiveBytes != tr2.PeakLiveBytes {
		t.Error("round trip changed the trace")
	}
}

// BenchmarkLoad loads the largest shipped trace (524k events) from its
// gzip-compressed file.
func BenchmarkLoad(b *testing.B) {
	path := tracePath(b, "gpt2_generate")
	events, n := 0, 0
	for b.Loop() {
		tr, err := Load(path)
		if err != nil {
			b.Fatal(err)
		}
		events = len(tr.Events)
		n++
	}
	b.ReportMetric(float64(events)*float64(n)/b.Elapsed().Seconds(), "events/s")
}

// BenchmarkReadPlain parses the same trace already decompressed in memory:
// the cost of parsing and checking alone.
func BenchmarkReadPlain(b *testing.B) {
	path := tracePath(b, "gpt2_generate")
	f, err := os.Open(path)
	if err != nil {
		b.Fatal(err)
	}
	zr, err := gzip.NewReader(f)
	if err != nil {
		b.Fatal(err)
	}
	data, err := io.ReadAll(zr)
	f.Close()
	if err != nil {
		b.Fatal(err)
	}
	b.SetBytes(int64(len(data)))
	events, n := 0, 0
	for b.Loop() {
		tr, err := Read(bytes.NewReader(data), "gpt2_generate.trace")
		if err != nil {
			b.Fatal(err)
		}
		events = len(tr.Events)
		n++
	}
	b.ReportMetric(float64(events)*float64(n)/b.Elapsed().Seconds(), "events/s")
}
