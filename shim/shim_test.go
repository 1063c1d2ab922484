package shim

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
)

// built is what the tests run: the shim, gpumem's library, the stand-in
// driver (as libcuda.so.1 in its own directory) and the C programs.
type built struct {
	shim, lib, driverDir, tfalloc, paths, shimbench, gatecheck string
}

// buildDir holds what build made, once for all the tests (TestMain removes
// it); buildErr is why it could not.
var (
	buildOnce sync.Once
	buildDir  string
	builtOnce built
	buildErr  string
	buildSkip bool
)

func TestMain(m *testing.M) {
	code := m.Run()
	if buildDir != "" {
		os.RemoveAll(buildDir)
	}
	os.Exit(code)
}

func build(t *testing.T) built {
	t.Helper()
	buildOnce.Do(func() { builtOnce, buildErr, buildSkip = buildAll() })
	if buildSkip {
		t.Skip(buildErr)
	}
	if buildErr != "" {
		t.Fatal(buildErr)
	}
	return builtOnce
}

func buildAll() (b built, failure string, skip bool) {
	cc, err := exec.LookPath("cc")
	if err != nil {
		return b, "no C compiler (cc): the shim and its test programs are C", true
	}
	dir, err := os.MkdirTemp("", "gpumem-shim-test")
	if err != nil {
		return b, err.Error(), false
	}
	buildDir = dir
	b = built{
		shim:      filepath.Join(dir, "libgpumem_preload.so"),
		lib:       filepath.Join(dir, "libgpumem.so"),
		driverDir: filepath.Join(dir, "driver"),
		tfalloc:   filepath.Join(dir, "tfalloc"),
		paths:     filepath.Join(dir, "paths"),
		shimbench: filepath.Join(dir, "shimbench"),
		gatecheck: filepath.Join(dir, "gatecheck"),
	}
	if err := os.Mkdir(b.driverDir, 0o755); err != nil {
		return b, err.Error(), false
	}
	run := func(name string, args ...string) {
		if failure != "" {
			return
		}
		cmd := exec.Command(name, args...)
		cmd.Env = append(os.Environ(), "CGO_ENABLED=1")
		if out, err := cmd.CombinedOutput(); err != nil {
			failure = fmt.Sprintf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
		}
	}
	run(cc, "-O2", "-Wall", "-Werror", "-fPIC", "-shared", "-o", b.shim, "c/preload.c", "c/gate.c", "-ldl", "-lpthread")
	// -Bsymbolic: the stand-in's calls to its own functions stay its own,
	// as the driver's do, rather than reaching the shim's exported names.
	run(cc, "-O2", "-Wall", "-Werror", "-fPIC", "-shared", "-Wl,-Bsymbolic", "-o", filepath.Join(b.driverDir, "libcuda.so.1"), "c/fakecuda.c")
	run(cc, "-O2", "-Wall", "-Werror", "-o", b.tfalloc, "c/tfalloc.c", "-ldl")
	run(cc, "-O2", "-Wall", "-Werror", "-o", b.paths, "c/paths.c", "-ldl", "-lpthread")
	run(cc, "-O2", "-Wall", "-Werror", "-o", b.shimbench, "c/shimbench.c", "-ldl")
	run(cc, "-O2", "-Wall", "-Werror", "-o", b.gatecheck, "c/gatecheck.c", "-ldl", "-lpthread")
	run("go", "build", "-buildmode=c-shared", "-o", b.lib, "../clib")
	return b, failure, false
}

func (b built) command(env []string, name string, args ...string) *exec.Cmd {
	cmd := exec.Command(name, args...)
	cmd.Env = append(os.Environ(), "LD_PRELOAD="+b.shim, "LD_LIBRARY_PATH="+b.driverDir, "GPUMEM_LIBRARY="+b.lib)
	cmd.Env = append(cmd.Env, env...)
	return cmd
}

func output(t *testing.T, cmd *exec.Cmd) (stdout, stderr string, code int) {
	t.Helper()
	var o, e strings.Builder
	cmd.Stdout, cmd.Stderr = &o, &e
	err := cmd.Run()
	if ee, ok := err.(*exec.ExitError); ok {
		if !ee.Exited() {
			t.Fatalf("%s died: %v\nstdout:\n%s\nstderr:\n%s", cmd.Path, err, o.String(), e.String())
		}
		return o.String(), e.String(), ee.ExitCode()
	} else if err != nil {
		t.Fatal(err)
	}
	return o.String(), e.String(), 0
}

