package gputest

import (
	"bytes"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/gpumem/gpumem"
	"github.com/gpumem/gpumem/device"
	"github.com/gpumem/gpumem/device/cuda"
	"github.com/gpumem/gpumem/internal/conformance"
	"github.com/gpumem/gpumem/nvml"
	"github.com/gpumem/gpumem/trace"
)

const (
	miB = 1 << 20
	giB = 1 << 30
)

// openGPU opens GPU 0 or skips with the reason (fails instead when
// GPUMEM_REQUIRE_GPU is set, as on the GPU machine).
func openGPU(t *testing.T) *cuda.Device {
	t.Helper()
	d, err := cuda.Open(0)
	if err != nil {
		if os.Getenv("GPUMEM_REQUIRE_GPU") != "" {
			t.Fatalf("cuda.Open(0): %v", err)
		}
		t.Skipf("GPU test skipped: %v", err)
	}
	t.Cleanup(func() { d.Close() })
	return d
}

// plainOnly hides the virtual-memory capability, so the allocator runs in
// plain mode on the same GPU.
type plainOnly struct {
	device.Device
	device.Events
	device.Streams
}

func modes(d *cuda.Device) map[string]device.Device {
	return map[string]device.Device{
		"virtual": d,
		"plain":   plainOnly{Device: d, Events: d, Streams: d},
	}
}

// TestConformanceCUDA runs the whole conformance suite on the GPU, each test
// on a fresh suiteGPU: the real device with the suite's hooks for faults,
// work held pending and memory taken away (suite_test.go, pend_test.go).
func TestConformanceCUDA(t *testing.T) {
	d := openGPU(t)
	conformance.Run(t, func(t *testing.T) conformance.Device { return newSuiteGPU(t, d) })
}

