package policy

import (
	"slices"
	"testing"
)

func TestCudaAsyncModel(t *testing.T) {
	a := mustNew(t, "cuda-async", 256<<20)
	x := mustAlloc(t, a, 1000, 0)   // a 32 MiB piece, split
	y := mustAlloc(t, a, 40<<20, 0) // more than a piece: 40 MiB (2 MiB multiple)
	mustAlloc(t, a, 1000, 1)        // another stream: a piece of its own
	if got := segSizes(a); !slices.Equal(got, []uint64{32 << 20, 40 << 20, 32 << 20}) {
		t.Fatalf("pieces %v, want 32, 40 and 32 MiB", got)
	}
	mustFree(t, a, x)
	mustFree(t, a, y)
	// Full: the wholly free pieces of stream 0 go back for a 200 MiB request.
	mustAlloc(t, a, 200<<20, 1)
	if got := segSizes(a); !slices.Equal(got, []uint64{32 << 20, 200 << 20}) {
		t.Fatalf("pieces %v, want stream 0's given back", got)
	}
}
