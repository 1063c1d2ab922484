package host

import (
	"cmp"
	"errors"
	"math/rand/v2"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gpumem/gpumem"
	"github.com/gpumem/gpumem/device"
	"github.com/gpumem/gpumem/device/sim"
)

// TestPoolKeepsGraphMemory: what a capture allocates comes from its pool
// (on the capturing stream and on a stream that joined the capture, not
// on a stream outside it), is reused within the pool, and serves no
// allocation outside it after the capture, however many; the capture is
// never broken; the pool's memory counts in the device's numbers and goes
// back once its graph is released and its buffers freed.
func TestPoolKeepsGraphMemory(t *testing.T) {
	h := newSimHost(t, "limit=2GiB")
	d, err := h.Device(0)
	if err != nil {
		t.Fatal(err)
	}
	sd := d.dev.(*sim.Device)
	s1, _ := sd.NewStream()
	s2, _ := sd.NewStream()
	id := PoolID{1, 0}
	alloc := func(size uint64, s uint64) uint64 { t.Helper(); return mustAlloc(t, h, size, s, 0) }
	free := func(p uint64) { t.Helper(); mustFree(t, h, p) }
	before := alloc(32*miB, uint64(s1))

	sd.BeginCapture(s1)
	if err := h.BeginPool(0, id, RouteCapture, uint64(s1), 0); err != nil {
		t.Fatal(err)
	}
	free(before) // a buffer from before the capture, freed in it
	tmp := alloc(64*miB, uint64(s1))
	free(tmp) // an intermediate: the graph's replays still use it
	out := alloc(64*miB, uint64(s1))
	if out != tmp {
		t.Errorf("the capture's second 64 MiB is at %#x, want the %#x it freed (reuse within the pool)", out, tmp)
	}
	scratch := alloc(24*miB, uint64(s1))
	free(scratch) // freed and not reused in the capture: still the graph's
	sd.JoinCapture(s2, s1)
	side := alloc(16*miB, uint64(s2))
	outside := alloc(16*miB, 0) // the default stream does not capture
	if err := sd.EndCapture(s2); err != nil {
		t.Fatal(err)
	}
	if err := sd.EndCapture(s1); err != nil {
		t.Errorf("the capture was broken: %v", err)
	}
	if err := h.EndPool(0, id); err != nil {
		t.Fatal(err)
	}
	if d.Alloc.Capturing() {
		t.Error("the allocator still counts a capture after EndPool")
	}

	live := h.PoolLive(0, id)
	slices.Sort(live)
	want := []uint64{out, side}
	slices.Sort(want)
	if !slices.Equal(live, want) {
		t.Errorf("PoolLive = %#x, want %#x (out and side, not the outside buffer %#x)", live, want, outside)
	}
	pooled := d.Alloc.Stats().Reserved
	st, _ := h.Stats(0)
	if st.Reserved < pooled+104*miB {
		t.Errorf("the device's numbers hold %d bytes, want the pool's 104 MiB beyond the allocator's %d", st.Reserved, pooled)
	}

	// After the capture: nothing outside the pool lands in its memory.
	graph := [][2]uint64{{tmp, 64 * miB}, {scratch, 24 * miB}, {side, 16 * miB}}
	var after []uint64
	for i := range 24 {
		p := alloc(uint64(8+i%5*24)*miB, uint64([]uint64{0, uint64(s1), uint64(s2)}[i%3]))
		for _, g := range graph {
			if p < g[0]+g[1] && g[0] < p+8*miB {
				t.Fatalf("allocation %d at %#x lies in the graph's memory [%#x, +%d MiB)", i, p, g[0], g[1]>>20)
			}
		}
		after = append(after, p)
	}
	for _, p := range after {
		free(p)
	}

	// A graph released, its outputs freed: the pool's memory goes back.
	if err := h.ReleasePool(0, id); err != nil {
		t.Fatal(err)
	}
	free(out)
	free(side)
	// Freeable now, not closed: a graph captured later may still use a
	// buffer freed in its capture; the next trim gives it back.
	if n := len(d.pools.byID); n != 1 {
		t.Errorf("%d pools after the release and the last free, want the freeable one kept", n)
	}
	free(outside)
	if err := h.Trim(0); err != nil {
		t.Fatal(err)
	}
	if n := len(d.pools.byID); n != 0 {
		t.Errorf("%d pools left after a trim, want 0", n)
	}
	if st, _ := h.Stats(0); st.Reserved != 0 {
		t.Errorf("%d bytes held after every free and a trim", st.Reserved)
	}
	if v := sd.Stats().CaptureViolations; v != 0 {
		t.Errorf("%d calls the driver forbids during a capture", v)
	}
}

