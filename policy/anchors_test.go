package policy

import (
	"bufio"
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"sync"
	"testing"

	"github.com/gpumem/gpumem/trace"
)

// anchors are the ratios (peak held from the driver / peak live bytes) the
// real allocators reached on an H100 on the shipped traces, from
// ../shared/ANCHORS.md (the peers' side-by-side run, 2026-11): torch-native,
// torch-expandable, torch-async (the anchor of cuda-async) and jax-bfc (the
// anchor of tf-bfc, XLA's BFC in growth mode). gpt2_generate has no jax-bfc
// figure; tf-bfc-prealloc and gpumem have no anchor.
var anchors = map[string]map[string]float64{
	"gpt2_train_varlen":    {"torch-native": 1.539, "torch-expandable": 1.074, "cuda-async": 1.053, "tf-bfc": 1.464},
	"bert_mlm_varlen":      {"torch-native": 1.293, "torch-expandable": 1.096, "cuda-async": 1.067, "tf-bfc": 1.577},
	"t5_train_varlen":      {"torch-native": 1.199, "torch-expandable": 1.053, "cuda-async": 1.103, "tf-bfc": 1.740},
	"resnet50_train":       {"torch-native": 1.193, "torch-expandable": 1.019, "cuda-async": 1.278, "tf-bfc": 1.382},
	"gpt2_generate":        {"torch-native": 1.323, "torch-expandable": 1.071, "cuda-async": 1.234},
	"sweep_create_dispose": {"torch-native": 1.082, "torch-expandable": 1.028, "cuda-async": 1.028, "tf-bfc": 1.596},
}

// misses are the rows the emulation does not bring within 2% of its anchor,
// with the ratio it reaches, which the test holds it to (a change shows).
//
// tf-bfc: ANCHORS.md's jax-bfc column is not what this repository's own
// H100 runs of the same harness measured (bench/results/h100_peers.jsonl,
// h100-9b3cea7, h100-ed1c7b6: JAX 0.11.2, peak_pool_bytes, three runs,
// identical): 1.3151, 1.4113, 1.701, 1.374, 2.2592 and 1.6071 where
// ANCHORS.md has 1.464, 1.577, 1.740, 1.382, none and 1.596. The torch
// columns of those runs are ANCHORS.md's to the third decimal. tf-bfc is
// within 0.1% of the measured runs on all six traces (TestHarnessBFC), so
// the emulation stands and the three rows below record how far the
// anchor table is from it; no constant per trace stands in for the gap.
//
// cuda-async is within 2% of its anchor on all six (pending and completed
// frees, docs/EXPERIMENTS.md "cuda-async, third round"): no misses.
var misses = map[string]float64{
	"gpt2_train_varlen/tf-bfc": 1.315,
	"bert_mlm_varlen/tf-bfc":   1.411,
	"t5_train_varlen/tf-bfc":   1.701,
}

// anchorCapacity is the H100's memory, on which the anchors were measured.
const anchorCapacity = 80 << 30

var traceCache struct {
	sync.Mutex
	m map[string]*trace.Trace
}

// shipped loads the shipped traces once per test binary.
func shipped(t testing.TB) []*trace.Trace {
	t.Helper()
	traceCache.Lock()
	defer traceCache.Unlock()
	paths, err := filepath.Glob("../testdata/traces/*.trace.gz")
	if err != nil || len(paths) != 6 {
		t.Fatalf("want the 6 shipped traces in testdata/traces, found %d (%v)", len(paths), err)
	}
	if traceCache.m == nil {
		traceCache.m = make(map[string]*trace.Trace)
	}
	var out []*trace.Trace
	for _, p := range paths {
		tr := traceCache.m[p]
		if tr == nil {
			tr, err = trace.Load(p)
			if err != nil {
				t.Fatal(err)
			}
			traceCache.m[p] = tr
		}
		out = append(out, tr)
	}
	return out
}

