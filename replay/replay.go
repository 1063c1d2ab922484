// Package replay runs an allocation trace against a device and an allocator
// configuration and reports what the allocator held: the figure that
// matters for fragmentation (peak reserved / peak live), the OOMs, the
// device work and the time per event.
package replay

import (
	"errors"
	"fmt"
	"reflect"
	"slices"
	"time"

	"github.com/gpumem/gpumem"
	"github.com/gpumem/gpumem/device"
	"github.com/gpumem/gpumem/device/timed"
	"github.com/gpumem/gpumem/trace"
)

// Options tune a replay.
type Options struct {
	// Touch, if set, is called with every allocation (its stream and
	// buffer) before the replay goes on; the CUDA replay writes the memory
	// so that it is truly backed.
	Touch func(s device.Stream, b gpumem.Buffer) error
	// Check runs Allocator.Check after the replay and fails on a violation.
	Check bool
	// Warm replays the trace a second time on the same allocator (what
	// the first pass left live staying live, see Passes) and reports that
	// pass's time as NsPerOpWarm: the allocator's speed once its cache is
	// populated (the peers' benchmark reports the same).
	Warm bool
	// Passes replays the trace this many times in all on the same
	// allocator (Warm asks for at least 2): a program that runs longer
	// than its trace, or runs it again in the same process. What the trace
	// never frees (its model, if still held when the recording stopped;
	// the workspaces of cuBLAS and cuDNN, 32 MiB each, which PyTorch keeps
	// for the life of the process) stays live from the pass that allocated
	// it, and later passes do not allocate it again: so a real program run
	// three times in one process held what three passes of its trace hold,
	// to the MiB, on three of four corpus programs (docs/BENCHMARKS.md,
	// "Three runs in one process"), where freeing everything between
	// passes, as the replay did before, matched none. The
	// peak over every pass, the device calls and the time of the passes
	// after the first are reported in Result.Passes. 0 and 1 mean one pass
	// (two with Warm).
	Passes int
	// Repeat (Run only) replays the trace this many times (at least once),
	// each on a new allocator, and reports the median times, with every run's in
	// NsPerOpRuns and NsPerOpWarmRuns: one pass on a shared machine varies
	// by tens of percent. Every run must make the same decisions (peak,
	// counts); a run that does not is an error.
	Repeat int
	// DriverTimes (Run only) counts and times every call to the device,
	// by operation (device/timed), in Result.Driver and
	// PassesResult.DriverLater. With Repeat, the first run's.
	DriverTimes bool
	// AtTime, if set, is called with each event's trace time before the
	// event is replayed: the simulated device's clock for its
	// Config.RunAhead (a host that runs ahead of the GPU).
	AtTime func(us uint64)
	// AtPeak reports what the allocator held, part by part, right after
	// the event that last raised its peak of reserved bytes, over every
	// pass (Result.AtPeak): where the overhead at the peak lies. A
	// diagnostic: it reads the allocator's state after every event.
	AtPeak bool
}

// PeakMakeup is what the allocator held right after the event that last
// raised its peak of reserved bytes, part by part (Options.AtPeak). The
// parts sum to ReservedBytes.
type PeakMakeup struct {
	Pass    int    `json:"pass"`    // from 1
	Event   int    `json:"event"`   // index in the trace
	Request uint64 `json:"request"` // the bytes that event asked for (0: a free)
	// PeakReservedBytes is the peak it raised (a move may take its new
	// span before giving the old one back, so the peak can lie above
	// ReservedBytes, what was held once the event was done).
	PeakReservedBytes uint64 `json:"peak_reserved_bytes"`
	ReservedBytes     uint64 `json:"reserved_bytes"`
	// Of a virtual arena: the blocks not free (allocated, or freed with
	// other streams' work pending), the free bytes in chunks that hold
	// one of them, the chunks with none in spans that have one (a span is
	// mapped whole, so they cannot be given back or moved), and the
	// spans with no live chunk (mapped, cached, free to move).
	LiveBytes           uint64 `json:"live_bytes"`
	FreeInLiveChunks    uint64 `json:"free_in_live_chunks"`
	IdleChunksLiveSpans uint64 `json:"idle_chunks_in_live_spans"`
	EmptySpans          uint64 `json:"empty_spans"`
	// Of plain segments (ModePlain, or a device without virtual memory):
	// the blocks not free and the rest.
	PlainLiveBytes uint64 `json:"plain_live_bytes,omitempty"`
	PlainFreeBytes uint64 `json:"plain_free_bytes,omitempty"`
	// OtherBytes is held outside spans and segments: handles not mapped
	// (unreleased, shared, dormant moves).
	OtherBytes uint64 `json:"other_bytes,omitempty"`
}