// TestPoolRoutes: a thread route takes that thread's allocations only, an
// all route every one, the latest route wins, and calls that do not match
// a pool's state fail with ErrPool, changing nothing.
func TestPoolRoutes(t *testing.T) {
	h := newSimHost(t, "")
	a, b := PoolID{0, 1}, PoolID{0, 2}
	if err := h.BeginPool(0, a, RouteThread, 0, 7); err != nil {
		t.Fatal(err)
	}
	p7, err := h.AllocThread(0, miB, 0, 0, 7)
	if err != nil {
		t.Fatal(err)
	}
	p8, err := h.AllocThread(0, miB, 0, 0, 8)
	if err != nil {
		t.Fatal(err)
	}
	if got := h.PoolLive(0, a); !slices.Equal(got, []uint64{p7}) {
		t.Errorf("pool a holds %#x, want only thread 7's %#x (not thread 8's %#x)", got, p7, p8)
	}
	if err := h.BeginPool(0, b, RouteAll, 0, 0); err != nil {
		t.Fatal(err)
	}
	q7, _ := h.AllocThread(0, miB, 0, 0, 7)
	if got := h.PoolLive(0, b); !slices.Equal(got, []uint64{q7}) {
		t.Errorf("pool b holds %#x, want thread 7's %#x: the latest route wins", got, q7)
	}
	if err := h.EndPool(0, b); err != nil {
		t.Fatal(err)
	}
	if err := h.EndPool(0, b); !errors.Is(err, ErrPool) {
		t.Errorf("a second EndPool: %v, want ErrPool", err)
	}
	if err := h.BeginPool(0, b, Route(9), 0, 0); !errors.Is(err, ErrPool) || Code(err) != StatusInvalidValue {
		t.Errorf("an unknown route: %v (status %d), want ErrPool, invalid value", err, Code(err))
	}
	if err := h.ReleasePool(0, b); err != nil {
		t.Fatal(err)
	}
	if err := h.EndPool(0, a); err != nil {
		t.Fatal(err)
	}
	if err := h.ReleasePool(0, a); err != nil {
		t.Fatal(err)
	}
	if err := h.ReleasePool(0, a); !errors.Is(err, ErrPool) {
		t.Errorf("releasing a pool with no use left: %v, want ErrPool", err)
	}
	for _, p := range []uint64{p7, p8, q7} {
		if err := h.Free(0, p); err != nil {
			t.Fatal(err)
		}
	}
	if err := h.Trim(0); err != nil {
		t.Fatal(err)
	}
	d, _ := h.Device(0)
	if n := len(d.pools.byID); n != 0 {
		t.Errorf("%d pools left", n)
	}
}

// TestTorchSnapshot: the snapshot in PyTorch's layout has every live buffer
// as an active_allocated block with its site, in a segment that holds it,
// private pools' segments named by their pool; the history keeps the
// latest entries, oldest first, alloc then free_requested and
// free_completed.
func TestTorchSnapshot(t *testing.T) {
	h := newSimHost(t, "")
	began := time.Now().UnixMicro()
	if err := h.RecordHistory(0, true, 5); err != nil {
		t.Fatal(err)
	}
	d, _ := h.Device(0)
	s1, _ := d.dev.(*sim.Device).NewStream()
	var live []uint64
	for i := range 4 {
		stream := uint64(0)
		if i == 0 {
			stream = uint64(s1) // the one freed: its free entries name its stream
		}
		p, err := h.Alloc(0, uint64(i+1)*3*miB, stream, uint32(10+i))
		if err != nil {
			t.Fatal(err)
		}
		live = append(live, p)
	}
	if err := h.Free(0, live[0]); err != nil {
		t.Fatal(err)
	}
	live = live[1:]
	id := PoolID{3, 0}
	if err := h.BeginPool(0, id, RouteAll, 0, 0); err != nil {
		t.Fatal(err)
	}
	pooled, err := h.Alloc(0, miB, 0, 20)
	if err != nil {
		t.Fatal(err)
	}
	s := h.TorchSnapshot(0)
	found := map[uint64]TorchBlock{}
	for _, seg := range s.Segments {
		var sum uint64
		for _, b := range seg.Blocks {
			if b.Address < seg.Address || b.Address+b.Size > seg.Address+seg.TotalSize {
				t.Errorf("block %#x+%d outside its segment %#x+%d", b.Address, b.Size, seg.Address, seg.TotalSize)
			}
			sum += b.Size
			if b.State == "active_allocated" {
				found[b.Address] = b
				if b.Address == pooled && seg.PoolID != [2]uint64{3, 0} {
					t.Errorf("the pool's buffer is in a segment of pool %v", seg.PoolID)
				}
			}
		}
		if sum != seg.TotalSize {
			t.Errorf("segment %#x: blocks cover %d of %d bytes", seg.Address, sum, seg.TotalSize)
		}
	}
	for i, p := range live {
		if b, ok := found[p]; !ok || b.Site != uint32(11+i) || b.Requested != uint64(i+2)*3*miB {
			t.Errorf("live buffer %#x: block %+v, want active_allocated, site %d", p, b, 11+i)
		}
	}
	if b := found[pooled]; b.Site != 20 {
		t.Errorf("the pool's buffer: %+v", b)
	}
	var actions []string
	now := time.Now().UnixMicro()
	for _, e := range s.DeviceTraces[0] {
		actions = append(actions, e.Action)
		if e.TimeUS < began || e.TimeUS > now {
			t.Errorf("%s at time_us %d, want microseconds since the epoch in [%d, %d] (PyTorch's)", e.Action, e.TimeUS, began, now)
		}
		if strings.HasPrefix(e.Action, "free") && e.Stream != uint64(s1) {
			t.Errorf("%s on stream %d, want the buffer's stream %d", e.Action, e.Stream, s1)
		}
	}
	want := []string{"alloc", "alloc", "free_requested", "free_completed", "alloc"}
	if !slices.Equal(actions, want) {
		t.Errorf("history %v, want the latest five: %v", actions, want)
	}
	if err := h.RecordHistory(0, false, 0); err != nil {
		t.Fatal(err)
	}
	if s := h.TorchSnapshot(0); len(s.DeviceTraces[0]) != 0 {
		t.Errorf("history off, %d entries", len(s.DeviceTraces[0]))
	}
	if err := h.EndPool(0, id); err != nil {
		t.Fatal(err)
	}
}

