package policy

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"testing"

	"github.com/gpumem/gpumem/trace"
)

func TestCudaAsyncModel(t *testing.T) {
	a := mustNew(t, "cuda-async", 256<<20)
	x := mustAlloc(t, a, 1000, 0)   // 1024 bytes at the heap's start: granule 0 mapped
	y := mustAlloc(t, a, 40<<20, 0) // back to back, into granules 0-1
	z := mustAlloc(t, a, 2000, 1)   // another stream, the same heap
	if x != asyncHeap || y != x+1024 || z != y+40<<20 || a.Reserved() != 64<<20 {
		t.Fatalf("addresses %#x %#x %#x, reserved %d: want back to back from %#x, two granules", x, y, z, a.Reserved(), asyncHeap)
	}
	w := mustAlloc(t, a, 30<<20, 0) // granules 1-2
	mustFree(t, a, x)               // a pending block of 1 KiB at the start
	mustFree(t, a, w)               // the heap's end is pending, freed last
	if a.Reserved() != 96<<20 {
		t.Fatalf("reserved %d, want the high-water mark of 3 granules", a.Reserved())
	}
	// 512 bytes fit in both pending blocks: the best fit wins, not the
	// one freed last.
	if v := mustAlloc(t, a, 512, 0); v != asyncHeap {
		t.Fatalf("512 bytes at %#x, want the best fit, at the heap's start", v)
	}
	// Granules 0 and 1 are mapped (live blocks at the start and in granule 1),
	// granule 2 is not: its memory is spare, still reserved.
	segs := a.Segments()
	if n := len(segs); n != 2 || segs[0].Size != 64<<20 || segs[1].Addr != spareAddr || segs[1].Size != 32<<20 {
		t.Fatalf("segments %+v, want granules 0-1 mapped and 32 MiB spare", segs)
	}
	// 96 MiB held, 160 more on the device: 224 MiB at the end needs 7 granules
	// beyond the two mapped, 9 in all (288 MiB): refused; 190 MiB fits.
	if _, err := a.Alloc(224<<20, 0); !errors.Is(err, ErrOutOfMemory) {
		t.Fatalf("224 MiB served (err %v) on a device with 160 MiB left and 32 MiB spare", err)
	}
	mustAlloc(t, a, 150<<20, 0)
	if a.Reserved() > 256<<20 {
		t.Fatalf("reserved %d on a device of 256 MiB", a.Reserved())
	}
}

