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
	for _, want := range []string{"tiny: peak live 14.00 MiB", "fits a 20.00 MiB GPU under gpumem", "torch-native needs 22.00 MiB"} {
		if !strings.Contains(out, want) {
			t.Errorf("no %q in\n%s", want, out)
		}
	}
	if !strings.Contains(out, "torch-native      22.00 MiB") {
		t.Errorf("torch-native's row is not 22 MiB:\n%s", out)
	}
	// The shared snapshot fixture, beside the repository (../shared).
	snap := "../../shared/fixtures/resnet18_snapshot.pickle"
	if _, err := os.Stat(snap); err != nil {
		t.Skipf("no snapshot fixture: %v", err)
	}
	code, out, _ = run(t, nil, "fit", "--policy", "torch-native", snap)
	if code != 0 || !strings.Contains(out, "resnet18_snapshot: peak live") {
		t.Errorf("snapshot: exit %d, %q", code, out)
	}
	if code, _, errs := run(t, nil, "fit", "--policy", "nope", "testdata/tiny.trace"); code != ExitUsage || !strings.Contains(errs, `invalid value "nope"`) {
		t.Errorf("bad policy: exit %d, %q", code, errs)
	}
	if code, _, errs := run(t, nil, "fit", "testdata/corrupt.trace"); code != ExitFail || !strings.Contains(errs, "corrupt.trace") {
		t.Errorf("corrupt trace: exit %d, %q", code, errs)
	}
}