// makeup reads snapshot s into the parts of a PeakMakeup.
func makeup(s gpumem.Snapshot) PeakMakeup {
	m := PeakMakeup{PeakReservedBytes: s.Stats.PeakReserved, ReservedBytes: s.Stats.Reserved}
	var held uint64
	for _, seg := range s.Segments {
		var live uint64
		for _, b := range seg.Blocks {
			if b.State != "free" {
				live += b.Size
			}
		}
		if seg.Kind == "plain" {
			m.PlainLiveBytes += live
			m.PlainFreeBytes += seg.Size - live
			held += seg.Size
			continue
		}
		m.LiveBytes += live
		var liveChunks uint64
		for _, sp := range seg.Spans {
			held += sp.Size
			liveChunks += sp.LiveBytes
			if sp.LiveBytes == 0 {
				m.EmptySpans += sp.Size
			} else {
				m.IdleChunksLiveSpans += sp.Size - sp.LiveBytes
			}
		}
		m.FreeInLiveChunks += liveChunks - min(live, liveChunks)
	}
	m.OtherBytes = m.ReservedBytes - min(held, m.ReservedBytes)
	return m
}

// Result is one trace's replay. JSON keys are part of the CLI's contract.
type Result struct {
	Trace             string  `json:"trace"`
	Device            string  `json:"device"`
	Mode              string  `json:"mode"`
	Events            int     `json:"events"`
	PeakLiveBytes     uint64  `json:"peak_live_bytes"`
	PeakReservedBytes uint64  `json:"peak_reserved_bytes"`
	Ratio             float64 `json:"ratio"`
	OOMs              int     `json:"ooms"`
	NsPerOp           float64 `json:"ns_per_op"`
	NsPerOpWarm       float64 `json:"ns_per_op_warm,omitempty"`
	Maps              uint64  `json:"maps"`
	Unmaps            uint64  `json:"unmaps"`
	DeviceCalls       uint64  `json:"device_calls"`
	Creates           uint64  `json:"creates"`
	Releases          uint64  `json:"releases"`
	Fences            uint64  `json:"fences"`
	// Handoffs and Orders: free memory handed to another stream once its
	// work was known done, and waits on the GPU for another stream's work
	// so that its frees serve a request (gpumem.Stats).
	Handoffs uint64 `json:"handoffs,omitempty"`
	Orders   uint64 `json:"orders,omitempty"`
	// Misses counts the allocations the cache did not serve at once
	// (gpumem.Stats.Misses): the slow path's share of the requests.
	Misses uint64 `json:"misses"`
	// Splits, Copies and CopiedBytes: sparse spans whose live chunks
	// moved, the runs of live chunks copied (each a new handle) and their
	// bytes (gpumem.Config.Defrag; else 0).
	Splits      uint64 `json:"splits,omitempty"`
	Copies      uint64 `json:"copies,omitempty"`
	CopiedBytes uint64 `json:"copied_bytes,omitempty"`
	// SplitNs is the wall time the splits took (gpumem.Stats.SplitNanos).
	SplitNs uint64 `json:"split_ns,omitempty"`
	// Driver is the device calls of the first pass and their wall time,
	// by operation (Options.DriverTimes; the allocator's creation and
	// the first pass's calls; Close's are not counted).
	Driver          timed.Times `json:"driver,omitempty"`
	PeakActiveBytes uint64      `json:"peak_active_bytes"`
	// EndReservedBytes is what the allocator still held after the last
	// event, before Close.
	EndReservedBytes uint64 `json:"end_reserved_bytes"`
	// NsPerOpRuns and NsPerOpWarmRuns are the times of each run when
	// Options.Repeat is above 1; NsPerOp and NsPerOpWarm are their medians.
	NsPerOpRuns     []float64 `json:"ns_per_op_runs,omitempty"`
	NsPerOpWarmRuns []float64 `json:"ns_per_op_warm_runs,omitempty"`
	// Passes is set when more than one pass ran (Options.Passes,
	// Options.Warm).
	Passes *PassesResult `json:"passes,omitempty"`
	// FirstOOM is the first request of the first pass that ran out of
	// memory, with the allocator's verdict; nil when none did.
	FirstOOM *OOM `json:"first_oom,omitempty"`
	// AtPeak is what was held at the peak, part by part (Options.AtPeak).
	AtPeak *PeakMakeup `json:"at_peak,omitempty"`
}

