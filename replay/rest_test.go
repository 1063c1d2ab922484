package replay_test

import (
	"path/filepath"
	"testing"

	"github.com/gpumem/gpumem"
	"github.com/gpumem/gpumem/device/sim"
	"github.com/gpumem/gpumem/replay"
	"github.com/gpumem/gpumem/trace"
)

// TestRestHoldsFirstPass: a program that frees everything and runs again
// holds over three passes what it held over one, because its pool rests
// when it holds nothing and the next pass is placed as the first was
// (rest.go). Before the rest, these three shipped traces' later passes
// held 8-16 MiB more than their first (the drift; docs/EXPERIMENTS.md, "A
// pool that holds nothing starts over").
func TestRestHoldsFirstPass(t *testing.T) {
	for _, name := range []string{"sweep_create_dispose", "bert_mlm_varlen", "t5_train_varlen"} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			tr, err := trace.Load(filepath.Join(traceDir, name+".trace.gz"))
			if err != nil {
				t.Fatal(err)
			}
			r, err := replay.Run(tr, sim.MustNew(sim.Config{}), gpumem.Config{}, replay.Options{Check: true, Passes: 3})
			if err != nil {
				t.Fatal(err)
			}
			if r.Passes.PeakReservedBytes != r.PeakReservedBytes {
				t.Errorf("peak reserved %d MiB over three passes, %d MiB over the first", r.Passes.PeakReservedBytes>>20, r.PeakReservedBytes>>20)
			}
			if r.Passes.CreatesLater >= r.Creates/4 {
				t.Errorf("%d creates in the later passes, %d in the first: the rested spans were not reused", r.Passes.CreatesLater, r.Creates)
			}
		})
	}
}