// TestTensorFlowCalls: TensorFlow's cuda_malloc_async calls, made through
// dlsym and cuGetProcAddress as frameworks make them, are served by gpumem
// (tfalloc checks each contract and that the driver got none of them but
// the capturing stream's); out-of-memory is the driver's error with one
// verdict on stderr.
func TestTensorFlowCalls(t *testing.T) {
	b := build(t)
	stdout, stderr, code := output(t, b.command([]string{"GPUMEM_CONFIG=device=sim,capacity=4GiB,limit=1GiB,check=true"},
		b.tfalloc, "1073741824"))
	if code != 0 {
		t.Fatalf("tfalloc under the shim: exit %d\n%s%s", code, stdout, stderr)
	}
	if n := strings.Count(stdout, "ok: "); n != 5 {
		t.Errorf("%d checks passed, want 5:\n%s", n, stdout)
	}
	if !strings.HasPrefix(stderr, "gpumem: out of memory (allocator limit)") || strings.Count(stderr, "\n") != 1 {
		t.Errorf("stderr should be the one verdict of the out-of-memory, got:\n%s", stderr)
	}
	// Without the shim the same program sees the driver's allocations:
	// the checks can fail.
	cmd := exec.Command(b.tfalloc, "1073741824")
	cmd.Env = append(os.Environ(), "LD_LIBRARY_PATH="+b.driverDir)
	if _, _, code := output(t, cmd); code == 0 {
		t.Error("tfalloc passed without the shim: its checks do not tell gpumem from the driver")
	}
}

// TestMissingLibrary: without a usable gpumem the shim says so in one line
// and the program runs on the driver (tfalloc then reports that the driver
// served its allocations), never crashing.
func TestMissingLibrary(t *testing.T) {
	b := build(t)
	for _, lib := range []string{"/nonexistent/libgpumem.so", b.driverDir + "/libcuda.so.1"} {
		cmd := b.command([]string{"GPUMEM_LIBRARY=" + lib}, b.tfalloc, "0")
		stdout, stderr, code := output(t, cmd)
		lines := strings.Split(strings.TrimSpace(stderr), "\n")
		if !strings.HasPrefix(lines[0], "gpumem: preload: cannot use "+lib) {
			t.Errorf("GPUMEM_LIBRARY=%s: first line %q, want the shim's one line", lib, lines[0])
		}
		if strings.Count(stderr, "gpumem: preload") != 1 {
			t.Errorf("GPUMEM_LIBRARY=%s: the shim said more than one line:\n%s", lib, stderr)
		}
		if code != 1 || !strings.Contains(stderr, "the driver got allocations") {
			t.Errorf("GPUMEM_LIBRARY=%s: exit %d; want tfalloc to find the driver serving it\n%s%s", lib, code, stdout, stderr)
		}
	}
}

// TestNoWrappedCalls: a program that never allocates device memory runs as
// without the shim, and gpumem is never loaded into it.
func TestNoWrappedCalls(t *testing.T) {
	b := build(t)
	stdout, stderr, code := output(t, b.command(nil, "sh", "-c", "echo hello; grep -c libgpumem.so /proc/self/maps || true"))
	if code != 0 || stdout != "hello\n0\n" || stderr != "" {
		t.Errorf("exit %d, stdout %q, stderr %q; want hello, 0 mappings of gpumem, nothing on stderr", code, stdout, stderr)
	}
}

// TestPerCallPath: the contracts of the per-call path (c/paths.c: each case
// checks what reached the stand-in driver and which device gpumem served):
// a stream being captured allocates from the driver, and while no capture
// is in progress no allocation asks the driver anything; the device is the
// pool's or the thread's current context's, and with one device the driver
// is not asked; a child forked after gpumem started goes to the driver,
// saying so once, and one forked before runs a gpumem of its own.
func TestPerCallPath(t *testing.T) {
	b := build(t)
	for _, c := range []struct {
		name    string
		devices string
		oks     int
		stderr  string
	}{
		{"capture", "1", 4, ""},
		{"devices", "2", 3, ""},
		{"single", "1", 1, ""},
		{"fork", "1", 1, "gpumem: preload: this process was forked after gpumem started, which cannot run in a forked child; it allocates from the driver as without gpumem\n"},
	} {
		t.Run(c.name, func(t *testing.T) {
			cmd := b.command([]string{"GPUMEM_CONFIG=device=sim,capacity=4GiB,check=true", "FAKE_CUDA_DEVICES=" + c.devices}, b.paths, c.name)
			stdout, stderr, code := output(t, cmd)
			if code != 0 || strings.Count(stdout, "ok: ") != c.oks || stderr != c.stderr {
				t.Errorf("paths %s: exit %d, want 0 with %d ok lines and stderr %q\nstdout:\n%sstderr:\n%s", c.name, code, c.oks, c.stderr, stdout, stderr)
			}
		})
	}
}

