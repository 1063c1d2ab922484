package gpumem_test

import (
	"path/filepath"
	"slices"
	"testing"

	"github.com/gpumem/gpumem"
	"github.com/gpumem/gpumem/device/sim"
	"github.com/gpumem/gpumem/internal/longtest"
	"github.com/gpumem/gpumem/replay"
	"github.com/gpumem/gpumem/trace"
)

// TestFindBackedAgreesOnTraces replays the shipped traces and tune programs
// of the corpus, ten passes each, comparing every answer of the search for
// backed memory (findReady with its ready cache) with the one-scan search
// (findFewest): the allocator panics on the first difference, so every
// decision (address, maps, creates, releases) is the scan's. It also checks
// that the cache did work: on the programs whose later passes search
// partly backed holes, most candidates are answered without a placement
// search.
func TestFindBackedAgreesOnTraces(t *testing.T) {
	longtest.Skip(t, "every placement search against the full scan, over the shipped traces")
	shipped, err := filepath.Glob("testdata/traces/*.trace.gz")
	if err != nil || len(shipped) == 0 {
		t.Fatalf("no shipped traces: %v", err)
	}
	paths := slices.Clone(shipped)
	// Tune programs only (bench/corpus/MANIFEST.md): the holdout is not
	// for tests.
	for _, n := range []string{"ckpt_grad_accum", "diffusion_unet", "gnn_random_graphs", "llama_train_varlen", "prefetch_two_stream", "comm_buckets"} {
		paths = append(paths, "bench/corpus/traces/"+n+".trace.gz")
	}
	passes := 10
	if testing.Short() {
		passes = 3
	}
	for _, path := range paths {
		tr, err := trace.Load(path)
		if err != nil {
			t.Fatal(err)
		}
		t.Run(tr.Name, func(t *testing.T) {
			if testing.Short() && len(tr.Events) > 200000 {
				t.Skip("long trace in -short mode")
			}
			dev := sim.MustNew(sim.Config{})
			// RunOn uses the trace's stream numbers (CUDA's handles in a
			// recorded trace): renumber them as the device's new streams.
			ids := map[uint64]uint64{0: 0}
			for i, s := range tr.Streams {
				if s != 0 {
					ds, err := dev.NewStream()
					if err != nil {
						t.Fatal(err)
					}
					ids[s] = uint64(ds)
				}
				tr.Streams[i] = ids[s]
			}
			for i := range tr.Events {
				tr.Events[i].Stream = ids[tr.Events[i].Stream]
			}
			a, err := gpumem.New(dev, gpumem.Config{})
			if err != nil {
				t.Fatal(err)
			}
			gpumem.CheckSearch(a)
			if _, err := replay.RunOn(tr, a, replay.Options{Passes: passes, Check: true}); err != nil {
				t.Fatal(err)
			}
			finds, fewest, placements, cached := gpumem.SearchCounts(a)
			t.Logf("%d searches (%d with no ready place), %d placement searches, %d candidates answered by the cache",
				finds, fewest, placements, cached)
			if tr.Name == "ckpt_grad_accum" && (finds == 0 || cached < placements) {
				t.Errorf("the ready cache answered %d candidates and placement %d in %d searches: expected most answered by the cache", cached, placements, finds)
			}
			_ = a.Close()
		})
	}
}

// TestReadyCacheChecked replays two programs whose searches use the ready
// cache, three passes each, with the whole-structure checker after every
// operation: it verifies each cached claim (block.nzFrom) against a fresh
// placement search, besides comparing every search with the one scan. The
// device is sized to the program (the checker walks every chunk of the
// arena, twice the device, after every operation).
func TestReadyCacheChecked(t *testing.T) {
	longtest.Skip(t, "the ready cache against fresh searches, three passes of two traces, under the checker")
	if testing.Short() {
		t.Skip("the checker after every operation of three passes: seconds per trace")
	}
	for _, path := range []string{"testdata/traces/sweep_create_dispose.trace.gz", "bench/corpus/traces/gnn_random_graphs.trace.gz"} {
		tr, err := trace.Load(path)
		if err != nil {
			t.Fatal(err)
		}
		t.Run(tr.Name, func(t *testing.T) {
			const gib = 1 << 30
			dev := sim.MustNew(sim.Config{Capacity: (tr.PeakLiveBytes*5/4 + gib - 1) / gib * gib})
			a, err := gpumem.New(dev, gpumem.Config{CheckInvariants: true})
			if err != nil {
				t.Fatal(err)
			}
			defer a.Close()
			res, err := replay.RunOn(tr, a, replay.Options{Passes: 3, Check: true})
			if err != nil {
				t.Fatal(err)
			}
			finds, fewest, placements, cached := gpumem.SearchCounts(a)
			t.Logf("%d OOMs; %d searches (%d with no ready place), %d placement searches, %d candidates answered by the cache",
				res.OOMs, finds, fewest, placements, cached)
			if cached == 0 {
				t.Errorf("the ready cache answered no candidate in %d searches: the checker verified no claim", finds)
			}
		})
	}
}