// The pending and completed frees, step by step (docs/EXPERIMENTS.md,
// "cuda-async, third round").
func TestCudaAsyncPending(t *testing.T) {
	const M = 1 << 20
	h := uint64(asyncHeap)
	a := newCudaAsync(512 * M)
	al := func(n uint64, want uint64, why string) uint64 {
		t.Helper()
		v := mustAlloc(t, a, n, 0)
		if v != want {
			t.Fatalf("%d MiB at heap+%d MiB, want heap+%d MiB: %s", n/M, (v-h)/M, (want-h)/M, why)
		}
		return v
	}
	p := make([]uint64, 7)
	for i, n := range []uint64{1, 1, 4, 1, 2, 1} {
		p[i] = mustAlloc(t, a, n*M, 0)
	}
	mustFree(t, a, p[4]) // 2 MiB at heap+7
	mustFree(t, a, p[2]) // 4 MiB at heap+2, freed last
	al(M, h+7*M, "the best fit among the pending blocks, not the one freed last")
	mustFree(t, a, p[0]) // 1 MiB at heap+0; the 1 MiB left at heap+8 was stamped first
	al(M, h+8*M, "among pending blocks of one size, the one stamped first")
	// 40 MiB fits nowhere: the pool completes the pending frees (heap+0
	// and heap+2), then goes to the heap's end.
	q := al(40*M, h+10*M, "at the heap's end")
	if a.Reserved() != 64*M || len(a.pend.b) != 0 || len(a.done.b) != 2 {
		t.Fatalf("reserved %d, %d pending and %d completed blocks: want 64 MiB, the two freed completed", a.Reserved(), len(a.pend.b), len(a.done.b))
	}
	mustFree(t, a, q) // 40 MiB pending at the heap's end
	al(M, h+10*M, "a pending block before a completed one that fits exactly (heap+0)")
	mustFree(t, a, p[1]) // pending, between completed neighbours: not merged with them
	al(5*M, h+11*M, "not in the 6 MiB at heap+0 (pending and completed do not merge)")
	if len(a.pend.b) != 2 || len(a.done.b) != 2 {
		t.Fatalf("%d pending and %d completed blocks, want 2 and 2", len(a.pend.b), len(a.done.b))
	}

	// A place that needs memory from the device: the pool first completes
	// the pending frees and places anew.
	a = newCudaAsync(512 * M)
	mustAlloc(t, a, M, 0)                                                // heap+0, keeps granule 0 mapped
	c := mustAlloc(t, a, 32*M, 0)                                        // heap+1..33
	a1 := mustAlloc(t, a, 31*M, 0)                                       // heap+33..64
	x := mustAlloc(t, a, 32*M, 0)                                        // heap+64..96, granule 2
	mustAlloc(t, a, M, 0)                                                // heap+96, granule 3
	mustFree(t, a, c)                                                    // pending
	mustFree(t, a, a1)                                                   // pending, merged: heap+1..64; granule 1 spare
	al(100*M, h+97*M, "the heap's end")                                  // completes heap+1..64; granules 4-6 new: 6 mapped, none spare
	mustFree(t, a, x)                                                    // pending at heap+64 (granule 2 spare), beside the completed heap+1..64
	al(40*M, h+1*M, "the completed block: the pending one is too small") // maps granule 1: none spare
	if a.Reserved() != 192*M {
		t.Fatalf("reserved %d MiB, want 192", a.Reserved()/M)
	}
	// 16 MiB fits the pending block at heap+64, whose granule 2 has no
	// memory: the pool completes it (merged with heap+41..64) and takes
	// heap+41, in mapped granule 1.
	al(16*M, h+41*M, "completed and merged before growing")
	if a.Reserved() != 192*M {
		t.Fatalf("reserved %d MiB, want 192: nothing taken from the device", a.Reserved()/M)
	}

	// Synced: every free completes at once and merges with its neighbours.
	a = newCudaAsyncSynced(512 * M)
	for i := range p[:6] {
		p[i] = mustAlloc(t, a, M, 0)
	}
	mustFree(t, a, p[1])
	mustFree(t, a, p[3])
	mustFree(t, a, p[2]) // heap+1..4, merged
	if len(a.pend.b) != 0 || len(a.done.b) != 1 {
		t.Fatalf("synced: %d pending and %d completed blocks, want 0 and 1", len(a.pend.b), len(a.done.b))
	}
	mustFree(t, a, p[5]) // the heap's end, 1 MiB, completed
	al(M, h+M, "not the completed block at the heap's end, though it fits exactly")
	al(2*M, h+2*M, "the rest of the merged block")
	al(M, h+5*M, "the heap's end, when nothing else fits")
}

// passes replays tr n times in a row on one allocator, freeing what each
// pass left live before the next, as the peer harness's --passes does, and
// returns the first pass's peak and the peak over all passes.
func passes(t *testing.T, tr *trace.Trace, name string, n int) (first, all uint64) {
	t.Helper()
	a := mustNew(t, name, anchorCapacity)
	addrs := make([]uint64, tr.Requests)
	for p := 0; p < n; p++ {
		for i := range tr.Events {
			ev, slot := &tr.Events[i], tr.Slot[i]
			if ev.Kind == trace.Alloc {
				addr, err := a.Alloc(ev.Size, ev.Stream)
				if err != nil {
					t.Fatalf("%s pass %d event %d: %v", tr.Name, p, i, err)
				}
				addrs[slot] = addr
				all = max(all, a.Reserved())
			} else if addrs[slot] != 0 {
				if err := a.Free(addrs[slot]); err != nil {
					t.Fatalf("%s pass %d event %d: %v", tr.Name, p, i, err)
				}
				addrs[slot] = 0
			}
		}
		if p == 0 {
			first = all
		}
		for s := len(addrs) - 1; s >= 0; s-- {
			if addrs[s] != 0 {
				if err := a.Free(addrs[s]); err != nil {
					t.Fatalf("%s after pass %d: %v", tr.Name, p, err)
				}
				addrs[s] = 0
			}
		}
	}
	if err := Check(a); err != nil {
		t.Fatal(err)
	}
	return first, all
}