// OOM is a request of a trace that ran out of memory in a replay.
type OOM struct {
	Pass    int                      `json:"pass"`    // the pass it happened in, from 1
	Event   int                      `json:"event"`   // its index among the trace's events
	ID      uint64                   `json:"id"`      // its request id in the trace
	Verdict *gpumem.OutOfMemoryError `json:"verdict"` // the allocator's
	// Policies is how the same trace fared under other allocators'
	// policies on a device of the memory the request ran into
	// (Verdict.Limit): the question a single allocator cannot answer. Run
	// leaves it empty; gpumem replay fills it from package policy.
	Policies []PolicyOOMs `json:"policies,omitempty"`
}

// PolicyOOMs is how many requests of a trace ran out of memory under one
// emulated policy.
type PolicyOOMs struct {
	Policy   string `json:"policy"`
	Capacity uint64 `json:"capacity"`
	OOMs     int    `json:"ooms"`
}

// PassesResult is what a replay of several passes on one allocator held
// and did after its first pass: the first-pass figures of Result do not see
// a peak that rises later, as a program's cache is rearranged by running
// longer than its trace.
type PassesResult struct {
	N                 int     `json:"n"`
	PeakReservedBytes uint64  `json:"peak_reserved_bytes"` // over all passes
	Ratio             float64 `json:"ratio"`               // PeakReservedBytes / PeakLiveBytes
	// PeakLiveBytes is the most live over all passes (trace.Trace's
	// PeakLivePasses): the trace's own peak live bytes where what it never
	// frees is allocated once and kept, as a recorded program's workspaces.
	PeakLiveBytes uint64 `json:"peak_live_bytes"`
	CreatesLater  uint64 `json:"creates_later"` // in the passes after the first
	MapsLater     uint64 `json:"maps_later"`
	ReleasesLater uint64 `json:"releases_later"`
	MissesLater   uint64 `json:"misses_later"` // Result.Misses, of the passes after the first
	// OOMsLater counts the requests of the passes after the first that ran
	// out of memory (a capacity or limit the first pass fitted in may not
	// hold a later pass whose layout has drifted); FirstOOMLater is the
	// first of them, with its pass.
	OOMsLater     int  `json:"ooms_later"`
	FirstOOMLater *OOM `json:"first_oom_later,omitempty"`
	// SplitsLater counts the later passes' splits (Result.Splits), and
	// SplitNsLater is the time they took (Result.SplitNs).
	SplitsLater  uint64 `json:"splits_later,omitempty"`
	SplitNsLater uint64 `json:"split_ns_later,omitempty"`
	// DriverLater is Result.Driver for the passes after the first,
	// together (the frees between passes included).
	DriverLater timed.Times `json:"driver_later,omitempty"`
	// NsPerOpLater is the time per event of the passes after the first,
	// together (with Options.Repeat, the median over the runs): the
	// allocator's speed in a program's steady state.
	NsPerOpLater float64 `json:"ns_per_op_later"`
}

