package trace

import (
	"bytes"
	"compress/gzip"
	"errors"
	"io"
	"maps"
	"math"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
)

const hdr = "# gpumem-trace v1: a ID SIZE STREAM T_US | f ID T_US\n"

func gzipBytes(t testing.TB, b []byte) []byte {
	t.Helper()
	var buf bytes.Buffer
	zw := gzip.NewWriter(&buf)
	if _, err := zw.Write(b); err != nil {
		t.Fatal(err)
	}
	if err := zw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// alloc and free return the events of the lines "a id size stream t" and
// "f id t".
func alloc(id, size, stream, t uint64) Event {
	return Event{Kind: Alloc, ID: id, Size: size, Stream: stream, TimeUS: t}
}

func free(id, t uint64) Event { return Event{Kind: Free, ID: id, TimeUS: t} }

// hdr2 is a v2 header line.
const hdr2 = "# gpumem-trace v2: a SIZE STREAM DT_US | f BACK DT_US | t DT_US\n"

func TestReadBadInput(t *testing.T) {
	tests := []struct {
		name string
		in   string
		line int
		msg  string // substring of the message
	}{
		{"empty", "", 1, "missing header"},
		{"no header", "a 0 1 0 0\n", 1, `missing header line "# gpumem-trace v1"; got "a 0 1 0 0"`},
		{"blank before header", "\n" + hdr, 1, "missing header"},
		{"wrong version", "# gpumem-trace v3: a ID SIZE STREAM T_US\n", 1, "unsupported format"},
		{"version prefix", "# gpumem-trace v10\n", 1, "unsupported format"},
		{"unknown kind", hdr + "a 0 1 0 0\nx 1 2\n", 3, `unknown event kind "x"`},
		{"trim 1 field", hdr + "a 0 1 0 0\nt\n", 3, "t line with 1 fields; want 2: t T_US"},
		{"trim 3 fields", hdr + "a 0 1 0 0\nt 5 6\n", 3, "t line with 3 fields; want 2"},
		{"trim bad time", hdr + "a 0 1 0 0\nt -5\n", 3, `t: T_US "-5" is not an unsigned decimal number`},
		{"trim back in time", hdr + "a 0 1 0 9\nt 5\n", 3, "t: time 5 us is before the previous event's 9 us"},
		{"event before trim", hdr + "t 9\na 0 1 0 5\n", 3, "a 0: time 5 us is before the previous event's 9 us"},
		{"long kind", hdr + "alloc 0 1 0 0\n", 2, `unknown event kind "alloc"`},
		{"upper kind", hdr + "A 0 1 0 0\n", 2, `unknown event kind "A"`},
		{"alloc 4 fields", hdr + "a 0 1 0\n", 2, "a event with 4 fields; want 5"},
		{"alloc 7 fields", hdr + "s 1 f x.py:1\na 0 1 0 0 1 1\n", 3, "a event with 7 fields; want 5 or 6: a ID SIZE STREAM T_US [SITE]"},
		{"alloc 1 field", hdr + "a\n", 2, "a event with 1 fields; want 5"},
		{"free 2 fields", hdr + "a 0 1 0 0\nf 0\n", 3, "f event with 2 fields; want 3"},
		{"free 5 fields", hdr + "a 0 1 0 0\nf 0 1 0 5\n", 3, "f event with 5 fields; want 3"},
		{"bad id", hdr + "a x 1 0 0\n", 2, `a: ID "x" is not a decimal number`},
		{"bad size", hdr + "a 3 1k 0 0\n", 2, `a 3: SIZE "1k" is not a decimal number`},
		{"bad stream", hdr + "a 3 1 0x7 0\n", 2, `a 3: STREAM "0x7" is not a decimal number`},
		{"bad time", hdr + "a 3 1 0 1.5\n", 2, `a 3: T_US "1.5" is not a decimal number`},
		{"plus sign", hdr + "a 3 +1 0 0\n", 2, `SIZE "+1" is not a decimal number`},
		{"negative size", hdr + "a 3 -1 0 0\n", 2, `a 3: SIZE "-1" is negative`},
		{"negative id", hdr + "f -7 0\n", 2, `f: ID "-7" is negative`},
		{"negative time", hdr + "a 0 1 0 0\nf 0 -5\n", 3, `f 0: T_US "-5" is negative`},
		{"minus alone", hdr + "a 0 - 0 0\n", 2, `SIZE "-" is not a decimal number`},
		{"overflow id", hdr + "a 18446744073709551616 1 0 0\n", 2, `ID "18446744073709551616" overflows 64 bits`},
		{"overflow time", hdr + "a 0 1 0 99999999999999999999\n", 2, "overflows 64 bits"},
		{"overflow long", hdr + "a 0 1 0 000000000000000000000018446744073709551616\n", 2, "overflows 64 bits"},
		{"size 0", hdr + "a 0 1 0 0\na 1 0 0 0\n", 3, "a 1: SIZE is 0"},
		{"size above 1 PiB", hdr + "a 5 1125899906842625 0 0\n", 2, "a 5: SIZE 1125899906842625 is larger than 1 PiB"},
		{"duplicate alloc", hdr + "a 0 1 0 0\na 1 1 0 0\na 0 1 0 0\n", 4, "a 0: request 0 was already allocated at line 2"},
		{"realloc after free", hdr + "a 0 1 0 0\nf 0 1\na 0 1 0 2\n", 4, "a 0: request 0 was already allocated at line 2"},
		{"free never allocated", hdr + "a 0 1 0 0\nf 77 1\n", 3, "f 77: request 77 was never allocated"},
		{"free huge id", hdr + "a 0 1 0 0\nf 18446744073709551615 1\n", 3, "f 18446744073709551615: request 18446744073709551615 was never allocated"},
		{"double free", hdr + "a 0 1 0 0\nf 0 1\nf 0 2\n", 4, "f 0: request 0 was already freed at line 3"},
		{"double free sparse", hdr + "a 99999999 1 0 0\nf 99999999 1\nf 99999999 2\n", 4, "f 99999999: request 99999999 was already freed at line 3"},
		{"time backwards alloc", hdr + "a 0 1 0 10\na 1 1 0 9\n", 3, "a 1: time 9 us is before the previous event's 10 us"},
		{"time backwards free", hdr + "a 0 1 0 10\nf 0 3\n", 3, "f 0: time 3 us is before the previous event's 10 us"},
		{"line counts comments", hdr + "# note\n\na 0 1 0 0\n   \n# x\nf 1 1\n", 7, "f 1: request 1 was never allocated"},
		{"crlf", hdr + "a 0 1 0 0\r\nf 1 1\r\n", 3, "f 1: request 1 was never allocated"},
		// Every line ends with a newline: a file without one at its end was
		// cut short, and its cut line may read as a shorter valid one ("f 0"
		// of "f 0 12", "a 0 1 0 1" of "a 0 1 0 12").
		{"no final newline", hdr + "a 0 1 0 0\nf 0", 3, `the last line, "f 0", has no newline: the trace is cut short`},
		{"cut inside a valid line", hdr + "a 0 1 0 0\na 1 2 0 1", 3, "has no newline"},
		{"bare header", "# gpumem-trace v1", 1, "has no newline"},
		{"line too long", hdr + "# " + strings.Repeat("x", maxLine) + "\n", 2, "line longer than"},
		{"nul byte", hdr + "a 0 1\x00 0 0\n", 2, `SIZE "1\x00" is not a decimal number`},

		// Sites.
		{"site undefined", hdr + "s 1 f x.py:1\na 0 1 0 0 2\n", 3, `a 0: site 2 is not defined; an "s 2 TEXT" line must come first`},
		{"site used before defined", hdr + "a 0 1 0 0 1\ns 1 f x.py:1\n", 2, "a 0: site 1 is not defined"},
		{"site redefined", hdr + "s 1 f x.py:1\ns 2 g\ns 1 f x.py:1\n", 4, "s 1: site 1 was already defined at line 2"},
		{"site 0 defined", hdr + "s 0 f x.py:1\n", 2, "s 0: SITE is 0; sites are numbered from 1"},
		{"site 0 used", hdr + "a 0 1 0 0 0\n", 2, "a 0: SITE is 0; sites are numbered from 1 (leave the field out for none)"},
		{"site without text", hdr + "s 1\n", 2, "s 1: no TEXT; want s SITE TEXT"},
		{"site with blank text", hdr + "s 1 \t  \r\n", 2, "s 1: no TEXT"},
		{"site alone", hdr + "s\n", 2, "s line with no SITE; want s SITE TEXT"},
		{"site not a number", hdr + "s x f\n", 2, `s: SITE "x" is not a decimal number`},
		{"site negative", hdr + "s -1 f\n", 2, `s: SITE "-1" is negative`},
		{"site overflows", hdr + "s 4294967296 f\n", 2, `s: SITE "4294967296" overflows 32 bits`},
		{"alloc site overflows", hdr + "a 0 1 0 0 4294967296\n", 2, `a 0: SITE "4294967296" overflows 32 bits`},
		{"alloc site not a number", hdr + "a 0 1 0 0 one\n", 2, `a 0: SITE "one" is not a decimal number`},
		{"free with site", hdr + "s 1 f\na 0 1 0 0 1\nf 0 1 1\n", 4, "f event with 4 fields; want 3: f ID T_US"},
		{"site text too long", hdr + "s 1 " + strings.Repeat("x", MaxSiteText+1) + "\n", 2, "s 1: TEXT of 61441 bytes is longer than 61440"},
		{"site text not utf-8", hdr + "s 1 f \xff.py:1\n", 2, "s 1: TEXT is not valid UTF-8"},
		{"site text with cr", hdr + "s 1 f\rg\n", 2, "s 1: TEXT holds a carriage return"},
		{"site upper case", hdr + "S 1 f\n", 2, `unknown event kind "S"`},
		{"site spelled out", hdr + "site 1 f\n", 2, `unknown event kind "site"`},

		// v2: IDs implicit, times as deltas.
		{"v2 unknown kind", hdr2 + "a 1 0 0\nx 1 2\n", 3, `unknown event kind "x"; want "a" (a SIZE STREAM DT_US [SITE])`},
		{"v2 alloc v1 fields", hdr2 + "a 0 1 0 0 0 0\n", 2, "a event with 7 fields; want 4 or 5: a SIZE STREAM DT_US [SITE]"},
		{"v2 alloc 3 fields", hdr2 + "a 1 0\n", 2, "a event with 3 fields; want 4 or 5"},
		{"v2 free 2 fields", hdr2 + "a 1 0 0\nf 0\n", 3, "f event with 2 fields; want 3: f BACK DT_US"},
		{"v2 size 0", hdr2 + "a 1 0 0\na 0 0 0\n", 3, "a 1: SIZE is 0"},
		{"v2 bad size", hdr2 + "a 1k 0 0\n", 2, `a 0: SIZE "1k" is not a decimal number`},
		{"v2 negative delta", hdr2 + "a 1 0 5\na 1 0 -1\n", 3, `a 1: DT_US "-1" is negative`},
		{"v2 time overflows", hdr2 + "a 1 0 18446744073709551615\na 1 0 1\n", 3, "a 1: DT_US 1 after 18446744073709551615 us overflows 64 bits"},
		{"v2 free before the first", hdr2 + "a 1 0 0\na 1 0 0\nf 2 1\n", 4, "f: BACK 2 reaches before the first request (2 allocated so far)"},
		{"v2 free with none", hdr2 + "f 0 1\n", 2, "f: BACK 0 reaches before the first request (0 allocated so far)"},
		{"v2 double free", hdr2 + "a 1 0 0\na 1 0 0\nf 1 1\nf 1 1\n", 5, "f 0: request 0 was already freed at line 4"},
		{"v2 bad back", hdr2 + "a 1 0 0\nf x 1\n", 3, `f: BACK "x" is not a decimal number`},
		{"v2 trim fields", hdr2 + "t\n", 2, "t line with 1 fields; want 2: t DT_US"},
		{"v2 trim overflows", hdr2 + "a 1 0 18446744073709551615\nt 3\n", 3, "t: DT_US 3 after 18446744073709551615 us overflows 64 bits"},
		{"v2 site undefined", hdr2 + "a 1 0 0 4\n", 2, `a 0: site 4 is not defined`},
	}
	for _, tt := range tests {
		for _, compressed := range []bool{false, true} {
			name := tt.name
			in := []byte(tt.in)
			if compressed {
				name += "/gzip"
				in = gzipBytes(t, in)
			}
			t.Run(name, func(t *testing.T) {
				tr, err := Read(bytes.NewReader(in), "x.trace.gz")
				if err == nil {
					t.Fatalf("Read accepted the input (%d events)", len(tr.Events))
				}
				if !errors.Is(err, ErrSyntax) {
					t.Fatalf("error %v does not match ErrSyntax", err)
				}
				var se *SyntaxError
				if !errors.As(err, &se) {
					t.Fatalf("error %v is a %T, not a *SyntaxError", err, err)
				}
				if se.Line != tt.line {
					t.Errorf("line %d, want %d (error %v)", se.Line, tt.line, err)
				}
				if se.Name != "x.trace.gz" {
					t.Errorf("name %q, want x.trace.gz", se.Name)
				}
				if !strings.Contains(se.Msg, tt.msg) {
					t.Errorf("message %q does not contain %q", se.Msg, tt.msg)
				}
				prefix := "trace x.trace.gz:" + strconv.Itoa(tt.line) + ": "
				if !strings.HasPrefix(err.Error(), prefix) {
					t.Errorf("error %q does not start with %q", err, prefix)
				}

				// The streaming Reader reports the same error.
				rd, err2 := NewReader(bytes.NewReader(in))
				for err2 == nil {
					_, err2 = rd.Next()
				}
				if !errors.As(err2, &se) || se.Line != tt.line || !strings.Contains(se.Msg, tt.msg) {
					t.Errorf("Reader: %v; want line %d, %q", err2, tt.line, tt.msg)
				}
				if se.Name != "" || !strings.HasPrefix(err2.Error(), "trace: line "+strconv.Itoa(tt.line)+": ") {
					t.Errorf("Reader error %q: want no name", err2)
				}
			})
		}
	}
}

func TestErrorString(t *testing.T) {
	_, err := Read(strings.NewReader(hdr+"a 0 1 0 0\nf 77 1\n"), "gpt2.trace.gz")
	const want = "trace gpt2.trace.gz:3: f 77: request 77 was never allocated"
	if err == nil || err.Error() != want {
		t.Fatalf("error %v, want %q", err, want)
	}
}

func allocSite(id, size, stream, t uint64, site uint32) Event {
	e := alloc(id, size, stream, t)
	e.Site = site
	return e
}

func TestReadGood(t *testing.T) {
	const maxU = "18446744073709551615"
	tests := []struct {
		name    string
		in      string
		want    []Event
		slots   []int32
		peak    uint64
		streams []uint64
		sites   map[uint32]string
	}{
		{
			name:    "header only",
			in:      hdr,
			peak:    0,
			streams: nil,
		},
		{
			name:    "bare header",
			in:      "# gpumem-trace v1\n",
			streams: nil,
		},
		{
			name: "readme example",
			in:   hdr + "a 0 154389504 0 4\na 1 3145728 0 31442\nf 1 31502\n",
			want: []Event{
				alloc(0, 154389504, 0, 4),
				alloc(1, 3145728, 0, 31442),
				free(1, 31502),
			},
			slots:   []int32{0, 1, 1},
			peak:    157535232,
			streams: []uint64{0},
		},
		{
			name: "spacing comments crlf",
			in:   "# gpumem-trace v1\r\n# comment\n\n\t a\t0  10 7 0 \r\n  #x\na 1 20 0 0\nf 0 5\na 2 1 7 6\nf 2 6\r\n",
			want: []Event{
				alloc(0, 10, 7, 0),
				alloc(1, 20, 0, 0),
				free(0, 5),
				alloc(2, 1, 7, 6),
				free(2, 6),
			},
			slots:   []int32{0, 1, 0, 2, 2},
			peak:    30,
			streams: []uint64{7, 0},
		},
		{
			name: "sparse and extreme ids",
			in: hdr + "a " + maxU + " 1125899906842624 " + maxU + " 0\na 5 2 0 1\na 4000 3 9 1\n" +
				"f " + maxU + " 2\na 0 4 " + maxU + " 3\nf 4000 " + maxU + "\n",
			want: []Event{
				alloc(math.MaxUint64, MaxSize, math.MaxUint64, 0),
				alloc(5, 2, 0, 1),
				alloc(4000, 3, 9, 1),
				free(math.MaxUint64, 2),
				alloc(0, 4, math.MaxUint64, 3),
				free(4000, math.MaxUint64),
			},
			slots:   []int32{0, 1, 2, 0, 3, 2},
			peak:    MaxSize + 5,
			streams: []uint64{math.MaxUint64, 0, 9},
		},
		{
			name: "leading zeros",
			in:   hdr + "a 007 0000000000000000000000000001 0 00\nf 7 1\n",
			want: []Event{
				alloc(7, 1, 0, 0),
				free(7, 1),
			},
			slots:   []int32{0, 0},
			peak:    1,
			streams: []uint64{0},
		},
		{
			name: "sites",
			in: hdr + "s 1 forward model.py:10 < <module> train.py:3\n" +
				"a 0 10 0 0 1\n" +
				"  s\t7\t  spaced\ttext  \t\r\n" +
				"a 1 20 0 1 7\na 2 5 0 2\nf 0 3\na 3 1 0 3 00001\n" +
				"s 4294967295 \u00e9t\u00e9 caf\u00e9.py:1\n" +
				"s 9 unused\n",
			want: []Event{
				allocSite(0, 10, 0, 0, 1),
				allocSite(1, 20, 0, 1, 7),
				alloc(2, 5, 0, 2),
				free(0, 3),
				allocSite(3, 1, 0, 3, 1),
			},
			slots:   []int32{0, 1, 2, 0, 3},
			peak:    35,
			streams: []uint64{0},
			sites: map[uint32]string{
				1:          "forward model.py:10 < <module> train.py:3",
				7:          "spaced\ttext",
				4294967295: "\u00e9t\u00e9 caf\u00e9.py:1",
				9:          "unused",
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			for _, in := range [][]byte{[]byte(tt.in), gzipBytes(t, []byte(tt.in))} {
				tr, err := Read(bytes.NewReader(in), "dir/t.txt")
				if err != nil {
					t.Fatal(err)
				}
				if tr.Name != "t" {
					t.Errorf("Name %q, want t", tr.Name)
				}
				if !slices.Equal(tr.Events, tt.want) {
					t.Errorf("events\n%v\nwant\n%v", tr.Events, tt.want)
				}
				if !slices.Equal(tr.Slot, tt.slots) {
					t.Errorf("slots %v, want %v", tr.Slot, tt.slots)
				}
				if tr.PeakLiveBytes != tt.peak {
					t.Errorf("peak %d, want %d", tr.PeakLiveBytes, tt.peak)
				}
				if !slices.Equal(tr.Streams, tt.streams) {
					t.Errorf("streams %v, want %v", tr.Streams, tt.streams)
				}
				if !maps.Equal(tr.Sites, tt.sites) || (tr.Sites == nil) != (tt.sites == nil) {
					t.Errorf("sites %v, want %v", tr.Sites, tt.sites)
				}
				allocs := 0
				for _, e := range tt.want {
					if e.Kind == Alloc {
						allocs++
					}
				}
				if tr.Requests != allocs {
					t.Errorf("Requests %d, want %d", tr.Requests, allocs)
				}
			}
		})
	}
}

func TestLiveBytesOverflow(t *testing.T) {
	var b strings.Builder
	b.WriteString(hdr)
	n := 1 << 14 // 2^14 requests of 1 PiB = 2^64 bytes
	for i := range n {
		b.WriteString("a " + strconv.Itoa(i) + " 1125899906842624 0 0\n")
	}
	_, err := Read(strings.NewReader(b.String()), "")
	var se *SyntaxError
	if !errors.As(err, &se) || se.Line != n+1 || !strings.Contains(se.Msg, "more than 2^64 bytes") {
		t.Fatalf("error %v; want an overflow at line %d", err, n+1)
	}
}

func TestTruncatedGzip(t *testing.T) {
	var b strings.Builder
	b.WriteString(hdr)
	for i := range 20000 {
		b.WriteString("a " + strconv.Itoa(i) + " " + strconv.Itoa(i*7919%100000+1) + " 0 " + strconv.Itoa(i) + "\n")
	}
	full := gzipBytes(t, []byte(b.String()))
	if _, err := Read(bytes.NewReader(full), "t.gz"); err != nil {
		t.Fatal(err)
	}
	for _, cut := range []int{2, 5, 10, 30, len(full) / 2, len(full) - 8, len(full) - 1} {
		t.Run(strconv.Itoa(cut), func(t *testing.T) {
			_, err := Read(bytes.NewReader(full[:cut]), "t.gz")
			var se *SyntaxError
			if !errors.As(err, &se) || !errors.Is(err, ErrSyntax) {
				t.Fatalf("error %v; want a *SyntaxError", err)
			}
			if !errors.Is(err, io.ErrUnexpectedEOF) || !strings.Contains(se.Msg, "truncated gzip") {
				t.Errorf("error %v; want a truncated gzip stream", err)
			}
			if se.Line < 1 || se.Line > 20002 {
				t.Errorf("line %d out of range", se.Line)
			}
		})
	}
}

func TestCorruptGzip(t *testing.T) {
	in := []byte(hdr + strings.Repeat("a 0 1 0 0\nf 0 1\n", 1)) // valid
	z := gzipBytes(t, in)
	tests := []struct {
		name string
		z    []byte
	}{
		{"checksum", append(slices.Clone(z[:len(z)-8]), 0, 0, 0, 0, 0, 0, 0, 0)},
		{"bad header", []byte{0x1f, 0x8b, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}},
		{"trailing garbage", append(slices.Clone(z), "garbage!"...)},
		{"bad deflate", append(slices.Clone(z[:10]), 0xff, 0xff, 0xff, 0xff, 0xff, 0xff)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Read(bytes.NewReader(tt.z), "t.gz")
			var se *SyntaxError
			if !errors.As(err, &se) {
				t.Fatalf("error %v; want a *SyntaxError", err)
			}
			if se.Err == nil || !strings.Contains(se.Msg, "gzip") {
				t.Errorf("error %v; want a gzip error", err)
			}
		})
	}
}

