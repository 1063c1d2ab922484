package cli

import (
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/gpumem/gpumem/policy"
	"github.com/gpumem/gpumem/trace"
)

// reportData reads back the data a report page holds.
func reportData(t *testing.T, path string) map[string]any {
	t.Helper()
	page, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	const open = `<script id="report-data" type="application/json">`
	_, rest, ok := strings.Cut(string(page), open)
	js, _, ok2 := strings.Cut(rest, "</script>")
	if !ok || !ok2 {
		t.Fatalf("%s holds no report data", path)
	}
	var d map[string]any
	if err := json.Unmarshal([]byte(js), &d); err != nil {
		t.Fatalf("%s: the report data: %v", path, err)
	}
	return d
}

func TestReportTrace(t *testing.T) {
	out := filepath.Join(t.TempDir(), "tiny.html")
	code, stdout, stderr := run(t, nil, "report", "testdata/tiny.trace", "-o", out, "--policy", "gpumem", "--capacity", "1GiB")
	if want := `^` + regexp.QuoteMeta(out) + `: tiny, 10 events, peak live 14.00 MiB, 1 policy, \d+\.\d\d KiB\n$`; code != 0 || stderr != "" || !regexp.MustCompile(want).MatchString(stdout) {
		t.Fatalf("exit %d, stdout %q, stderr %q; want 0, %s, nothing", code, stdout, stderr, want)
	}
	d := reportData(t, out)
	tr, err := trace.Load("testdata/tiny.trace")
	if err != nil {
		t.Fatal(err)
	}
	pols := d["policies"].([]any)
	if d["trace"] != "tiny" || d["peak_live"].(map[string]any)["bytes"] != float64(tr.PeakLiveBytes) || len(pols) != 1 {
		t.Fatalf("report of tiny: trace %v, peak live %v, %d policies", d["trace"], d["peak_live"], len(pols))
	}
	// The report's peak for gpumem is what gpumem replay --policy finds.
	r, err := policy.Run(tr, "gpumem", 1<<30, true, policy.Options{})
	if err != nil {
		t.Fatal(err)
	}
	p := pols[0].(map[string]any)
	if p["name"] != "gpumem" || p["peak_reserved"].(map[string]any)["bytes"] != float64(r.PeakReservedBytes) {
		t.Errorf("policy %v peak %v; gpumem replay --policy gpumem: %d", p["name"], p["peak_reserved"], r.PeakReservedBytes)
	}

	// All policies by default, in policy.Names' order; flags after the
	// trace as well.
	code, _, stderr = run(t, nil, "report", "testdata/multistream.trace", "-o", out)
	if code != 0 || stderr != "" {
		t.Fatalf("all policies: exit %d, stderr %q", code, stderr)
	}
	pols = reportData(t, out)["policies"].([]any)
	names := policy.Names()
	if len(pols) != len(names) {
		t.Fatalf("%d policies in the report, want %d", len(pols), len(names))
	}
	for i, p := range pols {
		if p.(map[string]any)["name"] != names[i] {
			t.Errorf("policy %d is %v, want %s", i, p.(map[string]any)["name"], names[i])
		}
	}
}

func TestReportSnapshot(t *testing.T) {
	out := filepath.Join(t.TempDir(), "resnet18.html")
	code, stdout, stderr := run(t, nil, "report", fixtureSnapshot, "-o", out, "--policy=gpumem")
	if code != 0 || stderr != "" || !strings.Contains(stdout, ": resnet18_snapshot, 1188 events, peak live 488.69 MiB, 1 policy, ") {
		t.Fatalf("exit %d, stdout %q, stderr %q", code, stdout, stderr)
	}
	d := reportData(t, out)
	// The figures of TestImportFixture: the same importer.
	if d["source"] != "PyTorch snapshot resnet18_snapshot.pickle, device 0" || d["requests"] != float64(657) ||
		d["peak_live"].(map[string]any)["bytes"] != float64(512423751) {
		t.Errorf("source %v, %v requests, peak live %v", d["source"], d["requests"], d["peak_live"])
	}
	if sites := d["at_peak"].([]any); len(sites) == 0 || len(d["sites"].(map[string]any)) == 0 {
		t.Errorf("no call sites in the report of a snapshot with frames: %d at the peak", len(sites))
	}
}