// TestFreeablePools: a pool released with its buffers freed is given back
// by a trim, but not while another graph captures (the synchronize would
// break the capture), nor sooner (a later capture may use a buffer it
// freed); and an allocation that would run out of memory gets it first.
func TestFreeablePools(t *testing.T) {
	h := newSimHost(t, "limit=256MiB")
	d, _ := h.Device(0)
	sd := d.dev.(*sim.Device)
	s1, _ := sd.NewStream()
	a, b := PoolID{1, 0}, PoolID{2, 0}
	if err := h.BeginPool(0, b, RouteThread, 0, 9); err != nil {
		t.Fatal(err)
	}
	p, err := h.AllocThread(0, 160*miB, 0, 0, 9)
	if err != nil {
		t.Fatal(err)
	}
	if err := h.EndPool(0, b); err != nil {
		t.Fatal(err)
	}
	sd.BeginCapture(s1)
	if err := h.BeginPool(0, a, RouteCapture, uint64(s1), 0); err != nil {
		t.Fatal(err)
	}
	if err := h.ReleasePool(0, b); err != nil {
		t.Fatal(err)
	}
	if err := h.Free(0, p); err != nil {
		t.Fatal(err)
	}
	if err := h.Trim(0); !errors.Is(err, device.ErrCapturing) {
		t.Errorf("Trim during a capture: %v, want ErrCapturing", err)
	}
	if _, ok := d.pools.byID[b]; !ok {
		t.Error("pool b closed during a capture")
	}
	if err := sd.EndCapture(s1); err != nil {
		t.Errorf("the capture was broken: %v", err)
	}
	if err := h.EndPool(0, a); err != nil {
		t.Fatal(err)
	}
	if _, ok := d.pools.byID[b]; !ok {
		t.Error("pool b closed before a trim or a shortage")
	}
	// 160 MiB of the 256 MiB limit are b's: a 200 MiB request gets them.
	q, err := h.Alloc(0, 200*miB, 0, 0)
	if err != nil {
		t.Fatalf("200 MiB with a freeable pool holding 160 of the 256 MiB limit: %v", err)
	}
	if _, ok := d.pools.byID[b]; ok {
		t.Error("pool b still open after the shortage")
	}
	if err := h.Free(0, q); err != nil {
		t.Fatal(err)
	}
	if err := h.ReleasePool(0, a); err != nil {
		t.Fatal(err)
	}
	if err := h.Trim(0); err != nil {
		t.Fatal(err)
	}
	if n := len(d.pools.byID); n != 0 {
		t.Errorf("%d pools left", n)
	}
}

// TestRetainPool: a retained pool (a MemPool) exists with its use and no
// route, takes a thread route's allocations, counts its uses, and is
// freeable once every use is released and its buffers freed.
func TestRetainPool(t *testing.T) {
	h := newSimHost(t, "")
	id := PoolID{0, 5}
	if err := h.RetainPool(0, id); err != nil {
		t.Fatal(err)
	}
	if n := h.PoolUses(0, id); n != 1 {
		t.Fatalf("uses %d after RetainPool, want 1", n)
	}
	if err := h.BeginPool(0, id, RouteThread, 0, 3); err != nil {
		t.Fatal(err)
	}
	p, err := h.AllocThread(0, miB, 0, 0, 3)
	if err != nil {
		t.Fatal(err)
	}
	if got := h.PoolLive(0, id); !slices.Equal(got, []uint64{p}) {
		t.Errorf("pool holds %#x, want %#x", got, p)
	}
	if n := h.PoolUses(0, id); n != 2 {
		t.Errorf("uses %d inside the route, want 2", n)
	}
	for _, step := range []func() error{
		func() error { return h.EndPool(0, id) },
		func() error { return h.ReleasePool(0, id) },
		func() error { return h.Free(0, p) },
		func() error { return h.ReleasePool(0, id) },
		func() error { return h.Trim(0) },
	} {
		if err := step(); err != nil {
			t.Fatal(err)
		}
	}
	if n := h.PoolUses(0, id); n != 0 {
		t.Errorf("uses %d after every release and a trim", n)
	}
	d, _ := h.Device(0)
	if n := len(d.pools.byID); n != 0 {
		t.Errorf("%d pools left", n)
	}
}