// failReader returns data, then a non-EOF error.
type failReader struct {
	data []byte
	err  error
}

func (r *failReader) Read(p []byte) (int, error) {
	if len(r.data) == 0 {
		return 0, r.err
	}
	n := copy(p, r.data)
	r.data = r.data[n:]
	return n, nil
}

func TestIOErrorIsNotSyntax(t *testing.T) {
	boom := errors.New("boom")
	for _, in := range [][]byte{nil, {0x1f}, []byte(hdr + "a 0 1 0 0\n"), gzipBytes(t, []byte(hdr+"a 0 1 0 0\n"))[:20]} {
		_, err := Read(&failReader{data: in, err: boom}, "t")
		if !errors.Is(err, boom) {
			t.Errorf("error %v does not wrap the read error", err)
		}
		if errors.Is(err, ErrSyntax) {
			t.Errorf("read error %v matches ErrSyntax", err)
		}
	}
}

func TestReaderStream(t *testing.T) {
	rd, err := NewReader(strings.NewReader(hdr + "a 0 1 0 0\nf 0 1\nf 0 2\n"))
	if err != nil {
		t.Fatal(err)
	}
	want := []Event{alloc(0, 1, 0, 0), free(0, 1)}
	for i, w := range want {
		ev, err := rd.Next()
		if err != nil || ev != w {
			t.Fatalf("event %d: %v, %v; want %v", i, ev, err, w)
		}
	}
	_, err = rd.Next()
	if !errors.Is(err, ErrSyntax) {
		t.Fatalf("got %v, want a syntax error", err)
	}
	if _, err2 := rd.Next(); err2 != err {
		t.Errorf("second Next after error: %v, want the same %v", err2, err)
	}

	// Site definitions are kept, not returned.
	rd, _ = NewReader(strings.NewReader(hdr + "s 3 f x.py:1 < g y.py:2\n\na 0 1 0 0 3\ns 4 h\nf 0 1\n"))
	if rd.Site(3) != "" {
		t.Errorf("Site(3) before reading its line: %q", rd.Site(3))
	}
	if ev, err := rd.Next(); err != nil || ev != allocSite(0, 1, 0, 0, 3) {
		t.Fatalf("first event %v, %v", ev, err)
	}
	if got := rd.Site(3); got != "f x.py:1 < g y.py:2" {
		t.Errorf("Site(3) = %q", got)
	}
	if ev, err := rd.Next(); err != nil || ev != free(0, 1) {
		t.Fatalf("second event %v, %v", ev, err)
	}
	if rd.Site(4) != "h" || rd.Site(0) != "" || rd.Site(5) != "" {
		t.Errorf("Site(4), Site(0), Site(5) = %q, %q, %q", rd.Site(4), rd.Site(0), rd.Site(5))
	}

	rd, _ = NewReader(strings.NewReader(hdr))
	for range 2 {
		if _, err := rd.Next(); err != io.EOF {
			t.Errorf("Next at end: %v, want io.EOF", err)
		}
	}
}

