package torchsnapshot

import (
	"bytes"
	"errors"
	"io"
	"math"
	"math/big"
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/gpumem/gpumem/trace"
	"github.com/nlpodyssey/gopickle/types"
)

// fixture is a snapshot exactly as PyTorch 2.11 wrote it: two training steps
// of ResNet-18 on one device (see testdata/traces/README.md).
const fixture = "../testdata/fixtures/resnet18_snapshot.pickle"

func readFixture(tb testing.TB) []byte {
	tb.Helper()
	data, err := os.ReadFile(fixture)
	if err != nil {
		tb.Skipf("fixture not found (run from the torchsnapshot directory of a full checkout): %v", err)
	}
	return data
}

// convert reads the snapshot in data and writes the trace of device dev.
// It checks that the trace reads back, agrees with the summary, and (with
// wantLive) that the requests live at its end are the blocks the snapshot
// lists as allocated: the trace ends where the snapshot was taken.
func convert(t *testing.T, data []byte, dev int) (string, Summary, *trace.Trace) {
	t.Helper()
	s, err := Read(bytes.NewReader(data))
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	w, _ := trace.NewWriter(&buf)
	sum, err := s.WriteTrace(dev, w)
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Flush(); err != nil {
		t.Fatal(err)
	}
	text := buf.String()
	tr, err := trace.Read(&buf, "converted")
	if err != nil {
		t.Fatalf("the trace written does not read back: %v", err)
	}
	frees := 0
	for _, e := range tr.Events {
		if e.Kind == trace.Free {
			frees++
		}
	}
	if tr.Requests != sum.Requests || len(tr.Events) != sum.Events || tr.PeakLiveBytes != sum.PeakLiveBytes || len(tr.Sites) != sum.Sites {
		t.Errorf("summary %+v; the trace has %d requests, %d events, peak %d, %d sites",
			sum, tr.Requests, len(tr.Events), tr.PeakLiveBytes, len(tr.Sites))
	}
	return text, sum, tr
}

// liveAtEnd returns the number and bytes of the requests a trace leaves live.
func liveAtEnd(tr *trace.Trace) (n int, bytes uint64) {
	size := make(map[uint64]uint64)
	for _, e := range tr.Events {
		if e.Kind == trace.Alloc {
			size[e.ID] = e.Size
		} else {
			delete(size, e.ID)
		}
	}
	for _, s := range size {
		bytes += s
	}
	return len(size), bytes
}

func TestFixture(t *testing.T) {
	data := readFixture(t)
	s, err := Read(bytes.NewReader(data))
	if err != nil {
		t.Fatal(err)
	}
	if devs := s.Devices(); !slices.Equal(devs, []int{0}) {
		t.Fatalf("Devices() = %v, want [0]", devs)
	}
	// The figures, counted from the pickle with Python: 657 alloc and 531
	// free_requested entries, 35 distinct stacks among the allocs, 126
	// blocks active_allocated at the end holding 114954052 bytes.
	text, sum, tr := convert(t, data, 0)
	want := Summary{Events: 1188, Requests: 657, Sites: 35, PeakLiveBytes: 512423751}
	if sum != want {
		t.Errorf("summary %+v, want %+v", sum, want)
	}
	if n, b := liveAtEnd(tr); n != 126 || b != 114954052 {
		t.Errorf("live at the end: %d requests of %d bytes; want the snapshot's 126 blocks of 114954052", n, b)
	}
	head := "# gpumem-trace v1: a ID SIZE STREAM T_US | f ID T_US\n" +
		"s 1 <lambda> site-packages/torch/nn/modules/module.py:1097 < _apply site-packages/torch/nn/modules/module.py:965 < " +
		"_apply site-packages/torch/nn/modules/module.py:934 < cuda site-packages/torch/nn/modules/module.py:1097 < <module> train_resnet18.py:4\n" +
		"a 0 37632 0 0 1\na 1 256 0 1002 1\n"
	if !strings.HasPrefix(text, head) {
		t.Errorf("trace starts\n%.400s\nwant\n%s", text, head)
	}
	if !strings.Contains(text, " train_resnet18.py:") || tr.Events[0].Site != 1 {
		t.Error("no sites from the training script")
	}
}

