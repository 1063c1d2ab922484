package replay_test

import (
	"encoding/json"
	"errors"
	"path/filepath"
	"reflect"
	"slices"
	"sort"
	"strings"
	"testing"

	"github.com/gpumem/gpumem"
	"github.com/gpumem/gpumem/device"
	"github.com/gpumem/gpumem/device/sim"
	"github.com/gpumem/gpumem/internal/longtest"
	"github.com/gpumem/gpumem/replay"
	"github.com/gpumem/gpumem/trace"
)

const traceDir = "../testdata/traces"

// loadTraces loads every shipped trace, or skips the test if there are none.
func loadTraces(t *testing.T) []*trace.Trace {
	t.Helper()
	paths, err := filepath.Glob(filepath.Join(traceDir, "*.trace.gz"))
	if err != nil {
		t.Fatal(err)
	}
	if len(paths) == 0 {
		t.Skipf("no traces in %s", traceDir)
	}
	sort.Strings(paths)
	var out []*trace.Trace
	for _, p := range paths {
		tr, err := trace.Load(p)
		if err != nil {
			t.Fatalf("loading %s: %v", p, err)
		}
		out = append(out, tr)
	}
	return out
}

// TestReplayTraces replays every shipped trace on the simulated 80 GiB
// device: in the default configuration the allocator must hold at most 2%
// more than the trace's peak of live bytes and never run out; in ModePlain
// (PyTorch's rules) it must not run out either.
func TestReplayTraces(t *testing.T) {
	traces := loadTraces(t)
	for _, tr := range traces {
		t.Run(tr.Name, func(t *testing.T) {
			if testing.Short() && len(tr.Events) > 200000 {
				t.Skip("long trace in -short mode")
			}
			for _, c := range []struct {
				name     string
				cfg      gpumem.Config
				maxRatio float64
			}{
				{"default", gpumem.Config{}, 1.02},
				{"plain", gpumem.Config{Mode: gpumem.ModePlain}, 0},
			} {
				dev := sim.MustNew(sim.Config{})
				res, err := replay.Run(tr, dev, c.cfg, replay.Options{Check: true})
				if err != nil {
					t.Fatalf("%s: %v", c.name, err)
				}
				t.Logf("%s: ratio %.4f, peak reserved %d, peak live %d, %d OOMs, %.0f ns/event, %d device calls",
					c.name, res.Ratio, res.PeakReservedBytes, res.PeakLiveBytes, res.OOMs, res.NsPerOp, res.DeviceCalls)
				if res.OOMs != 0 {
					t.Errorf("%s: %d OOMs on an 80 GiB device for a peak of %d live bytes", c.name, res.OOMs, res.PeakLiveBytes)
				}
				if c.maxRatio > 0 && res.Ratio > c.maxRatio {
					t.Errorf("%s: peak reserved / peak live = %.4f, want <= %.2f", c.name, res.Ratio, c.maxRatio)
				}
				if res.Events != len(tr.Events) || res.PeakLiveBytes != tr.PeakLiveBytes || res.Trace != tr.Name {
					t.Errorf("%s: result describes another trace: %+v", c.name, res)
				}
				if res.PeakReservedBytes < res.PeakLiveBytes || res.PeakActiveBytes < res.PeakLiveBytes {
					t.Errorf("%s: peaks below the trace's live peak: %+v", c.name, res)
				}
				if err := dev.Leaks(); err != nil {
					t.Errorf("%s: after the replay: %v", c.name, err)
				}
			}
		})
	}
}

func readTrace(t *testing.T, text string) *trace.Trace {
	t.Helper()
	tr, err := trace.Read(strings.NewReader(text), "test.trace")
	if err != nil {
		t.Fatal(err)
	}
	return tr
}