func TestIDTableDense(t *testing.T) {
	// Sequential IDs stay in the slice; wild ones go to the map.
	var tab idTable
	for i := range 1000 {
		tab.put(uint64(i), int32(i))
	}
	tab.put(1<<40, 1000)
	tab.put(1500, 1001) // within reach of the slice
	if tab.sparse == nil || len(tab.sparse) != 1 || len(tab.dense) != 1501 {
		t.Errorf("dense %d, sparse %d; want 1501, 1", len(tab.dense), len(tab.sparse))
	}
	for id, want := range map[uint64]int32{0: 0, 999: 999, 1 << 40: 1000, 1500: 1001} {
		if s, ok := tab.get(id); !ok || s != want {
			t.Errorf("get(%d) = %d, %v; want %d", id, s, ok, want)
		}
	}
	for _, id := range []uint64{1000, 1499, 1501, 1<<40 - 1, math.MaxUint64} {
		if _, ok := tab.get(id); ok {
			t.Errorf("get(%d) found an entry", id)
		}
	}
}

// TestReadV2 reads a v2 trace: requests numbered in order of allocation,
// frees counted back from the last request, times and trims as deltas.
func TestReadV2(t *testing.T) {
	in := hdr2 + "s 3 f x.py:1\n" +
		"a 4096 0 5\n" + // request 0 at 5 us
		"a 512 7 2 3\n" + // request 1 at 7 us, stream 7, site 3
		"f 1 0\n" + // request 0 at 7 us
		"t 4\n" + // a trim at 11 us
		"a 8 0 1\n" + // request 2 at 12 us
		"f 1 10\n" + // request 1 at 22 us
		"f 0 0\n" // request 2 at 22 us
	tr, err := Read(strings.NewReader(in), "x.trace")
	if err != nil {
		t.Fatal(err)
	}
	want := []Event{
		alloc(0, 4096, 0, 5),
		{Kind: Alloc, ID: 1, Size: 512, Stream: 7, TimeUS: 7, Site: 3},
		free(0, 7),
		alloc(2, 8, 0, 12),
		free(1, 22),
		free(2, 22),
	}
	if !slices.Equal(tr.Events, want) {
		t.Fatalf("events %v, want %v", tr.Events, want)
	}
	if !slices.Equal(tr.Trims, []int32{3}) || tr.Sites[3] != "f x.py:1" || tr.Requests != 3 || tr.PeakLiveBytes != 4096+512 {
		t.Fatalf("trims %v, sites %v, requests %d, peak live %d", tr.Trims, tr.Sites, tr.Requests, tr.PeakLiveBytes)
	}
}

