package gpumem_test

import (
	"testing"

	"github.com/gpumem/gpumem"
)

// TestHandedOverBuffersAreReused: a producer stream allocates each batch,
// a consumer stream uses it (RecordStream) and the batch is freed while the
// consumer's work is still pending, as a prefetching data loader does with
// record_stream. Once the consumer's work completes, the next batches must
// reuse that memory: the allocator may hold about two batches in flight,
// not grow with every step (it did in ModeVirtual, where the arena always
// had an unbacked free block that fit, so completed frees stayed parked).
func TestHandedOverBuffersAreReused(t *testing.T) {
	for _, mode := range []gpumem.Mode{gpumem.ModeVirtual, gpumem.ModePlain} {
		t.Run(mode.String(), func(t *testing.T) {
			dev := newSim(8 << 30)
			a := newAlloc(t, dev, gpumem.Config{Mode: mode})
			side, _ := dev.NewStream()
			main, _ := dev.NewStream()
			const batch = 96 * miB
			var prev gpumem.Buffer
			for step := range 40 {
				b, err := a.Alloc(batch+uint64(step%5)*miB, side)
				if err != nil {
					t.Fatal(err)
				}
				// The consumer uses the batch; its work stays pending until
				// the next step.
				dev.Hold(main)
				if err := a.RecordStream(b, main); err != nil {
					t.Fatal(err)
				}
				if err := dev.Touch(main, b.Ptr(), b.Size()); err != nil {
					t.Fatal(err)
				}
				if !prev.IsZero() {
					dev.Drain(main) // the previous step's work is done
				}
				if err := a.Free(b); err != nil { // freed while main still reads it
					t.Fatal(err)
				}
				prev = b
				mustCheck(t, a, "a handed-over free")
			}
			dev.Drain(main)
			if r := a.Stats().PeakReserved; r > 4*(batch+8*miB) {
				t.Errorf("peak reserved %d MiB for batches of about %d MiB with one in flight: completed frees were not reused",
					r>>20, batch>>20)
			}
		})
	}
}
