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
	mustFree(t, a, x)               // a free block of 1 KiB at the start
	mustFree(t, a, w)               // the heap's end is free, freed last
	if a.Reserved() != 96<<20 {
		t.Fatalf("reserved %d, want the high-water mark of 3 granules", a.Reserved())
	}
	// 512 bytes fit in both free blocks: the one freed last (the end) wins.
	if v := mustAlloc(t, a, 512, 0); v != z+2048 {
		t.Fatalf("512 bytes at %#x, want the block freed last, at %#x", v, z+2048)
	}
	mustFree(t, a, y) // merges with the block at the start: 40 MiB + 1 KiB, freed last
	if v := mustAlloc(t, a, 512, 0); v != asyncHeap {
		t.Fatalf("512 bytes at %#x, want the block freed last, at the heap's start", v)
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
	"bert_mlm_varlen/1":      1.0501,
	"bert_mlm_varlen/2":      1.0528,
	"bert_mlm_varlen/3":      1.0528,
	"gpt2_generate/1":        1.1285,
	"gpt2_generate/2":        1.1285,
	"gpt2_generate/3":        1.1285,
	"gpt2_train_varlen/1":    1.0504,
	"gpt2_train_varlen/2":    1.0504,
	"gpt2_train_varlen/3":    1.0504,
	"resnet50_train/1":       1.0847,
	"resnet50_train/2":       1.0847,
	"resnet50_train/3":       1.0847,
	"sweep_create_dispose/1": 1.0341,
	"sweep_create_dispose/2": 1.0341,
	"sweep_create_dispose/3": 1.0341,
	"t5_train_varlen/1":      1.0628,
	"t5_train_varlen/2":      1.0628,
	"t5_train_varlen/3":      1.0628,
	"kv0/1":                  1.2310,
	"kv1/1":                  1.0412,
	"kv2/1":                  1.1474,
	"kv3/1":                  1.0523,
	"kv4/1":                  1.3320,
	"rand0/1":                1.2985,
	"rand1/1":                1.2955,
	"rand2/1":                1.3048,
	"rand3/1":                1.3100,
	"rand4/1":                1.3164,
	"serve0/1":               1.0874,
	"serve1/1":               1.0436,
	"serve2/1":               1.0359,
	"serve3/1":               1.0243,
	"serve4/1":               1.0666,
	"ckpt_grad_accum/1":      1.3425,
	"clip_contrastive/1":     1.0076,
	"comm_buckets/1":         1.0369,
	"dataloader_pinned/1":    1.0965,
	"ddp_world1/1":           1.0762,
	"diffusion_unet/1":       1.0876,
	"fcn_segmentation/1":     1.0429,
	"fp16_gradscaler_bert/1": 1.0684,
	"gnn_random_graphs/1":    1.0344,
	"infer_server/1":         1.1753,
	"llama_train_varlen/1":   1.0597,
	"lora_finetune/1":        1.1087,
	"maskrcnn_train/1":       1.0337,
	"model_sweep/1":          1.0413,
	"moe_top2_train/1":       1.0625,
	"paged_kv_server/1":      1.0005,
	"prefetch_two_stream/1":  1.0835,
	"t5_beam_search/1":       1.1262,
	"vit_train/1":            1.1386,
	"whisper_train/1":        1.1215,
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
	a := mustNew(t, "cuda-async", anchorCapacity)
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
		a.(*cudaAsync).completeAll()
	}
	if err := Check(a); err != nil {
		t.Fatal(err)
	}
	return out
}