// TestV2RoundTrip writes each shipped trace in v2 and reads it back: the
// same events and sites, in at most 40% of v1's bytes gzipped (2.8-3.1
// times fewer on the six).
func TestV2RoundTrip(t *testing.T) {
	paths, _ := filepath.Glob("../testdata/traces/*.trace.gz")
	if len(paths) == 0 {
		t.Fatal("no shipped traces")
	}
	for _, path := range paths {
		tr, err := Load(path)
		if err != nil {
			t.Fatal(err)
		}
		var v1, v2 bytes.Buffer
		for _, f := range []struct {
			buf    *bytes.Buffer
			format Format
		}{{&v1, V1}, {&v2, V2}} {
			zw := gzip.NewWriter(f.buf)
			w, err := NewWriterFormat(zw, f.format)
			if err != nil {
				t.Fatal(err)
			}
			for s, text := range tr.Sites {
				if err := w.Site(s, text); err != nil {
					t.Fatal(err)
				}
			}
			for i, ev := range tr.Events {
				id := uint64(tr.Slot[i])
				if ev.Kind == Alloc {
					err = w.AllocSite(id, ev.Size, ev.Stream, ev.TimeUS, ev.Site)
				} else {
					err = w.Free(id, ev.TimeUS)
				}
				if err != nil {
					t.Fatal(err)
				}
			}
			if err := w.Flush(); err != nil {
				t.Fatal(err)
			}
			if err := zw.Close(); err != nil {
				t.Fatal(err)
			}
		}
		back, err := Read(bytes.NewReader(v2.Bytes()), path)
		if err != nil {
			t.Fatal(err)
		}
		for i, ev := range tr.Events {
			ev.ID = uint64(tr.Slot[i])
			if back.Events[i] != ev {
				t.Fatalf("%s: event %d reads back as %v, want %v", path, i, back.Events[i], ev)
			}
		}
		if len(back.Events) != len(tr.Events) || back.PeakLiveBytes != tr.PeakLiveBytes || !maps.Equal(back.Sites, tr.Sites) {
			t.Fatalf("%s: %d events, peak %d; want %d, %d", path, len(back.Events), back.PeakLiveBytes, len(tr.Events), tr.PeakLiveBytes)
		}
		if 10*v2.Len() > 4*v1.Len() {
			t.Errorf("%s: v2 %d bytes gzipped, v1 %d: more than 40%%", path, v2.Len(), v1.Len())
		}
	}
}