// TestCaptureReport: GPUMEM_PRELOAD_REPORT=1 prints what the shim saw at
// exit: the captures begun and the allocations passed to the driver, then
// the calls by entry point.
func TestCaptureReport(t *testing.T) {
	b := build(t)
	cmd := b.command([]string{"GPUMEM_CONFIG=device=sim,capacity=4GiB", "GPUMEM_PRELOAD_REPORT=1"}, b.paths, "capture")
	_, stderr, code := output(t, cmd)
	// paths capture begins 3 captures and makes 5 allocations on captured
	// streams (4 on c, 1 on the per-thread stream).
	lines := strings.SplitAfter(stderr, "\n")
	if want := "gpumem: preload: 3 stream captures begun, 5 allocations passed to the driver while captured\n"; code != 0 || len(lines) != 3 || lines[0] != want || !strings.HasPrefix(lines[1], "gpumem: preload: calls: ") {
		t.Errorf("exit %d, stderr %q; want 0, %q and the calls line", code, stderr, want)
	}
}

// reportedCalls parses the report's calls line: entry point -> count.
func reportedCalls(t *testing.T, stderr string) map[string]int {
	t.Helper()
	const prefix = "gpumem: preload: calls: "
	for _, line := range strings.Split(stderr, "\n") {
		if !strings.HasPrefix(line, prefix) {
			continue
		}
		calls := map[string]int{}
		for _, item := range strings.Split(strings.TrimPrefix(line, prefix), ", ") {
			i := strings.LastIndexByte(item, ' ')
			var n int
			if _, err := fmt.Sscan(item[i+1:], &n); i < 0 || err != nil {
				t.Fatalf("calls line: item %q is not NAME COUNT: %q", item, line)
			}
			calls[item[:i]] = n
		}
		return calls
	}
	t.Fatalf("no calls line in stderr:\n%s", stderr)
	return nil
}

