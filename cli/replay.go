package cli

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"runtime/pprof"
	"strconv"
	"strings"

	"github.com/gpumem/gpumem"
	"github.com/gpumem/gpumem/device"
	"github.com/gpumem/gpumem/device/sim"
	"github.com/gpumem/gpumem/device/timed"
	"github.com/gpumem/gpumem/internal/units"
	"github.com/gpumem/gpumem/policy"
	"github.com/gpumem/gpumem/replay"
	"github.com/gpumem/gpumem/trace"
)

const replayAbout = `Replay replays allocation traces (gpumem-trace v1 or v2, plain or gzip;
or PyTorch memory snapshots, .pickle, the first device with an allocation
history, as gpumem import reads them) through a new allocator each, and
prints per trace: the events, the peak of live bytes (the least any
allocator must hold), the peak the allocator reserved from the device,
their ratio (1.000 is no fragmentation overhead), the requests that failed
for want of memory (OOMs), the chunks mapped and unmapped, and the time per
event.

The device is the CUDA GPU if the driver loads, else (with one line on
stderr) a simulated device of --capacity bytes; each trace gets a fresh
simulated device, or a fresh allocator on the GPU. --touch writes every
allocation on the GPU, so that the memory is truly backed; it implies
--device cuda. --capacity and --granularity describe the simulated device
only.

With --json, each trace is one JSON object on one line, with the keys trace,
device, mode, events, peak_live_bytes, peak_reserved_bytes, ratio, ooms,
ns_per_op, maps, unmaps, device_calls, creates, releases, fences, misses
(the allocations the cache did not serve at once), peak_active_bytes and
end_reserved_bytes, and with --defrag splits, copies,
copied_bytes and split_ns (the spans whose live chunks moved, the device
copies and their bytes, the wall time of the splits); with
--warm or --passes also passes: {n, peak_reserved_bytes and ratio over all
passes, creates_later, maps_later, releases_later, misses_later, ooms_later,
ns_per_op_later, splits_later and split_ns_later with --defrag, and
first_oom_later when a
later pass ran out of memory}; with --at-peak at_peak: {pass, event,
request, peak_reserved_bytes, reserved_bytes, live_bytes,
free_in_live_chunks, idle_chunks_in_live_spans, empty_spans, and
plain_live_bytes, plain_free_bytes and other_bytes where not 0: what was
held right after the event that last raised the peak, part by part; the
parts sum to reserved_bytes}; when a request ran out
of memory, first_oom: {pass, event, id, verdict}, the verdict of the first
(the fields of gpumem.h's gpumem_oom, cause and answers as words, and the
message). Without --json, each trace's first OOM is printed after the
table: its cause with the numbers, and what would have fit (after a trim,
with virtual-memory spans, a smaller request), then the first OOM of the
later passes. A trace cut short (gzip data or a last line that stops
early: a recording whose process died) is an error; --partial replays it
up to its last whole line instead, with a note on stderr saying where it
was cut. A capacity the first pass fitted in may not hold a later
pass: --passes with --capacity or --limit says whether it does. The
first-pass ratio is what a program as long as its trace holds;
passes.ratio is what it holds if it goes on doing the same (its peak may
rise as its cache is rearranged).

--policy NAME replays under another allocator's policy, emulated on the
simulated device of --capacity bytes (see package policy): tf-bfc and
tf-bfc-prealloc (TensorFlow's and XLA's BFC allocator, growing or with 75%
of the device taken at start), torch-native and torch-expandable (PyTorch's
caching allocator as shipped and with expandable segments) and cuda-async
(CUDA's stream-ordered pool, as PyTorch's cudaMallocAsync backend uses it);
gpumem, the default, is the replay described above; all replays each trace
under every policy, gpumem's default configuration first. The table then
has one row per trace and policy: the peak live and reserved bytes, their
ratio, the OOMs and what was still reserved at the end; with --json, one
object per row with the keys policy, trace, capacity, events,
peak_live_bytes, peak_reserved_bytes, ratio, ooms, end_reserved_bytes and
peak_event (the index of the event after which the peak was first held).
With --passes N (2 or more) each trace is also replayed N times on one
allocator of the policy (what the trace never frees stays live, allocated once),
and the table gains the peak over all passes and the address repetition:
the share of the requests of passes 2..N that got the address the same
request had in the pass before (1.000: every pass repeats the last; XLA's
command buffers are traced again when a step's addresses change); with
--json, passes: {n, compared, same, same_address, peak_reserved_bytes,
ratio, ooms_later}. The flags that configure gpumem or the GPU do not apply to it.

A trace that cannot be read is reported and skipped; a replay that fails
stops the command. Either way the exit status is 1. SIZE is bytes with an
optional unit: 80GiB, 512MiB, 1.5GB, 1024.`

