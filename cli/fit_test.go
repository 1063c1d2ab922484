package cli

import (
	"os"
	"strings"
	"testing"
)

func TestFit(t *testing.T) {
	code, out, errs := run(t, nil, "fit", "--gpu", "20MiB", "testdata/tiny.trace")
	if code != 0 || errs != "" {
		t.Fatalf("exit %d, stderr %q", code, errs)
	}
	// tiny: 14 MiB live at the peak; gpumem fits on 16 MiB, torch-native
	// needs its 22 MiB (TestReplayPolicyJSON works it out).
	// Grouped: one list of the policies that fit, then what each other needs.
	for _, want := range []string{"tiny: peak live 14.00 MiB", "fits a 20 MiB GPU under gpumem, gpumem-compact and tf-bfc-prealloc; torch-native needs 22 MiB; torch-expandable needs 22 MiB; cuda-async needs 32 MiB; tf-bfc needs 24 MiB\n"} {
		if !strings.Contains(out, want) {
			t.Errorf("no %q in\n%s", want, out)
		}
	}
	if !strings.Contains(out, "torch-native      22.00 MiB        1.571    22.00 MiB") {
		t.Errorf("torch-native's row is not 22 MiB:\n%s", out)
	}
	// Three passes: said in the header; tiny repeats its layout, so the
	// same capacities.
	code, out, errs = run(t, nil, "fit", "--policy", "torch-native", "--passes", "3", "testdata/tiny.trace")
	if code != 0 || errs != "" || !strings.Contains(out, "tiny: peak live 14.00 MiB over 3 passes") || !strings.Contains(out, "torch-native  22.00 MiB        1.571") {
		t.Errorf("--passes 3: exit %d, stderr %q, stdout:\n%s", code, errs, out)
	}
	if code, _, errs := run(t, nil, "fit", "--passes", "0", "testdata/tiny.trace"); code != ExitUsage || !strings.Contains(errs, "invalid value 0 for flag --passes") {
		t.Errorf("--passes 0: exit %d, %q", code, errs)
	}
	if code, _, errs := run(t, nil, "fit", "--policy", "nope", "testdata/tiny.trace"); code != ExitUsage || !strings.Contains(errs, `invalid value "nope"`) {
		t.Errorf("bad policy: exit %d, %q", code, errs)
	}
	if code, _, errs := run(t, nil, "fit", "testdata/corrupt.trace"); code != ExitFail || !strings.Contains(errs, "corrupt.trace") {
		t.Errorf("corrupt trace: exit %d, %q", code, errs)
	}
	// The shared snapshot fixture, beside the repository (../shared): last,
	// since its absence skips the rest.
	snap := "../../shared/fixtures/resnet18_snapshot.pickle"
	if _, err := os.Stat(snap); err != nil {
		t.Skipf("no snapshot fixture: %v", err)
	}
	code, out, _ = run(t, nil, "fit", "--policy", "torch-native", snap)
	if code != 0 || !strings.Contains(out, "resnet18_snapshot: peak live") {
		t.Errorf("snapshot: exit %d, %q", code, out)
	}
}

func TestFitVerdict(t *testing.T) {
	for _, c := range []struct {
		fit, need []string
		want      string
	}{
		{[]string{"gpumem", "torch-native", "tf-bfc"}, []string{"tf-bfc-prealloc needs 17.7 GiB"}, "fits a 16 GiB GPU under gpumem, torch-native and tf-bfc; tf-bfc-prealloc needs 17.7 GiB"},
		{[]string{"gpumem"}, nil, "fits a 16 GiB GPU under gpumem"},
		{nil, []string{"gpumem needs 17 GiB", "tf-bfc needs 18 GiB"}, "fits a 16 GiB GPU under no policy; gpumem needs 17 GiB; tf-bfc needs 18 GiB"},
	} {
		if got := fitVerdict("16 GiB", c.fit, c.need); got != c.want {
			t.Errorf("fitVerdict(%v, %v) = %q, want %q", c.fit, c.need, got, c.want)
		}
	}
	if got := shortSize(17 << 30); got != "17 GiB" {
		t.Errorf("shortSize(17 GiB) = %q", got)
	}
	if got := shortSize(17<<30 + 700<<20); got != "17.69 GiB" { // 17.6836: a need, rounded up
		t.Errorf("shortSize(17.6836 GiB) = %q, want 17.69 GiB", got)
	}
}

// TestPetabyteRequest: a trace whose one request (1e15 bytes, within the
// trace format's 1 PiB) is larger than any device answers at once: the
// replay's out-of-memory on its simulated device, fit's "more than the
// largest device", and a --capacity beyond sim.MaxCapacity refused
// (each used to build allocator books for a petabyte arena: minutes and
// gigabytes of host memory).
func TestPetabyteRequest(t *testing.T) {
	code, out, errs := run(t, nil, "replay", "testdata/petabyte.trace")
	if code != ExitOK || !strings.Contains(out, "out of memory (allocator limit): requested 909.49 TiB") {
		t.Errorf("replay: exit %d, stderr %q, stdout:\n%s", code, errs, out)
	}
	code, _, errs = run(t, nil, "fit", "testdata/petabyte.trace")
	if code != ExitFail || !strings.Contains(errs, "holds 909.49 TiB live at its peak: more than the largest device fit models (4.00 TiB)") {
		t.Errorf("fit: exit %d, stderr %q", code, errs)
	}
	for _, args := range [][]string{
		{"replay", "--capacity", "1PiB", "testdata/tiny.trace"},
		{"replay", "--policy", "torch-native", "--capacity", "5TiB", "testdata/tiny.trace"},
		{"report", "--capacity", "8TiB", "-o", t.TempDir() + "/r.html", "testdata/tiny.trace"},
	} {
		code, _, errs := run(t, nil, args...)
		if code != ExitUsage || !strings.Contains(errs, "the simulated device models at most 4.00 TiB") {
			t.Errorf("%v: exit %d, stderr %q", args, code, errs)
		}
	}
	if code, _, errs := run(t, nil, "replay", "--capacity", "4TiB", "testdata/tiny.trace"); code != ExitOK {
		t.Errorf("--capacity 4TiB: exit %d, stderr %q", code, errs)
	}
}