// Run replays tr on dev with a new allocator configured by cfg, and closes
// the allocator. Requests still live at the end of the trace are freed by
// Close (traces end with live requests; that is not a leak of the replay).
func Run(tr *trace.Trace, dev device.Device, cfg gpumem.Config, opt Options) (Result, error) {
	first, err := runOnce(tr, dev, cfg, opt)
	if err != nil || opt.Repeat <= 1 {
		return first, err
	}
	cold, warm := []float64{first.NsPerOp}, []float64{first.NsPerOpWarm}
	var later []float64
	if first.Passes != nil {
		later = append(later, first.Passes.NsPerOpLater)
	}
	for run := 2; run <= opt.Repeat; run++ {
		r, err := runOnce(tr, dev, cfg, opt)
		if err != nil {
			return Result{}, fmt.Errorf("replay %s: run %d: %w", tr.Name, run, err)
		}
		if !sameDecisions(r, first) {
			return Result{}, fmt.Errorf("replay %s: run %d decided differently from run 1 (peak reserved %d vs %d, %d vs %d creates, %d vs %d maps): the allocator is not deterministic",
				tr.Name, run, r.PeakReservedBytes, first.PeakReservedBytes, r.Creates, first.Creates, r.Maps, first.Maps)
		}
		cold, warm = append(cold, r.NsPerOp), append(warm, r.NsPerOpWarm)
		if r.Passes != nil {
			later = append(later, r.Passes.NsPerOpLater)
		}
	}
	if first.Passes != nil {
		first.Passes.NsPerOpLater = median(later)
	}
	first.NsPerOpRuns, first.NsPerOp = cold, median(cold)
	if opt.Warm {
		first.NsPerOpWarmRuns, first.NsPerOpWarm = warm, median(warm)
	}
	return first, nil
}

// decisions is p without its times (and its first later OOM, a pointer:
// the count is compared).
func (p *PassesResult) decisions() PassesResult {
	d := *p
	d.NsPerOpLater, d.SplitNsLater, d.FirstOOMLater, d.DriverLater = 0, 0, nil, nil
	return d
}

// sameDecisions reports whether two runs of one trace held and did the same.
func sameDecisions(a, b Result) bool {
	return a.PeakReservedBytes == b.PeakReservedBytes && a.OOMs == b.OOMs &&
		a.Creates == b.Creates && a.Releases == b.Releases && a.Maps == b.Maps &&
		a.Unmaps == b.Unmaps && a.EndReservedBytes == b.EndReservedBytes &&
		(a.Passes == nil) == (b.Passes == nil) && (a.Passes == nil || reflect.DeepEqual(a.Passes.decisions(), b.Passes.decisions()))
}

// median returns the median of xs (the mean of the middle two for an even
// count); xs is left unchanged.
func median(xs []float64) float64 {
	s := slices.Clone(xs)
	slices.Sort(s)
	n := len(s)
	if n%2 == 1 {
		return s[n/2]
	}
	return (s[n/2-1] + s[n/2]) / 2
}

// runOnce is one replay of tr on a new allocator (Run without Repeat).
func runOnce(tr *trace.Trace, dev device.Device, cfg gpumem.Config, opt Options) (Result, error) {
	streams, destroy, err := mapStreams(tr, dev)
	if err != nil {
		return Result{}, err
	}
	defer destroy() // after Close: streams must outlive the memory on them
	var clock *timed.Device
	if opt.DriverTimes {
		if clock, err = timed.New(dev); err != nil {
			return Result{}, err
		}
		dev = clock
	}
	a, err := gpumem.New(dev, cfg)
	if err != nil {
		return Result{}, err
	}
	res, err := runOn(tr, a, streams, opt, clock)
	if cerr := a.Close(); cerr != nil && !errors.Is(cerr, gpumem.ErrLeak) && err == nil {
		err = cerr
	}
	return res, err
}

// RunOn replays tr on an existing allocator, which it leaves open with the
// trace's still-live requests allocated. A multi-stream trace runs on
// streams of the trace's own numbering, which the device must know.
func RunOn(tr *trace.Trace, a *gpumem.Allocator, opt Options) (Result, error) {
	streams := map[uint64]device.Stream{}
	for _, s := range tr.Streams {
		streams[s] = device.Stream(s)
	}
	return runOn(tr, a, streams, opt, nil)
}