func (e *env) replay(args []string) int {
	fs := e.flagSet("replay", "TRACE...", replayAbout)
	jsonOut := fs.Bool("json", false, "print one JSON object per trace per line instead of a table")
	devName := fs.String("device", "auto", "the `device`: auto (cuda if the driver loads, else sim), sim or cuda")
	ordinal := fs.Int("gpu", 0, "the CUDA device `ordinal` (as the driver numbers them, after CUDA_VISIBLE_DEVICES)")
	capacity := sizeFlag(sim.DefaultCapacity)
	fs.Var(&capacity, "capacity", "the simulated device's memory (`SIZE`)")
	granularity := sizeFlag(sim.DefaultGranularity)
	fs.Var(&granularity, "granularity", "the simulated device's granule (`SIZE`: a power of two, at least 4KiB)")
	runAhead := fs.Duration("run-ahead", 0, "the simulated GPU runs this far behind the host, in the trace's time (5ms): an event recorded at a trace time t is not done before t plus this unless the allocator waited for it; a program that does not synchronize at each step runs ahead so (0: the GPU keeps up)")
	queryLag := fs.Int("query-lag", 0, "the simulated device's events report not done to their first `n` queries after a record, as a GPU's do for microseconds (0: done at once on an idle stream)")
	mode := fs.String("mode", "auto", "allocator `mode`: auto, plain (whole segments) or virtual (memory mapped in spans)")
	var limit, prealloc, release, small, span sizeFlag
	fs.Var(&limit, "limit", "cap on the bytes the allocator holds (`SIZE`; 0: the device's capacity)")
	fs.Var(&prealloc, "preallocate", "take `SIZE` bytes from the device up front and keep them")
	fraction := fs.Float64("preallocate-fraction", 0, "take this `fraction` (0 to 1) of the device's memory up front")
	fs.Var(&release, "release-threshold", "return cached memory above `SIZE` to the device after each free (0: keep the cache)")
	fs.Var(&small, "small-size", "plain mode: requests of at most `SIZE` bytes use the small pool (0: 1MiB)")
	fs.Var(&span, "span", "virtual mode: the most memory taken from the device in one piece (`SIZE`; 0: 16MiB, 4MiB with --compact)")
	touch := fs.Bool("touch", false, "write every allocation (an asynchronous memset on its stream) so it is truly backed (the time per event includes it); CUDA only")
	check := fs.Bool("check", false, "run the allocator's invariant checker after each replay")
	warm := fs.Bool("warm", false, "replay each trace a second time on the same allocator and report that pass's time too (ns_per_op_warm)")
	passes := fs.Int("passes", 1, "replay each trace `n` times on the same allocator (what the trace never frees stays live, allocated once, as a process keeps its workspaces) and report the peak over all passes (passes.ratio, over the most live over all passes): a program that runs longer than its trace, or again in one process")
	repeat := fs.Int("repeat", 1, "replay each trace `n` times, each on a new allocator, and report the median times (every run's in ns_per_op_runs)")
	compact := fs.Bool("compact", false, "best-fit placement that holds the least memory, at more driver calls (gpumem.Config.Compact)")
	chunkHandles := fs.Bool("chunk-handles", false, "virtual mode: a physical handle per chunk, so that growth takes the free chunks of partly used spans before new memory (gpumem.Config.ChunkHandles; experimental)")
	defrag := fs.Bool("defrag", false, "move live chunks out of sparse spans rather than grow past peak active + 1% (gpumem.Config.Defrag; synchronizes the device at each move)")
	gather := fs.Bool("gather", false, "before an out-of-memory, move live chunks out of sparse spans until the request fits (gpumem.Config.Gather; synchronizes the device at each move; in a program, only where all GPU work, libraries' included, is launched from one thread at a time: another host thread's writes to moved memory are lost with no error)")
	partial := fs.Bool("partial", false, "replay a trace cut short (a recording whose process died, gzip data or a last line that stops early) up to its last whole line, with a note on stderr that says where it was cut; without it such a trace is an error")
	atPeak := fs.Bool("at-peak", false, "say what was held right after the event that last raised the peak of reserved bytes, part by part: live blocks, free bytes in chunks that hold one, idle chunks in spans that hold one, empty spans (JSON: at_peak; a line after the table); it reads the allocator after every event, so its times mean nothing")
	driverTimes := fs.Bool("driver-times", false, "count and time every call to the device, by operation (JSON: driver, passes.driver_later; the table: a second table): where the time per event goes on the real driver")
	cpuProfile := fs.String("cpuprofile", "", "write a CPU profile of the replays (runtime/pprof) to `file`: where the time per event goes")
	pol := fs.String("policy", "gpumem", "the allocation `policy`: gpumem, or another allocator's emulated on the simulated device ("+strings.Join(policy.Names()[1:], ", ")+"), or all")

	paths, code := e.parse(fs, args)
	if code >= 0 {
		return code
	}
	if len(paths) == 0 {
		fs.printUsage(e.stderr)
		return ExitUsage
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	if *passes < 1 {
		return e.usageError(fs, fmt.Sprintf("invalid value %d for flag --passes: want 1 or more", *passes))
	}
	if *cpuProfile != "" {
		f, err := os.Create(*cpuProfile)
		if err != nil {
			fmt.Fprintf(e.stderr, "gpumem replay: --cpuprofile: %v\n", err)
			return ExitFail
		}
		if err := pprof.StartCPUProfile(f); err != nil {
			f.Close()
			fmt.Fprintf(e.stderr, "gpumem replay: --cpuprofile: %v\n", err)
			return ExitFail
		}
		defer func() {
			pprof.StopCPUProfile()
			if err := f.Close(); err != nil {
				fmt.Fprintf(e.stderr, "gpumem replay: --cpuprofile: %v\n", err)
			}
		}()
	}
	if *pol != "gpumem" {
		return e.replayPolicies(fs, set, *pol, paths, uint64(capacity), *passes, *check, *jsonOut, e.cutNote(*partial))
	}

	cfg := gpumem.Config{
		Limit:               uint64(limit),
		Preallocate:         uint64(prealloc),
		PreallocateFraction: *fraction,
		ReleaseThreshold:    uint64(release),
		SmallSize:           uint64(small),
		SpanSize:            uint64(span),
		Compact:             *compact,
		Defrag:              *defrag,
		Gather:              *gather,
		ChunkHandles:        *chunkHandles,
	}
	m, err := gpumem.ParseMode(*mode)
	if err != nil {
		return e.usageError(fs, fmt.Sprintf("invalid value %q for flag --mode: want auto, plain or virtual", *mode))
	}
	cfg.Mode = m
	if !(*fraction >= 0 && *fraction <= 1) {
		return e.usageError(fs, fmt.Sprintf("invalid value %v for flag --preallocate-fraction: want 0 to 1", *fraction))
	}
	if *repeat < 1 {
		return e.usageError(fs, fmt.Sprintf("invalid value %d for flag --repeat: want 1 or more", *repeat))
	}
	if *queryLag < 0 {
		return e.usageError(fs, fmt.Sprintf("invalid value %d for flag --query-lag: want 0 or more", *queryLag))
	}
	if msg := capacityProblem(capacity); msg != "" {
		return e.usageError(fs, msg)
	}
	simCfg := sim.Config{Capacity: uint64(capacity), Granularity: uint64(granularity), QueryLag: *queryLag,
		RunAhead: uint64(runAhead.Microseconds())}
	if *runAhead < 0 {
		return e.usageError(fs, fmt.Sprintf("invalid value %v for flag --run-ahead: want 0 or more", *runAhead))
	}
	if _, err := sim.New(simCfg); err != nil {
		return e.usageError(fs, "invalid simulated device: "+err.Error())
	}

	// Choose the device.
	var gpu gpuDevice
	switch *devName {
	case "sim":
		if *touch {
			return e.usageError(fs, "--touch needs a CUDA device (--device cuda)")
		}
	case "auto", "cuda":
		gpu, err = e.openCUDA(*ordinal)
		switch {
		case err == nil:
			defer gpu.Close()
		case errors.Is(err, device.ErrNoDriver) && *devName == "auto" && !*touch:
			fmt.Fprintf(e.stderr, "gpumem: no NVIDIA driver (%v); using the simulated device\n", err)
		case errors.Is(err, device.ErrNoDriver):
			fmt.Fprintf(e.stderr, "gpumem replay: no NVIDIA driver (%v)\n", err)
			return ExitFail
		default:
			fmt.Fprintf(e.stderr, "gpumem replay: opening CUDA device %d: %v\n", *ordinal, err)
			return ExitFail
		}
	default:
		return e.usageError(fs, fmt.Sprintf("invalid value %q for flag --device: want auto, sim or cuda", *devName))
	}
	if gpu != nil && (set["capacity"] || set["granularity"]) {
		return e.usageError(fs, "--capacity and --granularity describe the simulated device; add --device sim to use it")
	}
	opt := replay.Options{Check: *check, Warm: *warm, Passes: *passes, Repeat: *repeat, DriverTimes: *driverTimes, AtPeak: *atPeak}
	if gpu != nil && *touch {
		opt.Touch = func(s device.Stream, b gpumem.Buffer) error {
			return gpu.MemsetAsync(b.Ptr(), 0, b.Size(), s)
		}
	}

	var results []replay.Result
	enc := json.NewEncoder(e.stdout)
	status := ExitOK
	for i, path := range paths {
		tr, _, err := loadInput(path, -1, e.cutNote(*partial))
		if err != nil {
			fmt.Fprintf(e.stderr, "gpumem replay: %v\n", err)
			status = ExitFail
			continue
		}
		var dev device.Device = gpu
		if gpu == nil {
			sd := sim.MustNew(simCfg) // checked above
			if simCfg.RunAhead > 0 {
				opt.AtTime = sd.SetTime
			}
			dev = sd
		}
		res, err := replay.Run(tr, dev, cfg, opt)
		if err == nil && gpu != nil {
			err = gpu.Synchronize() // surfaces errors of asynchronous work
		}
		if err != nil {
			msg := fmt.Sprintf("gpumem replay: %s: %v", path, err)
			if left := len(paths) - i - 1; left > 0 {
				msg += fmt.Sprintf(" (stopped: %d more not replayed)", left)
			}
			fmt.Fprintln(e.stderr, msg)
			status = ExitFail
			break
		}
		if o := res.FirstOOM; o != nil {
			if o.Policies, err = policyOOMs(tr, o.Verdict.Limit); err != nil {
				fmt.Fprintf(e.stderr, "gpumem replay: %s: %v\n", path, err)
				status = ExitFail
				break
			}
		}
		if *jsonOut {
			if err := enc.Encode(res); err != nil {
				fmt.Fprintf(e.stderr, "gpumem replay: %v\n", err)
				return ExitFail
			}
			continue
		}
		results = append(results, res)
	}
	if len(results) > 0 {
		if err := writeReplayTable(e.stdout, results); err != nil {
			fmt.Fprintf(e.stderr, "gpumem replay: %v\n", err)
			return ExitFail
		}
	}
	return status
}

// cutNote returns, with partial, what replay says of a trace cut short
// (loadInput); nil without.
func (e *env) cutNote(partial bool) func(error) {
	if !partial {
		return nil
	}
	return func(err error) {
		fmt.Fprintf(e.stderr, "gpumem replay: note: %v; replaying what came before the cut (--partial)\n", err)
	}
}

// writeReplayTable writes results as an aligned table, the trace names
// left-aligned and the figures right-aligned.
func writeReplayTable(w io.Writer, results []replay.Result) error {
	t := table{header: []string{"trace", "events", "peak live", "peak reserved", "ratio", "OOMs", "maps", "unmaps", "ns/op"}}
	passes := false
	for _, r := range results {
		passes = passes || r.Passes != nil
	}
	if passes {
		t.header = append(t.header, "passes", "ratio (all passes)", "maps (later passes)", "OOMs (later passes)")
	}
	for _, r := range results {
		row := []string{
			r.Trace,
			strconv.Itoa(r.Events),
			units.Format(r.PeakLiveBytes),
			units.Format(r.PeakReservedBytes),
			strconv.FormatFloat(r.Ratio, 'f', 3, 64),
			strconv.Itoa(r.OOMs),
			strconv.FormatUint(r.Maps, 10),
			strconv.FormatUint(r.Unmaps, 10),
			strconv.FormatFloat(r.NsPerOp, 'f', 1, 64),
		}
		if ps := r.Passes; ps != nil {
			row = append(row, strconv.Itoa(ps.N), strconv.FormatFloat(ps.Ratio, 'f', 3, 64), strconv.FormatUint(ps.MapsLater, 10), strconv.Itoa(ps.OOMsLater))
		} else if passes {
			row = append(row, "1", "", "", "")
		}
		t.rows = append(t.rows, row)
	}
	if err := t.write(w); err != nil {
		return err
	}
	if err := writeDriverTimes(w, results); err != nil {
		return err
	}
	if err := writeAtPeak(w, results); err != nil {
		return err
	}
	return writeFirstOOMs(w, results)
}

// writeAtPeak writes, for each result with one (--at-peak), what was held
// at its peak, part by part.
func writeAtPeak(w io.Writer, results []replay.Result) error {
	for _, r := range results {
		m := r.AtPeak
		if m == nil {
			continue
		}
		what := "a free"
		if m.Request > 0 {
			what = "a request of " + units.Format(m.Request)
		}
		line := fmt.Sprintf("\n%s: right after its peak of %s (pass %d, event %d, %s): %s reserved = %s live + %s free in chunks that hold live blocks + %s idle chunks in spans that hold live chunks + %s empty spans",
			r.Trace, units.Format(m.PeakReservedBytes), m.Pass, m.Event, what, units.Format(m.ReservedBytes), units.Format(m.LiveBytes),
			units.Format(m.FreeInLiveChunks), units.Format(m.IdleChunksLiveSpans), units.Format(m.EmptySpans))
		if m.PlainLiveBytes+m.PlainFreeBytes > 0 {
			line += fmt.Sprintf(" + plain segments: %s live, %s free", units.Format(m.PlainLiveBytes), units.Format(m.PlainFreeBytes))
		}
		if m.OtherBytes > 0 {
			line += fmt.Sprintf(" + %s in handles not mapped", units.Format(m.OtherBytes))
		}
		if _, err := fmt.Fprintln(w, line); err != nil {
			return err
		}
	}
	return nil
}

// writeDriverTimes writes, for the results with driver times
// (--driver-times), each operation's calls, milliseconds and microseconds
// per call, the dearest first, in the first pass and in the later passes
// together; then each pass's whole time, of which the calls are part.
func writeDriverTimes(w io.Writer, results []replay.Result) error {
	t := table{header: []string{"trace", "driver call", "calls", "ms", "us/call"}}
	later := false
	for _, r := range results {
		later = later || (r.Passes != nil && r.Passes.DriverLater != nil)
	}
	if later {
		t.header = append(t.header, "calls (later passes)", "ms (later)", "us/call (later)")
	}
	ms := func(ns uint64) string { return strconv.FormatFloat(float64(ns)/1e6, 'f', 2, 64) }
	cells := func(o timed.Op) []string {
		if o.Calls == 0 {
			return []string{"0", "", ""}
		}
		return []string{strconv.FormatUint(o.Calls, 10), ms(o.Ns), strconv.FormatFloat(float64(o.Ns)/float64(o.Calls)/1e3, 'f', 1, 64)}
	}
	for _, r := range results {
		if r.Driver == nil {
			continue
		}
		var l timed.Times
		if r.Passes != nil {
			l = r.Passes.DriverLater
		}
		both := timed.Times{}
		for name, o := range r.Driver {
			both[name] = o
		}
		for name, o := range l {
			both[name] = timed.Op{Calls: both[name].Calls + o.Calls, Ns: both[name].Ns + o.Ns}
		}
		for _, name := range both.Names() {
			row := append([]string{r.Trace, name}, cells(r.Driver[name])...)
			if later {
				row = append(row, cells(l[name])...)
			}
			t.rows = append(t.rows, row)
		}
		row := append([]string{r.Trace, "all"}, cells(r.Driver.Total())...)
		if later {
			row = append(row, cells(l.Total())...)
		}
		t.rows = append(t.rows, row)
		pass := []string{r.Trace, "(the pass, all of it)", "", ms(uint64(r.NsPerOp * float64(r.Events))), ""}
		if later && r.Passes != nil {
			pass = append(pass, "", ms(uint64(r.Passes.NsPerOpLater*float64(r.Events*(r.Passes.N-1)))), "")
		}
		t.rows = append(t.rows, pass)
	}
	if len(t.rows) == 0 {
		return nil
	}
	if _, err := fmt.Fprintln(w); err != nil {
		return err
	}
	return t.write(w)
}

// policyOOMs replays tr under every emulated policy on a device of
// capacity bytes (the memory a replay ran out of): which allocator would
// have run the program there.
func policyOOMs(tr *trace.Trace, capacity uint64) ([]replay.PolicyOOMs, error) {
	var out []replay.PolicyOOMs
	for _, name := range policy.Names() {
		r, err := policy.Run(tr, name, capacity, false, policy.Options{})
		if err != nil {
			return nil, fmt.Errorf("under policy %s: %w", name, err)
		}
		out = append(out, replay.PolicyOOMs{Policy: name, Capacity: capacity, OOMs: r.OOMs})
	}
	return out, nil
}

// writeFirstOOMs writes, for each trace that ran out of memory, the
// verdict of its first OOM, then how the trace fared under the emulated
// policies: one paragraph each, after the table.
func writeFirstOOMs(w io.Writer, results []replay.Result) error {
	for _, r := range results {
		if err := writeFirstOOM(w, r); err != nil {
			return err
		}
		if ps := r.Passes; ps != nil && ps.FirstOOMLater != nil {
			o := ps.FirstOOMLater
			if _, err := fmt.Fprintf(w, "\n%s: %d OOM%s in the passes after the first; the first in pass %d at event %d (request %d): %v\n",
				r.Trace, ps.OOMsLater, map[bool]string{true: "s"}[ps.OOMsLater > 1], o.Pass, o.Event, o.ID, o.Verdict); err != nil {
				return err
			}
		}
	}
	return nil
}

// writeFirstOOM writes the verdict of r's first OOM, if any, and how the
// trace fared under the emulated policies.
func writeFirstOOM(w io.Writer, r replay.Result) error {
	o := r.FirstOOM
	if o == nil {
		return nil
	}
	if _, err := fmt.Fprintf(w, "\n%s: first OOM at event %d (request %d): %v\n", r.Trace, o.Event, o.ID, o.Verdict); err != nil {
		return err
	}
	if len(o.Policies) == 0 {
		return nil
	}
	var ok, failed []string
	for _, p := range o.Policies {
		if p.OOMs == 0 {
			ok = append(ok, p.Policy)
		} else {
			failed = append(failed, fmt.Sprintf("%s (%d OOM%s)", p.Policy, p.OOMs, map[bool]string{true: "s"}[p.OOMs > 1]))
		}
	}
	if len(ok) == 0 {
		ok = []string{"none"}
	}
	if len(failed) == 0 {
		failed = []string{"none"}
	}
	_, err := fmt.Fprintf(w, "%s: under emulated policies on a device of %s (gpumem's in its default configuration): ran without OOM: %s; ran out of memory: %s\n",
		r.Trace, units.Format(o.Policies[0].Capacity), strings.Join(ok, ", "), strings.Join(failed, ", "))
	return err
}

// gpumemOnly are the replay flags that configure gpumem's allocator or a
// real GPU: under another policy they mean nothing.
var gpumemOnly = []string{"device", "gpu", "granularity", "mode", "limit", "preallocate", "preallocate-fraction",
	"release-threshold", "small-size", "span", "compact", "chunk-handles", "defrag", "touch", "warm", "repeat"}

// replayPolicies is gpumem replay --policy NAME (or all) for a policy other
// than gpumem alone: every trace under the policy, or under each, on the
// simulated device's accounting.
func (e *env) replayPolicies(fs *cmdFlags, set map[string]bool, name string, paths []string, capacity uint64, passes int, check, jsonOut bool, cut func(error)) int {
	names := []string{name}
	if name == "all" {
		names = policy.Names()
	} else if _, err := policy.New(name, 1<<30); err != nil {
		return e.usageError(fs, fmt.Sprintf("invalid value %q for flag --policy: want %s or all", name, strings.Join(policy.Names(), ", ")))
	}
	for _, f := range gpumemOnly {
		if set[f] {
			return e.usageError(fs, fmt.Sprintf("--%s configures gpumem or the GPU; it does not apply to --policy %s", f, name))
		}
	}
	if msg := capacityProblem(sizeFlag(capacity)); msg != "" {
		return e.usageError(fs, msg)
	}
	var results []policy.Result
	enc := json.NewEncoder(e.stdout)
	status := ExitOK
	for i, path := range paths {
		tr, _, err := loadInput(path, -1, cut)
		if err != nil {
			fmt.Fprintf(e.stderr, "gpumem replay: %v\n", err)
			status = ExitFail
			continue
		}
		for _, n := range names {
			r, err := policy.Run(tr, n, capacity, check, policy.Options{})
			if err == nil && passes > 1 {
				var rep policy.Repetition
				if rep, err = policy.Repeat(tr, n, capacity, passes); err == nil {
					r.Passes = &rep
				}
			}
			if err != nil {
				msg := fmt.Sprintf("gpumem replay: %s: %v", path, err)
				if left := len(paths) - i - 1; left > 0 {
					msg += fmt.Sprintf(" (stopped: %d more not replayed)", left)
				}
				fmt.Fprintln(e.stderr, msg)
				status = ExitFail
				goto out
			}
			if jsonOut {
				if err := enc.Encode(r); err != nil {
					fmt.Fprintf(e.stderr, "gpumem replay: %v\n", err)
					return ExitFail
				}
				continue
			}
			results = append(results, r)
		}
	}
out:
	if len(results) > 0 {
		if err := writePolicyTable(e.stdout, results); err != nil {
			fmt.Fprintf(e.stderr, "gpumem replay: %v\n", err)
			return ExitFail
		}
	}
	return status
}

// writePolicyTable writes one row per trace and policy, aligned as
// writeReplayTable's.
func writePolicyTable(w io.Writer, results []policy.Result) error {
	t := table{header: []string{"trace", "policy", "events", "peak live", "peak reserved", "ratio", "OOMs", "end reserved"}}
	passes := results[0].Passes != nil
	if passes {
		t.header = append(t.header, "passes", "ratio (all passes)", "same address (later passes)", "OOMs (later passes)")
	}
	for _, r := range results {
		row := []string{
			r.Trace,
			r.Policy,
			strconv.Itoa(r.Events),
			units.Format(r.PeakLiveBytes),
			units.Format(r.PeakReservedBytes),
			strconv.FormatFloat(r.Ratio, 'f', 3, 64),
			strconv.Itoa(r.OOMs),
			units.Format(r.EndReservedBytes),
		}
		if p := r.Passes; p != nil {
			row = append(row, strconv.Itoa(p.Passes), strconv.FormatFloat(p.Ratio, 'f', 3, 64), strconv.FormatFloat(p.SameFraction, 'f', 3, 64), strconv.Itoa(p.OOMsLater))
		}
		t.rows = append(t.rows, row)
	}
	return t.write(w)
}
