package main

import (
	"strings"
	"testing"

	"github.com/gpumem/gpumem/trace"
)

func load(t *testing.T, text string) *trace.Trace {
	t.Helper()
	tr, err := trace.Read(strings.NewReader("# gpumem-trace v1\n"+text), "t.trace")
	if err != nil {
		t.Fatal(err)
	}
	return tr
}

// TestModel checks best fit, coalescing and the page count on a trace
// worked out by hand (MiB = 1048576).
func TestModel(t *testing.T) {
	tr := load(t, strings.Join([]string{
		"a 0 3145728 0 0", // large [0, 3M): pages 0-1
		"a 1 1048576 0 1", // large [3M, 4M): page 1
		"a 2 4194304 0 2", // large [4M, 8M): pages 2-3
		"a 3 1000 0 3",    // small [0, 1024): small page 0
		"f 0 4",           // large [0, 3M) free: page 0 empties
		"a 4 2097152 0 5", // best fit: [0, 2M) (the only hole that holds it)
		"f 1 6",           // [2M, 4M) free after coalescing with [2M, 3M)
		"a 5 3145728 0 7", // no hole holds 3M: at the top, [8M, 11M)
		"f 2 8",           // [2M, 8M) free
		"a 6 6291456 0 9", // the hole [2M, 8M) exactly
	}, "\n")+"\n")
	r, err := model(tr)
	if err != nil {
		t.Fatal(err)
	}
	// Pages held after each event: 2, 2, 4, 5 (small), 4, 5, 4, 6, 4, 7.
	if want := uint64(7 * page); r.PeakHeld != want {
		t.Fatalf("peak held %d MiB, want %d MiB", r.PeakHeld>>20, want>>20)
	}
	if r.LiveAtPeak != 2097152+1000+3145728+6291456 {
		t.Fatalf("live at the peak %d", r.LiveAtPeak)
	}
	if r.LargeTopPeak != 11<<20 {
		t.Fatalf("large pool's top %d MiB, want 11", r.LargeTopPeak>>20)
	}
}

func TestTreap(t *testing.T) {
	var tr treap
	keys := [][2]uint64{{5, 10}, {3, 20}, {5, 5}, {9, 1}, {3, 7}}
	for _, k := range keys {
		tr.insert(k[0], k[1])
	}
	check := func(size, wantSize, wantAddr uint64, wantOK bool) {
		t.Helper()
		addr, s, ok := tr.ceil(size)
		if ok != wantOK || (ok && (s != wantSize || addr != wantAddr)) {
			t.Fatalf("ceil(%d) = %d at %d, %v; want %d at %d, %v", size, s, addr, ok, wantSize, wantAddr, wantOK)
		}
	}
	check(1, 3, 7, true)
	check(4, 5, 5, true)
	check(10, 0, 0, false)
	tr.delete(5, 5)
	check(4, 5, 10, true)
	tr.delete(3, 7)
	tr.delete(3, 20)
	check(1, 5, 10, true)
	tr.delete(5, 10)
	check(1, 9, 1, true)
	tr.delete(9, 1)
	check(1, 0, 0, false)
}
