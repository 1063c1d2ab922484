package cli

import (
	"bytes"
	"compress/gzip"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/google/pprof/profile"

	"github.com/gpumem/gpumem/device"
	"github.com/gpumem/gpumem/device/cuda"
	"github.com/gpumem/gpumem/nvml"
	"github.com/gpumem/gpumem/trace"
)

var update = flag.Bool("update", false, "rewrite the golden files in testdata")

// run runs the command line in e (or the real environment if e is nil)
// and returns its exit status, stdout and stderr.
func run(t *testing.T, e *env, args ...string) (int, string, string) {
	t.Helper()
	var out, errb bytes.Buffer
	var code int
	if e == nil {
		code = Main(args, &out, &errb)
	} else {
		e.stdout, e.stderr = &out, &errb
		code = e.main(args)
	}
	return code, out.String(), errb.String()
}

// fakeEnv is an environment without a driver, whatever the machine has.
func fakeEnv() *env {
	noCUDA := &device.OpError{Op: "dlopen", Err: device.ErrNoDriver}
	noNVML := fmt.Errorf("libnvidia-ml.so.1 not found: %w", device.ErrNoDriver)
	return &env{
		openCUDA: func(int) (gpuDevice, error) { return nil, noCUDA },
		listGPUs: func() ([]nvml.GPUReport, error) { return nil, noNVML },
	}
}

// maskTiming replaces the last column (ns/op) of every line with "*".
func maskTiming(s string) string {
	return regexp.MustCompile(`(?m)\s+\S+$`).ReplaceAllString(s, "  *")
}

func golden(t *testing.T, name, got string) {
	t.Helper()
	path := filepath.Join("testdata", name)
	if *update {
		if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run go test -update to create it)", err)
	}
	if got != string(want) {
		t.Errorf("output differs from %s (go test -update rewrites it):\n--- got\n%s--- want\n%s", path, got, want)
	}
}

var tinyTraces = []string{"testdata/tiny.trace", "testdata/multistream.trace", "testdata/live_at_end.trace.gz"}

func TestReplayTableGolden(t *testing.T) {
	for _, mode := range []string{"auto", "plain", "virtual"} {
		t.Run(mode, func(t *testing.T) {
			code, out, errs := run(t, nil, append([]string{"replay", "--device", "sim", "--check", "--mode", mode}, tinyTraces...)...)
			if code != 0 || errs != "" {
				t.Fatalf("exit %d, stderr %q", code, errs)
			}
			lines := strings.Split(strings.TrimSuffix(out, "\n"), "\n")
			if len(lines) != 1+len(tinyTraces) {
				t.Fatalf("want a header and %d rows, got\n%s", len(tinyTraces), out)
			}
			// The columns are aligned: every line ends at the same column.
			for _, l := range lines {
				if len(l) != len(lines[0]) {
					t.Errorf("ragged table:\n%s", out)
					break
				}
			}
			golden(t, "replay_"+mode+".golden", maskTiming(out))
		})
	}
}

func TestReplayJSON(t *testing.T) {
	code, out, errs := run(t, nil, append([]string{"replay", "--device=sim", "--json"}, tinyTraces...)...)
	if code != 0 || errs != "" {
		t.Fatalf("exit %d, stderr %q", code, errs)
	}
	lines := strings.Split(strings.TrimSuffix(out, "\n"), "\n")
	if len(lines) != len(tinyTraces) {
		t.Fatalf("want %d lines, got\n%s", len(tinyTraces), out)
	}
	var masked strings.Builder
	for i, line := range lines {
		var m map[string]any
		if err := json.Unmarshal([]byte(line), &m); err != nil {
			t.Fatalf("line %d: %v: %s", i+1, err, line)
		}
		for _, k := range []string{"trace", "events", "peak_live_bytes", "peak_reserved_bytes", "ratio", "ooms", "ns_per_op", "maps", "unmaps"} {
			if _, ok := m[k]; !ok {
				t.Errorf("line %d: no key %q: %s", i+1, k, line)
			}
		}
		// The figures a trace fixes, checked against the trace itself.
		tr, err := trace.Load(tinyTraces[i])
		if err != nil {
			t.Fatal(err)
		}
		if m["trace"] != tr.Name || m["events"] != float64(len(tr.Events)) || m["peak_live_bytes"] != float64(tr.PeakLiveBytes) {
			t.Errorf("line %d: trace, events, peak_live_bytes = %v, %v, %v; want %s, %d, %d",
				i+1, m["trace"], m["events"], m["peak_live_bytes"], tr.Name, len(tr.Events), tr.PeakLiveBytes)
		}
		if r, want := m["ratio"], m["peak_reserved_bytes"].(float64)/m["peak_live_bytes"].(float64); r != want {
			t.Errorf("line %d: ratio %v, want %v", i+1, r, want)
		}
		if ns, ok := m["ns_per_op"].(float64); !ok || ns <= 0 {
			t.Errorf("line %d: ns_per_op %v", i+1, m["ns_per_op"])
		}
		m["ns_per_op"] = "*"
		b, _ := json.Marshal(m) // sorted keys
		masked.Write(append(b, '\n'))
	}
	// Worked out by hand from testdata/tiny.trace: the peak is 14 MiB live,
	// after "a 4 10485760".
	if !strings.Contains(lines[0], `"trace":"tiny","device":"sim","mode":"virtual","events":10,"peak_live_bytes":14680064,`) {
		t.Errorf("tiny: %s", lines[0])
	}
	golden(t, "replay_json.golden", masked.String())
}

