package cli

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/gpumem/gpumem/policy"
)

func TestReplayPolicyAllGolden(t *testing.T) {
	code, out, errs := run(t, nil, append([]string{"replay", "--policy", "all", "--check"}, tinyTraces...)...)
	if code != 0 || errs != "" {
		t.Fatalf("exit %d, stderr %q", code, errs)
	}
	lines := strings.Split(strings.TrimSuffix(out, "\n"), "\n")
	if want := 1 + len(tinyTraces)*len(policy.Names()); len(lines) != want {
		t.Fatalf("want %d lines (a header, a row per trace and policy), got\n%s", want, out)
	}
	golden(t, "replay_policy_all.golden", out)
}

func TestReplayPolicyJSON(t *testing.T) {
	code, out, errs := run(t, nil, "replay", "--policy", "torch-native", "--json", "--capacity", "1GiB", "testdata/tiny.trace")
	if code != 0 || errs != "" {
		t.Fatalf("exit %d, stderr %q", code, errs)
	}
	var r policy.Result
	if err := json.Unmarshal([]byte(out), &r); err != nil {
		t.Fatal(err)
	}
	// Worked out by hand from tiny.trace under PyTorch's rules: 1 MiB takes
	// a 2 MiB small segment; 4 MiB a 20 MiB segment (under 10 MiB), whose
	// rest serves 3000000 B and, once that is freed and merged, 10 MiB: 22
	// MiB from event 1 on, against 14 MiB live at the peak.
	if r.Policy != "torch-native" || r.Trace != "tiny" || r.Capacity != 1<<30 || r.PeakLiveBytes != 14<<20 ||
		r.PeakReservedBytes != 22<<20 || r.PeakEvent != 1 || r.OOMs != 0 {
		t.Errorf("got %+v", r)
	}
	for _, k := range []string{`"policy"`, `"trace"`, `"capacity"`, `"events"`, `"peak_live_bytes"`, `"peak_reserved_bytes"`, `"ratio"`, `"ooms"`, `"end_reserved_bytes"`, `"peak_event"`} {
		if !strings.Contains(out, k) {
			t.Errorf("no key %s: %s", k, out)
		}
	}
}

// TestReplayPolicyPasses: --passes with --policy adds the address
// repetition, and the table names the columns. fragments.trace never
// frees five of its requests, which stay live from the first pass (as a
// program's workspaces do when it runs again in one process): the six
// others are compared in passes 2 and 3; tf-bfc places two of them in
// pass 2 where pass 1 did (the five kept ones now live from its start),
// and all six of pass 3 where pass 2 did.
func TestReplayPolicyPasses(t *testing.T) {
	code, out, errs := run(t, nil, "replay", "--policy", "tf-bfc", "--passes", "3", "--json", "testdata/fragments.trace")
	if code != ExitOK || errs != "" {
		t.Fatalf("exit %d, stderr %q", code, errs)
	}
	if !strings.Contains(out, `"passes":{"n":3,"compared":12,"same":8,`) {
		t.Errorf("tf-bfc over 3 passes: %s", out)
	}
	code, out, errs = run(t, nil, "replay", "--policy", "all", "--passes", "2", "testdata/fragments.trace")
	if code != ExitOK || errs != "" || !strings.Contains(out, "same address (later passes)") || strings.Count(out, "fragments") != len(policy.Names()) {
		t.Errorf("all policies over 2 passes: exit %d, stderr %q, out:\n%s", code, errs, out)
	}
	code, out, _ = run(t, nil, "replay", "--policy", "tf-bfc", "--json", "testdata/fragments.trace")
	if code != ExitOK || strings.Contains(out, `"passes"`) {
		t.Errorf("one pass: exit %d, want no passes key: %s", code, out)
	}
}

func TestReplayPolicyErrors(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--policy", "jemalloc"}, `invalid value "jemalloc" for flag --policy: want gpumem, `},
		{[]string{"--policy", "torch-native", "--mode", "plain"}, "--mode configures gpumem or the GPU"},
		{[]string{"--policy", "all", "--device", "cuda"}, "--device configures gpumem or the GPU"},
		{[]string{"--policy", "all", "--capacity", "0"}, "invalid value 0 for flag --capacity"},
		{[]string{"--policy", "tf-bfc", "--passes", "0"}, "invalid value 0 for flag --passes: want 1 or more"},
	} {
		code, _, errs := run(t, nil, append(append([]string{"replay"}, tc.args...), "testdata/tiny.trace")...)
		if code != ExitUsage || !strings.Contains(errs, tc.want) {
			t.Errorf("%v: exit %d, stderr %q; want %d and %q", tc.args, code, errs, ExitUsage, tc.want)
		}
	}
	code, _, errs := run(t, nil, "replay", "--policy", "torch-native", "testdata/corrupt.trace")
	if code != ExitFail || !strings.Contains(errs, "corrupt.trace") {
		t.Errorf("a corrupt trace: exit %d, stderr %q", code, errs)
	}
}
