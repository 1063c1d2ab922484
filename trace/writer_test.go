package trace

import (
	"bytes"
	"maps"
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
			err = w.AllocSite(e.ID, e.Size, e.Stream, e.TimeUS, e.Site)
		} else {
			err = w.Free(e.ID, e.TimeUS)
		}
		if err != nil {
			t.Fatalf("writing %v: %v", e, err)
		}
	}
}

var roundTripEvents = []Event{
	alloc(0, 154389504, 0, 4),
	alloc(1, 3145728, 0, 31442),
	free(1, 31502),
	alloc(2, 1, 0x7f3a00001000, 31502),
	alloc(math.MaxUint64, MaxSize, math.MaxUint64, 40000),
	alloc(12345678901, 512, 3, 40000),
	free(0, 50000),
	free(math.MaxUint64, math.MaxUint64),
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

// TestTrims: "t" lines written by Writer.Trim are read back as
// Trace.Trims, each the index of the event it came before, one after the
// last event included; Reader.Trims counts them as it goes; a trim back
// in time is refused, writing nothing.
func TestTrims(t *testing.T) {
	var buf bytes.Buffer
	w, err := NewWriter(&buf)
	if err != nil {
		t.Fatal(err)
	}
	steps := []func() error{
		func() error { return w.Trim(0) }, // before anything
		func() error { return w.Alloc(0, 4096, 0, 1) },
		func() error { return w.Free(0, 2) },
		func() error { return w.Trim(3) },
		func() error { return w.Trim(3) }, // twice in a row
		func() error { return w.Alloc(1, 8192, 0, 4) },
		func() error { return w.Trim(5) }, // after the last event
	}
	for i, step := range steps {
		if err := step(); err != nil {
			t.Fatalf("step %d: %v", i, err)
		}
	}
	if err := w.Trim(4); err == nil || !strings.Contains(err.Error(), "before the previous event's 5 us") {
		t.Errorf("a trim back in time: %v", err)
	}
	if err := w.Flush(); err != nil {
		t.Fatal(err)
	}
	want := hdr + "t 0\na 0 4096 0 1\nf 0 2\nt 3\nt 3\na 1 8192 0 4\nt 5\n"
	if !strings.HasSuffix(buf.String(), strings.TrimPrefix(want, hdr)) {
		t.Errorf("written:\n%s\nwant the lines of\n%s", buf.String(), want)
	}
	tr, err := Read(bytes.NewReader(buf.Bytes()), "trims.trace")
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(tr.Trims, []int32{0, 2, 2, 3}) || len(tr.Events) != 3 {
		t.Errorf("Trims = %v with %d events, want [0 2 2 3] with 3", tr.Trims, len(tr.Events))
	}
	rd, err := NewReader(bytes.NewReader(buf.Bytes()))
	if err != nil {
		t.Fatal(err)
	}
	var seen []int
	for {
		if _, err := rd.Next(); err != nil {
			break
		}
		seen = append(seen, rd.Trims())
	}
	if !slices.Equal(seen, []int{1, 1, 3}) || rd.Trims() != 4 {
		t.Errorf("Reader.Trims after each event %v, at the end %d; want [1 1 3], 4", seen, rd.Trims())
	}
}

func TestWriterSites(t *testing.T) {
	var buf bytes.Buffer
	w, _ := NewWriter(&buf)
	sites := map[uint32]string{
		1:              "forward model.py:10 < <module> train.py:3",
		math.MaxUint32: "inner\tframe <lambda> caf\u00e9.py:1",
		5:              strings.Repeat("x", MaxSiteText),
	}
	steps := []func() error{
		func() error { return w.Site(1, sites[1]) },
		func() error { return w.AllocSite(0, 10, 0, 0, 1) },
		func() error { return w.AllocSite(1, 20, 0, 1, 0) },
		func() error { return w.Site(math.MaxUint32, sites[math.MaxUint32]) },
		func() error { return w.Site(5, sites[5]) },
		func() error { return w.AllocSite(2, 30, 7, 2, math.MaxUint32) },
		func() error { return w.Free(0, 3) },
		func() error { return w.AllocSite(3, 40, 0, 3, 1) },
	}
	for i, step := range steps {
		if err := step(); err != nil {
			t.Fatalf("step %d: %v", i, err)
		}
	}
	w.Flush()
	want := hdr + "s 1 forward model.py:10 < <module> train.py:3\na 0 10 0 0 1\na 1 20 0 1\n" +
		"s 4294967295 inner\tframe <lambda> caf\u00e9.py:1\n"
	if !strings.HasPrefix(buf.String(), want) {
		t.Errorf("output starts\n%.200s\nwant\n%s", buf.String(), want)
	}
	tr, err := Read(&buf, "sites")
	if err != nil {
		t.Fatal(err)
	}
	wantEvents := []Event{
		allocSite(0, 10, 0, 0, 1),
		alloc(1, 20, 0, 1),
		allocSite(2, 30, 7, 2, math.MaxUint32),
		free(0, 3),
		allocSite(3, 40, 0, 3, 1),
	}
	if !slices.Equal(tr.Events, wantEvents) {
		t.Errorf("events\n%v\nwant\n%v", tr.Events, wantEvents)
	}
	if !maps.Equal(tr.Sites, sites) {
		t.Errorf("sites differ: %d read, %d written", len(tr.Sites), len(sites))
	}
}

func TestWriterSiteRejects(t *testing.T) {
	tests := []struct {
		name string
		do   func(w *Writer) error
		msg  string
	}{
		{"alloc at undefined site", func(w *Writer) error { return w.AllocSite(1, 1, 0, 10, 2) }, "trace: Alloc 1: site 2 is not defined"},
		{"site 0", func(w *Writer) error { return w.Site(0, "f") }, "trace: Site 0: sites are numbered from 1"},
		{"site twice", func(w *Writer) error { return w.Site(1, "g") }, "trace: Site 1: already written"},
		{"empty", func(w *Writer) error { return w.Site(2, "") }, "the text is empty"},
		{"newline", func(w *Writer) error { return w.Site(2, "f x.py:1\ng y.py:2") }, "line break"},
		{"carriage return", func(w *Writer) error { return w.Site(2, "f\r") }, "line break"},
		{"leading space", func(w *Writer) error { return w.Site(2, " f") }, "starts or ends with a space or a tab"},
		{"trailing tab", func(w *Writer) error { return w.Site(2, "f\t") }, "starts or ends with a space or a tab"},
		{"blank", func(w *Writer) error { return w.Site(2, " ") }, "starts or ends with a space or a tab"},
		{"too long", func(w *Writer) error { return w.Site(2, strings.Repeat("x", MaxSiteText+1)) }, "text of 61441 bytes is longer than 61440"},
		{"not utf-8", func(w *Writer) error { return w.Site(2, "f \xff") }, "not valid UTF-8"},
		{"bad size with a good site", func(w *Writer) error { return w.AllocSite(1, 0, 0, 10, 1) }, "size is 0"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var buf bytes.Buffer
			w, _ := NewWriter(&buf)
			if err := w.Site(1, "f x.py:1"); err != nil {
				t.Fatal(err)
			}
			if err := w.AllocSite(0, 1, 0, 10, 1); err != nil {
				t.Fatal(err)
			}
			err := tt.do(w)
			if err == nil || !strings.Contains(err.Error(), tt.msg) {
				t.Fatalf("error %v, want %q", err, tt.msg)
			}
			w.Flush()
			if want := hdr + "s 1 f x.py:1\na 0 1 0 10 1\n"; buf.String() != want {
				t.Errorf("output %q, want %q (nothing written for the rejected line)", buf.String(), want)
			}
		})
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
		{alloc(3, 4096, 7, 12), "a 3 4096 7 12"},
		{free(3, 15), "f 3 15"},
		{allocSite(3, 4096, 7, 12, 9), "a 3 4096 7 12 9"},
	} {
		if got := tt.e.String(); got != tt.want {
			t.Errorf("%#v.String() = %q, want %q", tt.e, got, tt.want)
		}
	}
	if Alloc.String() != "a" || Free.String() != "f" || Kind('x').String() != "'x'" {
		t.Errorf("Kind.String: %v %v %v", Alloc, Free, Kind('x'))
	}
}

