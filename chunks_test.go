package gpumem_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/gpumem/gpumem"
	"github.com/gpumem/gpumem/device/sim"
)

// stranded runs defrag_test.go's strand (eight 16 MiB spans, each with one
// live 2 MiB chunk and seven free) and large (a 100 MiB block, which fits
// no hole) on a new allocator of cfg, reads every live buffer back, and
// returns the bytes reserved before and after the large block; everything
// freed and trimmed, nothing may stay reserved.
func stranded(t *testing.T, cfg gpumem.Config) (before, after uint64) {
	t.Helper()
	dev := sim.MustNew(sim.Config{Capacity: 4 << 30})
	cfg.SpanSize = strandSpan
	a := newAlloc(t, dev, cfg)
	live := strand(t, dev, a, 8)
	before = a.Stats().Reserved
	live = large(t, dev, a, live)
	after = a.Stats().Reserved
	readBack(t, dev, live, "after the large block")
	for _, m := range live {
		if err := a.Free(m.b); err != nil {
			t.Fatal(err)
		}
	}
	if err := a.Trim(); err != nil {
		t.Fatal(err)
	}
	if r := a.Stats().Reserved; r != 0 {
		t.Errorf("after freeing everything and Trim, %d bytes reserved", r)
	}
	return before, after
}

// TestChunkHandlesTakeStrandedChunks: under Config.ChunkHandles the free
// chunks of partly used spans back a request that fits no free range,
// where the default takes new memory; no live byte moves (invariants
// checked after every operation: each chunk of a span has a handle of its
// own, none twice).
func TestChunkHandlesTakeStrandedChunks(t *testing.T) {
	_, defAfter := stranded(t, gpumem.Config{})
	before, after := stranded(t, gpumem.Config{ChunkHandles: true})
	if defAfter <= before {
		t.Fatalf("the default served 100 MiB from its stranded chunks (reserved %d -> %d): the test does not test", before, defAfter)
	}
	if after != before {
		t.Errorf("chunk handles: reserved %d -> %d for 100 MiB with 112 MiB free in partly used spans; want no growth (the default: %d)", before, after, defAfter)
	}
}

// TestChunkHandlesUnderLimit: the same under a 160 MiB limit: the default,
// which would have to grow past it, fails with an out-of-memory; chunk
// handles serve the block from the stranded chunks, under the limit.
func TestChunkHandlesUnderLimit(t *testing.T) {
	try := func(chunks bool) (uint64, error) {
		dev := sim.MustNew(sim.Config{Capacity: 4 << 30})
		a := newAlloc(t, dev, gpumem.Config{ChunkHandles: chunks, Limit: 160 * miB, SpanSize: strandSpan})
		strand(t, dev, a, 8)
		_, err := a.Alloc(100*miB, 0)
		return a.Stats().PeakReserved, err
	}
	if _, err := try(false); !errors.Is(err, gpumem.ErrOutOfMemory) {
		t.Fatalf("the default: %v; want an out-of-memory (else the test does not test)", err)
	}
	peak, err := try(true)
	if err != nil {
		t.Fatalf("chunk handles: 100 MiB with 16 MiB live under a 160 MiB limit: %v", err)
	}
	if peak > 160*miB {
		t.Errorf("chunk handles: peak reserved %d past the limit", peak)
	}
}

// TestChunkHandlesRefusedWithMoves: ChunkHandles with Compact, Defrag or
// Gather is refused at New with one line saying so.
func TestChunkHandlesRefusedWithMoves(t *testing.T) {
	for _, cfg := range []gpumem.Config{{Compact: true}, {Defrag: true}, {Gather: true}} {
		cfg.ChunkHandles, cfg.Mode = true, gpumem.ModeVirtual
		_, err := gpumem.New(sim.MustNew(sim.Config{}), cfg)
		if err == nil || !strings.Contains(err.Error(), "ChunkHandles cannot be combined") {
			t.Errorf("%+v: New: %v; want a refusal", cfg, err)
		}
	}
}
