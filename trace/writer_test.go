package trace

import (
	"bytes"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// writeEvents writes events with w.
func writeEvents(t testing.TB, w *Writer, events []Event) {
	t.Helper()
	for _, e := range events {
		var err error
		if e.Kind == Alloc {
			err = w.Alloc(e.ID, e.Size, e.Stream, e.TimeUS)
		} else {
			err = w.Free(e.ID, e.TimeUS)
		}
		if err != nil {
			t.Fatalf("writing %v: %v", e, err)
		}
	}
}

var roundTripEvents = []Event{
	{Alloc, 0, 154389504, 0, 4},
	{Alloc, 1, 3145728, 0, 31442},
	{Free, 1, 0, 0, 31502},
	{Alloc, 2, 1, 0x7f3a00001000, 31502},
	{Alloc, math.MaxUint64, MaxSize, math.MaxUint64, 40000},
	{Alloc, 12345678901, 512, 3, 40000},
	{Free, 0, 0, 0, 50000},
	{Free, math.MaxUint64, 0, 0, math.MaxUint64},
}

func TestWriterRoundTrip(t *testing.T) {
	var buf bytes.Buffer
	w, err := NewWriter(&buf)
	if err != nil {
		t.Fatal(err)
	}
	writeEvents(t, w, roundTripEvents)
	if err := w.Flush(); err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(buf.String(), hdr+"a 0 154389504 0 4\na 1 3145728 0 31442\nf 1 31502\n") {
		t.Errorf("output starts\n%.120s", buf.String())
	}
	rd, err := NewReader(&buf)
	if err != nil {
		t.Fatal(err)
	}
	var got []Event
	for {
		e, err := rd.Next()
		if err != nil {
			if err.Error() != "EOF" {
				t.Fatal(err)
			}
			break
		}
		got = append(got, e)
	}
	if !slices.Equal(got, roundTripEvents) {
		t.Errorf("read back\n%v\nwant\n%v", got, roundTripEvents)
	}
}

func TestCreateLoad(t *testing.T) {
	dir := t.TempDir()
	tests := []struct{ file, name string }{
		{"run.trace.gz", "run"},
		{"run.trace", "run"},
		{"run.txt", "run"},
		{"run.txt.gz", "run"},
		{"run.gz", "run"},
		{"run.v2.trace.gz", "run.v2"},
		{"plain", "plain"},
	}
	for _, tt := range tests {
		t.Run(tt.file, func(t *testing.T) {
			path := filepath.Join(dir, tt.file)
			w, err := Create(path)
			if err != nil {
				t.Fatal(err)
			}
			writeEvents(t, w.Writer, roundTripEvents)
			if err := w.Close(); err != nil {
				t.Fatal(err)
			}
			if err := w.Close(); err == nil {
				t.Error("second Close succeeded")
			}
			raw, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			if gz := len(raw) > 2 && raw[0] == 0x1f && raw[1] == 0x8b; gz != strings.HasSuffix(tt.file, ".gz") {
				t.Errorf("file gzip-compressed: %v", gz)
			}
			tr, err := Load(path)
			if err != nil {
				t.Fatal(err)
			}
			if tr.Name != tt.name {
				t.Errorf("Name %q, want %q", tr.Name, tt.name)
			}
			if !slices.Equal(tr.Events, roundTripEvents) {
				t.Errorf("events\n%v\nwant\n%v", tr.Events, roundTripEvents)
			}
			if tr.Requests != 5 || tr.PeakLiveBytes != 154389504+1+MaxSize+512 {
				t.Errorf("Requests %d, PeakLiveBytes %d", tr.Requests, tr.PeakLiveBytes)
			}
			if want := []uint64{0, 0x7f3a00001000, math.MaxUint64, 3}; !slices.Equal(tr.Streams, want) {
				t.Errorf("Streams %v, want %v", tr.Streams, want)
			}
		})
	}
}

func TestLoadErrors(t *testing.T) {
	if _, err := Load(filepath.Join(t.TempDir(), "missing.trace.gz")); !os.IsNotExist(err) {
		t.Errorf("Load of a missing file: %v", err)
	}
	if _, err := Create(filepath.Join(t.TempDir(), "no", "such", "dir.gz")); err == nil {
		t.Error("Create in a missing directory succeeded")
	}
}

func TestWriterRejects(t *testing.T) {
	tests := []struct {
		name string
		do   func(w *Writer) error
		msg  string
	}{
		{"size 0", func(w *Writer) error { return w.Alloc(1, 0, 0, 10) }, "size is 0"},
		{"size above 1 PiB", func(w *Writer) error { return w.Alloc(1, MaxSize+1, 0, 10) }, "larger than 1 PiB"},
		{"alloc backwards", func(w *Writer) error { return w.Alloc(1, 1, 0, 9) }, "before the previous event's 10 us"},
		{"free backwards", func(w *Writer) error { return w.Free(0, 9) }, "before the previous event's 10 us"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var buf bytes.Buffer
			w, _ := NewWriter(&buf)
			if err := w.Alloc(0, 1, 0, 10); err != nil {
				t.Fatal(err)
			}
			err := tt.do(w)
			if err == nil || !strings.Contains(err.Error(), tt.msg) {
				t.Fatalf("error %v, want %q", err, tt.msg)
			}
			w.Flush()
			if want := hdr + "a 0 1 0 10\n"; buf.String() != want {
				t.Errorf("output %q, want %q (nothing written for the rejected event)", buf.String(), want)
			}
		})
	}
}

func TestEventString(t *testing.T) {
	for _, tt := range []struct {
		e    Event
		want string
	}{
		{Event{Alloc, 3, 4096, 7, 12}, "a 3 4096 7 12"},
		{Event{Free, 3, 0, 0, 15}, "f 3 15"},
	} {
		if got := tt.e.String(); got != tt.want {
			t.Errorf("%#v.String() = %q, want %q", tt.e, got, tt.want)
		}
	}
	if Alloc.String() != "a" || Free.String() != "f" || Kind('x').String() != "'x'" {
		t.Errorf("Kind.String: %v %v %v", Alloc, Free, Kind('x'))
	}
}