// TestFixtureWrapped cuts the fixture's history as a full ring buffer
// would, and checks that the trace still ends with the snapshot's blocks
// live and does not understate the peak.
func TestFixtureWrapped(t *testing.T) {
	top := mustUnpickle(t, readFixture(t))
	traces := (*record{d: top}.mustGet(t, "device_traces").(*types.List))
	full := *traces[0].(*types.List)
	// Counted with Python as for TestFixture, on the entries from 700 and
	// from 1200 on.
	for _, tt := range []struct {
		from int
		want Summary
	}{
		{700, Summary{Events: 876, Requests: 501, Sites: 35, PeakLiveBytes: 512423751, AllocatedBefore: 73, LiveThroughout: 125}},
		{1200, Summary{Events: 554, Requests: 340, Sites: 8, PeakLiveBytes: 512423751, AllocatedBefore: 84, LiveThroughout: 126}},
	} {
		traces[0] = list(full[tt.from:]...)
		_, sum, tr := convert(t, pickleOf(t, top), 0)
		if sum != tt.want {
			t.Errorf("from %d: summary %+v, want %+v", tt.from, sum, tt.want)
		}
		if n, b := liveAtEnd(tr); n != 126 || b != 114954052 {
			t.Errorf("from %d: live at the end: %d requests of %d bytes; want 126 of 114954052", tt.from, n, b)
		}
		// The requests live from the start come first, at time 0.
		for i, e := range tr.Events[:tt.want.AllocatedBefore+tt.want.LiveThroughout] {
			if e.Kind != trace.Alloc || e.TimeUS != 0 || e.ID != uint64(i) {
				t.Fatalf("from %d: event %d is %v; want an alloc at time 0", tt.from, i, e)
			}
		}
	}
}

func mustUnpickle(t *testing.T, data []byte) *types.Dict {
	t.Helper()
	v, err := unpickle(data)
	if err != nil {
		t.Fatal(err)
	}
	return v.(*types.Dict)
}

func (r record) mustGet(t *testing.T, key string) any {
	t.Helper()
	v, ok := r.get(key)
	if !ok {
		t.Fatalf("no key %q", key)
	}
	return v
}

// frame returns a frame of a call stack.
func frame(name, file string, line int) *types.Dict {
	return dict("name", name, "filename", file, "line", line)
}

// ev returns a trace entry.
func ev(action string, addr, size, timeUS int, frames ...any) *types.Dict {
	return dict("action", action, "addr", addr, "size", size, "stream", 0, "time_us", timeUS,
		"compile_context", "N/A", "user_metadata", "", "frames", list(frames...))
}

// snapshot returns a snapshot of the given device traces and segments.
func snapshot(traces []any, segments ...any) *types.Dict {
	return dict("segments", list(segments...), "device_traces", list(traces...),
		"allocator_settings", dict(), "external_annotations", list())
}

func segment(dev int, blocks ...any) *types.Dict {
	return dict("device", dev, "address", 1<<20, "total_size", 2<<20, "stream", 7, "segment_type", "large", "blocks", list(blocks...))
}

func blk(addr, size int, state string, frames ...any) *types.Dict {
	return dict("address", addr, "size", size+100, "requested_size", size, "state", state, "frames", list(frames...))
}