// TestReplayFreeOfFailedAlloc: a request whose allocation ran out of memory
// is counted as an OOM, and its later free is skipped, not an error.
func TestReplayFreeOfFailedAlloc(t *testing.T) {
	const text = "# gpumem-trace v1: a ID SIZE STREAM T_US | f ID T_US\n" +
		"a 0 1048576 0 1\n" +
		"a 1 1073741824 0 2\n" + // more than the device
		"a 2 4096 0 3\n" +
		"f 1 4\n" +
		"f 0 5\n" +
		"a 3 2097152 0 6\n" +
		"f 2 7\n"
	tr := readTrace(t, text)
	for _, mode := range []gpumem.Mode{gpumem.ModeAuto, gpumem.ModePlain} {
		dev := sim.MustNew(sim.Config{Capacity: 64 << 20})
		res, err := replay.Run(tr, dev, gpumem.Config{Mode: mode}, replay.Options{Check: true})
		if err != nil {
			t.Fatalf("%v: %v", mode, err)
		}
		if res.OOMs != 1 {
			t.Errorf("%v: %d OOMs, want 1", mode, res.OOMs)
		}
		if o := res.FirstOOM; o == nil || o.Event != 1 || o.ID != 1 || o.Verdict.Requested != 1<<30 || o.Verdict.Cause != gpumem.CauseLimit {
			t.Errorf("%v: first OOM %+v, want event 1, request 1 of 1 GiB, over the device's whole memory", mode, o)
		}
		if err := dev.Leaks(); err != nil {
			t.Errorf("%v: %v", mode, err)
		}
	}
}

// TestReplayStreams: streams of a trace are made on the device and each
// request lands on its own stream's memory (Touch sees the right stream).
func TestReplayStreams(t *testing.T) {
	const text = "# gpumem-trace v1: a ID SIZE STREAM T_US | f ID T_US\n" +
		"a 0 1048576 0 1\n" +
		"a 1 3145728 94000000001 2\n" +
		"a 2 4096 94000000002 3\n" +
		"f 1 4\n" +
		"a 3 3145728 94000000002 5\n"
	tr := readTrace(t, text)
	dev := sim.MustNew(sim.Config{Capacity: 256 << 20})
	seen := map[device.Stream]int{}
	touch := func(s device.Stream, b gpumem.Buffer) error {
		seen[s]++
		return dev.Touch(s, b.Ptr(), b.Size())
	}
	res, err := replay.Run(tr, dev, gpumem.Config{}, replay.Options{Touch: touch, Check: true})
	if err != nil {
		t.Fatal(err)
	}
	if len(seen) != 3 || seen[0] != 1 {
		t.Errorf("requests touched on streams %v, want 3 streams, one request on stream 0", seen)
	}
	if res.OOMs != 0 || res.Events != len(tr.Events) {
		t.Errorf("result %+v", res)
	}
	// The streams the replay created are destroyed once it is done.
	if n := dev.Stats().LiveStreams; n != 1 {
		t.Errorf("after the replay %d streams are live on the device, want only the default stream", n)
	}
}