// A device too small for the trace: the report counts the OOMs.
func TestReportOOM(t *testing.T) {
	out := filepath.Join(t.TempDir(), "tiny.html")
	code, _, stderr := run(t, nil, "report", "testdata/tiny.trace", "-o", out, "--policy", "gpumem", "--capacity", "8MiB")
	if code != 0 || stderr != "" {
		t.Fatalf("exit %d, stderr %q", code, stderr)
	}
	p := reportData(t, out)["policies"].([]any)[0].(map[string]any)
	if ooms := p["ooms"].(float64); ooms < 1 || p["peak_reserved"].(map[string]any)["bytes"].(float64) > 8<<20 {
		t.Errorf("on 8 MiB: %v OOMs, peak %v", ooms, p["peak_reserved"])
	}
}

func TestReportErrors(t *testing.T) {
	dir := t.TempDir()
	out := filepath.Join(dir, "r.html")
	bad := filepath.Join(dir, "bad.trace")
	if err := os.WriteFile(bad, []byte("# gpumem-trace v1\na 0 10 0 0\nf 1 1\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name   string
		args   []string
		code   int
		stderr string // a regexp the whole of stderr must match
	}{
		{"no input", []string{"report"}, 2, `(?s)^Usage: gpumem report \[flags\] TRACE\|SNAPSHOT -o FILE\n.*--capacity SIZE\n.*--policy policies\n`},
		{"no -o", []string{"report", "testdata/tiny.trace"}, 2, `^gpumem report: -o FILE is required\nRun 'gpumem report -h' for usage\.\n$`},
		{"two inputs", []string{"report", "-o", out, "testdata/tiny.trace", "testdata/tiny.trace"}, 2, `^gpumem report: one TRACE or SNAPSHOT at a time; got 2\n`},
		{"unknown policy", []string{"report", "-o", out, "--policy", "gpumem,nope", "testdata/tiny.trace"}, 2,
			`^gpumem report: invalid value "gpumem,nope" for flag --policy: unknown policy "nope" \(want gpumem, .*, or all\)\n`},
		{"policy twice", []string{"report", "-o", out, "--policy", "gpumem, gpumem", "testdata/tiny.trace"}, 2, `^gpumem report: invalid value "gpumem, gpumem" for flag --policy: gpumem twice\n`},
		{"capacity 0", []string{"report", "-o", out, "--capacity", "0", "testdata/tiny.trace"}, 2, `^gpumem report: invalid value 0 for flag --capacity\n`},
		{"bad capacity", []string{"report", "-o", out, "--capacity", "lots", "testdata/tiny.trace"}, 2, `^gpumem report: invalid value "lots" for flag --capacity: `},
		{"missing", []string{"report", "-o", out, "testdata/missing.trace"}, 1, `^gpumem report: open testdata/missing\.trace: no such file or directory\n$`},
		{"bad trace", []string{"report", "-o", out, bad}, 1, `^gpumem report: trace bad\.trace:3: f 1: request 1 was never allocated\n$`},
		{"device of a trace", []string{"report", "-o", out, "--device", "1", "testdata/tiny.trace"}, 1,
			`^gpumem report: testdata/tiny\.trace: --device picks a device of a snapshot; this is not one\n$`},
		{"no such device", []string{"report", "-o", out, "--device", "3", fixtureSnapshot}, 1,
			`^gpumem report: .*resnet18_snapshot\.pickle: no allocation history on device 3 \(devices with one: \[0\]\)\n$`},
		{"no history", []string{"report", "-o", out, filepath.Join(snapshotDir, "no_history.pickle")}, 1,
			`^gpumem report: .*no_history\.pickle: no allocation history \(was torch\.cuda\.memory\._record_memory_history\(\) called before the program allocated\?\)\n$`},
		{"no such directory", []string{"report", "-o", filepath.Join(dir, "no", "r.html"), "testdata/tiny.trace"}, 1, `^gpumem report: open .*r\.html: no such file or directory\n$`},
		{"device too small", []string{"report", "-o", out, "--capacity", "1MiB", "--policy", "gpumem", "testdata/tiny.trace"}, 1,
			`^gpumem report: report: trace tiny: policy gpumem: sim: capacity 1048576 is smaller than one granule \(2097152\)\n$`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, stdout, stderr := run(t, nil, tc.args...)
			if code != tc.code || (code != 0) != (stdout == "") {
				t.Errorf("exit %d, stdout %q; want %d (stderr %q)", code, stdout, tc.code, stderr)
			}
			if !regexp.MustCompile(tc.stderr).MatchString(stderr) {
				t.Errorf("stderr %q does not match %q", stderr, tc.stderr)
			}
		})
	}
}