func TestReplayShippedTrace(t *testing.T) {
	const path = "../testdata/traces/sweep_create_dispose.trace.gz"
	code, out, errs := run(t, nil, "replay", "--device", "sim", "--json", path)
	if code != 0 || errs != "" {
		t.Fatalf("exit %d, stderr %q", code, errs)
	}
	var r struct {
		Trace string
		Ratio float64
		OOMs  int
	}
	if err := json.Unmarshal([]byte(out), &r); err != nil {
		t.Fatal(err)
	}
	if r.Trace != "sweep_create_dispose" || r.Ratio <= 0 || r.Ratio > 1.02 || r.OOMs != 0 {
		t.Errorf("%s: ratio %.4f, %d OOMs; want ratio <= 1.02 and no OOMs", r.Trace, r.Ratio, r.OOMs)
	}
}

func TestReplayPasses(t *testing.T) {
	code, out, errs := run(t, nil, "replay", "--device", "sim", "--passes", "3", "--json", "testdata/tiny.trace")
	if code != 0 || errs != "" || !strings.Contains(out, `"passes":{"n":3,"peak_reserved_bytes":`) {
		t.Errorf("--json: exit %d, stdout %q, stderr %q", code, out, errs)
	}
	code, out, errs = run(t, nil, "replay", "--device", "sim", "--passes", "3", "testdata/tiny.trace")
	if code != 0 || errs != "" || !strings.Contains(out, "ratio (all passes)") {
		t.Errorf("table: exit %d, stdout %q, stderr %q", code, out, errs)
	}
}

// TestReplayDriverTimes: --driver-times adds each operation's calls and
// time to the JSON (as many as the allocator counts) and a second table.
func TestReplayDriverTimes(t *testing.T) {
	code, out, errs := run(t, nil, "replay", "--device", "sim", "--passes", "2", "--driver-times", "--json", "testdata/tiny.trace")
	if code != 0 || errs != "" {
		t.Fatalf("exit %d, stderr %q", code, errs)
	}
	var r struct {
		Creates, Maps uint64
		Driver        map[string]struct{ Calls, Ns uint64 }
		Passes        struct {
			DriverLater map[string]struct{ Calls, Ns uint64 } `json:"driver_later"`
		}
	}
	if err := json.Unmarshal([]byte(out), &r); err != nil {
		t.Fatal(err)
	}
	if r.Creates == 0 || r.Driver["Create"].Calls != r.Creates || r.Driver["Map"].Calls != r.Maps || len(r.Passes.DriverLater) == 0 || r.Passes.DriverLater["Create"].Calls != 0 {
		t.Errorf("creates %d, maps %d, driver %v, later %v", r.Creates, r.Maps, r.Driver, r.Passes.DriverLater)
	}
	code, out, errs = run(t, nil, "replay", "--device", "sim", "--passes", "2", "--driver-times", "testdata/tiny.trace")
	if code != 0 || errs != "" || !strings.Contains(out, "driver call") || !regexp.MustCompile(`(?m)^tiny +all +13 `).MatchString(out) ||
		!strings.Contains(out, "(the pass, all of it)") || !strings.Contains(out, "calls (later passes)") {
		t.Errorf("table: exit %d, stdout\n%s\nstderr %q", code, out, errs)
	}
	code, out, _ = run(t, nil, "replay", "--device", "sim", "testdata/tiny.trace")
	if code != 0 || strings.Contains(out, "driver call") {
		t.Errorf("without --driver-times: exit %d, stdout\n%s", code, out)
	}
}