// TestReplayWarm: with Options.Warm the trace runs twice on one allocator;
// the second pass is timed apart and needs no new memory.
func TestReplayWarm(t *testing.T) {
	tr := loadTraces(t)[0]
	dev := sim.MustNew(sim.Config{})
	res, err := replay.Run(tr, dev, gpumem.Config{}, replay.Options{Warm: true, Check: true})
	if err != nil {
		t.Fatal(err)
	}
	if res.NsPerOp <= 0 || res.NsPerOpWarm <= 0 {
		t.Fatalf("ns/op %v, warm %v: want both timed", res.NsPerOp, res.NsPerOpWarm)
	}
	cold, err := replay.Run(tr, sim.MustNew(sim.Config{}), gpumem.Config{}, replay.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if res.PeakReservedBytes != cold.PeakReservedBytes || cold.NsPerOpWarm != 0 {
		t.Fatalf("warm run peak %d, cold run peak %d (warm ns %v): the first pass must report as a cold run does",
			res.PeakReservedBytes, cold.PeakReservedBytes, cold.NsPerOpWarm)
	}
}

// TestReplayPasses: Options.Passes replays on one allocator, keeps what
// the trace never frees live (allocated once), and reports the peak over
// all passes.
func TestReplayPasses(t *testing.T) {
	// 20 MiB never freed: were it allocated again in each pass beside the
	// last pass's, each pass would add 20 MiB to the peak.
	tr := readTrace(t, "# gpumem-trace v1\na 0 20971520 0 1\na 1 4096 0 2\nf 1 3\n")
	res, err := replay.Run(tr, sim.MustNew(sim.Config{}), gpumem.Config{}, replay.Options{Passes: 3, Check: true})
	if err != nil {
		t.Fatal(err)
	}
	if ps := res.Passes; ps == nil || ps.N != 3 || ps.PeakReservedBytes != res.PeakReservedBytes || res.PeakReservedBytes < 20<<20 || res.PeakReservedBytes >= 40<<20 {
		t.Errorf("3 passes: %+v, peak %d in the first pass: want 3 and one pass's peak (the leftover allocated once)", ps, res.PeakReservedBytes)
	}
	if res.NsPerOpWarm != 0 || res.Passes == nil || res.Passes.NsPerOpLater <= 0 {
		t.Errorf("ns_per_op_warm %v without Warm, later passes %+v: want none, and the later passes timed", res.NsPerOpWarm, res.Passes)
	}

	// gpt2_generate's peak rises in its third pass (docs/EXPERIMENTS.md,
	// "Later passes"): the first-pass figures must not hide it.
	gen, err := trace.Load("../testdata/traces/gpt2_generate.trace.gz")
	if err != nil {
		t.Fatal(err)
	}
	res, err = replay.Run(gen, sim.MustNew(sim.Config{}), gpumem.Config{}, replay.Options{Passes: 3})
	if err != nil {
		t.Fatal(err)
	}
	if ps := res.Passes; ps == nil || ps.Ratio <= res.Ratio || ps.CreatesLater == 0 || ps.MapsLater < ps.CreatesLater {
		t.Errorf("gpt2_generate, 3 passes: ratio %.4f first, then %+v: want the later rise reported", res.Ratio, ps)
	}
	once, err := replay.Run(gen, sim.MustNew(sim.Config{}), gpumem.Config{}, replay.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if once.PeakReservedBytes != res.PeakReservedBytes || once.Passes != nil {
		t.Errorf("one pass: peak %d (%d with 3 passes), passes %+v: want the first pass alike and no later-pass figures",
			once.PeakReservedBytes, res.PeakReservedBytes, once.Passes)
	}
}

// TestReplayRepeat: Options.Repeat replays on new allocators, reports every
// run's times and their median, and the decisions of the first run.
func TestReplayRepeat(t *testing.T) {
	tr := loadTraces(t)[0]
	once, err := replay.Run(tr, sim.MustNew(sim.Config{}), gpumem.Config{}, replay.Options{})
	if err != nil {
		t.Fatal(err)
	}
	res, err := replay.Run(tr, sim.MustNew(sim.Config{}), gpumem.Config{}, replay.Options{Repeat: 3, Warm: true})
	if err != nil {
		t.Fatal(err)
	}
	if len(res.NsPerOpRuns) != 3 || len(res.NsPerOpWarmRuns) != 3 {
		t.Fatalf("runs %v, warm runs %v: want 3 of each", res.NsPerOpRuns, res.NsPerOpWarmRuns)
	}
	mid := func(runs []float64) float64 { return slices.Sorted(slices.Values(runs))[1] }
	if res.NsPerOp != mid(res.NsPerOpRuns) || res.NsPerOpWarm != mid(res.NsPerOpWarmRuns) {
		t.Errorf("runs %v and %v, reported %v and %v: want the medians", res.NsPerOpRuns, res.NsPerOpWarmRuns, res.NsPerOp, res.NsPerOpWarm)
	}
	if slices.Min(res.NsPerOpRuns) <= 0 || slices.Min(res.NsPerOpWarmRuns) <= 0 {
		t.Errorf("runs %v and %v: want every run timed", res.NsPerOpRuns, res.NsPerOpWarmRuns)
	}
	if res.PeakReservedBytes != once.PeakReservedBytes || res.Creates != once.Creates || res.Maps != once.Maps {
		t.Errorf("repeated: peak %d, %d creates, %d maps; once: %d, %d, %d", res.PeakReservedBytes, res.Creates, res.Maps,
			once.PeakReservedBytes, once.Creates, once.Maps)
	}
}

// TestReplayRepeatDefrag: the time splits take is not a decision; two runs
// of a trace whose later passes split (Config.Defrag) agree.
func TestReplayRepeatDefrag(t *testing.T) {
	tr, err := trace.Load(filepath.Join(traceDir, "resnet50_train.trace.gz"))
	if err != nil {
		t.Skip(err)
	}
	res, err := replay.Run(tr, sim.MustNew(sim.Config{}), gpumem.Config{Defrag: true}, replay.Options{Repeat: 2, Passes: 3})
	if err != nil {
		t.Fatal(err)
	}
	if res.Passes == nil || res.Passes.SplitsLater == 0 || res.Passes.SplitNsLater == 0 {
		t.Errorf("passes %+v: want later splits, timed", res.Passes)
	}
}

// TestReplayDriverTimes: Options.DriverTimes reports the device calls of
// the first pass and of the later ones, by operation, as many as the
// allocator counts; without it none are reported.
func TestReplayDriverTimes(t *testing.T) {
	tr, err := trace.Load(filepath.Join(traceDir, "resnet50_train.trace.gz"))
	if err != nil {
		t.Skip(err)
	}
	res, err := replay.Run(tr, sim.MustNew(sim.Config{}), gpumem.Config{Defrag: true}, replay.Options{Passes: 3, DriverTimes: true})
	if err != nil {
		t.Fatal(err)
	}
	d, ps := res.Driver, res.Passes
	if d["Create"].Calls != res.Creates || d["Map"].Calls != res.Maps || d["Unmap"].Calls != res.Unmaps ||
		d["Release"].Calls != res.Releases || d["Copy"].Calls != res.Copies {
		t.Errorf("first pass: driver %+v, counted %d creates, %d maps, %d unmaps, %d releases, %d copies",
			d, res.Creates, res.Maps, res.Unmaps, res.Releases, res.Copies)
	}
	if d["Reserve"].Calls == 0 || d.Total().Ns == 0 {
		t.Errorf("first pass: driver %+v: want the allocator's reservation and some time", d)
	}
	l := ps.DriverLater
	if l["Create"].Calls != ps.CreatesLater || l["Map"].Calls != ps.MapsLater || l["Release"].Calls != ps.ReleasesLater || l["Reserve"].Calls != 0 {
		t.Errorf("later passes: driver %+v, counted %d creates, %d maps, %d releases", l, ps.CreatesLater, ps.MapsLater, ps.ReleasesLater)
	}
	plain, err := replay.Run(tr, sim.MustNew(sim.Config{}), gpumem.Config{Defrag: true}, replay.Options{Passes: 3})
	if err != nil {
		t.Fatal(err)
	}
	if plain.Driver != nil || plain.Passes.DriverLater != nil || plain.PeakReservedBytes != res.PeakReservedBytes || plain.Passes.MapsLater != ps.MapsLater {
		t.Errorf("without DriverTimes: driver %v / %v, peak %d, later maps %d: want none and the same decisions (%d, %d)",
			plain.Driver, plain.Passes.DriverLater, plain.PeakReservedBytes, plain.Passes.MapsLater, res.PeakReservedBytes, ps.MapsLater)
	}
}

// TestReplayTouchError: an error from Options.Touch stops the replay and is
// returned with the request named.
func TestReplayTouchError(t *testing.T) {
	tr := readTrace(t, "# gpumem-trace v1\na 7 4096 0 1\n")
	boom := errors.New("boom")
	_, err := replay.Run(tr, sim.MustNew(sim.Config{Capacity: 64 << 20}), gpumem.Config{},
		replay.Options{Touch: func(device.Stream, gpumem.Buffer) error { return boom }})
	if !errors.Is(err, boom) || !strings.Contains(err.Error(), "7") {
		t.Fatalf("replay with a failing Touch: %v", err)
	}
}

// TestResultJSONKeys: the JSON keys of Result are part of the CLI's
// contract; renaming one breaks its users.
func TestResultJSONKeys(t *testing.T) {
	want := []string{"trace", "device", "mode", "events", "peak_live_bytes", "peak_reserved_bytes", "ratio", "ooms",
		"ns_per_op", "maps", "unmaps", "device_calls", "creates", "releases", "fences", "misses", "peak_active_bytes", "end_reserved_bytes"}
	raw, err := json.Marshal(replay.Result{Trace: "x", Ratio: 1.5})
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := json.Unmarshal(raw, &m); err != nil {
		t.Fatal(err)
	}
	var got []string
	for k := range m {
		got = append(got, k)
	}
	sort.Strings(got)
	sort.Strings(want)
	if !reflect.DeepEqual(got, want) {
		t.Errorf("Result JSON keys\n got %v\nwant %v", got, want)
	}
	var back replay.Result
	if err := json.Unmarshal(raw, &back); err != nil || back.Trace != "x" || back.Ratio != 1.5 {
		t.Errorf("Result does not round-trip: %+v, %v", back, err)
	}
}

// TestReplayTrims: a trace's "t" line (the program's empty_cache) trims
// the allocator there: after it, a request is served from new memory, so
// that the replay's peak is what the program's allocator held, and a
// capacity that held without the trim can run out with it, as the real
// run does (issue 30: a program's second round fragments anew after its
// empty_cache). Without the line, the replay reuses the cached span.
func TestReplayTrims(t *testing.T) {
	const head = "# gpumem-trace v1\n" +
		"a 0 2097152 0 1\n" + // 2 MiB kept live across the trim
		"a 1 62914560 0 2\n" + // 60 MiB, freed: cached
		"f 1 3\n"
	const tail = "a 2 62914560 0 5\n" +
		"f 2 6\n"
	with := readTrace(t, head+"t 4\n"+tail+"t 7\n")
	without := readTrace(t, head+tail)
	if !slices.Equal(with.Trims, []int32{3, 5}) {
		t.Fatalf("Trims = %v, want [3 5]", with.Trims)
	}
	run := func(tr *trace.Trace) replay.Result {
		dev := sim.MustNew(sim.Config{Capacity: 1 << 30})
		res, err := replay.Run(tr, dev, gpumem.Config{}, replay.Options{Check: true})
		if err != nil {
			t.Fatal(err)
		}
		return res
	}
	w, wo := run(with), run(without)
	if w.Creates <= wo.Creates {
		t.Errorf("creates with the trims %d, without %d: want more with them (memory given back and taken anew)", w.Creates, wo.Creates)
	}
	if w.EndReservedBytes > 4<<20 {
		t.Errorf("after the final trim the replay holds %d bytes, want at most the live 2 MiB's span", w.EndReservedBytes)
	}
}

// TestReplayRunAhead: with the simulated device's RunAhead and the replay
// setting its clock (Options.AtTime), memory one stream freed is not done
// when another stream asks for it: the second stream waits for the first's
// work on the GPU (an order) and reuses the memory, so the peak is the one
// of a GPU that keeps up, where the memory is handed over as done.
func TestReplayRunAhead(t *testing.T) {
	const text = "# gpumem-trace v1\n" +
		"a 0 67108864 7 0\n" +
		"f 0 10\n" +
		"a 1 67108864 9 20\n" + // another stream, 10 us after the free
		"f 1 30\n"
	tr := readTrace(t, text)
	run := func(ahead uint64) replay.Result {
		dev := sim.MustNew(sim.Config{Capacity: 1 << 30, RunAhead: ahead})
		opt := replay.Options{Check: true}
		if ahead > 0 {
			opt.AtTime = dev.SetTime
		}
		res, err := replay.Run(tr, dev, gpumem.Config{}, opt)
		if err != nil {
			t.Fatal(err)
		}
		return res
	}
	keepUp, behind := run(0), run(1000)
	if keepUp.PeakReservedBytes >= 128<<20 || behind.PeakReservedBytes != keepUp.PeakReservedBytes {
		t.Errorf("peak reserved with the GPU keeping up %d, 1 ms behind %d; want both the one 64 MiB block's (the free reused)",
			keepUp.PeakReservedBytes, behind.PeakReservedBytes)
	}
	if keepUp.Orders != 0 || behind.Orders != 1 || keepUp.Handoffs != 1 || behind.Handoffs != 1 {
		t.Errorf("orders %d and %d, handoffs %d and %d (keeping up, behind); want 0 and 1, 1 and 1",
			keepUp.Orders, behind.Orders, keepUp.Handoffs, behind.Handoffs)
	}
}

// TestReplayTightCalls: ten passes of a program on a device just above its
// ten-pass fit under Config.Gather (gpumem fit --policy gpumem-gather)
// run without an out-of-memory and make at most twice the driver calls
// that matter for time (creates, maps, unmaps and releases; later passes'
// unmaps are not counted, as in docs/EXPERIMENTS.md, "A failed backing
// keeps its spans") of the same ten passes unlimited. When each failed
// attempt gave back the spans it had mapped and every retry released the
// whole cache first, bert_mlm_varlen made 28,810 such calls there against
// 1,569 unlimited, and sweep_create_dispose 8,346 against 1,421. The
// capacities follow the fit figures: since a batch of frees is kept in
// order (pool.batch) bert_mlm_varlen's is 11.38 GiB (11.37 before: at the
// old 11,634 MiB two requests now fail) and both programs make fewer calls
// unlimited (1,511 and 1,039).
func TestReplayTightCalls(t *testing.T) {
	for _, c := range []struct {
		name     string
		capacity uint64 // the fit figure raised as bench/core/calls_at_fit.sh does (5.12 MiB, then up to 2 MiB)
	}{
		{"bert_mlm_varlen", 11660 << 20},      // 11.38 GiB
		{"sweep_create_dispose", 10298 << 20}, // 10.05 GiB
	} {
		t.Run(c.name, func(t *testing.T) {
			tr, err := trace.Load(filepath.Join(traceDir, c.name+".trace.gz"))
			if err != nil {
				t.Fatal(err)
			}
			run := func(capacity uint64) (calls uint64, ooms int) {
				res, err := replay.Run(tr, sim.MustNew(sim.Config{Capacity: capacity}), gpumem.Config{Gather: true}, replay.Options{Passes: 10})
				if err != nil {
					t.Fatal(err)
				}
				p := res.Passes
				return res.Creates + res.Maps + res.Unmaps + res.Releases + p.CreatesLater + p.MapsLater + p.ReleasesLater, res.OOMs + p.OOMsLater
			}
			free, _ := run(0)
			tight, ooms := run(c.capacity)
			t.Logf("%s: %d calls at %d MiB, %d unlimited", c.name, tight, c.capacity>>20, free)
			if ooms != 0 {
				t.Errorf("%d out-of-memory errors at %d MiB", ooms, c.capacity>>20)
			}
			if tight > 2*free {
				t.Errorf("%d calls at %d MiB, %.1f times the %d unlimited: want at most twice", tight, c.capacity>>20, float64(tight)/float64(free), free)
			}
		})
	}
}

// TestAtPeak: the make-up at the peak sums to what was held, names the
// event that raised the peak last, and on a one-request trace is what the
// chunk and span arithmetic says: 1 MiB live in a 2 MiB chunk of the
// first span, the rest of that span idle.
func TestAtPeak(t *testing.T) {
	sum := func(m *replay.PeakMakeup) uint64 {
		return m.LiveBytes + m.FreeInLiveChunks + m.IdleChunksLiveSpans + m.EmptySpans + m.PlainLiveBytes + m.PlainFreeBytes + m.OtherBytes
	}
	one, err := trace.Read(strings.NewReader("# gpumem-trace v1\na 0 1048576 0 0\n"), "one")
	if err != nil {
		t.Fatal(err)
	}
	res, err := replay.Run(one, sim.MustNew(sim.Config{Capacity: 1 << 30}), gpumem.Config{Mode: gpumem.ModeVirtual}, replay.Options{AtPeak: true})
	if err != nil {
		t.Fatal(err)
	}
	m := res.AtPeak
	if m == nil {
		t.Fatal("no make-up at the peak")
	}
	if m.Pass != 1 || m.Event != 0 || m.Request != 1<<20 || m.ReservedBytes != res.PeakReservedBytes ||
		m.LiveBytes != 1<<20 || m.FreeInLiveChunks != 1<<20 || m.IdleChunksLiveSpans != m.ReservedBytes-2<<20 || m.EmptySpans != 0 || sum(m) != m.ReservedBytes {
		t.Errorf("one request: %+v (peak %d)", *m, res.PeakReservedBytes)
	}

	if res, err := replay.Run(one, sim.MustNew(sim.Config{Capacity: 1 << 30}), gpumem.Config{}, replay.Options{}); err != nil || res.AtPeak != nil {
		t.Errorf("without AtPeak: %v, %+v", err, res.AtPeak)
	}

	// A whole trace, both modes, two passes: the snapshot at each new peak
	// makes it 20 s under the race detector.
	longtest.Skip(t, "the make-up at the peak of a whole trace")
	for _, mode := range []gpumem.Mode{gpumem.ModeVirtual, gpumem.ModePlain} {
		for _, tr := range loadTraces(t)[:1] {
			res, err := replay.Run(tr, sim.MustNew(sim.Config{}), gpumem.Config{Mode: mode}, replay.Options{AtPeak: true, Passes: 2})
			if err != nil {
				t.Fatal(err)
			}
			m := res.AtPeak
			if m == nil {
				t.Fatalf("%s %v: no make-up at the peak", tr.Name, mode)
			}
			if sum(m) != m.ReservedBytes || m.PeakReservedBytes != res.Passes.PeakReservedBytes || m.ReservedBytes > m.PeakReservedBytes ||
				m.Pass < 1 || m.Pass > 2 || m.Event >= len(tr.Events) || (tr.Events[m.Event].Kind == trace.Alloc) != (m.Request == tr.Events[m.Event].Size) {
				t.Errorf("%s %v: %+v; the parts sum to %d; peak over the passes %d", tr.Name, mode, *m, sum(m), res.Passes.PeakReservedBytes)
			}
			if mode == gpumem.ModePlain && m.LiveBytes+m.FreeInLiveChunks+m.IdleChunksLiveSpans+m.EmptySpans != 0 {
				t.Errorf("%s plain: virtual parts %+v", tr.Name, *m)
			}
		}
	}
}