// runOn replays tr on a; clock, if not nil, is the timed device under a.
func runOn(tr *trace.Trace, a *gpumem.Allocator, streams map[uint64]device.Stream, opt Options, clock *timed.Device) (Result, error) {
	bufs := make([]gpumem.Buffer, tr.Requests)
	before := a.Stats()
	var atPeak *PeakMakeup
	var watch func(n, i int)
	if opt.AtPeak {
		seen := before.PeakReserved
		watch = func(n, i int) {
			if a.Usage().PeakReserved <= seen {
				return
			}
			m := makeup(a.Snapshot())
			seen = m.PeakReservedBytes
			m.Pass, m.Event = n, i
			if ev := tr.Events[i]; ev.Kind == trace.Alloc {
				m.Request = ev.Size
			}
			atPeak = &m
		}
	}
	var first *OOM
	elapsed, ooms, err := pass(tr, a, streams, bufs, opt, 1, &first, watch)
	if err != nil {
		return Result{}, err
	}
	st := a.Stats()
	var driverFirst timed.Times
	if clock != nil {
		driverFirst = clock.Times()
	}
	if opt.Check {
		if err := a.Check(); err != nil {
			return Result{}, fmt.Errorf("replay %s: invariants: %w", tr.Name, err)
		}
	}
	r := Result{
		Trace:             tr.Name,
		Device:            a.Device().Info().Name,
		Mode:              a.Mode().String(),
		Events:            len(tr.Events),
		PeakLiveBytes:     tr.PeakLiveBytes,
		PeakReservedBytes: st.PeakReserved,
		OOMs:              ooms,
		FirstOOM:          first,
		Maps:              st.Maps - before.Maps,
		Unmaps:            st.Unmaps - before.Unmaps,
		DeviceCalls:       st.DeviceCalls() - before.DeviceCalls(),
		Creates:           st.Creates - before.Creates,
		Releases:          st.Releases - before.Releases,
		Fences:            st.Fences - before.Fences,
		Handoffs:          st.Handoffs - before.Handoffs,
		Orders:            st.Orders - before.Orders,
		Misses:            st.Misses - before.Misses,
		Splits:            st.Splits - before.Splits,
		Copies:            st.Copies - before.Copies,
		SplitNs:           st.SplitNanos - before.SplitNanos,
		CopiedBytes:       st.CopiedBytes - before.CopiedBytes,
		PeakActiveBytes:   st.PeakActive,
		EndReservedBytes:  st.Reserved,
	}
	r.Driver = driverFirst // the clock began with the allocator
	if len(tr.Events) > 0 {
		r.NsPerOp = float64(elapsed.Nanoseconds()) / float64(len(tr.Events))
	}
	passes := max(opt.Passes, 1)
	if opt.Warm {
		passes = max(passes, 2)
	}
	var later time.Duration
	var oomsLater int
	var firstLater *OOM
	for n := 2; n <= passes; n++ {
		took, o, err := pass(tr, a, streams, bufs, opt, n, &firstLater, watch)
		if err != nil {
			return Result{}, fmt.Errorf("pass %d of %d: %w", n, passes, err)
		}
		later += took
		oomsLater += o
		if n == 2 && opt.Warm && len(tr.Events) > 0 {
			r.NsPerOpWarm = float64(took.Nanoseconds()) / float64(len(tr.Events))
		}
	}
	if r.PeakLiveBytes > 0 {
		r.Ratio = float64(r.PeakReservedBytes) / float64(r.PeakLiveBytes)
	}
	r.AtPeak = atPeak
	if passes > 1 {
		end := a.Stats()
		r.Passes = &PassesResult{N: passes, PeakReservedBytes: end.PeakReserved,
			CreatesLater: end.Creates - st.Creates, MapsLater: end.Maps - st.Maps, ReleasesLater: end.Releases - st.Releases,
			OOMsLater: oomsLater, FirstOOMLater: firstLater, SplitsLater: end.Splits - st.Splits, SplitNsLater: end.SplitNanos - st.SplitNanos,
			MissesLater: end.Misses - st.Misses}
		r.Passes.PeakLiveBytes = tr.PeakLivePasses(passes)
		if r.Passes.PeakLiveBytes > 0 {
			r.Passes.Ratio = float64(end.PeakReserved) / float64(r.Passes.PeakLiveBytes)
		}
		if clock != nil {
			r.Passes.DriverLater = clock.Times().Sub(driverFirst)
		}
		if len(tr.Events) > 0 {
			r.Passes.NsPerOpLater = float64(later.Nanoseconds()) / float64((passes-1)*len(tr.Events))
		}
	}
	return r, nil
}