func TestReplayFlagsAfterTraces(t *testing.T) {
	code, out, errs := run(t, nil, "replay", "testdata/tiny.trace", "--device", "sim", "-json", "--", "testdata/tiny.trace")
	if code != 0 || errs != "" || strings.Count(out, `"trace":"tiny"`) != 2 {
		t.Errorf("exit %d, stdout %q, stderr %q", code, out, errs)
	}
}

func TestReplayOOM(t *testing.T) {
	// 8 MiB cannot hold tiny's 14 MiB peak: requests fail, the replay goes
	// on. The first three requests (7.9 MiB) pack into the device's four
	// chunks and the second 4 MiB reuses the first one's hole, so only the
	// 10 MiB request fails. Larger than the limit, it fails at once, the
	// cache as it was: its free 3 MiB piece is what would have fit.
	code, out, errs := run(t, nil, "replay", "--device", "sim", "--capacity", "8MiB", "--json", "testdata/tiny.trace")
	if code != 0 || errs != "" || !strings.Contains(out, `"ooms":1,`) {
		t.Errorf("exit %d, stdout %q, stderr %q", code, out, errs)
	}
	var r struct {
		OOMs     int `json:"ooms"`
		FirstOOM struct {
			Event   int
			ID      uint64
			Verdict map[string]any
		} `json:"first_oom"`
	}
	if err := json.Unmarshal([]byte(out), &r); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	if v := r.FirstOOM.Verdict; r.FirstOOM.Event != 7 || r.FirstOOM.ID != 4 || v["cause"] != "limit" ||
		v["requested"] != float64(10<<20) || v["would_fit"] != float64(3<<20) || v["after_trim"] != "no" {
		t.Errorf("first_oom %+v: want event 7 (request 4 of 10 MiB), the limit, 3 MiB would fit, no help from a trim", r.FirstOOM)
	}
	// The table, then the verdict.
	code, out, errs = run(t, nil, "replay", "--device", "sim", "--capacity", "8MiB", "testdata/tiny.trace")
	want := "tiny: first OOM at event 7 (request 4): gpumem: out of memory (allocator limit): requested 10.00 MiB (10485760) on stream 0: live buffers hold 4.00 MiB of the limit of 8.00 MiB (the device's whole memory)"
	if code != 0 || errs != "" || !strings.Contains(out, want) || !strings.Contains(out, "largest request that would have fit: 3.00 MiB") {
		t.Errorf("exit %d, stdout %q, stderr %q; want the first OOM's verdict", code, out, errs)
	}
	// Over three passes the same request fails in each: the later passes'
	// OOMs are counted and the first of them is told, with its pass.
	code, out, errs = run(t, nil, "replay", "--device", "sim", "--capacity", "8MiB", "--passes", "3", "--json", "testdata/tiny.trace")
	var rp struct {
		OOMs     int `json:"ooms"`
		FirstOOM struct {
			Pass, Event int
		} `json:"first_oom"`
		Passes struct {
			OOMsLater     int `json:"ooms_later"`
			FirstOOMLater struct {
				Pass, Event int
				ID          uint64
			} `json:"first_oom_later"`
		} `json:"passes"`
	}
	if err := json.Unmarshal([]byte(out), &rp); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	if rp.OOMs != 1 || rp.FirstOOM.Pass != 1 || rp.Passes.OOMsLater != 2 || rp.Passes.FirstOOMLater.Pass != 2 ||
		rp.Passes.FirstOOMLater.Event != 7 || rp.Passes.FirstOOMLater.ID != 4 {
		t.Errorf("3 passes on 8 MiB: %+v; want 1 OOM in pass 1, 2 later, the first later in pass 2 at event 7 (request 4)", rp)
	}
	code, out, errs = run(t, nil, "replay", "--device", "sim", "--capacity", "8MiB", "--passes", "3", "testdata/tiny.trace")
	if want := "tiny: 2 OOMs in the passes after the first; the first in pass 2 at event 7 (request 4): gpumem: out of memory"; code != 0 || errs != "" ||
		!strings.Contains(out, "OOMs (later passes)") || !strings.Contains(out, want) {
		t.Errorf("3 passes, table: exit %d, stdout %q, stderr %q; want the later OOMs' column and %q", code, out, errs, want)
	}
	if first, later := strings.Index(out, "tiny: first OOM at event 7"), strings.Index(out, "tiny: 2 OOMs in the passes after the first"); first < 0 || later < first {
		t.Errorf("3 passes: the first pass's OOM at %d, the later passes' at %d; want the first pass's first:\n%s", first, later, out)
	}
	code, out, errs = run(t, nil, "replay", "--device", "sim", "--limit", "4MiB", "--json", "testdata/tiny.trace")
	if code != 0 || errs != "" || strings.Contains(out, `"ooms":0,`) {
		t.Errorf("--limit 4MiB: exit %d, stdout %q, stderr %q", code, out, errs)
	}
}

