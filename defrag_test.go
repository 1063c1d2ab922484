package gpumem_test

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/gpumem/gpumem"
	"github.com/gpumem/gpumem/device"
	"github.com/gpumem/gpumem/device/sim"
	"github.com/gpumem/gpumem/internal/longtest"
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

// strandSpan is the span size of the tests that strand memory on purpose:
// set, it keeps the default from tightening as memory runs short
// (pressure.go), which would place the layout so that nothing strands.
const strandSpan = 16 << 20

// strand maps n 16 MiB spans (one buffer each, freed), fills them with
// 2 MiB buffers and frees all but one of each eight, so that every span
// keeps one live chunk (its fourth; its last when n is 1), and returns the
// live buffers. A block larger than any hole then makes Defrag split them.
// With eight spans a split stages the live chunk in the free chunks of the
// other spans; with one the pool has no free memory mapped outside the
// span, and the split goes through the scratch range.
func strand(t *testing.T, dev *sim.Device, a *gpumem.Allocator, n int) []marked {
	t.Helper()
	const mib = 1 << 20
	spans(t, a, n)
	keep := 3
	if n == 1 {
		keep = 7
	}
	var live []marked
	var freed []gpumem.Buffer
	for i := 0; i < 8*n; i++ {
		b, err := a.Alloc(2*mib, 0)
		if err != nil {
			t.Fatal(err)
		}
		m := mark(t, dev, b, uint64(i+1))
		if i%8 == keep {
			live = append(live, m)
		} else {
			freed = append(freed, b)
		}
	}
	for _, b := range freed {
		if err := a.Free(b); err != nil {
			t.Fatal(err)
		}
	}
	return live
}

// large asks for a 100 MiB block after strand and adds it to live.
func large(t *testing.T, dev *sim.Device, a *gpumem.Allocator, live []marked) []marked {
	t.Helper()
	b, err := a.Alloc(100<<20, 0)
	if err != nil {
		t.Fatal(err)
	}
	return append(live, mark(t, dev, b, 1000))
}