// pass replays every event of tr once (pass number n, from 1), timing the
// loop, and leaves the requests the trace never frees in bufs. The first
// request that runs out of memory is recorded in *first if that is nil.
// watch, if not nil, is called after each event with n and the event's
// index (Options.AtPeak).
func pass(tr *trace.Trace, a *gpumem.Allocator, streams map[uint64]device.Stream, bufs []gpumem.Buffer, opt Options, n int, first **OOM, watch func(n, i int)) (time.Duration, int, error) {
	ooms := 0
	start := time.Now()
	trims := 0 // tr.Trims done: the program's empty_cache calls, replayed as Trim
	for i, ev := range tr.Events {
		if watch != nil && i > 0 {
			watch(n, i-1) // after the event before
		}
		if opt.AtTime != nil {
			opt.AtTime(ev.TimeUS)
		}
		for trims < len(tr.Trims) && int(tr.Trims[trims]) == i {
			if err := a.Trim(); err != nil {
				return 0, 0, fmt.Errorf("replay %s: the trim before event %d: %w", tr.Name, i, err)
			}
			trims++
		}
		slot := tr.Slot[i]
		if ev.Kind == trace.Alloc {
			if !bufs[slot].IsZero() {
				continue // never freed: live since an earlier pass (Options.Passes)
			}
			s := streams[ev.Stream]
			b, err := a.Alloc(ev.Size, s)
			if err != nil {
				if errors.Is(err, gpumem.ErrOutOfMemory) {
					ooms++
					var v *gpumem.OutOfMemoryError
					if *first == nil && errors.As(err, &v) {
						*first = &OOM{Pass: n, Event: i, ID: ev.ID, Verdict: v}
					}
					continue
				}
				return 0, 0, fmt.Errorf("replay %s: event %d (a %d %d): %w", tr.Name, i, ev.ID, ev.Size, err)
			}
			bufs[slot] = b
			if opt.Touch != nil {
				if err := opt.Touch(s, b); err != nil {
					return 0, 0, fmt.Errorf("replay %s: touching request %d: %w", tr.Name, ev.ID, err)
				}
			}
			continue
		}
		b := bufs[slot]
		if b.IsZero() {
			continue // its allocation failed
		}
		if err := a.Free(b); err != nil {
			return 0, 0, fmt.Errorf("replay %s: event %d (f %d): %w", tr.Name, i, ev.ID, err)
		}
		bufs[slot] = gpumem.Buffer{}
	}
	if watch != nil && len(tr.Events) > 0 {
		watch(n, len(tr.Events)-1)
	}
	if trims < len(tr.Trims) { // after the last event: the next pass begins trimmed
		if err := a.Trim(); err != nil {
			return 0, 0, fmt.Errorf("replay %s: the trim after the last event: %w", tr.Name, err)
		}
	}
	return time.Since(start), ooms, nil
}

// mapStreams gives each stream of the trace a stream of the device: 0 stays
// the default stream; others are created when the device can, else they
// keep their identity (the allocator only needs identity). destroy
// destroys the streams it created.
func mapStreams(tr *trace.Trace, dev device.Device) (map[uint64]device.Stream, func(), error) {
	m := map[uint64]device.Stream{0: 0}
	st, ok := device.AsStreams(dev)
	var made []device.Stream
	destroy := func() {
		for _, s := range made {
			_ = st.DestroyStream(s)
		}
	}
	for _, s := range tr.Streams {
		if s == 0 {
			continue
		}
		if !ok {
			m[s] = device.Stream(s)
			continue
		}
		ds, err := st.NewStream()
		if err != nil {
			destroy()
			return nil, nil, fmt.Errorf("replay %s: creating a stream for trace stream %d: %w", tr.Name, s, err)
		}
		made = append(made, ds)
		m[s] = ds
	}
	return m, destroy, nil
}