// TestReplayOOMPolicies: a trace that fragments plain segments runs out of
// memory in --mode plain; the verdict says virtual-memory spans would have
// fit, and the emulated policies say which allocators would have run it on
// that device: gpumem's default (virtual memory) did, PyTorch's native
// allocator (plain segments) did not.
func TestReplayOOMPolicies(t *testing.T) {
	args := []string{"replay", "--device", "sim", "--mode", "plain", "--capacity", "100MiB"}
	code, out, errs := run(t, nil, append(args, "testdata/fragments.trace")...)
	for _, want := range []string{
		"fragments: first OOM at event 15 (request 10): gpumem: out of memory (fragmentation): requested 30.00 MiB",
		"the largest free piece is 11.00 MiB", "With virtual-memory spans: yes",
		"fragments: under emulated policies on a device of 100.00 MiB (gpumem's in its default configuration): ran without OOM: gpumem",
		"torch-native (1 OOM)",
	} {
		if code != 0 || errs != "" || !strings.Contains(out, want) {
			t.Errorf("exit %d, stderr %q; stdout lacks %q:\n%s", code, errs, want, out)
		}
	}
	code, out, errs = run(t, nil, append(args, "--json", "testdata/fragments.trace")...)
	var r struct {
		FirstOOM struct {
			Verdict  map[string]any
			Policies []struct {
				Policy   string
				Capacity uint64
				OOMs     int
			}
		} `json:"first_oom"`
	}
	if err := json.Unmarshal([]byte(out), &r); code != 0 || errs != "" || err != nil {
		t.Fatalf("exit %d, stderr %q, %v: %s", code, errs, err, out)
	}
	if v := r.FirstOOM.Verdict; v["cause"] != "fragmentation" || v["with_virtual"] != "yes" || v["after_trim"] != "no" {
		t.Errorf("verdict %v: want fragmentation, virtual memory yes, trim no", v)
	}
	ooms := map[string]int{}
	for _, p := range r.FirstOOM.Policies {
		ooms[p.Policy] = p.OOMs
		if p.Capacity != 100<<20 {
			t.Errorf("policy %s on %d bytes, want the 100 MiB the replay ran out of", p.Policy, p.Capacity)
		}
	}
	if g, ok := ooms["gpumem"]; !ok || g != 0 || ooms["torch-native"] != 1 {
		t.Errorf("policies' OOMs %v: want gpumem 0 and torch-native 1", ooms)
	}
}

