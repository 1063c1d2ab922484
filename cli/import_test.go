package cli

import (
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/gpumem/gpumem/torchsnapshot"
	"github.com/gpumem/gpumem/trace"
)

const (
	fixtureSnapshot = "../testdata/fixtures/resnet18_snapshot.pickle"
	snapshotDir     = "../testdata/snapshots"
)

// TestImportFixture imports a snapshot exactly as PyTorch wrote it and
// replays the trace.
func TestImportFixture(t *testing.T) {
	out := filepath.Join(t.TempDir(), "resnet18.trace.gz")
	code, stdout, stderr := run(t, nil, "import", fixtureSnapshot, "-o", out)
	// 657 alloc and 531 free_requested entries, 35 distinct stacks among
	// the 336 allocs with frames and a peak of 512423751 live bytes,
	// counted from the pickle with Python.
	if want := out + ": device 0, 1188 events, 657 requests, peak live 488.69 MiB, 35 sites\n"; code != 0 || stdout != want || stderr != "" {
		t.Fatalf("exit %d, stdout %q, stderr %q; want 0, %q, nothing", code, stdout, stderr, want)
	}
	tr, err := trace.Load(out)
	if err != nil {
		t.Fatal(err)
	}
	if tr.Requests != 657 || len(tr.Events) != 1188 || tr.PeakLiveBytes != 512423751 {
		t.Errorf("trace: %d requests, %d events, peak %d; want 657, 1188, 512423751", tr.Requests, len(tr.Events), tr.PeakLiveBytes)
	}
	withSite := 0
	for _, e := range tr.Events {
		if e.Kind == trace.Alloc && e.Site != 0 {
			withSite++
			if !regexp.MustCompile(`^\S+ \S+\.py:\d+( < \S+ \S+\.py:\d+)*$`).MatchString(tr.Sites[e.Site]) {
				t.Fatalf("request %d: site %d is %q, want a stack", e.ID, e.Site, tr.Sites[e.Site])
			}
		}
	}
	// 321 allocs were made with no Python frame on the stack (in the
	// backward pass, from C++): they have no site.
	if len(tr.Sites) != 35 || withSite != 336 {
		t.Errorf("%d sites, %d requests with a site; want 35 and 336", len(tr.Sites), withSite)
	}

	// -format v2: the same trace, packed.
	out2 := filepath.Join(t.TempDir(), "resnet18.v2.trace")
	if code, _, stderr := run(t, nil, "import", "-format", "v2", fixtureSnapshot, "-o", out2); code != 0 || stderr != "" {
		t.Fatalf("-format v2: exit %d, stderr %q", code, stderr)
	}
	text, err := os.ReadFile(out2)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(string(text), "# gpumem-trace v2") {
		t.Fatalf("-format v2 wrote %.40q", text)
	}
	tr2, err := trace.Load(out2)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(tr2.Events, tr.Events) || len(tr2.Sites) != len(tr.Sites) {
		t.Fatalf("-format v2: %d events, %d sites; not v1's %d, %d", len(tr2.Events), len(tr2.Sites), len(tr.Events), len(tr.Sites))
	}

	code, stdout, stderr = run(t, nil, "replay", "--device", "sim", "--check", "--json", out)
	if code != 0 || stderr != "" {
		t.Fatalf("replay: exit %d, stderr %q", code, stderr)
	}
	var r struct {
		Trace         string
		Events        int
		PeakLiveBytes uint64 `json:"peak_live_bytes"`
		Ratio         float64
		OOMs          int
	}
	if err := json.Unmarshal([]byte(stdout), &r); err != nil {
		t.Fatal(err)
	}
	if r.Trace != "resnet18" || r.Events != 1188 || r.PeakLiveBytes != 512423751 || r.OOMs != 0 || r.Ratio < 1 {
		t.Errorf("replay: %+v", r)
	}
}