// TestRestorePool follows torch.compile's CUDA graph trees: a recording
// into a pool by thread, a checkpoint of its live outputs, then frees and
// new allocations in the pool (a tensor dropped, another graph warmed up),
// then the pool put back: exactly the checkpoint's buffers are live again,
// at their addresses, and the next allocations, in the pool or outside,
// land elsewhere. A checkpoint that does not fit is refused and changes
// nothing.
func TestRestorePool(t *testing.T) {
	h := newSimHost(t, "limit=2GiB")
	id := PoolID{7, 1}
	const thread = 42
	alloc := func(size uint64) uint64 { t.Helper(); return mustAlloc(t, h, size, 0, thread) }
	free := func(p uint64) { t.Helper(); mustFree(t, h, p) }
	if err := h.BeginPool(0, id, RouteThread, 0, thread); err != nil {
		t.Fatal(err)
	}
	o1 := alloc(8 * miB)
	tmp := alloc(16 * miB)
	o2 := alloc(3*miB + 100)
	free(tmp)
	cp, err := h.CheckpointPool(0, id)
	if err != nil {
		t.Fatal(err)
	}
	want := []PoolBuffer{{o1, 8 * miB, 0}, {o2, 3*miB + 100, 0}}
	slices.SortFunc(want, func(x, y PoolBuffer) int { return cmp.Compare(x.Ptr, y.Ptr) })
	if !slices.Equal(cp, want) {
		t.Fatalf("checkpoint %v, want %v", cp, want)
	}
	free(o1) // the program dropped an output
	x := alloc(20 * miB)
	y := alloc(1 * miB)
	if err := h.EndPool(0, id); err != nil {
		t.Fatal(err)
	}
	before, _ := h.Stats(0)

	bad := []PoolBuffer{{o1, 8 * miB, 0}, {o1 + miB, miB, 0}}
	if _, err := h.RestorePool(0, id, bad); !errors.Is(err, ErrPool) || !strings.Contains(err.Error(), "overlap") {
		t.Errorf("RestorePool of overlapping buffers: %v, want a refusal", err)
	}
	if _, err := h.RestorePool(0, id, append(slices.Clone(cp), PoolBuffer{1 << 50, 512, 0})); !errors.Is(err, ErrPool) || !strings.Contains(err.Error(), "not in the pool's memory") {
		t.Errorf("RestorePool of a buffer outside the pool: %v, want a refusal", err)
	}
	if _, err := h.RestorePool(0, PoolID{9, 9}, cp); !errors.Is(err, ErrPool) {
		t.Errorf("RestorePool of an unknown pool: %v, want ErrPool", err)
	}
	if got := sortedLive(h, id); !slices.Equal(got, sorted(o2, x, y)) {
		t.Fatalf("the refusals changed the pool: live %#x, want %#x", got, sorted(o2, x, y))
	}
	if st, _ := h.Stats(0); st.Allocated != before.Allocated {
		t.Errorf("the refusals changed the books: allocated %d, was %d", st.Allocated, before.Allocated)
	}

	freed, err := h.RestorePool(0, id, cp)
	if err != nil {
		t.Fatal(err)
	}
	if slices.Sort(freed); !slices.Equal(freed, sorted(o2, x, y)) {
		t.Errorf("freed %#x, want the pool's live buffers %#x", freed, sorted(o2, x, y))
	}
	if got := sortedLive(h, id); !slices.Equal(got, sorted(o1, o2)) {
		t.Errorf("after the restore the pool's live buffers are %#x, want the checkpoint's %#x", got, sorted(o1, o2))
	}
	st, _ := h.Stats(0)
	if wantAlloc := before.Allocated - 20*miB - miB + 8*miB; st.Allocated != wantAlloc {
		t.Errorf("allocated %d after the restore, want %d", st.Allocated, wantAlloc)
	}
	// New allocations, in the pool and outside it, keep off the restored
	// buffers; the restored ones free as any other.
	if err := h.BeginPool(0, id, RouteThread, 0, thread); err != nil {
		t.Fatal(err)
	}
	in := alloc(8 * miB)
	if err := h.EndPool(0, id); err != nil {
		t.Fatal(err)
	}
	out, err := h.Alloc(0, 8*miB, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range []uint64{in, out} {
		for _, r := range want {
			if p < r.Ptr+r.Size && r.Ptr < p+8*miB {
				t.Errorf("a new buffer at %#x overlaps the restored %#x", p, r.Ptr)
			}
		}
	}
	for _, p := range []uint64{o1, o2, in, out} {
		free(p)
	}
	if n := h.Live(0); n != 0 {
		t.Errorf("%d buffers live after every free", n)
	}
}

func sorted(ps ...uint64) []uint64 { slices.Sort(ps); return ps }

func sortedLive(h *Host, id PoolID) []uint64 { return sorted(h.PoolLive(0, id)...) }

// TestHoldCaptureCoversTheWindow: between a stream capture's start and the
// route BeginPool opens for it (PyTorch begins the capture first, and only
// then is its id known), a free of a buffer another stream used records
// an event on the capturing stream, which breaks the capture, unless the
// capture was held before it began.
func TestHoldCaptureCoversTheWindow(t *testing.T) {
	for _, hold := range []bool{false, true} {
		h := newSimHost(t, "")
		d, err := h.Device(0)
		if err != nil {
			t.Fatal(err)
		}
		sd := d.dev.(*sim.Device)
		s1, _ := sd.NewStream()
		s2, _ := sd.NewStream()
		p, err := h.Alloc(0, 4*miB, uint64(s2), 0)
		if err != nil {
			t.Fatal(err)
		}
		if err := h.RecordStream(0, p, uint64(s1)); err != nil { // s1's work reads it
			t.Fatal(err)
		}
		if hold {
			if err := h.HoldCapture(0); err != nil {
				t.Fatal(err)
			}
		}
		sd.BeginCapture(s1)
		if err := h.Free(0, p); err != nil { // the window: another thread frees
			t.Fatal(err)
		}
		if err := h.BeginPool(0, PoolID{3, 0}, RouteCapture, uint64(s1), 0); err != nil {
			t.Fatal(err)
		}
		if hold {
			if err := h.ReleaseCapture(0); err != nil {
				t.Fatal(err)
			}
		}
		if err := h.EndPool(0, PoolID{3, 0}); err != nil {
			t.Fatal(err)
		}
		broken := sd.EndCapture(s1) != nil
		if broken != !hold {
			t.Errorf("hold %v: capture broken %v; want broken only without the hold", hold, broken)
		}
		if d.Alloc.Capturing() {
			t.Errorf("hold %v: the allocator still counts a capture", hold)
		}
	}
	h := newSimHost(t, "")
	if err := h.ReleaseCapture(0); !errors.Is(err, ErrPool) {
		t.Errorf("ReleaseCapture with none held: %v, want ErrPool", err)
	}
}

// TestTorchSegmentsTileTheirRanges: in a virtual arena whose frees leave
// unmapped gaps, so that its spans form many runs (a PyTorch segment
// each), every segment's blocks tile its range exactly, and every live
// buffer appears once, allocated, with its size.
func TestTorchSegmentsTileTheirRanges(t *testing.T) {
	h := newSimHost(t, "mode=virtual")
	var live, gone []uint64
	sizes := map[uint64]uint64{}
	for i := range 120 {
		n := uint64(1+i%5) * miB // live: 1-5 MiB
		if i%3 == 1 {
			n = 48 * miB // freed: whole spans, unmapped by Trim
		}
		p, err := h.Alloc(0, n, 0, 0)
		if err != nil {
			t.Fatal(err)
		}
		if i%3 == 1 {
			gone = append(gone, p)
			continue
		}
		live = append(live, p)
		sizes[p] = n
	}
	for _, p := range gone {
		if err := h.Free(0, p); err != nil {
			t.Fatal(err)
		}
	}
	if err := h.Trim(0); err != nil { // unmaps the emptied spans: gaps between runs
		t.Fatal(err)
	}
	s := h.TorchSnapshot(0)
	if len(s.Segments) < 2 {
		t.Fatalf("%d segments: want several runs of spans", len(s.Segments))
	}
	seen := map[uint64]int{}
	for _, seg := range s.Segments {
		at := seg.Address
		for _, b := range seg.Blocks {
			if b.Address != at {
				t.Fatalf("segment %#x: a block at %#x, want %#x (blocks tile the segment)", seg.Address, b.Address, at)
			}
			at += b.Size
			if b.State == "active_allocated" {
				seen[b.Address]++
				if b.Requested != sizes[b.Address] {
					t.Errorf("block %#x: requested %d, want %d", b.Address, b.Requested, sizes[b.Address])
				}
			}
		}
		if at != seg.Address+seg.TotalSize {
			t.Fatalf("segment %#x: blocks end at %#x, the segment at %#x", seg.Address, at, seg.Address+seg.TotalSize)
		}
	}
	for _, p := range live {
		if seen[p] != 1 {
			t.Errorf("live buffer %#x appears %d times", p, seen[p])
		}
	}
}

// TestPeakReservedAcrossPools: the device's reserved peak counts what its
// allocator and its private pools held at the same time, not the sum of
// their own peaks, which need not coincide; ResetPeaks starts it over.
func TestPeakReservedAcrossPools(t *testing.T) {
	h := newSimHost(t, "mode=plain")
	mustFree(t, h, mustAlloc(t, h, 100*miB, 0, 0))
	if err := h.Trim(0); err != nil {
		t.Fatal(err)
	}
	if err := h.BeginPool(0, PoolID{4, 0}, RouteAll, 0, 0); err != nil {
		t.Fatal(err)
	}
	q := mustAlloc(t, h, 60*miB, 0, 0) // the pool's: the root holds nothing now
	if err := h.EndPool(0, PoolID{4, 0}); err != nil {
		t.Fatal(err)
	}
	st, _ := h.Stats(0)
	if st.Reserved < 60*miB || st.Reserved >= 100*miB {
		t.Fatalf("reserved %d MiB, want the pool's 60 MiB segment", st.Reserved/miB)
	}
	if st.PeakReserved < 100*miB || st.PeakReserved >= 160*miB {
		t.Errorf("peak reserved %d MiB: want the 100 MiB the root held first, not the sum of the two peaks (160)", st.PeakReserved/miB)
	}
	h.ResetPeaks(0)
	if st, _ = h.Stats(0); st.PeakReserved != st.Reserved {
		t.Errorf("after ResetPeaks: peak reserved %d, reserved %d", st.PeakReserved, st.Reserved)
	}
	mustFree(t, h, q)
}

// mustAlloc allocates size bytes on device 0 for stream by thread (0: no
// thread), failing the test on an error.
func mustAlloc(t *testing.T, h *Host, size, stream, thread uint64) uint64 {
	t.Helper()
	p, err := h.AllocThread(0, size, stream, 0, thread)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// mustFree frees p on device 0, failing the test on an error.
func mustFree(t *testing.T, h *Host, p uint64) {
	t.Helper()
	if err := h.Free(0, p); err != nil {
		t.Fatal(err)
	}
}

// simSource is a gpumem.SegmentSource over the simulated device that
// counts its calls (a CUDAPluggableAllocator of a MemPool).
type simSource struct {
	dev           *sim.Device
	allocs, frees atomic.Int32
}

func (s *simSource) Alloc(size uint64, _ device.Stream) (device.Ptr, error) {
	s.allocs.Add(1)
	return s.dev.Alloc(size)
}

func (s *simSource) Free(p device.Ptr, _ uint64, _ device.Stream) error {
	s.frees.Add(1)
	return s.dev.Free(p)
}

// TestPoolUseOnOOM is PyTorch's test_mempool_limited_memory_with_allocator
// on the simulated device: under a limit of 80 MiB, two pools with an
// allocator of their own hold 40 MiB each, one of them made with
// UseOnOOM; once both are freed, 30 MiB of the device's own comes from the
// UseOnOOM pool, at its buffer's address, a second 30 MiB runs out of
// memory (the other pool serves no one else), and the pool serves its own
// again afterwards. Both pools' segments came from their source, and go
// back there once the pools are released and trimmed.
func TestPoolUseOnOOM(t *testing.T) {
	h := newSimHost(t, "limit=80MiB")
	d, err := h.Device(0)
	if err != nil {
		t.Fatal(err)
	}
	src := &simSource{dev: d.dev.(*sim.Device)}
	keep, use := PoolID{0, 1}, PoolID{0, 2}
	if err := h.RetainPoolWith(0, keep, PoolOptions{Segments: src}); err != nil {
		t.Fatal(err)
	}
	if err := h.RetainPoolWith(0, use, PoolOptions{Segments: src, UseOnOOM: true}); err != nil {
		t.Fatal(err)
	}
	if err := h.RetainPoolWith(0, use, PoolOptions{}); !errors.Is(err, ErrPool) {
		t.Errorf("a pool made again with options: %v, want ErrPool", err)
	}
	inPool := func(id PoolID, size uint64) uint64 {
		t.Helper()
		if err := h.BeginPool(0, id, RouteAll, 0, 0); err != nil {
			t.Fatal(err)
		}
		defer func() {
			if err := h.EndPool(0, id); err != nil {
				t.Fatal(err)
			}
			if err := h.ReleasePool(0, id); err != nil {
				t.Fatal(err)
			}
		}()
		return mustAlloc(t, h, size, 0, 0)
	}
	a := inPool(keep, 40*miB)
	b := inPool(use, 40*miB)
	if _, err := h.Alloc(0, 40*miB, 0, 0); !errors.Is(err, gpumem.ErrOutOfMemory) {
		t.Fatalf("40 MiB of the device's own with both pools full: %v, want out of memory", err)
	}
	mustFree(t, h, a)
	mustFree(t, h, b)
	c := mustAlloc(t, h, 30*miB, 0, 0)
	if c != b {
		t.Errorf("30 MiB in need is at %#x, want %#x (the UseOnOOM pool's free memory)", c, b)
	}
	if live := h.PoolLive(0, use); !slices.Equal(live, []uint64{c}) {
		t.Errorf("the UseOnOOM pool's live buffers: %#x, want [%#x]", live, c)
	}
	if _, err := h.Alloc(0, 30*miB, 0, 0); !errors.Is(err, gpumem.ErrOutOfMemory) {
		t.Errorf("a second 30 MiB: %v, want out of memory (the other pool is not UseOnOOM)", err)
	}
	mustFree(t, h, c)
	e := inPool(use, 20*miB)
	if e != c {
		t.Errorf("the pool's own 20 MiB is at %#x, want %#x", e, c)
	}
	mustFree(t, h, e)
	if n := src.allocs.Load(); n != 2 {
		t.Errorf("the source made %d segments, want 2 (one a pool)", n)
	}
	for _, id := range []PoolID{keep, use} {
		if err := h.ReleasePool(0, id); err != nil {
			t.Fatal(err)
		}
	}
	if err := h.Trim(0); err != nil {
		t.Fatal(err)
	}
	if n := src.frees.Load(); n != 2 {
		t.Errorf("the source got %d segments back after the pools were released and trimmed, want 2", n)
	}
	// A released UseOnOOM pool serves no one: 60 MiB fits the limit now.
	mustFree(t, h, mustAlloc(t, h, 60*miB, 0, 0))
	if d.pools.onOOM.Load() != 0 {
		t.Errorf("%d UseOnOOM pools counted after both closed", d.pools.onOOM.Load())
	}
}

// TestDropPool: the object that made a pool gone (PyTorch's ~MemPool),
// the pool's memory goes back at once when nothing else holds it; a pool
// whose buffer still lives keeps it until the buffer is freed and a Trim
// comes, as a released graph pool does.
func TestDropPool(t *testing.T) {
	h := newSimHost(t, "")
	d, err := h.Device(0)
	if err != nil {
		t.Fatal(err)
	}
	empty, held := PoolID{0, 1}, PoolID{0, 2}
	var live uint64
	for _, id := range []PoolID{empty, held} {
		if err := h.RetainPool(0, id); err != nil {
			t.Fatal(err)
		}
		if err := h.BeginPool(0, id, RouteAll, 0, 0); err != nil {
			t.Fatal(err)
		}
		p := mustAlloc(t, h, 4*miB, 0, 0)
		if err := h.EndPool(0, id); err != nil {
			t.Fatal(err)
		}
		if err := h.ReleasePool(0, id); err != nil { // the use BeginPool counted
			t.Fatal(err)
		}
		if id == empty {
			mustFree(t, h, p)
		} else {
			live = p
		}
	}
	if err := h.DropPool(0, empty); err != nil {
		t.Fatal(err)
	}
	if h.PoolUses(0, empty) != 0 || d.pools.byID[empty] != nil {
		t.Errorf("an empty pool dropped is still there")
	}
	before := h.PoolReserved(0)
	if err := h.DropPool(0, held); err != nil {
		t.Fatal(err)
	}
	if got := h.PoolReserved(0); got != before || got == 0 {
		t.Errorf("a pool with a live buffer, dropped: %d bytes held, want its %d kept", got, before)
	}
	mustFree(t, h, live)
	if err := h.Trim(0); err != nil {
		t.Fatal(err)
	}
	if got := h.PoolReserved(0); got != 0 {
		t.Errorf("after its buffer was freed and a Trim: %d bytes held by pools", got)
	}
	if err := h.DropPool(0, held); err != nil {
		t.Errorf("dropping a pool already closed: %v, want none (as ReleasePool)", err)
	}
}

// TestSnapshotAndSourcesHoldPools: a private pool's memory is in the
// device's snapshot (its segments, named by the pool) and in the numbers
// the HTTP handler, the metrics and `gpumem top` read (Sources), not only
// in Host.Stats: gpumem tells every byte it holds.
func TestSnapshotAndSourcesHoldPools(t *testing.T) {
	h := newSimHost(t, "")
	id := PoolID{0, 7}
	own := mustAlloc(t, h, 4*miB, 0, 0)
	if err := h.BeginPool(0, id, RouteAll, 0, 0); err != nil {
		t.Fatal(err)
	}
	pooled := mustAlloc(t, h, 30*miB, 0, 0)
	if err := h.EndPool(0, id); err != nil {
		t.Fatal(err)
	}
	snap, err := h.Snapshot(0)
	if err != nil {
		t.Fatal(err)
	}
	var inPool, own2 bool
	var segBytes uint64
	for _, seg := range snap.Segments {
		segBytes += seg.MappedBytes
		for _, b := range seg.Blocks {
			if b.Address == pooled && slices.Equal(seg.PrivatePool, []uint64{0, 7}) {
				inPool = true
			}
			if b.Address == own && seg.PrivatePool == nil {
				own2 = true
			}
		}
	}
	st, _ := h.Stats(0)
	if !inPool || !own2 {
		t.Errorf("snapshot: the pool's buffer in a segment named (0, 7): %v; the device's own in an unnamed one: %v", inPool, own2)
	}
	if snap.Stats.Reserved != st.Reserved || snap.Stats.LiveBuffers != 2 {
		t.Errorf("snapshot's stats: %d reserved, %d buffers; want Host.Stats' %d and 2", snap.Stats.Reserved, snap.Stats.LiveBuffers, st.Reserved)
	}
	if segBytes > st.Reserved {
		t.Errorf("the snapshot's segments map %d bytes, more than the %d reserved", segBytes, st.Reserved)
	}
	srcs := h.Sources()
	if len(srcs) != 1 || srcs[0].AllStats().Reserved != st.Reserved || len(srcs[0].Private) != 1 {
		t.Errorf("Sources: %d, reserved %d, %d private; want 1, %d, 1", len(srcs), srcs[0].AllStats().Reserved, len(srcs[0].Private), st.Reserved)
	}
	if got := srcs[0].AllSnapshot(); len(got.Segments) != len(snap.Segments) {
		t.Errorf("Sources' snapshot has %d segments, Host.Snapshot %d", len(got.Segments), len(snap.Segments))
	}
	mustFree(t, h, pooled)
	mustFree(t, h, own)
	if err := h.ReleasePool(0, id); err != nil {
		t.Fatal(err)
	}
}

// TestReleasedPoolGivesUnusedBack: a graph's pool released while one of
// its buffers (the graph's output) lives gives back, at the next Trim, the
// segments no buffer uses, as PyTorch's empty_cache does, and keeps the
// live buffer's; before its release the Trim gives back nothing of it.
func TestReleasedPoolGivesUnusedBack(t *testing.T) {
	h := newSimHost(t, "")
	id := PoolID{0, 11}
	if err := h.BeginPool(0, id, RouteAll, 0, 0); err != nil {
		t.Fatal(err)
	}
	out := mustAlloc(t, h, 12*miB, 0, 0)     // a segment of its own
	scratch := mustAlloc(t, h, 40*miB, 0, 0) // another
	if err := h.EndPool(0, id); err != nil {
		t.Fatal(err)
	}
	mustFree(t, h, scratch)
	held := h.PoolReserved(0)
	if err := h.Trim(0); err != nil {
		t.Fatal(err)
	}
	if got := h.PoolReserved(0); got != held {
		t.Errorf("a pool still in use gave back memory at Trim: %d -> %d", held, got)
	}
	if err := h.ReleasePool(0, id); err != nil { // the graph is gone; out lives
		t.Fatal(err)
	}
	if err := h.Trim(0); err != nil {
		t.Fatal(err)
	}
	if got := h.PoolReserved(0); got >= held || got < 12*miB {
		t.Errorf("a released pool with a live output holds %d bytes after Trim, want its output's segment of the %d", got, held)
	}
	if live := h.PoolLive(0, id); !slices.Equal(live, []uint64{out}) {
		t.Errorf("the pool's live buffers after the Trim: %#x, want [%#x]", live, out)
	}
	mustFree(t, h, out)
	if err := h.Trim(0); err != nil {
		t.Fatal(err)
	}
	if got := h.PoolReserved(0); got != 0 {
		t.Errorf("once the output is freed, the pool holds %d bytes after Trim", got)
	}
}

// TestMemInfoAgreesWithStats: MemInfo, which reads only the allocators'
// held and active bytes (Allocator.Held), answers what the full Stats of
// the device's allocator and its private pools say, in random states with
// a private pool holding memory.
func TestMemInfoAgreesWithStats(t *testing.T) {
	h := newSimHost(t, "limit=3GiB") // the limit, not the device, bounds the room
	d, err := h.Device(0)
	if err != nil {
		t.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(5, 6))
	var live []uint64
	pool := PoolID{0, 9}
	for i := range 600 {
		if i == 200 {
			if err := h.BeginPool(0, pool, RouteThread, 0, 3); err != nil {
				t.Fatal(err)
			}
		}
		if len(live) > 0 && rng.IntN(3) == 0 {
			k := rng.IntN(len(live))
			if err := h.Free(0, live[k]); err != nil {
				t.Fatal(err)
			}
			live = slices.Delete(live, k, k+1)
		} else {
			p, err := h.AllocThread(0, uint64(1+rng.IntN(8<<20)), 0, 0, uint64(rng.IntN(4))) // thread 3: the pool's
			if err != nil {
				t.Fatal(err)
			}
			live = append(live, p)
		}
		if i%50 != 49 {
			continue
		}
		free, total, err := h.MemInfo(0)
		if err != nil {
			t.Fatal(err)
		}
		st := d.Alloc.Stats()
		all := st
		d.poolStats(&all)
		devFree, _, _ := d.dev.MemInfo()
		want := st.Cached
		if lim := d.Alloc.Limit(); lim > all.Reserved {
			want += min(lim-all.Reserved, devFree)
		}
		if free != want || total != d.Alloc.Limit() {
			t.Fatalf("step %d: MemInfo free %d, total %d; from Stats %d, %d", i, free, total, want, d.Alloc.Limit())
		}
	}
	if h.PoolReserved(0) == 0 {
		t.Fatal("the private pool holds nothing: the test did not test it")
	}
}

// TestUsageMatchesStats: Host.Usage, the figures of Stats kept as counts
// (torch.cuda.memory_allocated and the like, the shim's pool attributes),
// is Stats' own at every point: the device's allocator and a private
// pool together, after allocations in both, frees, a trim and a reset of
// the peaks.
func TestUsageMatchesStats(t *testing.T) {
	h := newSimHost(t, "")
	same := func(when string) {
		t.Helper()
		u, err := h.Usage(0)
		if err != nil {
			t.Fatal(err)
		}
		s, err := h.Stats(0)
		if err != nil {
			t.Fatal(err)
		}
		want := gpumem.Usage{Allocated: s.Allocated, Active: s.Active, Reserved: s.Reserved,
			PeakAllocated: s.PeakAllocated, PeakActive: s.PeakActive, PeakReserved: s.PeakReserved}
		if u != want {
			t.Errorf("%s: Usage %+v, Stats' %+v", when, u, want)
		}
	}
	same("before any allocation")
	a := mustAlloc(t, h, 5*miB, 0, 0)
	id := PoolID{0, 1}
	if err := h.RetainPool(0, id); err != nil {
		t.Fatal(err)
	}
	if err := h.BeginPool(0, id, RouteAll, 0, 0); err != nil {
		t.Fatal(err)
	}
	p := mustAlloc(t, h, 7*miB+3, 0, 0)
	if err := h.EndPool(0, id); err != nil {
		t.Fatal(err)
	}
	b := mustAlloc(t, h, 30*miB, 0, 0)
	same("live in the allocator and in a pool")
	if u, _ := h.Usage(0); u.Allocated != 42*miB+3 || u.Reserved == 0 || h.PoolReserved(0) == 0 {
		t.Errorf("Usage %+v with 42 MiB + 3 live, %d bytes in the pool", u, h.PoolReserved(0))
	}
	mustFree(t, h, b)
	same("after a free")
	if err := h.Trim(0); err != nil {
		t.Fatal(err)
	}
	same("after a trim")
	h.ResetPeaks(0)
	same("after the peaks' reset")
	mustFree(t, h, p)
	mustFree(t, h, a)
	if err := h.ReleasePool(0, id); err != nil {
		t.Fatal(err)
	}
	same("all freed")
	if _, err := h.Usage(-1); err == nil {
		t.Error("Usage of device -1: no error")
	}
}