// TestWriterV2 writes a v2 trace line by line, and refuses what v2 cannot
// say: a request out of order, a free of one never allocated.
func TestWriterV2(t *testing.T) {
	var buf bytes.Buffer
	w, err := NewWriterFormat(&buf, V2)
	if err != nil {
		t.Fatal(err)
	}
	steps := []error{
		w.Alloc(0, 4096, 0, 5),
		w.Site(3, "f x.py:1"),
		w.AllocSite(1, 512, 7, 7, 3),
		w.Free(0, 7),
		w.Trim(11),
		w.Alloc(2, 8, 0, 12),
		w.Free(1, 22),
	}
	for i, err := range steps {
		if err != nil {
			t.Fatalf("step %d: %v", i, err)
		}
	}
	for _, bad := range []struct {
		err  error
		want string
	}{
		{w.Alloc(5, 8, 0, 30), "trace: Alloc 5: a v2 trace numbers requests in order; want 3"},
		{w.Free(3, 30), "trace: Free 3: request 3 was never allocated"},
		{w.Free(2, 21), "trace: f 2: time 21 us is before the previous event's 22 us"},
	} {
		if bad.err == nil || bad.err.Error() != bad.want {
			t.Errorf("error %v, want %q", bad.err, bad.want)
		}
	}
	if err := w.Flush(); err != nil {
		t.Fatal(err)
	}
	want := headerLineV2 + "a 4096 0 5\ns 3 f x.py:1\na 512 7 2 3\nf 1 0\nt 4\na 8 0 1\nf 1 10\n"
	if got := buf.String(); got != want {
		t.Fatalf("wrote\n%s\nwant\n%s", got, want)
	}
	if _, err := Read(strings.NewReader(want), "x.trace"); err != nil {
		t.Fatalf("reading it back: %v", err)
	}
	if _, err := NewWriterFormat(&buf, 3); err == nil {
		t.Fatal("NewWriterFormat accepted format 3")
	}
	for name, want := range map[string]Format{"v1": V1, "v2": V2, "v3": 0, "V2": 0, "": 0} {
		if f, ok := ParseFormat(name); f != want || ok != (want != 0) {
			t.Errorf("ParseFormat(%q) = %v, %v; want %v", name, f, ok, want)
		}
	}
}