// TestImportDevices imports a snapshot of three devices, one without a
// history, and a history whose ring buffer wrapped.
func TestImportDevices(t *testing.T) {
	dir := t.TempDir()
	out := filepath.Join(dir, "run.trace")
	code, stdout, stderr := run(t, nil, "import", "-o", out, filepath.Join(snapshotDir, "two_devices.pickle"))
	// Counted from the pickle with Python (testdata/snapshots/make_snapshots.py
	// says what it holds).
	wantOut := out + ": device 0, 346 events, 236 requests, peak live 434.56 MiB, 8 sites\n" +
		filepath.Join(dir, "run.dev2.trace") + ": device 2, 173 events, 165 requests, peak live 323.32 MiB, 20 sites\n"
	wantErr := "gpumem import: note: " + out + ": allocated at time 0: 72 requests freed in the history but allocated before it began; " +
		"126 blocks allocated at the snapshot but never in the history (never freed)\n"
	if code != 0 || stdout != wantOut || stderr != wantErr {
		t.Fatalf("exit %d\nstdout %q\nstderr %q\nwant 0\n%q\n%q", code, stdout, stderr, wantOut, wantErr)
	}
	for path, requests := range map[string]int{out: 236, filepath.Join(dir, "run.dev2.trace"): 165} {
		tr, err := trace.Load(path)
		if err != nil || tr.Requests != requests {
			t.Errorf("%s: %v; want %d requests", path, err, requests)
		}
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 2 {
		t.Errorf("%d files written, want 2", len(entries))
	}
}

func TestImportErrors(t *testing.T) {
	dir := t.TempDir()
	data, err := os.ReadFile(fixtureSnapshot)
	if err != nil {
		t.Fatal(err)
	}
	half := filepath.Join(dir, "half.pickle")
	if err := os.WriteFile(half, data[:len(data)/2], 0o644); err != nil {
		t.Fatal(err)
	}
	snap := filepath.Join(dir, "snap.pickle")
	if err := os.WriteFile(snap, data, 0o644); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(dir, "out.trace")
	for _, tc := range []struct {
		name   string
		args   []string
		code   int
		stderr string // a regexp the whole of stderr must match
	}{
		{"no snapshot", []string{"import"}, 2, `(?s)^Usage: gpumem import \[flags\] SNAPSHOT -o TRACE\n.*--o TRACE\n`},
		{"no -o", []string{"import", fixtureSnapshot}, 2, `^gpumem import: -o TRACE is required\nRun 'gpumem import -h' for usage\.\n$`},
		{"two snapshots", []string{"import", "-o", out, fixtureSnapshot, fixtureSnapshot}, 2, `^gpumem import: one SNAPSHOT at a time; got 2\n`},
		{"unknown flag", []string{"import", "--device", "1", fixtureSnapshot}, 2, `^gpumem import: flag provided but not defined: --device\n`},
		{"unknown format", []string{"import", "-format", "v3", "-o", out, fixtureSnapshot}, 2, `^gpumem import: -format "v3": want v1 or v2\n`},
		{"missing", []string{"import", "-o", out, "testdata/missing.pickle"}, 1, `^gpumem import: open testdata/missing\.pickle: no such file or directory\n$`},
		{"a trace", []string{"import", "-o", out, "testdata/tiny.trace"}, 1,
			`^gpumem import: testdata/tiny\.trace: torchsnapshot: corrupt pickle: unknown opcode 0x23 at byte 0\n$`},
		{"truncated", []string{"import", "-o", out, half}, 1,
			`^gpumem import: .*half\.pickle: torchsnapshot: truncated pickle: .* at byte \d+: unexpected EOF\n$`},
		{"no history", []string{"import", "-o", out, filepath.Join(snapshotDir, "no_history.pickle")}, 1,
			`^gpumem import: .*no_history\.pickle: no allocation history \(was torch\.cuda\.memory\._record_memory_history\(\) called before the program allocated\?\)\n$`},
		{"no such directory", []string{"import", "-o", filepath.Join(dir, "no", "out.trace"), fixtureSnapshot}, 1,
			`^gpumem import: open .*out\.trace: no such file or directory\n$`},
		{"over the snapshot", []string{"import", "-o", snap, snap}, 1, `^gpumem import: .*snap\.pickle: the trace would overwrite the snapshot\n$`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, stdout, stderr := run(t, nil, tc.args...)
			if code != tc.code || stdout != "" {
				t.Errorf("exit %d, stdout %q; want %d, nothing (stderr %q)", code, stdout, tc.code, stderr)
			}
			if !regexp.MustCompile(tc.stderr).MatchString(stderr) {
				t.Errorf("stderr %q does not match %q", stderr, tc.stderr)
			}
		})
	}
	if _, err := os.Stat(out); !os.IsNotExist(err) {
		t.Errorf("a failed import left %s: %v", out, err)
	}
	if got, _ := os.ReadFile(snap); len(got) != len(data) {
		t.Error("the snapshot was overwritten")
	}
}