func TestReplayErrors(t *testing.T) {
	for _, tc := range []struct {
		name   string
		args   []string
		code   int
		stderr string // a regexp the whole of stderr must match
		stdout string // a substring of stdout
	}{
		{"no traces", []string{"replay", "--device", "sim"}, 2, `(?s)^Usage: gpumem replay \[flags\] TRACE\.\.\..*--capacity SIZE`, ""},
		{"missing file", []string{"replay", "--device", "sim", "testdata/missing.trace"}, 1,
			`^gpumem replay: open testdata/missing\.trace: no such file or directory\n$`, ""},
		{"corrupt trace", []string{"replay", "--device", "sim", "testdata/corrupt.trace"}, 1,
			`^gpumem replay: trace corrupt\.trace:4: f 7: request 7 was never allocated\n$`, ""},
		{"truncated gzip", []string{"replay", "--device", "sim", "testdata/truncated.trace.gz"}, 1,
			`^gpumem replay: trace truncated\.trace\.gz:\d+: .*unexpected EOF\n$`, ""},
		{"bad trace among good", []string{"replay", "--device", "sim", "testdata/tiny.trace", "testdata/missing.trace", "testdata/multistream.trace"}, 1,
			`^gpumem replay: open testdata/missing\.trace: no such file or directory\n$`, "multistream"},
		{"unknown flag", []string{"replay", "--bogus", "testdata/tiny.trace"}, 2,
			`^gpumem replay: flag provided but not defined: --bogus\nRun 'gpumem replay -h' for usage\.\n$`, ""},
		{"bad size", []string{"replay", "--limit", "12XB", "testdata/tiny.trace"}, 2,
			`^gpumem replay: invalid value "12XB" for flag --limit: unknown unit "XB" .*\nRun 'gpumem replay -h' for usage\.\n$`, ""},
		{"overflowing size", []string{"replay", "--capacity=20000000PiB", "testdata/tiny.trace"}, 2,
			`^gpumem replay: invalid value "20000000PiB" for flag --capacity: too large .*\n`, ""},
		{"missing value", []string{"replay", "testdata/tiny.trace", "--limit"}, 2,
			`^gpumem replay: flag needs an argument: --limit\n`, ""},
		{"bad repeat", []string{"replay", "--repeat", "0", "testdata/tiny.trace"}, 2,
			`^gpumem replay: invalid value 0 for flag --repeat: want 1 or more\n`, ""},
		{"bad passes", []string{"replay", "--passes", "-1", "testdata/tiny.trace"}, 2,
			`^gpumem replay: invalid value -1 for flag --passes: want 1 or more\n`, ""},
		{"bad mode", []string{"replay", "--mode", "fast", "testdata/tiny.trace"}, 2,
			`^gpumem replay: invalid value "fast" for flag --mode: want auto, plain or virtual\n`, ""},
		{"bad device", []string{"replay", "--device", "tpu", "testdata/tiny.trace"}, 2,
			`^gpumem replay: invalid value "tpu" for flag --device: want auto, sim or cuda\n`, ""},
		{"bad granularity", []string{"replay", "--device", "sim", "--granularity", "3000", "testdata/tiny.trace"}, 2,
			`^gpumem replay: invalid simulated device: sim: granularity 3000 is not a power of two >= 4096\n`, ""},
		{"bad fraction", []string{"replay", "--preallocate-fraction", "1.5", "testdata/tiny.trace"}, 2,
			`^gpumem replay: invalid value 1.5 for flag --preallocate-fraction: want 0 to 1\n`, ""},
		{"touch on sim", []string{"replay", "--device", "sim", "--touch", "testdata/tiny.trace"}, 2,
			`^gpumem replay: --touch needs a CUDA device \(--device cuda\)\n`, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, out, errs := run(t, nil, tc.args...)
			if code != tc.code {
				t.Errorf("exit %d, want %d (stderr %q)", code, tc.code, errs)
			}
			if !regexp.MustCompile(tc.stderr).MatchString(errs) {
				t.Errorf("stderr %q does not match %q", errs, tc.stderr)
			}
			if !strings.Contains(out, tc.stdout) {
				t.Errorf("stdout %q does not contain %q", out, tc.stdout)
			}
		})
	}
}

// cudaMissing returns the error cuda.Open gives on this machine without a
// CUDA driver; tests of the no-driver messages skip otherwise.
func cudaMissing(t *testing.T) error {
	t.Helper()
	d, err := cuda.Open(0)
	if err == nil {
		d.Close()
		t.Skip("a CUDA driver and GPU are present")
	}
	if !errors.Is(err, device.ErrNoDriver) {
		t.Skipf("the CUDA driver loads but fails: %v", err)
	}
	return err
}

func TestReplayCUDAWithoutDriver(t *testing.T) {
	err := cudaMissing(t)
	code, out, errs := run(t, nil, "replay", "--device", "cuda", "testdata/tiny.trace")
	want := "gpumem replay: no NVIDIA driver (" + err.Error() + ")\n"
	if code != 1 || out != "" || errs != want {
		t.Errorf("exit %d, stdout %q, stderr %q; want 1, nothing, %q", code, out, errs, want)
	}
	// --touch makes auto mean cuda.
	code, _, errs = run(t, nil, "replay", "--touch", "testdata/tiny.trace")
	if code != 1 || errs != want {
		t.Errorf("--touch: exit %d, stderr %q; want 1, %q", code, errs, want)
	}
}

func TestReplayAutoWithoutDriver(t *testing.T) {
	err := cudaMissing(t)
	code, out, errs := run(t, nil, "replay", "testdata/tiny.trace")
	want := "gpumem: no NVIDIA driver (" + err.Error() + "); using the simulated device\n"
	if code != 0 || errs != want || !strings.HasPrefix(out, "trace ") {
		t.Errorf("exit %d, stdout %q, stderr %q; want 0, a table, %q", code, out, errs, want)
	}
}

