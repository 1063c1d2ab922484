package policy

import (
	"slices"
	"testing"
)

func TestTFBFCRegionsDouble(t *testing.T) {
	a := mustNew(t, "tf-bfc", 1<<30)
	mustAlloc(t, a, 1<<20, 0) // a 2 MiB region
	mustAlloc(t, a, 1<<20, 0) // the rest of it (1 MiB, not split: less than twice)
	mustAlloc(t, a, 1<<20, 0) // a 4 MiB region
	mustAlloc(t, a, 5<<20, 0) // does not fit the 3 MiB left: an 8 MiB region
	// 40 MiB: the next region (16 MiB) doubles to 64 MiB first, and the
	// one after stays 64 MiB.
	mustAlloc(t, a, 40<<20, 0)
	mustAlloc(t, a, 70<<20, 0) // the 64 MiB region's free 24 MiB is too small: 128 MiB
	if got, want := segSizes(a), []uint64{2 << 20, 4 << 20, 8 << 20, 64 << 20, 128 << 20}; !slices.Equal(got, want) {
		t.Fatalf("regions %v, want %v", got, want)
	}
}

func TestTFBFCSplitRule(t *testing.T) {
	a := mustNew(t, "tf-bfc", 1<<30)
	x := mustAlloc(t, a, 1000, 0) // rounds to 1024 B; the 2 MiB region splits
	seg := a.Segments()[0]
	if seg.Blocks[0].Size != 1024 || len(seg.Blocks) != 2 {
		t.Fatalf("blocks %+v, want 1024 B and the rest", seg.Blocks)
	}
	mustFree(t, a, x) // coalesces back into one chunk
	if n := len(a.Segments()[0].Blocks); n != 1 {
		t.Fatalf("%d blocks after the free, want 1", n)
	}
	// 1.5 MiB from the free 2 MiB chunk: less than twice, so no split,
	// and 0.5 MiB is wasted.
	mustAlloc(t, a, 3<<19, 0)
	if b := a.Segments()[0].Blocks; len(b) != 1 || b[0].Size != 2<<20 || b[0].Requested != 3<<19 {
		t.Fatalf("blocks %+v, want one 2 MiB chunk serving 1.5 MiB", b)
	}
	// A chunk more than 128 MiB larger than the request is split even
	// when less than twice the request.
	c := mustNew(t, "tf-bfc", 4<<30)
	y := mustAlloc(t, c, 1<<30, 0) // a 1 GiB region
	mustFree(t, c, y)
	mustAlloc(t, c, 800<<20, 0)
	if b := c.Segments()[0].Blocks; len(b) != 2 || b[1].Size != 224<<20 {
		t.Fatalf("blocks %+v, want 800 MiB and 224 MiB", b)
	}
}

func TestTFBFCLimits(t *testing.T) {
	// Growth: the last region is cut to what the device has left.
	a := mustNew(t, "tf-bfc", 100<<20)
	mustAlloc(t, a, 60<<20, 0) // a 64 MiB region
	mustAlloc(t, a, 30<<20, 0) // 36 MiB left of the device: a 36 MiB region, not 128
	if got := segSizes(a); !slices.Equal(got, []uint64{64 << 20, 36 << 20}) {
		t.Fatalf("regions %v, want 64 MiB and 36 MiB", got)
	}
	if _, err := a.Alloc(5<<20, 0); err == nil {
		t.Fatal("a request beyond the device fit")
	}
	// Preallocated: 75% taken at once, nothing more ever.
	p := mustNew(t, "tf-bfc-prealloc", 100<<20)
	if p.Reserved() != 75<<20 {
		t.Fatalf("reserved %d at start, want 75 MiB", p.Reserved())
	}
	mustAlloc(t, p, 70<<20, 0)
	if _, err := p.Alloc(10<<20, 0); err == nil {
		t.Fatal("the preallocated pool grew past 75% of the device")
	}
	if err := checkAll(p); err != nil {
		t.Fatal(err)
	}
}