// TestCallCounts: the report counts every call to each wrapped entry point
// and the driver calls the shim makes itself, exactly (shimbench's calls
// are known from its loop counts); with GPUMEM_PRELOAD_PASSTHROUGH=1 the
// same program's calls all go to the driver, counted the same, gpumem is
// never loaded, and the shim makes no driver call of its own.
func TestCallCounts(t *testing.T) {
	b := build(t)
	const pairs = 100
	// shimbench: 5 runs of PAIRS iterations per row; the pair rows run at
	// two sizes: FromPool + FreeAsync, the same during a capture, AllocAsync
	// + FreeAsync; then two attribute rows and one cuMemGetInfo row.
	want := map[string]int{
		"cuMemAllocFromPoolAsync":   2 * 2 * 5 * pairs,
		"cuMemAllocAsync":           2 * 5 * pairs,
		"cuMemFreeAsync":            3 * 2 * 5 * pairs,
		"cuMemPoolGetAttribute":     2 * 5 * pairs,
		"cuMemGetInfo_v2":           5 * pairs,
		"cuStreamBeginCapture_v2":   1,
		"cuStreamEndCapture":        1,
		"cuDeviceGetDefaultMemPool": 1,
		"cuMemPoolSetAttribute":     1,
	}
	for _, mode := range []struct {
		name string
		env  []string
		own  map[string]int // the shim's own driver calls
	}{
		// During the capture each of the pair's allocations asks whether
		// its stream is captured, and ending the capture asks twice (before
		// and after); with one device nothing else is asked. Passing
		// through, only the end of the capture asks.
		{"shim", nil, map[string]int{"cuStreamIsCapturing (the shim's own)": 2*5*pairs + 2}},
		{"passthrough", []string{"GPUMEM_PRELOAD_PASSTHROUGH=1"}, map[string]int{"cuStreamIsCapturing (the shim's own)": 2}},
	} {
		t.Run(mode.name, func(t *testing.T) {
			env := append([]string{"GPUMEM_CONFIG=device=sim,capacity=4GiB", "GPUMEM_PRELOAD_REPORT=1"}, mode.env...)
			stdout, stderr, code := output(t, b.command(env, b.shimbench, fmt.Sprint(pairs)))
			if code != 0 {
				t.Fatalf("shimbench: exit %d\n%s%s", code, stdout, stderr)
			}
			calls := reportedCalls(t, stderr)
			for name, n := range want {
				if calls[name] != n {
					t.Errorf("%s: %d calls reported, want %d", name, calls[name], n)
				}
			}
			for name, n := range calls {
				if strings.Contains(name, "the shim's own") && mode.own[name] != n {
					t.Errorf("%s: %d calls reported, want %d", name, n, mode.own[name])
				}
			}
			for name, n := range mode.own {
				if calls[name] != n {
					t.Errorf("%s: %d calls reported, want %d", name, calls[name], n)
				}
			}
			if calls["cuGetProcAddress_v2"] == 0 {
				t.Error("the program's cuGetProcAddress_v2 lookups were not counted")
			}
			passthrough := strings.Contains(stderr, "gpumem: preload: passthrough (GPUMEM_PRELOAD_PASSTHROUGH=1), every call went to the driver; 1 stream captures begun\n")
			if passthrough != (mode.name == "passthrough") {
				t.Errorf("passthrough line present %v, want %v:\n%s", passthrough, mode.name == "passthrough", stderr)
			}
			// shimbench says whose functions it got: the shim's in both modes.
			if !strings.Contains(stdout, "go to the shim") {
				t.Errorf("shimbench did not get the shim's functions:\n%s", stdout)
			}
		})
	}
	// Without the report the shim counts nothing and says nothing.
	_, stderr, code := output(t, b.command([]string{"GPUMEM_CONFIG=device=sim,capacity=4GiB"}, b.shimbench, "10"))
	if code != 0 || stderr != "" {
		t.Errorf("without GPUMEM_PRELOAD_REPORT: exit %d, stderr %q; want 0 and nothing", code, stderr)
	}
}

// TestPassthroughServesFromDriver: with GPUMEM_PRELOAD_PASSTHROUGH=1
// TensorFlow's calls reach the driver (tfalloc finds the driver serving
// them and fails its gpumem checks), with no line from the shim.
func TestPassthroughServesFromDriver(t *testing.T) {
	b := build(t)
	stdout, stderr, code := output(t, b.command([]string{"GPUMEM_PRELOAD_PASSTHROUGH=1"}, b.tfalloc, "0"))
	if code != 1 || !strings.Contains(stderr, "the driver got allocations") || strings.Contains(stderr, "gpumem: preload") {
		t.Errorf("exit %d; want tfalloc to find the driver serving it, and no line from the shim\n%s%s", code, stdout, stderr)
	}
}

// TestShimbench: the benchmark runs through the shim against the stand-in
// driver and prints every row (its figures are for BENCHMARKS.md, not
// checked here).
func TestShimbench(t *testing.T) {
	b := build(t)
	stdout, stderr, code := output(t, b.command([]string{"GPUMEM_CONFIG=device=sim,capacity=4GiB"}, b.shimbench, "1000"))
	if code != 0 || !strings.Contains(stdout, "go to the shim") {
		t.Fatalf("shimbench: exit %d\n%s%s", code, stdout, stderr)
	}
	for _, row := range []string{"pair (FromPool", "another stream capturing", "async pair", "capture check", "ctx device",
		"ctx current", "pool used", "pool threshold", "mem info", "free's device -1", "free's device known", "crossings"} {
		if !strings.Contains(stdout, row) {
			t.Errorf("no row %q:\n%s", row, stdout)
		}
	}
	if _, _, code := output(t, b.command(nil, b.shimbench, "0")); code != 2 {
		t.Errorf("shimbench 0: exit %d, want 2 (a usage error)", code)
	}
}