func TestReplayCUDA(t *testing.T) {
	d, err := cuda.Open(0)
	if err != nil {
		t.Skipf("no CUDA device: %v", err)
	}
	name := d.Info().Name
	d.Close()
	code, out, errs := run(t, nil, "replay", "--device", "cuda", "--touch", "--check", "--driver-times", "--json", "testdata/tiny.trace", "testdata/multistream.trace")
	if code != 0 || errs != "" || strings.Count(out, `"device":`+strconv.Quote(name)) != 2 || strings.Count(out, `"driver":{`) != 2 {
		t.Errorf("exit %d, stdout %q, stderr %q", code, out, errs)
	}
	code, _, errs = run(t, nil, "replay", "--capacity", "1GiB", "testdata/tiny.trace")
	if code != 2 || !strings.HasPrefix(errs, "gpumem replay: --capacity and --granularity describe the simulated device") {
		t.Errorf("--capacity on a GPU: exit %d, stderr %q", code, errs)
	}
}

func TestDevicesWithDriver(t *testing.T) {
	reports, err := nvml.List()
	if err != nil {
		t.Skipf("NVML unusable: %v", err)
	}
	code, out, errs := run(t, nil, "devices", "--json")
	if code != 0 || errs != "" || strings.Count(out, "\n") != len(reports) {
		t.Fatalf("exit %d, stdout %q, stderr %q", code, out, errs)
	}
	for _, line := range strings.Split(strings.TrimSuffix(out, "\n"), "\n") {
		var g gpuRecord
		if err := json.Unmarshal([]byte(line), &g); err != nil || g.Name == "" || g.MemoryTotal == 0 {
			t.Errorf("%v: %s", err, line)
		}
	}
	code, out, errs = run(t, nil, "devices")
	if code != 0 || errs != "" || !strings.HasPrefix(out, "GPU 0  ") {
		t.Errorf("exit %d, stdout %q, stderr %q", code, out, errs)
	}
}

func TestReplayFakeNoDriver(t *testing.T) {
	// The same messages, on any machine.
	code, out, errs := run(t, fakeEnv(), "replay", "--json", "testdata/tiny.trace")
	if code != 0 || !strings.Contains(out, `"device":"sim"`) ||
		!regexp.MustCompile(`^gpumem: no NVIDIA driver \(dlopen: .*\); using the simulated device\n$`).MatchString(errs) {
		t.Errorf("auto: exit %d, stdout %q, stderr %q", code, out, errs)
	}
	code, out, errs = run(t, fakeEnv(), "replay", "--device", "cuda", "testdata/tiny.trace")
	if code != 1 || out != "" || !regexp.MustCompile(`^gpumem replay: no NVIDIA driver \(dlopen: .*\)\n$`).MatchString(errs) {
		t.Errorf("cuda: exit %d, stdout %q, stderr %q", code, out, errs)
	}
}

func TestDevicesWithoutDriver(t *testing.T) {
	if _, err := nvml.List(); err == nil {
		t.Skip("NVML is usable: a driver is present")
	} else if !errors.Is(err, device.ErrNoDriver) {
		t.Skipf("NVML loads but fails: %v", err)
	}
	for _, args := range [][]string{{"devices"}, {"devices", "--json"}} {
		code, out, errs := run(t, nil, args...)
		if code != 1 || out != "" || strings.Count(errs, "\n") != 1 ||
			!strings.HasPrefix(errs, "gpumem devices: no NVIDIA driver (libnvidia-ml.so.1 not found") {
			t.Errorf("%q: exit %d, stdout %q, stderr %q; want 1 and one line", args, code, out, errs)
		}
	}
	code, _, errs := run(t, fakeEnv(), "devices")
	if code != 1 || errs != "gpumem devices: no NVIDIA driver (libnvidia-ml.so.1 not found: GPU driver not available)\n" {
		t.Errorf("fake: exit %d, stderr %q", code, errs)
	}
}