// asyncModel is what cuda-async reaches on each figure of the probe
// (bench/results/h100-async-probe-2183765/probe.jsonl: the real pool's
// peak reserved over the trace's peak live bytes, per trace and pass): the
// test holds the model to it (a change shows) and logs the distance to the
// pool. Shipped traces: passes 1-3; kv, serve, rand (GPUMEM_SYNTH_DIR) and
// the corpus: pass 1. Tuned on the shipped and synthetic traces; the
// corpus is a check.
var asyncModel = map[string]float64{
	"bert_mlm_varlen/1":      1.0666,
	"bert_mlm_varlen/2":      1.0694,
	"bert_mlm_varlen/3":      1.0694,
	"gpt2_generate/1":        1.2343,
	"gpt2_generate/2":        1.2343,
	"gpt2_generate/3":        1.2343,
	"gpt2_train_varlen/1":    1.0504,
	"gpt2_train_varlen/2":    1.0504,
	"gpt2_train_varlen/3":    1.0504,
	"resnet50_train/1":       1.2995,
	"resnet50_train/2":       1.2995,
	"resnet50_train/3":       1.2995,
	"sweep_create_dispose/1": 1.0279,
	"sweep_create_dispose/2": 1.0279,
	"sweep_create_dispose/3": 1.0279,
	"t5_train_varlen/1":      1.1027,
	"t5_train_varlen/2":      1.2688,
	"t5_train_varlen/3":      1.2688,
	"kv0/1":                  1.1490,
	"kv1/1":                  1.0907,
	"kv2/1":                  1.0485,
	"kv3/1":                  1.1400,
	"kv4/1":                  1.2295,
	"rand0/1":                1.3356,
	"rand1/1":                1.3359,
	"rand2/1":                1.3149,
	"rand3/1":                1.3505,
	"rand4/1":                1.3366,
	"serve0/1":               1.1293,
	"serve1/1":               1.0883,
	"serve2/1":               1.0934,
	"serve3/1":               1.0534,
	"serve4/1":               1.1258,
	"ckpt_grad_accum/1":      1.2440,
	"clip_contrastive/1":     1.0162,
	"comm_buckets/1":         1.0497,
	"dataloader_pinned/1":    1.0655,
	"ddp_world1/1":           1.0762,
	"diffusion_unet/1":       1.1278,
	"fcn_segmentation/1":     1.0670,
	"fp16_gradscaler_bert/1": 1.1430,
	"gnn_random_graphs/1":    1.0296,
	"infer_server/1":         1.2089,
	"llama_train_varlen/1":   1.0633,
	"lora_finetune/1":        1.0628,
	"maskrcnn_train/1":       1.0322,
	"model_sweep/1":          1.0796,
	"moe_top2_train/1":       1.0647,
	"paged_kv_server/1":      1.0005,
	"prefetch_two_stream/1":  1.0507,
	"t5_beam_search/1":       1.2527,
	"vit_train/1":            1.2209,
	"whisper_train/1":        1.2051,
}

func TestCudaAsyncProbeFigures(t *testing.T) {
	if testing.Short() {
		t.Skip("replays the shipped and corpus traces")
	}
	f, err := os.Open("../bench/results/h100-async-probe-2183765/probe.jsonl")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	type row struct {
		Trace    string  `json:"trace"`
		Pass     int     `json:"pass"`
		PeakLive uint64  `json:"peak_live_bytes"`
		Ratio    float64 `json:"ratio"`
	}
	real := map[string]row{}
	var order []string
	dec := json.NewDecoder(f)
	for dec.More() {
		var r row
		if err := dec.Decode(&r); err != nil {
			t.Fatal(err)
		}
		k := fmt.Sprintf("%s/%d", r.Trace, r.Pass+1)
		real[k] = r
		order = append(order, k)
	}
	dirs := []string{"../testdata/traces", "../bench/corpus/traces", os.Getenv("GPUMEM_SYNTH_DIR")}
	peaks := map[string][]uint64{}
	within, n := 0, 0
	for _, k := range order {
		r := real[k]
		if _, done := peaks[r.Trace]; !done {
			var tr *trace.Trace
			for _, d := range dirs {
				if d == "" {
					continue
				}
				if x, err := trace.Load(filepath.Join(d, r.Trace+".trace.gz")); err == nil {
					tr = x
					break
				}
			}
			if tr == nil {
				t.Logf("%s: trace not found (synthetic: set GPUMEM_SYNTH_DIR)", r.Trace)
				peaks[r.Trace] = nil
				continue
			}
			if tr.PeakLiveBytes != r.PeakLive {
				t.Errorf("%s: peak live %d, the probed trace's %d: not the trace the H100 ran", r.Trace, tr.PeakLiveBytes, r.PeakLive)
			}
			passes := 1
			for real[fmt.Sprintf("%s/%d", r.Trace, passes+1)].Trace != "" {
				passes++
			}
			peaks[r.Trace] = passPeaks(t, tr, passes)
		}
		pk := peaks[r.Trace]
		if pk == nil {
			continue
		}
		got := float64(pk[r.Pass]) / float64(r.PeakLive)
		diff := got/r.Ratio - 1
		n++
		if math.Abs(diff) <= 0.02 {
			within++
		}
		t.Logf("%-24s cuda-async %.4f, the pool %.4f (%+.1f%%)", k, got, r.Ratio, 100*diff)
		if m, ok := asyncModel[k]; !ok || math.Abs(got-m) > 0.00005 {
			t.Errorf("%s: cuda-async %.4f, recorded %.4f (found %v): update asyncModel and the docs", k, got, m, ok)
		}
	}
	t.Logf("%d of %d figures within 2%% of the pool", within, n)
}