// spans leaves n empty 16 MiB spans mapped.
func spans(t *testing.T, a *gpumem.Allocator, n int) {
	t.Helper()
	var bs []gpumem.Buffer
	for i := 0; i < n; i++ {
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
// Without it the same program holds the stranded chunks. With eight
// stranded spans each split stages its live chunk in the free chunks of
// the others (two copies, no scratch range); with one it goes through
// the scratch range (one copy, one more reservation).
func TestDefragMovesLiveChunks(t *testing.T) {
	const mib = 1 << 20
	for _, n := range []int{8, 1} {
		t.Run(fmt.Sprintf("%d spans", n), func(t *testing.T) {
			var peaks, reserves [2]uint64
			for k, defrag := range []bool{false, true} {
				dev := sim.MustNew(sim.Config{Capacity: 4 << 30})
				a, err := gpumem.New(dev, gpumem.Config{SpanSize: strandSpan, Defrag: defrag, CheckInvariants: true})
				if err != nil {
					t.Fatal(err)
				}
				live := large(t, dev, a, strand(t, dev, a, n))
				readBack(t, dev, live, "after the large block")
				st := a.Stats()
				peaks[k], reserves[k] = st.PeakReserved, st.Reserves
				switch {
				case !defrag:
					if st.Splits != 0 || st.Copies != 0 {
						t.Errorf("without Defrag: %d splits, %d copies", st.Splits, st.Copies)
					}
				case n == 8:
					// Each split moves one live 2 MiB chunk and gives
					// 14 MiB back; the span under the large block stays.
					if st.Splits < 6 || st.Copies != 2*st.Splits || st.CopiedBytes != st.Splits*4*mib {
						t.Errorf("staged: %d splits, %d copies of %d bytes; want at least 6, two copies of 2 MiB each", st.Splits, st.Copies, st.CopiedBytes)
					}
				default:
					if st.Splits != 1 || st.Copies != 1 || st.CopiedBytes != 2*mib {
						t.Errorf("through the scratch range: %d splits, %d copies of %d bytes; want one copy of 2 MiB", st.Splits, st.Copies, st.CopiedBytes)
					}
				}
				if defrag && dev.Stats().Copies != st.Copies {
					t.Errorf("the allocator counts %d copies, the device %d", st.Copies, dev.Stats().Copies)
				}
				freeAndClose(t, dev, a, live)
				if s := dev.Stats(); s.LiveMappings != 0 || s.LiveReservations != 0 {
					t.Errorf("defrag=%v: after Close %d mappings and %d reservations remain", defrag, s.LiveMappings, s.LiveReservations)
				}
			}
			if scratch := reserves[1] - reserves[0]; (n == 8) != (scratch == 0) {
				t.Errorf("%d spans: %d scratch ranges reserved", n, scratch)
			}
			// Eight spans: peak live 128 MiB (the eight 16 MiB buffers),
			// then 8 x 2 MiB + 100 MiB = 116 MiB. Without Defrag the
			// large block comes beside the stranded 128 MiB; with it,
			// those spans keep 16 MiB between them. One span: 14 MiB of
			// the 16 go back.
			want := map[int][2]uint64{8: {200 * mib, 140 * mib}, 1: {116 * mib, 104 * mib}}[n]
			if peaks[0] < want[0] || peaks[1] > want[1] {
				t.Errorf("peak reserved: %d MiB without Defrag, %d MiB with it; want at least %d and at most %d MiB",
					peaks[0]/mib, peaks[1]/mib, want[0]/mib, want[1]/mib)
			}
		})
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
		a, err := gpumem.New(dev, gpumem.Config{SpanSize: strandSpan, Defrag: true, CheckInvariants: true})
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
	longtest.Skip(t, "Defrag under a fault at each of 80 driver calls, under the checker")
	const mib = 1 << 20
	var splits [9]uint64 // by stranded spans
	for _, op := range []string{"Create", "Map", "SetAccess", "Synchronize", "Copy", "Unmap", "Release", "Reserve"} {
		for _, c := range []struct{ n, spans int }{{1, 8}, {2, 8}, {4, 8}, {9, 8}, {30, 8}, {80, 8}, {1, 1}, {2, 1}, {3, 1}, {4, 1}} {
			n, spans := c.n, c.spans
			dev := sim.MustNew(sim.Config{Capacity: 1 << 30})
			a, err := gpumem.New(dev, gpumem.Config{SpanSize: strandSpan, Defrag: true, CheckInvariants: true, Limit: 400 * mib})
			if err != nil {
				t.Fatal(err)
			}
			label := fmt.Sprintf("%s #%d, %d stranded spans", op, n, spans)
			// The stranded spans first, then the fault, then the large
			// request that splits them.
			live := strand(t, dev, a, spans)
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
			splits[spans] += a.Stats().Splits
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
	if splits[8] == 0 || splits[1] == 0 {
		t.Errorf("splits under faults: %d with eight stranded spans (staged), %d with one (scratch); want some of both", splits[8], splits[1])
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
	a, err := gpumem.New(dev, gpumem.Config{SpanSize: strandSpan, Defrag: true, CheckInvariants: true})
	if err != nil {
		t.Fatal(err)
	}
	live := strand(t, dev, a, 1)
	// The split's first Unmap is its scratch mapping's (after the
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

// TestGatherBeforeOutOfMemory: under a limit that the stranded spans of
// strand fill, a 100 MiB request fails without Config.Gather (the
// stranded chunks are the cause: fragmentation) and is served with it, the
// sparse spans split on the way to the out-of-memory, every live buffer
// reading back what was written to it. At 140 MiB the live chunks' new
// handles fit beside the spans (split makes them first); at 128 MiB
// nothing is left beside them, and each span is given back before its live
// chunk's handle is made (splitReleasing). Unlimited, nothing is short and
// Gather moves nothing. The attempts between the splits keep the spans
// they map (back): every handle released is a split span's, where giving
// back what each failed attempt made cost 15 more creates and releases.
func TestGatherBeforeOutOfMemory(t *testing.T) {
	const mib = 1 << 20
	for _, limit := range []uint64{140 * mib, 128 * mib, 0} {
		for _, gather := range []bool{false, true} {
			t.Run(fmt.Sprintf("limit %d MiB, gather %v", limit/mib, gather), func(t *testing.T) {
				dev := sim.MustNew(sim.Config{Capacity: 4 << 30})
				a, err := gpumem.New(dev, gpumem.Config{SpanSize: strandSpan, Gather: gather, Limit: limit, CheckInvariants: true})
				if err != nil {
					t.Fatal(err)
				}
				live := strand(t, dev, a, 8)
				before := a.Stats()
				b, err := a.Alloc(100*mib, 0)
				st := a.Stats()
				switch {
				case limit != 0 && !gather:
					var oom *gpumem.OutOfMemoryError
					if !errors.As(err, &oom) || oom.Cause != gpumem.CauseFragmentation {
						t.Fatalf("without Gather: %v; want an out-of-memory caused by fragmentation", err)
					}
					if !strings.Contains(err.Error(), "GPUMEM_CONFIG=gather=true") {
						t.Errorf("without Gather the verdict does not name it: %v", err)
					}
				case err != nil:
					t.Fatalf("gather %v, limit %d MiB: %v", gather, limit/mib, err)
				default:
					live = append(live, mark(t, dev, b, 1000))
				}
				readBack(t, dev, live, "after the large request")
				switch {
				case limit == 0 || !gather:
					if st.Splits != 0 || st.Copies != 0 {
						t.Errorf("%d splits, %d copies; want none", st.Splits, st.Copies)
					}
				case st.Splits < 6 || st.Copies != 2*st.Splits:
					t.Errorf("%d splits, %d copies; want at least 6, each staged (two copies)", st.Splits, st.Copies)
				case st.Releases-before.Releases != st.Splits:
					t.Errorf("%d handles released during the request, %d splits: the attempts gave back what they mapped", st.Releases-before.Releases, st.Splits)
				}
				if limit != 0 && st.PeakReserved > limit {
					t.Errorf("peak reserved %d MiB over the limit of %d MiB", st.PeakReserved/mib, limit/mib)
				}
				freeAndClose(t, dev, a, live)
			})
		}
	}
}

// TestGatherFaults: at a limit that leaves no room beside the stranded
// spans, each split gives its span back before its live chunk's new handle
// is made (splitReleasing). A driver failure then (the create, the map or
// the grant of the new handle) is met by trying that run again: the request
// is served and every live buffer keeps its bytes. If the run cannot be
// mapped again either, the allocator says it is broken, naming the
// address, and no live buffer outside that run loses its bytes.
func TestGatherFaults(t *testing.T) {
	const mib = 1 << 20
	for _, c := range []struct {
		ops    []string // armed, each to fail once, at its first call
		broken bool
	}{
		{[]string{"Create"}, false},
		{[]string{"Map"}, false},
		{[]string{"SetAccess"}, false},
		{[]string{"Create", "Create"}, true},
	} {
		t.Run(strings.Join(c.ops, "+"), func(t *testing.T) {
			dev := sim.MustNew(sim.Config{Capacity: 4 << 30})
			a, err := gpumem.New(dev, gpumem.Config{SpanSize: strandSpan, Gather: true, Limit: 128 * mib, CheckInvariants: !c.broken})
			if err != nil {
				t.Fatal(err)
			}
			live := strand(t, dev, a, 8)
			for k, op := range c.ops {
				dev.FailNth(op, 1+k)
			}
			b, err := a.Alloc(100*mib, 0)
			if c.broken {
				if !errors.Is(err, gpumem.ErrBroken) || !strings.Contains(err.Error(), "its bytes are at 0x") {
					t.Fatalf("both creates failing: %v; want ErrBroken saying where the bytes wait", err)
				}
				// The first split's run is the one lost; the other
				// stranded spans were not touched.
				readBack(t, dev, live[1:], "after the broken split")
				return
			}
			if err != nil {
				t.Fatalf("%v failing once: %v", c.ops, err)
			}
			live = append(live, mark(t, dev, b, 1000))
			readBack(t, dev, live, "after the large request")
			if st := a.Stats(); st.Splits < 6 {
				t.Errorf("%d splits; want at least 6", st.Splits)
			}
			freeAndClose(t, dev, a, live)
		})
	}
}

// freeAndClose frees the live buffers, closes the allocator and checks
// that the device has all its memory back.
func freeAndClose(t *testing.T, dev *sim.Device, a *gpumem.Allocator, live []marked) {
	t.Helper()
	for _, m := range live {
		if err := a.Free(m.b); err != nil {
			t.Fatal(err)
		}
	}
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	if free, total, _ := dev.MemInfo(); free != total {
		t.Errorf("after Close the device has %d of %d bytes free", free, total)
	}
}

// TestTightAvoidsStranding: the layout that strands memory under 16 MiB
// spans (strand, then a 100 MiB request that fits only if nothing is
// stranded) is served by the default as it tightens under a limit
// (pressure.go), with no move of live memory, every byte reading back,
// and the peak within the limit.
func TestTightAvoidsStranding(t *testing.T) {
	const mib = 1 << 20
	for _, limit := range []uint64{140 * mib, 128 * mib} {
		dev := sim.MustNew(sim.Config{Capacity: 4 << 30})
		a, err := gpumem.New(dev, gpumem.Config{Limit: limit, CheckInvariants: true})
		if err != nil {
			t.Fatal(err)
		}
		live := strand(t, dev, a, 8)
		b, err := a.Alloc(100*mib, 0)
		if err != nil {
			t.Fatalf("limit %d MiB: %v", limit/mib, err)
		}
		live = append(live, mark(t, dev, b, 1000))
		readBack(t, dev, live, "after the large request")
		if st := a.Stats(); st.Splits != 0 || st.Copies != 0 || st.PeakReserved > limit {
			t.Errorf("limit %d MiB: %d splits, %d copies, peak reserved %d MiB; want no move and the peak within the limit",
				limit/mib, st.Splits, st.Copies, st.PeakReserved/mib)
		}
		freeAndClose(t, dev, a, live)
	}
}