// TestAnchors replays every shipped trace under every policy on an 80 GiB
// device, checks the invariants at the end, and holds each emulation to
// within 2% of its real allocator's ratio where ANCHORS.md has one.
func TestAnchors(t *testing.T) {
	if testing.Short() {
		t.Skip("replays every shipped trace under every policy")
	}
	for _, tr := range shipped(t) {
		want, ok := anchors[tr.Name]
		if !ok {
			t.Fatalf("trace %s has no row in the anchor table", tr.Name)
		}
		for _, name := range Names() {
			r, err := Run(tr, name, anchorCapacity, true, Options{})
			if err != nil {
				t.Errorf("%s under %s: %v", tr.Name, name, err)
				continue
			}
			if r.OOMs != 0 {
				t.Errorf("%s under %s: %d OOMs on 80 GiB", tr.Name, name, r.OOMs)
			}
			a, ok := want[name]
			if !ok {
				t.Logf("%-22s %-17s ratio %.3f (no anchor)", tr.Name, name, r.Ratio)
				continue
			}
			diff := r.Ratio/a - 1
			t.Logf("%-22s %-17s ratio %.3f anchor %.3f (%+.1f%%)", tr.Name, name, r.Ratio, a, 100*diff)
			if m, ok := misses[tr.Name+"/"+name]; ok {
				if math.Abs(r.Ratio-m) > 0.0005 {
					t.Errorf("%s under %s: ratio %.3f, the recorded miss was %.3f (anchor %.3f): update misses and the docs", tr.Name, name, r.Ratio, m, a)
				}
				continue
			}
			if math.Abs(diff) > 0.02 {
				t.Errorf("%s under %s: ratio %.3f, the real allocator's %.3f: %+.1f%%, beyond 2%%", tr.Name, name, r.Ratio, a, 100*diff)
			}
		}
	}
}

// TestHarnessBFC holds tf-bfc to within 2% of XLA's BFC as this
// repository's peer harness measured it on the H100
// (bench/results/h100_peers.jsonl, jax-bfc: memory_stats()'s
// peak_pool_bytes over the trace's peak live bytes), and checks that the
// file's torch rows are ANCHORS.md's, so that the anchor table and the
// measured runs differ in the jax-bfc column only.
func TestHarnessBFC(t *testing.T) {
	if testing.Short() {
		t.Skip("replays every shipped trace")
	}
	f, err := os.Open("../bench/results/h100_peers.jsonl")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	measured := map[string]float64{} // trace/peer -> ratio
	sc := bufio.NewScanner(f)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		var row struct {
			Peer, Trace string
			Ratio       float64
		}
		if json.Unmarshal(sc.Bytes(), &row) == nil && row.Ratio > 0 {
			measured[row.Trace+"/"+row.Peer] = row.Ratio
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	peerOf := map[string]string{"torch-native": "torch-native", "torch-expandable": "torch-expandable", "cuda-async": "torch-async"}
	for _, tr := range shipped(t) {
		for policy, peer := range peerOf {
			got, ok := measured[tr.Name+"/"+peer]
			if want := anchors[tr.Name][policy]; !ok || math.Abs(got-want) > 0.0006 {
				t.Errorf("%s %s: the harness measured %.4f (found %v), ANCHORS.md has %.3f", tr.Name, peer, got, ok, want)
			}
		}
		want, ok := measured[tr.Name+"/jax-bfc"]
		if !ok {
			t.Errorf("%s: no jax-bfc row in the harness results", tr.Name)
			continue
		}
		r, err := Run(tr, "tf-bfc", anchorCapacity, false, Options{})
		if err != nil {
			t.Fatal(err)
		}
		diff := r.Ratio/want - 1
		t.Logf("%-22s tf-bfc %.4f, jax-bfc measured %.4f (%+.2f%%)", tr.Name, r.Ratio, want, 100*diff)
		if math.Abs(diff) > 0.02 {
			t.Errorf("%s: tf-bfc %.4f, XLA's BFC measured %.4f: %+.1f%%, beyond 2%%", tr.Name, r.Ratio, want, 100*diff)
		}
	}
}