// passPeaks replays tr n times in a row on one cuda-async allocator,
// freeing what each pass left live before the next, as async_probe.py
// does, and returns the peak reserved of each pass.
func passPeaks(t *testing.T, tr *trace.Trace, n int) []uint64 {
	t.Helper()
	return passPeaksOn(t, newCudaAsync(anchorCapacity), tr, n)
}

// passPeaksOn is passPeaks on the allocator a.
func passPeaksOn(t *testing.T, a *cudaAsync, tr *trace.Trace, n int) []uint64 {
	t.Helper()
	addrs := make([]uint64, tr.Requests)
	var out []uint64
	for p := 0; p < n; p++ {
		for i := range tr.Events {
			ev, slot := &tr.Events[i], tr.Slot[i]
			if ev.Kind == trace.Alloc {
				if ev.Size == 0 {
					continue // async_probe.py skips them
				}
				addr, err := a.Alloc(ev.Size, ev.Stream)
				if err != nil {
					t.Fatalf("%s pass %d event %d: %v", tr.Name, p, i, err)
				}
				addrs[slot] = addr
			} else if addrs[slot] != 0 {
				if err := a.Free(addrs[slot]); err != nil {
					t.Fatalf("%s pass %d event %d: %v", tr.Name, p, i, err)
				}
				addrs[slot] = 0
			}
		}
		out = append(out, a.Reserved())
		for s := range addrs {
			if addrs[s] != 0 {
				if err := a.Free(addrs[s]); err != nil {
					t.Fatalf("%s after pass %d: %v", tr.Name, p, err)
				}
				addrs[s] = 0
			}
		}
		// async_probe.py synchronizes the context after each pass: every
		// free completes.
		a.completeAll()
	}
	if err := Check(a); err != nil {
		t.Fatal(err)
	}
	return out
}

// asyncSyncedModel is what cuda-async with every free completed at once
// reaches on the probe's --after-free sync figures
// (bench/results/h100-async-probe-afterfree-7dd957e/probe.jsonl).
var asyncSyncedModel = map[string]float64{
	"bert_mlm_varlen":      1.0143,
	"gpt2_generate":        1.0580,
	"gpt2_train_varlen":    1.0145,
	"resnet50_train":       1.0202,
	"sweep_create_dispose": 1.0155,
	"t5_train_varlen":      1.0230,
}

// TestCudaAsyncSyncedFigures replays the shipped traces on the synced pool
// (newCudaAsyncSynced: a synchronize after every free, no free pending)
// against the real pool with a cuCtxSynchronize after every free.
func TestCudaAsyncSyncedFigures(t *testing.T) {
	f, err := os.Open("../bench/results/h100-async-probe-afterfree-7dd957e/probe.jsonl")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	dec := json.NewDecoder(f)
	within, n := 0, 0
	for dec.More() {
		var r struct {
			Trace     string  `json:"trace"`
			PeakLive  uint64  `json:"peak_live_bytes"`
			Ratio     float64 `json:"ratio"`
			AfterFree string  `json:"after_free"`
		}
		if err := dec.Decode(&r); err != nil {
			t.Fatal(err)
		}
		if r.AfterFree != "sync" {
			continue
		}
		tr, err := trace.Load(filepath.Join("../testdata/traces", r.Trace+".trace.gz"))
		if err != nil {
			t.Fatal(err)
		}
		if tr.PeakLiveBytes != r.PeakLive {
			t.Errorf("%s: peak live %d, the probed trace's %d", r.Trace, tr.PeakLiveBytes, r.PeakLive)
		}
		got := float64(passPeaksOn(t, newCudaAsyncSynced(anchorCapacity), tr, 1)[0]) / float64(r.PeakLive)
		diff := got/r.Ratio - 1
		n++
		if math.Abs(diff) <= 0.02 {
			within++
		}
		t.Logf("%-24s cuda-async synced %.4f, the pool synced %.4f (%+.1f%%)", r.Trace, got, r.Ratio, 100*diff)
		if math.Abs(diff) > 0.02 {
			t.Errorf("%s: cuda-async synced %.4f, more than 2%% from the pool's %.4f", r.Trace, got, r.Ratio)
		}
		if m, ok := asyncSyncedModel[r.Trace]; !ok || math.Abs(got-m) > 0.00005 {
			t.Errorf("%s: cuda-async synced %.4f, recorded %.4f (found %v): update asyncSyncedModel and the docs", r.Trace, got, m, ok)
		}
	}
	if n != 6 {
		t.Errorf("%d synced figures in the probe's record, want the six shipped traces", n)
	}
	t.Logf("%d of %d synced figures within 2%% of the pool", within, n)
}