func TestConvert(t *testing.T) {
	fwd := frame("forward", "model.py", 10)
	main := frame("<module>", "train.py", 3)
	const t0 = 1795335569924146
	tests := []struct {
		name  string
		snap  *types.Dict
		dev   int
		trace string // after the header
		sum   Summary
	}{
		{
			name: "history",
			snap: snapshot([]any{list(
				ev("segment_alloc", 1<<20, 2<<20, t0-5),
				ev("alloc", 1<<20, 100, t0, fwd, main),
				ev("alloc", 1<<20+512, 200, t0+10),
				ev("free_requested", 1<<20, 100, t0+20, main),
				ev("free_completed", 1<<20, 100, t0+25),
				ev("snapshot", 0, 0, t0+26),
				ev("oom", 0, 1<<40, t0+27),
				ev("alloc", 1<<20, 300, t0+30, frame("g", "x.py", 1), fwd, main),
				ev("alloc", 1<<20+4096, 400, t0+40, fwd, main),
			)}),
			trace: "s 1 forward model.py:10 < <module> train.py:3\n" +
				"a 0 100 0 0 1\na 1 200 0 10\nf 0 20\n" +
				"s 2 g x.py:1 < forward model.py:10 < <module> train.py:3\n" +
				"a 2 300 0 30 2\na 3 400 0 40 1\n",
			sum: Summary{Events: 5, Requests: 4, Sites: 2, PeakLiveBytes: 900},
		},
		{
			name: "wrapped",
			snap: snapshot([]any{list(
				ev("free_completed", 1<<20, 50, t0-10),
				ev("free_requested", 2<<20, 50, t0, main), // allocated before the history
				ev("alloc", 3<<20, 60, t0+5, fwd),
				ev("alloc", 3<<20, 70, t0+3, fwd), // lost free of the one before; time backwards
				ev("free_requested", 4<<20, 80, t0+20),
				ev("free_requested", 3<<20, 70, t0+21),
				ev("alloc", 4<<20, 90, t0+22),
			)},
				segment(0,
					blk(5<<20, 1000, "active_allocated", main),  // allocated before the history, never freed
					blk(4<<20, 90, "active_allocated"),          // the history's last alloc
					blk(6<<20, 2000, "inactive"),                // free
					blk(7<<20, 3000, "active_pending_free"),     // freed, its stream still using it
					blk(5<<20, 1000, "active_allocated", main)), // listed twice: counted once
				segment(1, blk(8<<20, 4000, "active_allocated")), // another device
			),
			trace: "a 0 50 0 0\na 1 80 0 0\n" +
				"s 1 <module> train.py:3\na 2 1000 7 0 1\n" +
				"f 0 0\n" +
				"s 2 forward model.py:10\na 3 60 0 5 2\n" +
				"f 3 5\na 4 70 0 5 2\n" +
				"f 1 20\nf 4 21\na 5 90 0 22\n",
			sum: Summary{Events: 10, Requests: 6, Sites: 2, PeakLiveBytes: 1150, AllocatedBefore: 2, LiveThroughout: 1, ImpliedFrees: 1, ClampedTimes: 1},
		},
		{
			name: "second device",
			snap: snapshot([]any{list(), list(ev("segment_alloc", 1<<20, 1<<20, 5)), list(ev("alloc", 1<<20, 10, 5), ev("alloc", 2<<20, 20, 4))},
				segment(2, blk(9<<20, 30, "active_allocated"))),
			dev:   2,
			trace: "a 0 30 7 0\na 1 10 0 0\na 2 20 0 0\n",
			sum:   Summary{Events: 3, Requests: 3, PeakLiveBytes: 60, LiveThroughout: 1, ClampedTimes: 1},
		},
		{
			name: "odd frames",
			snap: snapshot([]any{list(
				ev("alloc", 1, 1, 0, frame("", "a\nb.py", 1), frame("f\tg", "caf\xe9.py", -2)),
				dict("action", "alloc", "addr", 2, "size", 2, "stream", new(big.Int).SetUint64(math.MaxUint64), "time_us", 1),
				dict("action", "alloc", "addr", 3, "size", 3, "stream", 0, "time_us", 2, "frames", nil),
				ev("alloc", 4, 4, 3, frame("  ", " ", 0)),
			)}),
			trace: "s 1 ? a?b.py:1 < f?g caf\uFFFD.py:-2\na 0 1 0 0 1\n" +
				"a 1 2 18446744073709551615 1\na 2 3 0 2\n" +
				"s 2 :0\na 3 4 0 3 2\n",
			sum: Summary{Events: 4, Requests: 4, Sites: 2, PeakLiveBytes: 10},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			text, sum, _ := convert(t, pickleOf(t, tt.snap), tt.dev)
			const hdr = "# gpumem-trace v1: a ID SIZE STREAM T_US | f ID T_US\n"
			if want := hdr + tt.trace; text != want {
				t.Errorf("trace\n%s\nwant\n%s", text, want)
			}
			if sum != tt.sum {
				t.Errorf("summary %+v\nwant    %+v", sum, tt.sum)
			}
		})
	}
}

