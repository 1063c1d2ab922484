package main

import (
	"strings"
	"testing"

	"github.com/gpumem/gpumem/trace"
)

func TestMeasure(t *testing.T) {
	// 64 MiB, 300 MiB and 1 KiB requests; the 300 MiB one is freed and
	// asked for again, so it counts twice.
	text := "# gpumem-trace v1\na 1 67108864 0 0\na 2 314572800 0 1\nf 2 2\na 3 314572800 0 3\na 4 1024 0 4\n"
	tr, err := trace.Read(strings.NewReader(text), "t.trace")
	if err != nil {
		t.Fatal(err)
	}
	s := measure(tr)
	total := uint64(64<<20 + 2*300<<20 + 1024)
	if s.total != total || s.requests != 4 {
		t.Fatalf("total %d requests %d, want %d and 4", s.total, s.requests, total)
	}
	wantN := []int{3, 2, 2, 0}
	wantB := []uint64{64<<20 + 600<<20, 600 << 20, 600 << 20, 0}
	for i := range thresholds {
		if s.n[i] != wantN[i] || s.bytes[i] != wantB[i] {
			t.Errorf("threshold %d MiB: %d requests, %d bytes; want %d, %d", thresholds[i]>>20, s.n[i], s.bytes[i], wantN[i], wantB[i])
		}
	}
	var b strings.Builder
	s.print(&b)
	if got := b.String(); !strings.Contains(got, "| t | 364 | 4 | 3, 100% | 2, 90% |") {
		t.Errorf("row %q", got)
	}
}
