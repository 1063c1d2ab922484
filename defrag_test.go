package gpumem_test

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/gpumem/gpumem"
	"github.com/gpumem/gpumem/device"
	"github.com/gpumem/gpumem/device/sim"
)

// marked is a live buffer and the words written at its first and last
// 8 bytes through the simulated device's content model.
type marked struct {
	b          gpumem.Buffer
	head, tail uint64
}

func mark(t *testing.T, dev *sim.Device, b gpumem.Buffer, v uint64) marked {
	t.Helper()
	m := marked{b: b, head: v, tail: ^v}
	if err := dev.Poke(b.Ptr(), m.head); err != nil {
		t.Fatalf("writing buffer 0x%x: %v", b.Ptr(), err)
	}
	if err := dev.Poke(b.Ptr()+device.Ptr(b.Size())-8, m.tail); err != nil {
		t.Fatalf("writing buffer 0x%x: %v", b.Ptr(), err)
	}
	return m
}

// readBack checks that every live buffer still reads what was written to
// it: a move that lost or misplaced a live chunk shows here.
func readBack(t *testing.T, dev *sim.Device, live []marked, when string) {
	t.Helper()
	for _, m := range live {
		for _, w := range []struct {
			p    device.Ptr
			want uint64
		}{{m.b.Ptr(), m.head}, {m.b.Ptr() + device.Ptr(m.b.Size()) - 8, m.tail}} {
			got, ok, err := dev.Peek(w.p)
			if err != nil || !ok || got != w.want {
				t.Fatalf("%s: buffer 0x%x of %d bytes reads %#x (written: %v, err %v) at 0x%x, want %#x",
					when, m.b.Ptr(), m.b.Size(), got, ok, err, w.p, w.want)
			}
		}
	}
}

// strand maps eight 16 MiB spans (one buffer each, freed), fills them with
// 2 MiB buffers, frees all but one of each eight (so that every span keeps
// one live chunk), then asks for a block larger than any hole. Without Defrag the large block is new memory beside
// the stranded spans; with it, the lone live chunks move to spans of their
// own and the rest of their spans goes back first.
func strand(t *testing.T, dev *sim.Device, a *gpumem.Allocator) []marked {
	t.Helper()
	const mib = 1 << 20
	spans(t, a)
	var all []marked
	for i := 0; i < 64; i++ {
		b, err := a.Alloc(2*mib, 0)
		if err != nil {
			t.Fatal(err)
		}
		all = append(all, mark(t, dev, b, uint64(i+1)))
	}
	var live []marked
	for i, m := range all {
		if i%8 == 3 {
			live = append(live, m)
			continue
		}
		if err := a.Free(m.b); err != nil {
			t.Fatal(err)
		}
	}
	b, err := a.Alloc(100*mib, 0)
	if err != nil {
		t.Fatal(err)
	}
	return append(live, mark(t, dev, b, 1000))
}

// spans leaves eight empty 16 MiB spans mapped.
func spans(t *testing.T, a *gpumem.Allocator) {
	t.Helper()
	var bs []gpumem.Buffer
	for i := 0; i < 8; i++ {
		b, err := a.Alloc(16<<20, 0)
		if err != nil {
			t.Fatal(err)
		}
		bs = append(bs, b)
	}
	for _, b := range bs {
		if err := a.Free(b); err != nil {
			t.Fatal(err)
		}
	}
}