// TestLaunchGate: the launch gate's contracts (c/gatecheck.c): launches
// found every way a program finds them pass the gate with their arguments
// intact, none reaches the driver while it is closed, closing waits for
// one inside the driver; a lookup the shim cannot classify, a lookup of
// cuGetExportTable (the CUDA runtime's private way to the driver), or an
// export of gpumem's memory, turns moves off, said in one line.
func TestLaunchGate(t *testing.T) {
	b := build(t)
	for _, c := range []struct {
		name, stderr string
		oks          int
	}{
		{"gate", "", 4},
		{"unknown", "gpumem: preload: an unclassified driver entry point, cuBrandNewCall: gpumem will not move live memory in this process (an out-of-memory stays one)\n", 1},
		{"export", "gpumem: preload: an export of gpumem's memory by cuMemRetainAllocationHandle: gpumem will not move live memory in this process (an out-of-memory stays one)\n", 1},
		{"opaque", "gpumem: preload: launches the gate cannot see, through cuGetExportTable: gpumem will not move live memory in this process (an out-of-memory stays one)\n", 1},
	} {
		t.Run(c.name, func(t *testing.T) {
			cmd := b.command([]string{"GPUMEM_CONFIG=device=sim,capacity=4GiB"}, b.gatecheck, c.name)
			stdout, stderr, code := output(t, cmd)
			if code != 0 || strings.Count(stdout, "ok: ") != c.oks || stderr != c.stderr {
				t.Errorf("gatecheck %s: exit %d, want 0 with %d ok lines and stderr %q\nstdout:\n%sstderr:\n%s", c.name, code, c.oks, c.stderr, stdout, stderr)
			}
		})
	}
}

// TestGateGathersByDefault: under the shim, whose gate gpumem finds, the
// default moves live chunks on the way to an out-of-memory and serves a
// request that fits only so; without the shim the same program gets the
// out-of-memory and nothing moves; gather=false turns the moves off under
// the shim too.
func TestGateGathersByDefault(t *testing.T) {
	b := build(t)
	const cfg = "GPUMEM_CONFIG=device=sim,capacity=4GiB,limit=128MiB,span_size=16MiB,check=true"
	for _, c := range []struct {
		name, config string
		shim         bool
		want         string
	}{
		{"under the shim", cfg, true, "served"},
		{"without the shim", cfg, false, "out of memory, 0 splits"},
		{"gather=false", cfg + ",gather=false", true, "out of memory, 0 splits"},
	} {
		t.Run(c.name, func(t *testing.T) {
			cmd := exec.Command(b.gatecheck, "gather")
			cmd.Env = append(os.Environ(), "GPUMEM_LIBRARY="+b.lib, c.config)
			if c.shim {
				cmd = b.command([]string{c.config}, b.gatecheck, "gather")
			}
			stdout, stderr, code := output(t, cmd)
			if code != 0 || !strings.HasPrefix(stdout, c.want) || stderr != "" {
				t.Fatalf("exit %d, stdout %q, stderr %q; want %q", code, stdout, stderr, c.want)
			}
			if c.want == "served" && strings.HasPrefix(stdout, "served, 0 splits") {
				t.Errorf("served with no split: the request did not need a move, the test proves nothing")
			}
		})
	}
}

// BenchmarkLaunchGate: what the launch gate adds to a launch (c/gatecheck.c
// bench): a stand-in cuLaunchKernel that returns at once, called directly
// and through the shim's thunk, by 1 to 8 threads at once. Reported per
// thread count: the direct and gated ns per call (the slowest thread's,
// median of five runs) and their difference. Each iteration runs the
// whole C program.
func BenchmarkLaunchGate(b *testing.B) {
	t := &testing.T{}
	bt := build(t)
	for i := 0; i < b.N; i++ {
		out, err := bt.command(nil, bt.gatecheck, "bench").Output()
		if err != nil {
			b.Fatalf("gatecheck bench: %v\n%s", err, out)
		}
		for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
			var k int
			var direct, gated float64
			if _, err := fmt.Sscanf(line, "%d threads: direct %f ns, gated %f ns", &k, &direct, &gated); err != nil {
				b.Fatalf("gatecheck bench: %q: %v", line, err)
			}
			b.ReportMetric(direct, fmt.Sprintf("direct-ns/%dthreads", k))
			b.ReportMetric(gated, fmt.Sprintf("gated-ns/%dthreads", k))
			b.ReportMetric(gated-direct, fmt.Sprintf("gate-ns/%dthreads", k))
		}
	}
}