func TestDevices(t *testing.T) {
	snap := snapshot([]any{list(), list(ev("segment_alloc", 1, 1, 0)), list(ev("free_requested", 1, 1, 0)), list(), list(ev("alloc", 1, 1, 0))})
	s, err := Read(bytes.NewReader(pickleOf(t, snap)))
	if err != nil {
		t.Fatal(err)
	}
	if devs := s.Devices(); !slices.Equal(devs, []int{2, 4}) {
		t.Errorf("Devices() = %v, want [2 4]", devs)
	}
	w, _ := trace.NewWriter(io.Discard)
	for _, dev := range []int{-1, 0, 1, 3, 5} {
		if _, err := s.WriteTrace(dev, w); err == nil || err.Error() != "torchsnapshot: device "+itoa(dev)+" has no allocation history" {
			t.Errorf("WriteTrace(%d): %v", dev, err)
		}
	}
	s, err = Read(bytes.NewReader(pickleOf(t, snapshot(nil))))
	if err != nil || s.Devices() != nil {
		t.Errorf("no devices: %v, %v", s.Devices(), err)
	}
}

func itoa(i int) string { return big.NewInt(int64(i)).String() }

// TestLongStack cuts a stack too long for a site, and one frame too long.
func TestLongStack(t *testing.T) {
	var frames []any
	for i := range 5000 {
		frames = append(frames, frame("f", strings.Repeat("d/", 10)+"x.py", i))
	}
	long := frame(strings.Repeat("\u00e9", trace.MaxSiteText), "x.py", 1)
	snap := snapshot([]any{list(ev("alloc", 1, 1, 0, frames...), ev("alloc", 2, 1, 0, long, frame("g", "y.py", 2)))})
	_, _, tr := convert(t, pickleOf(t, snap), 0)
	deep, wide := tr.Sites[1], tr.Sites[2]
	if len(deep) > trace.MaxSiteText || !strings.HasSuffix(deep, " < ...") || !strings.HasPrefix(deep, "f d/d/d/d/d/d/d/d/d/d/x.py:0 < f ") {
		t.Errorf("deep stack: %d bytes, %.60q ... %q", len(deep), deep, deep[len(deep)-40:])
	}
	if len(wide) > trace.MaxSiteText || !strings.HasSuffix(wide, "\u00e9...") {
		t.Errorf("wide frame: %d bytes, ending %q", len(wide), wide[len(wide)-20:])
	}
}