func TestDevicePath(t *testing.T) {
	for _, tt := range []struct {
		path string
		dev  int
		want string
	}{
		{"run.trace.gz", 0, "run.trace.gz"},
		{"run.trace.gz", 1, "run.dev1.trace.gz"},
		{"run.trace", 3, "run.dev3.trace"},
		{"run.gz", 2, "run.dev2.gz"},
		{"run", 12, "run.dev12"},
		{"run.txt", 1, "run.txt.dev1"},
		{"out/a.b.trace.gz", 1, "out/a.b.dev1.trace.gz"},
		{"x.trace/run", 1, "x.trace/run.dev1"},
		{".trace", 1, ".trace.dev1"},
		{"dir/.gz", 1, "dir/.gz.dev1"},
	} {
		if got := torchsnapshot.DevicePath(tt.path, tt.dev); got != tt.want {
			t.Errorf("DevicePath(%q, %d) = %q, want %q", tt.path, tt.dev, got, tt.want)
		}
	}
}

func TestImportNotes(t *testing.T) {
	got := importNotes(torchsnapshot.Summary{AllocatedBefore: 1, ImpliedFrees: 2, ClampedTimes: 1})
	want := []string{
		"allocated at time 0: 1 request freed in the history but allocated before it began",
		"2 frees inferred: an alloc at the address of a live request frees it",
		"1 entry recorded earlier than the one before, written at its time",
	}
	if !slices.Equal(got, want) {
		t.Errorf("notes\n%q\nwant\n%q", got, want)
	}
	got = importNotes(torchsnapshot.Summary{LiveThroughout: 1, ClampedTimes: 3})
	want = []string{
		"allocated at time 0: 1 block allocated at the snapshot but never in the history (never freed)",
		"3 entries recorded earlier than the one before, written at its time",
	}
	if !slices.Equal(got, want) {
		t.Errorf("notes\n%q\nwant\n%q", got, want)
	}
	if got := importNotes(torchsnapshot.Summary{Events: 5, Requests: 5}); got != nil {
		t.Errorf("notes %q, want none", got)
	}

	code, stdout, stderr := run(t, nil, "help", "import")
	if code != 0 || stderr != "" || !strings.HasPrefix(stdout, "Usage: gpumem import [flags] SNAPSHOT -o TRACE\n") {
		t.Errorf("help import: exit %d, stdout %q, stderr %q", code, stdout, stderr)
	}
}

// TestReplaySnapshot: replay, like fit and report, takes a PyTorch snapshot
// and replays the trace gpumem import makes of its first device with a
// history: the same events, peaks and driver calls as replaying that import,
// under gpumem and under an emulated policy.
func TestReplaySnapshot(t *testing.T) {
	dir := t.TempDir()
	for _, snap := range []string{fixtureSnapshot, filepath.Join(snapshotDir, "two_devices.pickle")} {
		out := filepath.Join(dir, strings.TrimSuffix(filepath.Base(snap), ".pickle")+".trace")
		if code, _, stderr := run(t, nil, "import", "-o", out, snap); code != 0 {
			t.Fatalf("import %s: exit %d, %q", snap, code, stderr)
		}
		for _, extra := range [][]string{nil, {"--policy", "torch-expandable"}} {
			fields := func(path string) map[string]any {
				t.Helper()
				args := append(append([]string{"replay", "--json", "--capacity", "80GiB"}, extra...), path)
				code, stdout, stderr := run(t, nil, args...)
				if code != 0 {
					t.Fatalf("%v: exit %d, %q", args, code, stderr)
				}
				var m map[string]any
				if err := json.Unmarshal([]byte(stdout), &m); err != nil {
					t.Fatalf("%v: %v in %q", args, err, stdout)
				}
				delete(m, "trace")
				delete(m, "ns_per_op")
				return m
			}
			got, want := fields(snap), fields(out)
			if !reflect.DeepEqual(got, want) || got["events"] == float64(0) {
				t.Errorf("%s %v: replayed\n%v\nwant (its import)\n%v", snap, extra, got, want)
			}
		}
	}
	code, _, stderr := run(t, nil, "replay", filepath.Join(snapshotDir, "no_history.pickle"))
	if code != ExitFail || !strings.Contains(stderr, "no_history.pickle") || !strings.Contains(stderr, "no allocation history") {
		t.Errorf("no history: exit %d, %q", code, stderr)
	}
}