// TestDefragMovesLiveChunks: with Config.Defrag the stranded spans give
// back their empty chunks before the allocator grows, every live buffer
// reads back what was written to it, and the books hold (CheckInvariants).
// Without it the same program holds the stranded chunks.
func TestDefragMovesLiveChunks(t *testing.T) {
	const mib = 1 << 20
	peaks := map[bool]uint64{}
	for _, defrag := range []bool{false, true} {
		dev := sim.MustNew(sim.Config{Capacity: 4 << 30})
		a, err := gpumem.New(dev, gpumem.Config{Defrag: defrag, CheckInvariants: true})
		if err != nil {
			t.Fatal(err)
		}
		live := strand(t, dev, a)
		readBack(t, dev, live, "after the large block")
		st := a.Stats()
		peaks[defrag] = st.PeakReserved
		if !defrag {
			if st.Splits != 0 || st.Copies != 0 {
				t.Errorf("without Defrag: %d splits, %d copies", st.Splits, st.Copies)
			}
		} else {
			// Eight stranded spans of one live 2 MiB chunk each: each
			// split copies that chunk and gives 14 MiB back.
			if st.Splits < 6 || st.CopiedBytes != st.Splits*2*mib {
				t.Errorf("with Defrag: %d splits copying %d bytes, want at least 6 copying 2 MiB each", st.Splits, st.CopiedBytes)
			}
			if dev.Stats().Copies != st.Copies {
				t.Errorf("the allocator counts %d copies, the device %d", st.Copies, dev.Stats().Copies)
			}
		}
		for _, m := range live {
			if err := a.Free(m.b); err != nil {
				t.Fatal(err)
			}
		}
		if err := a.Close(); err != nil {
			t.Fatal(err)
		}
		if free, total, _ := dev.MemInfo(); free != total {
			t.Errorf("defrag=%v: after Close the device has %d of %d bytes free", defrag, free, total)
		}
		if s := dev.Stats(); s.LiveMappings != 0 || s.LiveReservations != 0 {
			t.Errorf("defrag=%v: after Close %d mappings and %d reservations remain", defrag, s.LiveMappings, s.LiveReservations)
		}
	}
	// Peak live: 128 MiB (the eight 16 MiB buffers), then 8 x 2 MiB +
	// 100 MiB = 116 MiB. Without Defrag the large block comes beside the
	// stranded 128 MiB; with it, those spans keep 16 MiB between them.
	if peaks[false] < 200*mib || peaks[true] > 140*mib {
		t.Errorf("peak reserved: %d MiB without Defrag, %d MiB with it; want the stranded 112 MiB given back with it", peaks[false]/mib, peaks[true]/mib)
	}
}

// churn runs a random workload of live buffers written and read back
// through the content model; it returns the live buffers at the end.
// Allocations may fail only as allowed says.
func churn(t *testing.T, dev *sim.Device, a *gpumem.Allocator, seed uint64, allowed func(error) bool, label string) []marked {
	t.Helper()
	const mib = 1 << 20
	rng := rand.New(rand.NewPCG(seed, 7))
	var live []marked
	for i := 0; i < 1500; i++ {
		if len(live) > 0 && (rng.IntN(2) == 0 || len(live) > 40) {
			j := rng.IntN(len(live))
			if err := a.Free(live[j].b); err != nil {
				t.Fatalf("%s: Free: %v", label, err)
			}
			live = append(live[:j], live[j+1:]...)
			continue
		}
		size := uint64(1+rng.IntN(16)) * mib / 2
		if rng.IntN(8) == 0 {
			size = uint64(16+rng.IntN(48)) * mib
		}
		b, err := a.Alloc(size, 0)
		if err != nil {
			if !allowed(err) {
				t.Fatalf("%s: Alloc(%d): %v", label, size, err)
			}
			continue
		}
		live = append(live, mark(t, dev, b, uint64(i)<<8|seed))
		if i%50 == 0 {
			readBack(t, dev, live, label)
		}
	}
	readBack(t, dev, live, label)
	return live
}

// TestDefragChurn: a random workload with large and small buffers under
// Defrag splits spans, and every live buffer keeps its bytes throughout.
func TestDefragChurn(t *testing.T) {
	var splits uint64
	for seed := uint64(1); seed <= 3; seed++ {
		dev := sim.MustNew(sim.Config{Capacity: 8 << 30})
		a, err := gpumem.New(dev, gpumem.Config{Defrag: true, CheckInvariants: true})
		if err != nil {
			t.Fatal(err)
		}
		live := churn(t, dev, a, seed, func(error) bool { return false }, "churn")
		splits += a.Stats().Splits
		for _, m := range live {
			if err := a.Free(m.b); err != nil {
				t.Fatal(err)
			}
		}
		if err := a.Close(); err != nil {
			t.Fatal(err)
		}
	}
	if splits == 0 {
		t.Error("no span was split in three random workloads: the test does not exercise Defrag")
	}
}