func TestReadErrors(t *testing.T) {
	good := func() *types.Dict {
		return snapshot([]any{list(ev("alloc", 1, 1, 0, frame("f", "x.py", 1)))}, segment(0, blk(1, 1, "active_allocated")))
	}
	// with returns good() with the value at a path replaced.
	entry := func(s *types.Dict) *types.Dict {
		return (*(*record{d: s}.mustGet(t, "device_traces").(*types.List))[0].(*types.List))[0].(*types.Dict)
	}
	set := func(d *types.Dict, key string, v any) {
		for i := range *d {
			if (*d)[i].Key == key {
				(*d)[i].Value = v
				return
			}
		}
		d.Set(key, v)
	}
	del := func(d *types.Dict, key string) {
		*d = slices.DeleteFunc(*d, func(e types.DictEntry) bool { return e.Key == key })
	}
	change := func(f func(s *types.Dict)) any {
		s := good()
		f(s)
		return s
	}
	shared := list(ev("alloc", 1, 1, 0))
	tooMany := dict("action", "alloc")
	for i := range maxRecordKeys {
		tooMany.Set(itoa(i), i)
	}
	huge, _ := new(big.Int).SetString("100000000000000000000000", 10)

	tests := []struct {
		name string
		v    any
		msg  string // the whole error
	}{
		{"list", list(), "torchsnapshot: the pickle holds list, not a dict: not a PyTorch memory snapshot (torch.cuda.memory._dump_snapshot writes one)"},
		{"no traces", dict("segments", list()), `torchsnapshot: no key "device_traces": not a PyTorch memory snapshot (torch.cuda.memory._dump_snapshot writes one)`},
		{"no segments", dict("device_traces", list()), `torchsnapshot: no key "segments": not a PyTorch`},
		{"traces a dict", change(func(s *types.Dict) { set(s, "device_traces", dict()) }), "torchsnapshot: device_traces is dict, want a list"},
		{"trace an int", change(func(s *types.Dict) { set(s, "device_traces", list(list(), 5)) }), "torchsnapshot: device_traces: item 1 is int, want a list"},
		{"entry a str", change(func(s *types.Dict) { set(s, "device_traces", list(list(ev("alloc", 1, 1, 0), "alloc"))) }), "torchsnapshot: device_traces[0]: item 1 is str, want a dict"},
		{"action an int", change(func(s *types.Dict) { set(entry(s), "action", 3) }), "torchsnapshot: device_traces[0][0]: action is int, want a string"},
		{"no action", change(func(s *types.Dict) { del(entry(s), "action") }), `torchsnapshot: device_traces[0][0]: no key "action"`},
		{"no addr", change(func(s *types.Dict) { del(entry(s), "addr") }), `torchsnapshot: device_traces[0][0]: no key "addr"`},
		{"addr negative", change(func(s *types.Dict) { set(entry(s), "addr", -5) }), "torchsnapshot: device_traces[0][0]: addr is -5, want 0 to 2^64-1"},
		{"addr huge", change(func(s *types.Dict) { set(entry(s), "addr", huge) }), "torchsnapshot: device_traces[0][0]: addr is 100000000000000000000000, want 0 to 2^64-1"},
		{"addr a str", change(func(s *types.Dict) { set(entry(s), "addr", "0x7f00") }), "torchsnapshot: device_traces[0][0]: addr is str, want an int"},
		{"addr a bool", change(func(s *types.Dict) { set(entry(s), "addr", true) }), "torchsnapshot: device_traces[0][0]: addr is bool, want an int"},
		{"size 0", change(func(s *types.Dict) { set(entry(s), "size", 0) }), "torchsnapshot: device_traces[0][0]: size is 0"},
		{"size 2 PiB", change(func(s *types.Dict) { set(entry(s), "size", 1<<51) }), "torchsnapshot: device_traces[0][0]: size is 2251799813685248, more than 1 PiB"},
		{"stream None", change(func(s *types.Dict) { set(entry(s), "stream", nil) }), "torchsnapshot: device_traces[0][0]: stream is None, want an int"},
		{"time a float", change(func(s *types.Dict) { set(entry(s), "time_us", 1.5) }), "torchsnapshot: device_traces[0][0]: time_us is float, want an int"},
		{"time overflows", change(func(s *types.Dict) { set(entry(s), "time_us", huge) }), "torchsnapshot: device_traces[0][0]: time_us is 100000000000000000000000, which overflows 64 bits"},
		{"frames a dict", change(func(s *types.Dict) { set(entry(s), "frames", dict()) }), "torchsnapshot: device_traces[0][0]: frames is dict, want a list"},
		{"frame a str", change(func(s *types.Dict) { set(entry(s), "frames", list("f x.py:1")) }), "torchsnapshot: device_traces[0][0].frames: item 0 is str, want a dict"},
		{"frame line a str", change(func(s *types.Dict) {
			set(entry(s), "frames", list(frame("f", "x.py", 1), dict("name", "f", "filename", "x.py", "line", "2")))
		}),
			"torchsnapshot: device_traces[0][0].frames[1]: line is str, want an int"},
		{"frame without name", change(func(s *types.Dict) { set(entry(s), "frames", list(dict("filename", "x.py", "line", 2))) }),
			`torchsnapshot: device_traces[0][0].frames[0]: no key "name"`},
		{"shared trace", change(func(s *types.Dict) { set(s, "device_traces", list(shared, list(), shared)) }),
			"torchsnapshot: device_traces: item 2 is the same list as device_traces[0]"},
		{"too many keys", change(func(s *types.Dict) { set(s, "device_traces", list(list(ev("alloc", 1, 1, 0), tooMany))) }),
			"torchsnapshot: device_traces[0][1]: a dict of 257 keys, more than any snapshot record has (at most 256)"},
		{"segments a tuple", change(func(s *types.Dict) { set(s, "segments", &types.Tuple{}) }), "torchsnapshot: segments is tuple, want a list"},
		{"segment None", change(func(s *types.Dict) { set(s, "segments", list(segment(0), nil)) }), "torchsnapshot: segments: item 1 is None, want a dict"},
		{"segment without device", change(func(s *types.Dict) { set(s, "segments", list(dict("stream", 0, "blocks", list()))) }), `torchsnapshot: segments[0]: no key "device"`},
		{"segment without blocks", change(func(s *types.Dict) { set(s, "segments", list(dict("device", 0, "stream", 0))) }), `torchsnapshot: segments[0]: no key "blocks"`},
		{"blocks a dict", change(func(s *types.Dict) { set(s, "segments", list(dict("device", 0, "stream", 0, "blocks", dict()))) }), "torchsnapshot: segments[0]: blocks is dict, want a list"},
		{"shared blocks", change(func(s *types.Dict) {
			seg := segment(0, blk(1, 1, "inactive"))
			seg2 := segment(0)
			set(seg2, "blocks", record{d: seg}.mustGet(t, "blocks"))
			set(s, "segments", list(seg, seg2))
		}), "torchsnapshot: segments[1]: blocks is the same list as segments[0].blocks"},
		{"block state an int", change(func(s *types.Dict) { set(s, "segments", list(segment(0, blk(1, 1, "inactive"), dict("state", 1)))) }),
			"torchsnapshot: segments[0].blocks[1]: state is int, want a string"},
		{"block requested_size a str", change(func(s *types.Dict) {
			b := blk(1, 1, "active_allocated")
			set(b, "requested_size", "1")
			set(s, "segments", list(segment(0, b)))
		}), "torchsnapshot: segments[0].blocks[0]: requested_size is str, want an int"},
		{"block of 0 bytes", change(func(s *types.Dict) {
			b := blk(1, 0, "active_allocated")
			set(b, "size", 0)
			set(s, "segments", list(segment(0, b)))
		}), "torchsnapshot: segments[0].blocks[0]: size is 0"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Read(bytes.NewReader(pickleOf(t, tt.v)))
			var fe *FormatError
			if !errors.As(err, &fe) || !errors.Is(err, ErrFormat) {
				t.Fatalf("error %v; want a *FormatError", err)
			}
			if !strings.HasPrefix(err.Error(), tt.msg) {
				t.Errorf("error\n%s\nwant\n%s", err, tt.msg)
			}
		})
	}

	// What a trace does not use is not checked.
	s := good()
	set(s, "allocator_settings", 5)
	set(entry(s), "compile_context", nil)
	set(s, "device_traces", list(list(ev("alloc", 1, 1, 0), dict("action", "segment_map", "addr", "x"), dict("action", "oom"))))
	set(s, "segments", list(segment(0, blk(1, 1, "inactive"), dict("state", "inactive", "size", "big"))))
	if _, err := Read(bytes.NewReader(pickleOf(t, s))); err != nil {
		t.Errorf("unused fields: %v", err)
	}
}

