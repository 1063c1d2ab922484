package replay_test

import (
	"path/filepath"
	"slices"
	"testing"

	"github.com/gpumem/gpumem"
	"github.com/gpumem/gpumem/device/sim"
	"github.com/gpumem/gpumem/replay"
	"github.com/gpumem/gpumem/trace"
)

// withFreeOrder returns a copy of tr in which every run of frees with no
// allocation (and no trim) between them comes in request order, or in the
// reverse order if down: what a program that frees a list of tensors at
// once, in an order it does not choose, may do in two runs. Times stay
// where they were.
func withFreeOrder(tr *trace.Trace, down bool) *trace.Trace {
	out := *tr
	out.Events, out.Slot = slices.Clone(tr.Events), slices.Clone(tr.Slot)
	trims := map[int32]bool{}
	for _, t := range tr.Trims {
		trims[t] = true
	}
	for i := 0; i < len(out.Events); {
		j := i
		for j < len(out.Events) && out.Events[j].Kind == trace.Free && (j == i || !trims[int32(j)]) {
			j++
		}
		if j-i > 1 {
			idx := make([]int, j-i)
			for k := range idx {
				idx[k] = i + k
			}
			slices.SortFunc(idx, func(x, y int) int {
				if down {
					x, y = y, x
				}
				return int(tr.Slot[x]) - int(tr.Slot[y])
			})
			for k, from := range idx {
				out.Events[i+k] = tr.Events[from]
				out.Events[i+k].TimeUS = tr.Events[i+k].TimeUS
				out.Slot[i+k] = tr.Slot[from]
			}
		}
		i = max(j, i+1)
	}
	return &out
}

// TestFreeOrderDoesNotMatter: the same frees between two allocations, in
// opposite orders, leave the allocator making the same decisions: the same
// peak, the same driver calls, over three passes (pool.batch). Before
// the free index and the empty list kept each batch in address order,
// these three shipped traces peaked 16-66 MiB apart and 34 of the 46 real
// traces differed (docs/EXPERIMENTS.md, "The order of a batch of frees").
func TestFreeOrderDoesNotMatter(t *testing.T) {
	for _, name := range []string{"sweep_create_dispose", "gpt2_train_varlen", "bert_mlm_varlen"} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			tr, err := trace.Load(filepath.Join(traceDir, name+".trace.gz"))
			if err != nil {
				t.Fatal(err)
			}
			var res [2]replay.Result
			for k, down := range []bool{false, true} {
				perm := withFreeOrder(tr, down)
				if perm.Requests != tr.Requests || len(perm.Events) != len(tr.Events) {
					t.Fatalf("permuted trace: %d requests, %d events", perm.Requests, len(perm.Events))
				}
				if res[k], err = replay.Run(perm, sim.MustNew(sim.Config{}), gpumem.Config{}, replay.Options{Check: true, Passes: 3}); err != nil {
					t.Fatal(err)
				}
			}
			up, down := res[0], res[1]
			if up.PeakReservedBytes != down.PeakReservedBytes || up.Passes.PeakReservedBytes != down.Passes.PeakReservedBytes {
				t.Errorf("peak reserved %d / %d over three passes with each batch of frees in request order, %d / %d in reverse",
					up.PeakReservedBytes, up.Passes.PeakReservedBytes, down.PeakReservedBytes, down.Passes.PeakReservedBytes)
			}
			if up.DeviceCalls != down.DeviceCalls || up.Maps != down.Maps || up.Unmaps != down.Unmaps || up.Fences != down.Fences ||
				up.Passes.MapsLater != down.Passes.MapsLater {
				t.Errorf("driver calls %d, maps %d, unmaps %d, fences %d, later maps %d in request order; %d, %d, %d, %d, %d in reverse",
					up.DeviceCalls, up.Maps, up.Unmaps, up.Fences, up.Passes.MapsLater,
					down.DeviceCalls, down.Maps, down.Unmaps, down.Fences, down.Passes.MapsLater)
			}
			if up.PeakLiveBytes != tr.PeakLiveBytes || down.PeakLiveBytes != tr.PeakLiveBytes {
				t.Errorf("peak live %d and %d; the trace's %d", up.PeakLiveBytes, down.PeakLiveBytes, tr.PeakLiveBytes)
			}
		})
	}
}