func TestDevicesFake(t *testing.T) {
	e := fakeEnv()
	e.listGPUs = func() ([]nvml.GPUReport, error) {
		return []nvml.GPUReport{
			{
				GPU: nvml.GPU{Index: 0, Name: "NVIDIA H100 80GB HBM3", UUID: "GPU-6e0d1a2b-3c4d-5e6f-7081-92a3b4c5d6e7", BusID: "00000000:19:00.0",
					Memory: nvml.Memory{Total: 85520809984, Used: 1632108544, Free: 83888701440}},
				Processes: []nvml.Process{
					{PID: 12345, UsedMemory: 1 << 30, MemoryKnown: true, Compute: true},
					{PID: 23456, Compute: true, Graphics: true},
				},
			},
			{GPU: nvml.GPU{Index: 1, Name: "NVIDIA H100 80GB HBM3", Memory: nvml.Memory{Total: 85520809984, Free: 85520809984}}},
		}, nil
	}
	code, out, errs := run(t, e, "devices", "--json")
	if code != 0 || errs != "" {
		t.Fatalf("exit %d, stderr %q", code, errs)
	}
	golden(t, "devices_json.golden", out)
	code, out, errs = run(t, e, "devices")
	if code != 0 || errs != "" {
		t.Fatalf("exit %d, stderr %q", code, errs)
	}
	golden(t, "devices.golden", out)

	// A GPU that could not be fully described fails the command.
	e.listGPUs = func() ([]nvml.GPUReport, error) {
		return []nvml.GPUReport{{GPU: nvml.GPU{Index: 0}, Err: errors.New("nvmlDeviceGetName: GPU is lost")}}, nil
	}
	code, out, _ = run(t, e, "devices", "--json")
	if code != 1 || !strings.Contains(out, `"error":"nvmlDeviceGetName: GPU is lost"`) {
		t.Errorf("exit %d, stdout %q", code, out)
	}
}

func TestHelp(t *testing.T) {
	for _, args := range [][]string{{"help"}, {"-h"}, {"--help"}} {
		code, out, errs := run(t, nil, args...)
		if code != 0 || errs != "" {
			t.Errorf("%q: exit %d, stderr %q", args, code, errs)
		}
		for _, c := range commands {
			if !regexp.MustCompile(`(?m)^\t` + c.name + ` +\S`).MatchString(out) {
				t.Errorf("%q: usage lists no %q:\n%s", args, c.name, out)
			}
		}
		golden(t, "help.golden", out)
	}
	code, _, errs := run(t, nil)
	if code != 2 || !strings.Contains(errs, "\treplay ") {
		t.Errorf("no arguments: exit %d, stderr %q", code, errs)
	}
	for _, args := range [][]string{{"replay", "-h"}, {"help", "replay"}, {"devices", "--help"}, {"help", "devices"}} {
		code, out, errs := run(t, nil, args...)
		if code != 0 || errs != "" || !strings.HasPrefix(out, "Usage: gpumem "+args[slices.IndexFunc(args, func(s string) bool { return !strings.HasPrefix(s, "-") && s != "help" })]) {
			t.Errorf("%q: exit %d, stdout %q, stderr %q", args, code, out, errs)
		}
	}
	code, out, _ := run(t, nil, "replay", "-h")
	for _, f := range []string{"--device device", "--capacity SIZE", "(default 80.00 GiB)", "--granularity SIZE", "(default 2.00 MiB)", "--mode mode", "--limit SIZE",
		"--preallocate SIZE", "--release-threshold SIZE", "--small-size SIZE", "--touch\n", "--check\n", "--json\n"} {
		if !strings.Contains(out, f) {
			t.Errorf("replay -h has no %q:\n%s", f, out)
		}
	}
	for _, args := range [][]string{{"frobnicate"}, {"--json"}, {"help", "frobnicate"}, {"help", "a", "b"}} {
		code, out, errs := run(t, nil, args...)
		if code != 2 || out != "" || !strings.HasPrefix(errs, "gpumem") {
			t.Errorf("%q: exit %d, stdout %q, stderr %q", args, code, out, errs)
		}
	}
}

func TestVersion(t *testing.T) {
	for _, args := range [][]string{{"version"}, {"--version"}} {
		code, out, errs := run(t, nil, args...)
		if code != 0 || errs != "" || !regexp.MustCompile(`^gpumem \S.* go\S+ \w+/\w+\n$`).MatchString(out) {
			t.Errorf("%q: exit %d, stdout %q, stderr %q", args, code, out, errs)
		}
	}
	old := Version
	Version = "v1.2.3"
	defer func() { Version = old }()
	if _, out, _ := run(t, nil, "version"); !strings.HasPrefix(out, "gpumem v1.2.3 ") {
		t.Errorf("with Version set: %q", out)
	}
	if code, _, _ := run(t, nil, "version", "extra"); code != 2 {
		t.Errorf("version extra: exit %d, want 2", code)
	}
}