func TestTruncated(t *testing.T) {
	data := readFixture(t)
	for _, n := range []int{0, 1, 2, 10, 11, 100, 1000, len(data) / 2, len(data) - 2, len(data) - 1} {
		_, err := Read(bytes.NewReader(data[:n]))
		if !errors.Is(err, ErrFormat) || !errors.Is(err, io.ErrUnexpectedEOF) || !strings.HasPrefix(err.Error(), "torchsnapshot: truncated pickle: ") {
			t.Errorf("%d of %d bytes: error %v; want a truncated pickle", n, len(data), err)
		}
	}
}

// errReader returns data, then err.
type errReader struct {
	data []byte
	err  error
}

func (r *errReader) Read(p []byte) (int, error) {
	if len(r.data) == 0 {
		return 0, r.err
	}
	n := copy(p, r.data)
	r.data = r.data[n:]
	return n, nil
}

func TestReadIOError(t *testing.T) {
	boom := errors.New("boom")
	_, err := Read(&errReader{data: []byte("\x80\x04"), err: boom})
	if !errors.Is(err, boom) || errors.Is(err, ErrFormat) {
		t.Errorf("error %v; want boom, not ErrFormat", err)
	}
	if _, err := Load("testdata/missing.pickle"); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("Load of a missing file: %v", err)
	}
}
