package gpumem_test

import (
	"testing"

	"github.com/gpumem/gpumem"
)

// TestFrontierSpans checks how memory grows at the frontier (vm.go,
// runEnd): exact spans of at most SpanSize while the allocator holds less
// than 16 spans' worth; past that, a block growing the arena gets spans of
// up to twice SpanSize, and its last span takes the chunks ahead of it up to
// SpanSize, which the next small request then uses without a driver call.
func TestFrontierSpans(t *testing.T) {
	a := newAlloc(t, newSim(4<<30), gpumem.Config{Mode: gpumem.ModeVirtual, SpanSize: 16 * miB})
	grow := func(size uint64, wantCreates, wantReserved uint64) {
		t.Helper()
		before := a.Stats()
		if _, err := a.Alloc(size, 0); err != nil {
			t.Fatal(err)
		}
		mustCheck(t, a, "Alloc")
		after := a.Stats()
		if c, r := after.Creates-before.Creates, after.Reserved-before.Reserved; c != wantCreates || r != wantReserved {
			t.Fatalf("Alloc(%d MiB) with %d MiB reserved: %d creates, reserved +%d MiB; want %d creates, +%d MiB",
				size/miB, before.Reserved/miB, c, r/miB, wantCreates, wantReserved/miB)
		}
	}
	// Below the threshold: spans cover exactly the chunks under the block.
	grow(20*miB, 2, 20*miB) // 16 + 4
	for a.Stats().Reserved < 256*miB {
		grow(16*miB, 1, 16*miB)
	}
	// At the frontier of a grown allocator: 32 MiB, then the last 8 MiB
	// of the block filled up to 16 MiB with the chunks ahead.
	grow(40*miB, 2, 48*miB)
	// The next request at the frontier lands in those chunks.
	grow(6*miB, 0, 0)
	// Beyond them, growth goes on at the frontier.
	grow(4*miB, 1, 16*miB)
}