// Memory written through gpumem buffers reads back exactly, across chunk
// edges and after blocks are freed and reused.
func TestGPUDataReadsBack(t *testing.T) {
	d := openGPU(t)
	for name, dev := range modes(d) {
		t.Run(name, func(t *testing.T) {
			a, err := gpumem.New(dev, gpumem.Config{CheckInvariants: true})
			if err != nil {
				t.Fatal(err)
			}
			defer a.Close()
			sizes := []uint64{512, 4096, 1<<20 + 3, 3 * miB, 5*miB + 777, 64 * miB}
			var bufs []written
			for round := 0; round < 3; round++ {
				for i, n := range sizes {
					b, err := a.Alloc(n, 0)
					if err != nil {
						t.Fatal(err)
					}
					seed := byte(round*16 + i)
					if err := d.CopyFromHost(b.Ptr(), pat(n, seed)); err != nil {
						t.Fatal(err)
					}
					bufs = append(bufs, written{b, seed})
				}
				// Read everything back, then free every other buffer so the
				// next round reuses their memory.
				readBack(t, d, bufs, round)
				var keep []written
				for i, w := range bufs {
					if i%2 == 0 {
						if err := a.Free(w.b); err != nil {
							t.Fatal(err)
						}
					} else {
						keep = append(keep, w)
					}
				}
				bufs = keep
			}
			if err := a.Check(); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// TestGPUChunkHandlesDataReadsBack: under Config.ChunkHandles, where each
// chunk is a handle of its own and growth takes the free chunks of partly
// used spans (unmapped one by one, mapped one by one elsewhere, one access
// grant over the run), every live buffer keeps what was written to it. It
// first strands one live 2 MiB buffer in each 16 MiB span of a freed
// 128 MiB buffer and asks for 64 MiB, which must come from the stranded
// chunks (no growth), then runs a random workload under a limit.
func TestGPUChunkHandlesDataReadsBack(t *testing.T) {
	d := openGPU(t)
	a, err := gpumem.New(d, gpumem.Config{ChunkHandles: true, SpanSize: 16 * miB, Limit: 256 * miB, CheckInvariants: true})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	big, err := a.Alloc(128*miB, 0)
	if err != nil {
		t.Fatal(err)
	}
	if err := a.Free(big); err != nil {
		t.Fatal(err)
	}
	var live []written
	for i := 0; i < 64; i++ {
		b, err := allocWritten(d, a, 2*miB, byte(i))
		if err != nil {
			t.Fatal(err)
		}
		live = append(live, written{b, byte(i)})
	}
	var pins []written
	for i, w := range live {
		if i%8 == 0 {
			pins = append(pins, w)
		} else if err := a.Free(w.b); err != nil {
			t.Fatal(err)
		}
	}
	live = pins
	before := a.Stats()
	x, err := allocWritten(d, a, 64*miB, 0x5c)
	if err != nil {
		t.Fatal(err)
	}
	after := a.Stats()
	if after.Reserved != before.Reserved {
		t.Errorf("64 MiB with 112 MiB free in partly used spans: reserved %d -> %d; want the stranded chunks used", before.Reserved, after.Reserved)
	}
	live = append(live, written{x, 0x5c})
	readBack(t, d, live, 0)
	live = randomWork(t, d, a, rand.New(rand.NewPCG(7, 11)), live, 3000, true)
	st := a.Stats()
	t.Logf("%d creates, %d maps, %d unmaps, %d grants, %d fences; peak reserved %d MiB", st.Creates, st.Maps, st.Unmaps, st.SetAccess, st.Fences, st.PeakReserved/miB)
	for _, w := range live {
		if err := a.Free(w.b); err != nil {
			t.Fatal(err)
		}
	}
	if err := a.Trim(); err != nil {
		t.Fatal(err)
	}
	if r := a.Stats().Reserved; r != 0 {
		t.Errorf("after freeing everything and Trim, %d bytes reserved", r)
	}
}

// TestGPUCompactDataReadsBack: under Config.Compact, where moved spans
// leave dormant mappings behind and come back to them, every live buffer
// keeps what was written to it through a random workload of allocations
// and frees under a limit (so that spans move, revive and are given back):
// no two live buffers ever share memory.
func TestGPUCompactDataReadsBack(t *testing.T) {
	d, a := virtualAllocator(t, gpumem.Config{Compact: true, CheckInvariants: true, Limit: 160 * miB})
	var live []written
	// First moves back and forth that revive for sure (as on the
	// simulated device: TestCompactCloseUnmapsDormant), with a live buffer
	// written beside them; then a random workload.
	keep, err := allocWritten(d, a, 3*miB, 0xa5)
	if err != nil {
		t.Fatal(err)
	}
	live = append(live, written{keep, 0xa5})
	for round := 0; round < 3; round++ {
		var bs []gpumem.Buffer
		for _, n := range []uint64{12 * miB, 4 * miB, 16 * miB} {
			b, err := a.Alloc(n, 0)
			if err != nil {
				t.Fatal(err)
			}
			bs = append(bs, b)
			if n == 4*miB {
				if err := a.Free(bs[0]); err != nil {
					t.Fatal(err)
				}
			}
		}
		for _, b := range bs[1:] {
			if err := a.Free(b); err != nil {
				t.Fatal(err)
			}
		}
		readBack(t, d, live, round)
	}
	live = randomWork(t, d, a, rand.New(rand.NewPCG(5, 9)), live, 3000, false)
	st := a.Stats()
	if st.Revived == 0 {
		t.Errorf("no dormant mapping was revived (%d maps, %d unmaps): the test did not exercise them", st.Maps, st.Unmaps)
	}
	t.Logf("%d maps, %d unmaps, %d revived, %d dormant at the end", st.Maps, st.Unmaps, st.Revived, st.DormantMappings)
	for _, w := range live {
		if err := a.Free(w.b); err != nil {
			t.Fatal(err)
		}
	}
}

// TestGPUCompactGrownSpansReadBack: under Config.Compact past 4 GiB held,
// where spans have grown past 4 MiB (spanMost), live buffers read back what
// was written to them through moves and revivals of the grown spans. 5 GiB
// of ballast, every other 64 MiB buffer then freed (grown empty spans
// between live ones); rounds of 80 MiB buffers (too large for the holes:
// the holes' spans move to them) and 48 MiB ones (in the holes again:
// revivals or moves back), all written and read back; then a random
// workload with large requests.
func TestGPUCompactGrownSpansReadBack(t *testing.T) {
	d, a := virtualAllocator(t, gpumem.Config{Compact: true, CheckInvariants: true, Limit: 12 << 30})
	ballast := allocN(t, a, 80, 64*miB)
	if r := a.Stats().Reserved; r < 4<<30 {
		t.Fatalf("%d MiB reserved after the ballast; want 4 GiB or more, where spans grow", r>>20)
	}
	for i, b := range ballast {
		if i%2 == 1 {
			if err := a.Free(b); err != nil {
				t.Fatal(err)
			}
		}
	}
	before := a.Stats()
	keep, err := allocWritten(d, a, 3*miB, 0xa5)
	if err != nil {
		t.Fatal(err)
	}
	live := []written{{keep, 0xa5}}
	for round := 0; round < 3; round++ {
		for _, size := range []uint64{80 * miB, 48 * miB} {
			var ws []written
			for i := 0; i < 30; i++ {
				seed := byte(round*64 + i)
				b, err := allocWritten(d, a, size, seed)
				if err != nil {
					t.Fatal(err)
				}
				ws = append(ws, written{b, seed})
			}
			readBack(t, d, append(ws, live...), round)
			for _, w := range ws {
				if err := a.Free(w.b); err != nil {
					t.Fatal(err)
				}
			}
		}
	}
	live = randomWork(t, d, a, rand.New(rand.NewPCG(11, 13)), live, 500, true)
	st := a.Stats()
	t.Logf("%d maps, %d unmaps, %d revived after the ballast; %d MiB reserved at most",
		st.Maps-before.Maps, st.Unmaps-before.Unmaps, st.Revived-before.Revived, st.PeakReserved>>20)
	if st.Maps == before.Maps || st.Revived == before.Revived {
		t.Error("no map or no revival after the ballast: the test did not exercise the grown spans")
	}
	for _, w := range live {
		if err := a.Free(w.b); err != nil {
			t.Fatal(err)
		}
	}
}

// TestGPUDefragDataReadsBack: under Config.Defrag, on the real driver, live
// buffers whose chunks were copied to new handles and mapped back at the
// same addresses (a split) read back every byte written to them: first
// stranded spans split for sure (eight 16 MiB spans with one live 2 MiB
// buffer each, then a 100 MiB request), then a random workload under a
// limit.
func TestGPUDefragDataReadsBack(t *testing.T) {
	d, a := virtualAllocator(t, gpumem.Config{Defrag: true, CheckInvariants: true, Limit: 400 * miB})
	live := strand(t, d, a)
	b, err := allocWritten(d, a, 100*miB, 0x5a)
	if err != nil {
		t.Fatal(err)
	}
	live = append(live, written{b, 0x5a})
	readBack(t, d, live, 0)
	if st := a.Stats(); st.Splits == 0 {
		t.Fatalf("no span was split: the test did not exercise Defrag; stats %+v", st)
	}
	live = randomWork(t, d, a, rand.New(rand.NewPCG(6, 10)), live, 2000, true)
	st := a.Stats()
	t.Logf("%d splits, %d copies of %d bytes, %d maps, %d unmaps, %d fences; peak reserved %d, peak active %d",
		st.Splits, st.Copies, st.CopiedBytes, st.Maps, st.Unmaps, st.Fences, st.PeakReserved, st.PeakActive)
	for _, w := range live {
		if err := a.Free(w.b); err != nil {
			t.Fatal(err)
		}
	}
}

// TestGPUGatherDataReadsBack: under Config.Gather, on the real driver, a
// request that fits only once sparse spans are split (eight 16 MiB spans
// with one live 2 MiB buffer each, then 100 MiB under the limit) is served,
// and every live buffer reads back what was written to it. Each split
// stages its live bytes in free memory of the pool and copies them back
// (two copies); at 128 MiB there is no room for the new handles beside the
// span, so the span goes back before they are made (splitReleasing). Then
// a random workload under the tight limit, read back every 100 steps (the
// same as TestGatherBeforeOutOfMemory on the simulated device).
func TestGPUGatherDataReadsBack(t *testing.T) {
	for _, limit := range []uint64{140 * miB, 128 * miB} {
		t.Run(fmt.Sprintf("limit %d MiB", limit/miB), func(t *testing.T) {
			d, a := virtualAllocator(t, gpumem.Config{Gather: true, CheckInvariants: true, Limit: limit})
			live := strand(t, d, a)
			before := a.Stats()
			b, err := allocWritten(d, a, 100*miB, 0x5a)
			if err != nil {
				t.Fatalf("100 MiB under a limit of %d MiB with 16 MiB live: %v", limit/miB, err)
			}
			live = append(live, written{b, 0x5a})
			readBack(t, d, live, 0)
			st := a.Stats()
			if splits := st.Splits - before.Splits; splits < 6 {
				t.Fatalf("%d splits; want at least 6: the test did not exercise Gather; stats %+v", splits, st)
			}
			if st.Copies-before.Copies != 2*(st.Splits-before.Splits) {
				t.Errorf("%d copies for %d splits; want each split staged in free memory (two copies)",
					st.Copies-before.Copies, st.Splits-before.Splits)
			}
			if st.PeakReserved > limit {
				t.Errorf("peak reserved %d MiB over the limit of %d MiB", st.PeakReserved/miB, limit/miB)
			}
			live = randomWork(t, d, a, rand.New(rand.NewPCG(7, uint64(limit))), live, 1500, true)
			st = a.Stats()
			t.Logf("%d splits, %d copies of %d bytes, %d maps, %d unmaps, %d fences; peak reserved %d",
				st.Splits, st.Copies, st.CopiedBytes, st.Maps, st.Unmaps, st.Fences, st.PeakReserved)
			for _, w := range live {
				if err := a.Free(w.b); err != nil {
					t.Fatal(err)
				}
			}
		})
	}
}

// strand leaves eight 16 MiB spans each with one live 2 MiB buffer (written,
// and returned) and the rest free: eight empty spans first, then 64
// buffers of 2 MiB that fill them in order, all but every eighth freed.
func strand(t *testing.T, d *cuda.Device, a *gpumem.Allocator) []written {
	t.Helper()
	for _, b := range allocN(t, a, 8, 16*miB) {
		if err := a.Free(b); err != nil {
			t.Fatal(err)
		}
	}
	var live []written
	var small []gpumem.Buffer // all first, so that they fill the spans in order
	for i := 0; i < 64; i++ {
		b, err := allocWritten(d, a, 2*miB, byte(i))
		if err != nil {
			t.Fatal(err)
		}
		small = append(small, b)
	}
	for i, b := range small {
		if i%8 == 3 {
			live = append(live, written{b, byte(i)})
		} else if err := a.Free(b); err != nil {
			t.Fatal(err)
		}
	}
	return live
}

// virtualAllocator opens the GPU and an allocator with cfg on it, closed
// at the end of the test; it skips where the device lacks virtual memory.
func virtualAllocator(t *testing.T, cfg gpumem.Config) (*cuda.Device, *gpumem.Allocator) {
	t.Helper()
	d := openGPU(t)
	if !d.VirtualMemorySupported() {
		t.Skip("device lacks virtual memory management")
	}
	a, err := gpumem.New(d, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.Close() })
	return d, a
}

// allocN allocates n buffers of size bytes on stream 0.
func allocN(t *testing.T, a *gpumem.Allocator, n int, size uint64) []gpumem.Buffer {
	t.Helper()
	bs := make([]gpumem.Buffer, 0, n)
	for range n {
		b, err := a.Alloc(size, 0)
		if err != nil {
			t.Fatal(err)
		}
		bs = append(bs, b)
	}
	return bs
}

// allocWritten allocates n bytes and writes pat(n, seed) to them.
func allocWritten(d *cuda.Device, a *gpumem.Allocator, n uint64, seed byte) (gpumem.Buffer, error) {
	b, err := a.Alloc(n, 0)
	if err != nil {
		return b, err
	}
	return b, d.CopyFromHost(b.Ptr(), pat(n, seed))
}

// randomWork runs steps random frees and written allocations of up to
// 12 MiB (with large, one in eight of 16-64 MiB) over live, reading every
// live buffer back each 100 steps and at the end; an allocation that runs
// out of memory is skipped. It returns the live buffers.
func randomWork(t *testing.T, d *cuda.Device, a *gpumem.Allocator, rng *rand.Rand, live []written, steps int, large bool) []written {
	t.Helper()
	for i := 0; i < steps; i++ {
		if len(live) > 0 && (rng.IntN(2) == 0 || len(live) > 30) {
			j := rng.IntN(len(live))
			if err := a.Free(live[j].b); err != nil {
				t.Fatal(err)
			}
			live = append(live[:j], live[j+1:]...)
		} else {
			n := uint64(1+rng.IntN(24))*miB/2 + uint64(rng.IntN(4096))
			if large && rng.IntN(8) == 0 {
				n = uint64(16+rng.IntN(48)) * miB
			}
			b, err := allocWritten(d, a, n, byte(i))
			if err == nil {
				live = append(live, written{b, byte(i)})
			} else if !errors.Is(err, gpumem.ErrOutOfMemory) {
				t.Fatal(err)
			}
		}
		if i%100 == 99 {
			readBack(t, d, live, i)
		}
	}
	readBack(t, d, live, -1)
	return live
}

// readBack fails t unless every buffer of live reads back the pattern
// written to it; step says when, in the message.
func readBack(t *testing.T, d *cuda.Device, live []written, step int) {
	t.Helper()
	for _, w := range live {
		got := make([]byte, w.b.Size())
		if err := d.CopyToHost(got, w.b.Ptr()); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, pat(w.b.Size(), w.seed)) {
			t.Fatalf("step %d: buffer 0x%x (%d bytes) did not read back what was written", step, w.b.Ptr(), w.b.Size())
		}
	}
}

// written is a buffer and the seed of the pattern (pat) written to it.
type written struct {
	b    gpumem.Buffer
	seed byte
}

// pat fills n bytes: byte i is seed+i*7, so every buffer and offset differs.
func pat(n uint64, seed byte) []byte {
	p := make([]byte, n)
	for i := range p {
		p[i] = seed + byte(i*7)
	}
	return p
}

// Work still pending on stream A (a memset queued behind a long kernel) is
// never overtaken by stream B's use of the same memory: the allocator must
// wait for A or make B wait. A limit forces B to take A's memory.
func TestGPUHandoffWaitsForPendingWork(t *testing.T) {
	d := openGPU(t)
	for name, dev := range modes(d) {
		t.Run(name, func(t *testing.T) {
			const size = 64 * miB
			sA, _ := d.NewStream()
			sB, _ := d.NewStream()
			defer d.DestroyStream(sA)
			defer d.DestroyStream(sB)
			// Streams must outlive the allocator's memory on them: the
			// allocator is closed (deferred last, run first) before they are
			// destroyed.
			a, err := gpumem.New(dev, gpumem.Config{Limit: size + 20*miB})
			if err != nil {
				t.Fatal(err)
			}
			defer a.Close()
			x, err := a.Alloc(size, sA)
			if err != nil {
				t.Fatal(err)
			}
			// ~0.3 s of spinning, then A's write of 0xAA.
			if err := d.Spin(sA, 500_000_000, 0); err != nil {
				t.Fatal(err)
			}
			if err := d.MemsetAsync(x.Ptr(), 0xAA, size, sA); err != nil {
				t.Fatal(err)
			}
			if err := a.Free(x); err != nil {
				t.Fatal(err)
			}
			y, err := a.Alloc(size, sB)
			if err != nil {
				t.Fatal(err)
			}
			if err := d.MemsetAsync(y.Ptr(), 0x55, size, sB); err != nil {
				t.Fatal(err)
			}
			if err := d.Synchronize(); err != nil {
				t.Fatal(err)
			}
			got := make([]byte, size)
			if err := d.CopyToHost(got, y.Ptr()); err != nil {
				t.Fatal(err)
			}
			if i := bytes.IndexByte(got, 0xAA); i >= 0 {
				t.Fatalf("byte %d of B's buffer holds A's late write: memory was handed over before A's work completed (reused=%v)", i, x.Ptr() == y.Ptr())
			}
			st := a.Stats()
			t.Logf("%s: reused A's address: %v; fences %d, handoffs %d, unmaps %d", name, x.Ptr() == y.Ptr(), st.Fences, st.Handoffs, st.Unmaps)
			a.Free(y)
		})
	}
}

// RecordStream: a buffer used by stream B is not reused on its own stream
// while B's work is pending.
func TestGPURecordStream(t *testing.T) {
	d := openGPU(t)
	sB, _ := d.NewStream()
	defer d.DestroyStream(sB)
	a, err := gpumem.New(d, gpumem.Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	const size = 8 * miB
	x, _ := a.Alloc(size, 0)
	if err := a.RecordStream(x, sB); err != nil {
		t.Fatal(err)
	}
	d.Spin(sB, 500_000_000, 0)
	d.MemsetAsync(x.Ptr(), 0xAA, size, sB)
	if err := a.Free(x); err != nil {
		t.Fatal(err)
	}
	y, err := a.Alloc(size, 0)
	if err != nil {
		t.Fatal(err)
	}
	if y.Ptr() == x.Ptr() {
		t.Fatalf("buffer reused at 0x%x while stream B's recorded work was pending", x.Ptr())
	}
	d.Synchronize()
	if a.Stats().PendingFrees != 1 {
		t.Fatalf("pending frees %d, want 1", a.Stats().PendingFrees)
	}
	a.Free(y)
}

// openNVML opens NVML (skipping without it) and finds d's index there.
func openNVML(t *testing.T, d *cuda.Device) (*nvml.NVML, int) {
	t.Helper()
	n, err := nvml.Open()
	if err != nil {
		t.Skipf("GPU test skipped: NVML: %v", err)
	}
	t.Cleanup(func() { n.Shutdown() })
	idx, err := n.IndexByUUID(d.UUID())
	if err != nil {
		t.Fatal(err)
	}
	return n, idx
}

// processMemory is this process's device memory on GPU 0 as NVML sees it.
func processMemory(t *testing.T, n *nvml.NVML, idx int) uint64 {
	t.Helper()
	used, ok, err := n.ProcessMemory(idx, os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	if !ok {
		gpu, err := n.Device(idx)
		if err != nil {
			t.Fatal(err)
		}
		return gpu.Memory.Used // pid not visible (container): whole GPU
	}
	return used
}

// trimAndWait calls Trim and polls NVML until the process is back within
// 64 MiB of before, for 100 ms at most; it returns the last figure and how
// long it took.
func trimAndWait(t *testing.T, a *gpumem.Allocator, n *nvml.NVML, idx int, before uint64) (uint64, time.Duration) {
	t.Helper()
	start := time.Now()
	if err := a.Trim(); err != nil {
		t.Fatal(err)
	}
	for {
		now := processMemory(t, n, idx)
		if now <= before+64*miB || time.Since(start) > 100*time.Millisecond {
			return now, time.Since(start)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// Virtual segments grow under use and Trim gives every unused byte back:
// NVML's figure for this process returns within 64 MiB of where it started,
// within 100 ms.
func TestGPUTrimVisibleInNVML(t *testing.T) {
	d := openGPU(t)
	n, idx := openNVML(t, d)
	for name, dev := range modes(d) {
		t.Run(name, func(t *testing.T) {
			before := processMemory(t, n, idx)
			a, err := gpumem.New(dev, gpumem.Config{})
			if err != nil {
				t.Fatal(err)
			}
			defer a.Close()
			var bufs []gpumem.Buffer
			for i := 0; i < 16; i++ {
				b, err := a.Alloc(uint64(64+i*32)*miB, 0)
				if err != nil {
					t.Fatal(err)
				}
				bufs = append(bufs, b)
			}
			grown := processMemory(t, n, idx)
			held := a.Stats().Reserved
			if grown < before+held/2 {
				t.Fatalf("NVML shows %d MiB after allocating (started at %d MiB, allocator holds %d MiB)", grown>>20, before>>20, held>>20)
			}
			for _, b := range bufs {
				a.Free(b)
			}
			now, took := trimAndWait(t, a, n, idx, before)
			t.Logf("%s: NVML before %d MiB, after allocating %d MiB (held %d MiB), after Trim %d MiB in %v", name, before>>20, grown>>20, held>>20, now>>20, took)
			if now > before+64*miB {
				t.Fatalf("after Trim NVML shows %d MiB, started at %d MiB: more than 64 MiB not given back within 100 ms", now>>20, before>>20)
			}
			if st := a.Stats(); st.Reserved != 0 {
				t.Fatalf("after Trim the allocator still holds %d bytes", st.Reserved)
			}
		})
	}
}

// findTrace finds a shipped trace from the package directory (go test) or
// the repository root (scripts/gpu.sh runs the test binary there).
func findTrace(t *testing.T, name string) string {
	t.Helper()
	for _, dir := range []string{"testdata/traces", "../../testdata/traces"} {
		p := filepath.Join(dir, name)
		if _, err := os.Stat(p); err == nil {
			return p
		}
	}
	t.Skipf("trace %s not found under testdata/traces", name)
	return ""
}

// After replaying a real program's trace on the GPU and Trim, the process's
// device memory as NVML reports it is back within 64 MiB of where it was
// before the replay, within 100 ms.
func TestGPUReplayThenTrim(t *testing.T) {
	d := openGPU(t)
	n, idx := openNVML(t, d)
	tr, err := trace.Load(findTrace(t, "resnet50_train.trace.gz"))
	if err != nil {
		t.Fatal(err)
	}
	before := processMemory(t, n, idx)
	a, err := gpumem.New(d, gpumem.Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	bufs := make([]gpumem.Buffer, tr.Requests)
	for i, ev := range tr.Events {
		if ev.Kind == trace.Alloc {
			if bufs[tr.Slot[i]], err = a.Alloc(ev.Size, 0); err != nil {
				t.Fatal(err)
			}
		} else {
			if err := a.Free(bufs[tr.Slot[i]]); err != nil {
				t.Fatal(err)
			}
			bufs[tr.Slot[i]] = gpumem.Buffer{}
		}
	}
	peak := processMemory(t, n, idx)
	for _, b := range bufs {
		if !b.IsZero() {
			if err := a.Free(b); err != nil {
				t.Fatal(err)
			}
		}
	}
	now, took := trimAndWait(t, a, n, idx, before)
	t.Logf("resnet50_train: NVML before %d MiB, at the end of the replay %d MiB (peak reserved %d MiB), after Trim %d MiB in %v",
		before>>20, peak>>20, a.Stats().PeakReserved>>20, now>>20, took)
	if now > before+64*miB {
		t.Fatalf("after the replay and Trim NVML shows %d MiB, %d MiB before: more than 64 MiB not given back within 100 ms", now>>20, before>>20)
	}
}

// A limit holds on the real GPU, and the driver's own out-of-memory comes
// back as gpumem's, with the driver's error inside.
func TestGPULimitAndDriverOOM(t *testing.T) {
	d := openGPU(t)
	for name, dev := range modes(d) {
		t.Run(name, func(t *testing.T) {
			a, err := gpumem.New(dev, gpumem.Config{Limit: 256 * miB})
			if err != nil {
				t.Fatal(err)
			}
			b, err := a.Alloc(200*miB, 0)
			if err != nil {
				t.Fatal(err)
			}
			_, err = a.Alloc(100*miB, 0)
			var oom *gpumem.OutOfMemoryError
			if !errors.As(err, &oom) || oom.Cause != gpumem.CauseLimit {
				t.Fatalf("over the limit: %v, want an OutOfMemoryError with cause limit", err)
			}
			if r := a.Stats().Reserved; r > 256*miB {
				t.Fatalf("reserved %d over the 256 MiB limit", r)
			}
			a.Free(b)
			a.Close()

			// Take most of the GPU outside gpumem, then ask for more than
			// is left.
			free, _, err := d.MemInfo()
			if err != nil {
				t.Fatal(err)
			}
			hog, err := d.Alloc(free - 2*giB)
			if err != nil {
				t.Fatal(err)
			}
			defer d.Free(hog)
			a2, err := gpumem.New(dev, gpumem.Config{})
			if err != nil {
				t.Fatal(err)
			}
			defer a2.Close()
			_, err = a2.Alloc(4*giB, 0)
			if !errors.As(err, &oom) || oom.Cause != gpumem.CauseDevice || !errors.Is(err, device.ErrOutOfMemory) {
				t.Fatalf("beyond the GPU's free memory: %v, want gpumem's OutOfMemoryError (cause device) wrapping the driver's", err)
			}
			t.Logf("%s: %v", name, err)
			if st := a2.Stats(); st.Reserved != 0 {
				t.Fatalf("a failed request left %d bytes reserved", st.Reserved)
			}
			if err := a2.Check(); err != nil {
				t.Fatal(err)
			}
		})
	}
}