// TestReadPartial: a trace cut short (a last line without its newline,
// gzip data that stops early) reads up to its last whole line, with the
// error that says where, which is ErrCutShort; a whole trace reads as
// Read reads it; any other fault is an error with no trace.
func TestReadPartial(t *testing.T) {
	whole := "# gpumem-trace v1\na 0 100 0 0\na 1 200 0 1\nf 0 2\na 2 300 0 3\n"
	var gz bytes.Buffer
	zw := gzip.NewWriter(&gz)
	zw.Write([]byte(whole + strings.Repeat("# padding so that the cut falls in the data\n", 50) + "f 1 4\n"))
	zw.Close()
	for _, c := range []struct {
		name, in string
		events   int
		cut      bool
	}{
		{"whole", whole, 4, false},
		{"cut inside a line", whole + "f 2", 4, true},
		{"cut inside the header", "# gpumem-tr", 0, true},
		{"gzip cut", gz.String()[:gz.Len()-20], -1, true},
	} {
		tr, err := ReadPartial(strings.NewReader(c.in), "p.trace")
		if !c.cut {
			if err != nil || len(tr.Events) != c.events {
				t.Errorf("%s: %v, %d events; want %d, no error", c.name, err, len(tr.Events), c.events)
			}
			continue
		}
		if !errors.Is(err, ErrCutShort) || !errors.Is(err, ErrSyntax) || tr == nil {
			t.Errorf("%s: %v, trace %v; want the trace before the cut and ErrCutShort", c.name, err, tr != nil)
			continue
		}
		if c.events >= 0 && len(tr.Events) != c.events {
			t.Errorf("%s: %d events; want %d", c.name, len(tr.Events), c.events)
		}
		if c.events < 0 && (len(tr.Events) != 4 || tr.PeakLiveBytes != 500) {
			t.Errorf("%s: %d events, peak %d; want the 4 before the cut, peak 500", c.name, len(tr.Events), tr.PeakLiveBytes)
		}
		if _, err := Read(strings.NewReader(c.in), "p.trace"); !errors.Is(err, ErrCutShort) {
			t.Errorf("%s: Read gives %v; want the cut as an error", c.name, err)
		}
	}
	if tr, err := ReadPartial(strings.NewReader("# gpumem-trace v1\nf 7 0\n"), "p.trace"); tr != nil || err == nil || errors.Is(err, ErrCutShort) {
		t.Errorf("a free never allocated: %v, %v; want no trace and a syntax error", tr, err)
	}
}