// TestDefragFaults fails each driver operation a split uses, at several
// points of the stranding program and of a random workload: every failure
// is the injected one or out of memory, every live buffer keeps its bytes,
// the books hold, and after the faults are cleared everything goes back.
func TestDefragFaults(t *testing.T) {
	const mib = 1 << 20
	var splits uint64
	for _, op := range []string{"Create", "Map", "SetAccess", "Synchronize", "Copy", "Unmap", "Release", "Reserve"} {
		for _, n := range []int{1, 2, 4, 9, 30, 80} {
			dev := sim.MustNew(sim.Config{Capacity: 1 << 30})
			a, err := gpumem.New(dev, gpumem.Config{Defrag: true, CheckInvariants: true, Limit: 400 * mib})
			if err != nil {
				t.Fatal(err)
			}
			label := fmt.Sprintf("%s #%d", op, n)
			// The stranded spans first, then the fault, then the large
			// request that splits them.
			spans(t, a)
			var all, live []marked
			for i := 0; i < 64; i++ {
				b, err := a.Alloc(2*mib, 0)
				if err != nil {
					t.Fatal(err)
				}
				all = append(all, mark(t, dev, b, uint64(i+1)))
			}
			for i, m := range all {
				if i%8 == 3 {
					live = append(live, m)
				} else if err := a.Free(m.b); err != nil {
					t.Fatal(err)
				}
			}
			dev.FailNth(op, n)
			allowed := func(err error) bool {
				return errors.Is(err, gpumem.ErrOutOfMemory) || errors.Is(err, device.ErrInjected)
			}
			if b, err := a.Alloc(100*mib, 0); err == nil {
				live = append(live, mark(t, dev, b, 1000))
			} else if !allowed(err) {
				t.Fatalf("%s: the large Alloc failed with %v", label, err)
			}
			readBack(t, dev, live, label+", after the large block")
			splits += a.Stats().Splits
			live = append(live, churn(t, dev, a, uint64(n), allowed, label)...)
			dev.ClearFaults()
			for _, m := range live {
				if err := a.Free(m.b); err != nil {
					t.Fatal(err)
				}
			}
			if err := a.Trim(); err != nil {
				t.Fatalf("%s: Trim after the faults were cleared: %v", label, err)
			}
			if err := a.Close(); err != nil {
				t.Fatalf("%s: Close: %v", label, err)
			}
			if free, total, _ := dev.MemInfo(); free != total {
				t.Errorf("%s: after Close the device has %d of %d bytes free", label, free, total)
			}
			if s := dev.Stats(); s.LiveMappings != 0 || s.LiveReservations != 0 || s.LiveHandles != 0 {
				t.Errorf("%s: after Close %d mappings, %d reservations and %d handles remain", label, s.LiveMappings, s.LiveReservations, s.LiveHandles)
			}
		}
	}
	if splits == 0 {
		t.Error("no large request split a span under any fault: the test does not exercise the moves")
	}
}

// TestDefragLostScratch: when the driver refuses twice to unmap a copy's
// scratch mapping, the split is abandoned (the request is served by new
// memory), the stuck handle counts in Stats.SpareBytes, and Trim gives it
// and its scratch range back once the driver relents; nothing is left on
// the device after Close.
func TestDefragLostScratch(t *testing.T) {
	const mib = 1 << 20
	dev := sim.MustNew(sim.Config{Capacity: 1 << 30})
	a, err := gpumem.New(dev, gpumem.Config{Defrag: true, CheckInvariants: true})
	if err != nil {
		t.Fatal(err)
	}
	spans(t, a)
	var all, live []marked
	for i := 0; i < 64; i++ {
		b, err := a.Alloc(2*mib, 0)
		if err != nil {
			t.Fatal(err)
		}
		all = append(all, mark(t, dev, b, uint64(i+1)))
	}
	for i, m := range all {
		if i%8 == 3 {
			live = append(live, m)
		} else if err := a.Free(m.b); err != nil {
			t.Fatal(err)
		}
	}
	// The first split's first Unmap is its scratch mapping's (after the
	// copy); undo tries it again: both fail.
	dev.FailNth("Unmap", 1)
	dev.FailNth("Unmap", 2)
	b, err := a.Alloc(100*mib, 0)
	if err != nil {
		t.Fatalf("the large Alloc: %v", err)
	}
	live = append(live, mark(t, dev, b, 1000))
	readBack(t, dev, live, "after the abandoned split")
	st := a.Stats()
	if st.SpareBytes != 2*mib || st.Reserved != st.PlainBytes+st.MappedBytes+st.SpareBytes {
		t.Errorf("stuck scratch mapping: SpareBytes %d (want 2 MiB), Reserved %d = Plain %d + Mapped %d + Spare %d?",
			st.SpareBytes, st.Reserved, st.PlainBytes, st.MappedBytes, st.SpareBytes)
	}
	dev.ClearFaults()
	if err := a.Trim(); err != nil {
		t.Fatalf("Trim: %v", err)
	}
	if st := a.Stats(); st.SpareBytes != 0 {
		t.Errorf("after Trim: SpareBytes %d", st.SpareBytes)
	}
	readBack(t, dev, live, "after Trim")
	for _, m := range live {
		if err := a.Free(m.b); err != nil {
			t.Fatal(err)
		}
	}
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	if s := dev.Stats(); s.LiveMappings != 0 || s.LiveReservations != 0 || s.LiveHandles != 0 || s.Used != 0 {
		t.Errorf("after Close: %d mappings, %d reservations, %d handles, %d bytes", s.LiveMappings, s.LiveReservations, s.LiveHandles, s.Used)
	}
}
