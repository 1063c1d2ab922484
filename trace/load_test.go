package trace

import (
	"bytes"
	"compress/gzip"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
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

// TestPeakLivePasses: what the trace never frees stays live from the pass
// that allocated it, and later passes do not allocate it again.
func TestPeakLivePasses(t *testing.T) {
	for _, tc := range []struct {
		name, text string
		one, three uint64
	}{
		// Everything freed: every pass peaks as the first.
		{"freed", "a 0 10 0 0\na 1 20 0 1\nf 0 2\nf 1 3\n", 30, 30},
		// A workspace allocated once at the start and kept: the same.
		{"workspace", "a 0 5 0 0\na 1 20 0 1\nf 1 2\na 2 7 0 3\nf 2 4\n", 25, 25},
		// A request kept after the peak: the next pass reaches the peak
		// with it live.
		{"kept late", "a 0 20 0 0\nf 0 1\na 1 8 0 2\n", 20, 28},
	} {
		tr, err := Read(strings.NewReader(hdr+tc.text), tc.name)
		if err != nil {
			t.Fatal(err)
		}
		if got := tr.PeakLivePasses(1); got != tc.one || tr.PeakLiveBytes != tc.one {
			t.Errorf("%s: one pass %d, PeakLiveBytes %d; want %d", tc.name, got, tr.PeakLiveBytes, tc.one)
		}
		if got := tr.PeakLivePasses(3); got != tc.three {
			t.Errorf("%s: three passes %d; want %d", tc.name, got, tc.three)
		}
	}
}
