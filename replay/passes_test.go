package replay_test

import (
	"strings"
	"testing"

	"github.com/gpumem/gpumem"
	"github.com/gpumem/gpumem/device/sim"
	"github.com/gpumem/gpumem/replay"
	"github.com/gpumem/gpumem/trace"
)

// TestPassesKeepWhatTheTraceNeverFrees: a request the trace never frees
// (a program's workspace, kept by PyTorch for the life of the process)
// stays live from the pass that allocated it, and later passes do not
// allocate it again; what the trace frees, each pass allocates anew.
func TestPassesKeepWhatTheTraceNeverFrees(t *testing.T) {
	const text = "# gpumem-trace v1\n" +
		"a 0 33554432 0 0\n" + // a workspace: never freed
		"a 1 67108864 0 1\nf 1 2\na 2 16777216 0 3\nf 2 4\n"
	tr, err := trace.Read(strings.NewReader(text), "ws.trace")
	if err != nil {
		t.Fatal(err)
	}
	a, err := gpumem.New(sim.MustNew(sim.Config{}), gpumem.Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	r, err := replay.RunOn(tr, a, replay.Options{Passes: 3, Check: true})
	if err != nil {
		t.Fatal(err)
	}
	st := a.Stats()
	if st.Allocs != 1+2*3 || st.LiveBuffers != 1 {
		t.Errorf("%d allocations, %d live after three passes; want 7 (the workspace once), 1", st.Allocs, st.LiveBuffers)
	}
	if r.Passes.PeakLiveBytes != tr.PeakLiveBytes || r.Passes.PeakLiveBytes != 96<<20 {
		t.Errorf("peak live over the passes %d, the trace's %d; want both 96 MiB", r.Passes.PeakLiveBytes, tr.PeakLiveBytes)
	}
	if r.Passes.PeakReservedBytes != r.PeakReservedBytes {
		t.Errorf("three passes peak at %d, the first at %d", r.Passes.PeakReservedBytes, r.PeakReservedBytes)
	}
}