// TestReplayCPUProfile: --cpuprofile writes a CPU profile that pprof reads,
// and a path that cannot be written fails the command with the flag named.
func TestReplayCPUProfile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "cpu.prof")
	code, _, errs := run(t, nil, "replay", "--device", "sim", "--passes", "3", "--cpuprofile", path, "../testdata/traces/sweep_create_dispose.trace.gz")
	if code != 0 || errs != "" {
		t.Fatalf("exit %d, stderr %q", code, errs)
	}
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	prof, err := profile.Parse(f)
	if err != nil {
		t.Fatalf("the profile does not parse: %v", err)
	}
	if len(prof.SampleType) != 2 || prof.SampleType[1].Type != "cpu" || prof.SampleType[1].Unit != "nanoseconds" {
		t.Errorf("sample types %v, want samples/count and cpu/nanoseconds", prof.SampleType)
	}
	code, _, errs = run(t, nil, "replay", "--device", "sim", "--cpuprofile", filepath.Join(t.TempDir(), "no", "such", "dir"), "testdata/tiny.trace")
	if code != ExitFail || !strings.Contains(errs, "--cpuprofile") {
		t.Errorf("unwritable profile: exit %d, stderr %q; want %d and the flag named", code, errs, ExitFail)
	}
}

// TestReplayAtPeak: --at-peak gives the make-up at the peak, in JSON (parts
// that sum to what was held) and as a line after the table.
func TestReplayAtPeak(t *testing.T) {
	code, out, errs := run(t, nil, "replay", "--json", "--at-peak", "--capacity", "1GiB", "testdata/tiny.trace")
	if code != ExitOK {
		t.Fatalf("exit %d: %s", code, errs)
	}
	var r struct {
		Peak uint64            `json:"peak_reserved_bytes"`
		Raw  map[string]uint64 `json:"at_peak"`
	}
	if err := json.Unmarshal([]byte(out), &r); err != nil {
		t.Fatalf("%v in %q", err, out)
	}
	m := r.Raw
	if m == nil {
		t.Fatalf("no at_peak in %s", out)
	}
	sum := m["live_bytes"] + m["free_in_live_chunks"] + m["idle_chunks_in_live_spans"] + m["empty_spans"] + m["plain_live_bytes"] + m["plain_free_bytes"] + m["other_bytes"]
	if sum != m["reserved_bytes"] || m["peak_reserved_bytes"] != r.Peak || m["pass"] != 1 {
		t.Errorf("at_peak %v: the parts sum to %d; the replay's peak %d", m, sum, r.Peak)
	}
	code, out, _ = run(t, nil, "replay", "--at-peak", "--capacity", "1GiB", "testdata/tiny.trace")
	if code != ExitOK || !strings.Contains(out, "tiny: right after its peak of ") || !strings.Contains(out, " live + ") {
		t.Errorf("exit %d, the table's line missing:\n%s", code, out)
	}
}

// TestReplayPartial: a recording cut short (gzip data that stops early) is
// an error, or with --partial replayed up to its last whole line with a
// note saying where it was cut: the same events as trace.LoadPartial reads.
func TestReplayPartial(t *testing.T) {
	var text strings.Builder
	text.WriteString("# gpumem-trace v1\n")
	for i := range 3000 { // sizes that do not repeat, so that the gzip data grows with the events
		fmt.Fprintf(&text, "a %d %d 0 %d\nf %d %d\n", i, 4096+i*512, 2*i, i, 2*i+1)
	}
	var gz bytes.Buffer
	zw := gzip.NewWriter(&gz)
	zw.Write([]byte(text.String()))
	zw.Close()
	path := filepath.Join(t.TempDir(), "died.trace.gz")
	if err := os.WriteFile(path, gz.Bytes()[:gz.Len()*2/3], 0o644); err != nil {
		t.Fatal(err)
	}
	before, err := trace.LoadPartial(path)
	if !errors.Is(err, trace.ErrCutShort) || before == nil || len(before.Events) == 0 {
		t.Fatalf("LoadPartial: %v; want some events and the cut", err)
	}
	if code, _, errs := run(t, nil, "replay", "--device", "sim", path); code != ExitFail || !strings.Contains(errs, "truncated gzip stream") {
		t.Errorf("without --partial: exit %d, %q", code, errs)
	}
	code, out, errs := run(t, nil, "replay", "--device", "sim", "--json", "--partial", path)
	var r struct {
		Events int `json:"events"`
	}
	if code != ExitOK || json.Unmarshal([]byte(out), &r) != nil || r.Events != len(before.Events) ||
		!strings.Contains(errs, "truncated gzip stream") || !strings.Contains(errs, "replaying what came before the cut") {
		t.Errorf("--partial: exit %d, %d events (want %d), stdout %q, stderr %q", code, r.Events, len(before.Events), out, errs)
	}
}
