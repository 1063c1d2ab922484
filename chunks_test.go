package gpumem_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/gpumem/gpumem"
	"github.com/gpumem/gpumem/device/sim"
)

// stranded, on a 16 GiB device (spans of 16 MiB: the default's are at most
// 1/512 of the device), leaves one live 2 MiB buffer in each of the eight 16 MiB spans
// of a freed 128 MiB buffer (the other seven chunks of each span free, in
// holes of 14 MiB), then asks for 64 MiB, which fits no hole. It returns
// the bytes reserved before and after that request.
func stranded(t *testing.T, cfg gpumem.Config) (before, after uint64) {
	t.Helper()
	a := newAlloc(t, sim.MustNew(sim.Config{Capacity: 16 << 30}), cfg)
	big := mustAlloc(t, a, 128*miB)
	free(t, a, big)
	var pins []gpumem.Buffer
	for i, b := range allocN(t, a, 64, 2*miB) {
		if i%8 == 0 {
			pins = append(pins, b)
		} else {
			free(t, a, b)
		}
	}
	st := a.Stats()
	if st.Reserved != 128*miB || st.Allocated != 16*miB {
		t.Fatalf("set-up: reserved %d, allocated %d; want 128 MiB and 16 MiB", st.Reserved, st.Allocated)
	}
	x := mustAlloc(t, a, 64*miB)
	st2 := a.Stats()
	free(t, a, x)
	for _, b := range pins {
		free(t, a, b)
	}
	if err := a.Trim(); err != nil {
		t.Fatal(err)
	}
	if r := a.Stats().Reserved; r != 0 {
		t.Errorf("after freeing everything and Trim, %d bytes reserved", r)
	}
	return st.Reserved, st2.Reserved
}

// TestChunkHandlesTakeStrandedChunks: under Config.ChunkHandles the free
// chunks of partly used spans back a request that fits no free range,
// where the default takes new memory (invariants checked after every
// operation: each chunk of a span has a handle of its own, none twice).
func TestChunkHandlesTakeStrandedChunks(t *testing.T) {
	_, defAfter := stranded(t, gpumem.Config{Mode: gpumem.ModeVirtual})
	before, after := stranded(t, gpumem.Config{Mode: gpumem.ModeVirtual, ChunkHandles: true})
	if defAfter <= before {
		t.Fatalf("the default served 64 MiB from its stranded chunks (reserved %d -> %d): the test does not test", before, defAfter)
	}
	if after != before {
		t.Errorf("chunk handles: reserved %d -> %d for 64 MiB with 112 MiB free in partly used spans; want no growth (the default: %d)", before, after, defAfter)
	}
}

// TestChunkHandlesUnderLimit: the same pattern under a 160 MiB limit with
// 16 MiB spans, and a 96 MiB request: the default, which would have to grow
// past the limit, fails with an out-of-memory; chunk handles serve it from
// the stranded chunks and stay under the limit.
func TestChunkHandlesUnderLimit(t *testing.T) {
	try := func(chunks bool) (uint64, error) {
		a := newAlloc(t, sim.MustNew(sim.Config{Capacity: 16 << 30}), gpumem.Config{Mode: gpumem.ModeVirtual, ChunkHandles: chunks, Limit: 160 * miB, SpanSize: 16 * miB})
		big := mustAlloc(t, a, 128*miB)
		free(t, a, big)
		for i, b := range allocN(t, a, 64, 2*miB) {
			if i%8 != 0 {
				free(t, a, b)
			}
		}
		_, err := a.Alloc(96*miB, 0)
		return a.Stats().PeakReserved, err
	}
	if _, err := try(false); !errors.Is(err, gpumem.ErrOutOfMemory) {
		t.Fatalf("the default: %v; want an out-of-memory (else the test does not test)", err)
	}
	peak, err := try(true)
	if err != nil {
		t.Fatalf("chunk handles: 96 MiB with 16 MiB live under a 160 MiB limit: %v", err)
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

func free(t *testing.T, a *gpumem.Allocator, b gpumem.Buffer) {
	t.Helper()
	if err := a.Free(b); err != nil {
		t.Fatal(err)
	}
}

func allocN(t *testing.T, a *gpumem.Allocator, n int, size uint64) []gpumem.Buffer {
	t.Helper()
	bs := make([]gpumem.Buffer, n)
	for i := range bs {
		bs[i] = mustAlloc(t, a, size)
	}
	return bs
}
