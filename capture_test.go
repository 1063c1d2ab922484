package gpumem_test

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/gpumem/gpumem"
	"github.com/gpumem/gpumem/device"
)

// TestCaptureMakesNoForbiddenCall: while a stream captures, an allocator
// told so (BeginCapture) serves requests on two streams, under a limit that
// forces the slow path, frees named on the capturing stream by
// RecordStream, empties spans and runs out of memory, without recording,
// querying or waiting for an event on the capturing stream or
// synchronizing the device: the simulated device refuses each of these
// and marks the capture broken, as the driver does. Once the capture ends,
// the frees it kept pending go back.
func TestCaptureMakesNoForbiddenCall(t *testing.T) {
	for _, mode := range []gpumem.Mode{gpumem.ModeVirtual, gpumem.ModePlain} {
		t.Run(mode.String(), func(t *testing.T) {
			dev := newSim(1 << 30)
			a := newAlloc(t, dev, gpumem.Config{Mode: mode, Limit: 256 * miB, SpanSize: 4 * miB})
			s0, _ := dev.NewStream()
			s1, _ := dev.NewStream()
			// Memory on both streams before the capture, some of it
			// freed with its work still pending on s0.
			var before []gpumem.Buffer
			for i := range 8 {
				b, err := a.Alloc(uint64(i+1)*miB, []device.Stream{s0, s1}[i%2])
				if err != nil {
					t.Fatal(err)
				}
				before = append(before, b)
			}
			shared, err := a.Alloc(8*miB, s0)
			if err != nil {
				t.Fatal(err)
			}
			dev.Hold(s0)

			a.BeginCapture()
			dev.BeginCapture(s1)
			if err := a.RecordStream(shared, s1); err != nil {
				t.Fatal(err)
			}
			if err := a.Free(shared); err != nil { // pending: s1 captures
				t.Fatal(err)
			}
			for _, b := range before {
				if err := a.Free(b); err != nil {
					t.Fatal(err)
				}
			}
			var live []gpumem.Buffer
			for i := range 40 {
				s := []device.Stream{s0, s1}[i%2]
				b, err := a.Alloc(uint64(1+i%7)*3*miB, s)
				if errors.Is(err, gpumem.ErrOutOfMemory) {
					break
				}
				if err != nil {
					t.Fatalf("alloc %d during the capture: %v", i, err)
				}
				live = append(live, b)
				if i%3 == 0 {
					if err := a.Free(live[0]); err != nil {
						t.Fatal(err)
					}
					live = live[1:]
				}
			}
			if err := a.Trim(); !errors.Is(err, device.ErrCapturing) {
				t.Errorf("Trim during a capture: %v, want an error matching device.ErrCapturing", err)
			}
			mustCheck(t, a, "the capture's allocations")
			if v := dev.Stats().CaptureViolations; v != 0 {
				t.Errorf("%d calls the driver forbids during a capture", v)
			}
			if err := dev.EndCapture(s1); err != nil {
				t.Errorf("the capture was broken: %v", err)
			}
			a.EndCapture()
			dev.Drain(s0)

			for _, b := range live {
				if err := a.Free(b); err != nil {
					t.Fatal(err)
				}
			}
			if err := a.Trim(); err != nil {
				t.Fatal(err)
			}
			if st := a.Stats(); st.Reserved != 0 {
				t.Errorf("after the capture and a trim the allocator holds %d bytes, want 0 (the pending free went back)", st.Reserved)
			}
		})
	}
}

// TestEndCaptureWithoutBegin panics: an unmatched EndCapture would hide the
// next capture from the allocator.
func TestEndCaptureWithoutBegin(t *testing.T) {
	a := newAlloc(t, newSim(1<<30), gpumem.Config{})
	defer func() {
		if recover() == nil {
			t.Error("EndCapture without BeginCapture did not panic")
		}
	}()
	a.EndCapture()
}

// TestPrivatePool: a private pool's memory is its own (a buffer freed there
// never serves the root, nor the root's the pool), it counts against the
// root's limit (an out-of-memory of the root says so), Trim and the root's
// reclaim leave it where it is, and its Close gives it all back.
func TestPrivatePool(t *testing.T) {
	dev := newSim(1 << 30)
	a := newAlloc(t, dev, gpumem.Config{Limit: 96 * miB})
	s, _ := dev.NewStream()
	p, err := a.NewPrivate()
	if err != nil {
		t.Fatal(err)
	}
	if !p.Private() || a.Private() {
		t.Fatalf("Private: pool %v, root %v", p.Private(), a.Private())
	}
	x, err := p.Alloc(40*miB, s)
	if err != nil {
		t.Fatal(err)
	}
	xp := x.Ptr()
	if err := p.Free(x); err != nil {
		t.Fatal(err)
	}
	// The root may take what the limit leaves (96 - 40), not the pool's
	// free 40 MiB.
	y, err := a.Alloc(40*miB, s)
	if err != nil {
		t.Fatal(err)
	}
	if lo, hi := y.Ptr(), y.Ptr()+device.Ptr(y.Size()); xp < hi && lo < xp+40*miB {
		t.Fatalf("the root's buffer [%#x, %#x) overlaps the pool's freed buffer at %#x", lo, hi, xp)
	}
	_, err = a.Alloc(40*miB, s)
	var oom *gpumem.OutOfMemoryError
	if !errors.As(err, &oom) {
		t.Fatalf("a second 40 MiB on the root: %v, want an out-of-memory (the pool holds 40 of the 96 MiB limit)", err)
	}
	if oom.Cause != gpumem.CauseLimit || oom.Family != p.Stats().Reserved {
		t.Errorf("verdict: cause %s, family %d; want limit, %d (the pool's)", oom.Cause, oom.Family, p.Stats().Reserved)
	}
	if err := p.Trim(); err != nil {
		t.Fatal(err)
	}
	if err := a.Trim(); err != nil {
		t.Fatal(err)
	}
	if r := p.Stats().Reserved; r < 40*miB {
		t.Errorf("the pool holds %d bytes after Trim, want its 40 MiB kept", r)
	}
	// The pool's freed memory serves the pool again, at the same address.
	z, err := p.Alloc(40*miB, s)
	if err != nil {
		t.Fatal(err)
	}
	if z.Ptr() != xp {
		t.Errorf("the pool's next 40 MiB is at %#x, want %#x (its own free memory)", z.Ptr(), xp)
	}
	mustCheck(t, a, "the root's allocations")
	mustCheck(t, p, "the pool's allocations")
	if err := p.Close(); !errors.Is(err, gpumem.ErrLeak) {
		t.Errorf("Close of a pool with a live buffer: %v, want a leak", err)
	}
	if r := p.Stats().Reserved; r != 0 {
		t.Errorf("a closed pool holds %d bytes", r)
	}
	// With the pool gone, the root may take the whole limit.
	if err := a.Free(y); err != nil {
		t.Fatal(err)
	}
	if _, err := a.Alloc(90*miB, s); err != nil {
		t.Errorf("90 MiB of a 96 MiB limit once the pool is closed: %v", err)
	}
}

// TestAllocAt: a private pool's buffers, freed, are made again at their
// addresses (a checkpoint put back), in any order, including one whose
// free waited for another stream; the pool's books count them as any
// buffer; a range in use, outside the pool, or on the root is refused and
// changes nothing.
func TestAllocAt(t *testing.T) {
	dev := newSim(1 << 30)
	a := newAlloc(t, dev, gpumem.Config{Limit: 256 * miB, CheckInvariants: true})
	s, _ := dev.NewStream()
	s2, _ := dev.NewStream()
	p, err := a.NewPrivate()
	if err != nil {
		t.Fatal(err)
	}
	sizes := []uint64{3 * miB, 700, 5*miB + 1, 64 << 10, 12 * miB}
	var bufs []gpumem.Buffer
	for _, n := range sizes {
		b, err := p.Alloc(n, s)
		if err != nil {
			t.Fatal(err)
		}
		bufs = append(bufs, b)
	}
	if err := p.RecordStream(bufs[2], s2); err != nil {
		t.Fatal(err)
	}
	want := p.Stats()
	for _, b := range bufs {
		if err := p.Free(b); err != nil {
			t.Fatal(err)
		}
	}
	for _, i := range []int{3, 0, 4, 2, 1} {
		b, err := p.AllocAt(bufs[i].Ptr(), sizes[i])
		if err != nil {
			t.Fatalf("AllocAt(%#x, %d): %v", bufs[i].Ptr(), sizes[i], err)
		}
		if b.Ptr() != bufs[i].Ptr() || b.Size() != sizes[i] {
			t.Fatalf("AllocAt(%#x, %d) = %#x, %d bytes", bufs[i].Ptr(), sizes[i], b.Ptr(), b.Size())
		}
		bufs[i] = b
	}
	mustCheck(t, p, "after AllocAt")
	got := p.Stats()
	if got.Allocated != want.Allocated || got.Active != want.Active || got.Reserved != want.Reserved || got.LiveBuffers != want.LiveBuffers {
		t.Errorf("after the restore: allocated %d, active %d, reserved %d, live %d; want %d, %d, %d, %d as before the frees",
			got.Allocated, got.Active, got.Reserved, got.LiveBuffers, want.Allocated, want.Active, want.Reserved, want.LiveBuffers)
	}
	// Refusals, each changing nothing.
	if _, err := p.AllocAt(bufs[0].Ptr(), 512); err == nil || !strings.Contains(err.Error(), "not free") {
		t.Errorf("AllocAt over a live buffer: %v, want a refusal naming it", err)
	}
	if _, err := p.AllocAt(bufs[4].Ptr()+device.Ptr(bufs[4].Size()), 1<<40); !errors.Is(err, gpumem.ErrForeign) && (err == nil || !strings.Contains(err.Error(), "not free")) {
		t.Errorf("AllocAt past the pool's memory: %v", err)
	}
	if _, err := p.AllocAt(1<<50, 512); !errors.Is(err, gpumem.ErrForeign) {
		t.Errorf("AllocAt outside the pool: %v, want ErrForeign", err)
	}
	if _, err := a.AllocAt(bufs[0].Ptr(), 512); !errors.Is(err, gpumem.ErrForeign) {
		t.Errorf("AllocAt on the root: %v, want ErrForeign", err)
	}
	if _, err := p.AllocAt(bufs[0].Ptr(), 0); !errors.Is(err, gpumem.ErrInvalidSize) {
		t.Errorf("AllocAt of 0 bytes: %v, want ErrInvalidSize", err)
	}
	if st := p.Stats(); st.Allocated != want.Allocated || st.LiveBuffers != want.LiveBuffers {
		t.Errorf("the refusals changed the books: allocated %d, live %d", st.Allocated, st.LiveBuffers)
	}
	for _, b := range bufs {
		if err := p.Free(b); err != nil {
			t.Fatal(err)
		}
	}
	if err := p.Close(); err != nil {
		t.Errorf("Close after every restored buffer is freed: %v", err)
	}
}

// countingSource is a SegmentSource over the simulated device that counts
// what it gives and checks that every Free names a segment it gave, with
// the size it was given.
type countingSource struct {
	dev           simDevice
	sizes         map[device.Ptr]uint64
	fail          bool // Alloc answers out-of-memory
	allocs, frees int
	bad           []string
}

func (c *countingSource) Alloc(size uint64, s device.Stream) (device.Ptr, error) {
	if c.fail {
		return 0, fmt.Errorf("the pool's allocator returned NULL: %w", device.ErrOutOfMemory)
	}
	p, err := c.dev.Alloc(size)
	if err == nil {
		c.sizes[p] = size
		c.allocs++
	}
	return p, err
}

func (c *countingSource) Free(p device.Ptr, size uint64, s device.Stream) error {
	if got, ok := c.sizes[p]; !ok || got != size {
		c.bad = append(c.bad, fmt.Sprintf("Free(%#x, %d): gave %d there", uint64(p), size, got))
	}
	delete(c.sizes, p)
	c.frees++
	return c.dev.Free(p)
}

// TestPrivateSegmentSource: a private pool with a SegmentSource takes its
// segments there and nowhere else, counts them against the root's limit,
// reuses them as any pool (PyTorch's MemPool(allocator)), and gives each
// back there with its size at Close; a source out of room is an
// out-of-memory of the pool, and the pool still works afterwards.
func TestPrivateSegmentSource(t *testing.T) {
	dev := newSim(1 << 30)
	a := newAlloc(t, dev, gpumem.Config{Limit: 64 * miB, CheckInvariants: true})
	s, _ := dev.NewStream()
	src := &countingSource{dev: dev, sizes: map[device.Ptr]uint64{}}
	p, err := a.NewPrivateWith(gpumem.PrivateConfig{Segments: src})
	if err != nil {
		t.Fatal(err)
	}
	before := dev.Stats().Allocs
	x, err := p.Alloc(4*miB, s)
	if err != nil {
		t.Fatal(err)
	}
	y, err := p.Alloc(4*miB, s) // the same 20 MiB segment (PyTorch's rule for mid sizes)
	if err != nil {
		t.Fatal(err)
	}
	if src.allocs != 1 || dev.Stats().Allocs-before != 1 {
		t.Errorf("two 4 MiB buffers: %d segments from the source, %d device allocations; want 1 and 1 (the source's own)", src.allocs, dev.Stats().Allocs-before)
	}
	if _, ok := src.sizes[device.Ptr(x.Ptr())]; !ok {
		t.Errorf("the first buffer at %#x is not at the start of the source's segment", x.Ptr())
	}
	// The source's 20 MiB count against the 64 MiB limit of the root.
	if b, err := a.Alloc(50*miB, s); !errors.Is(err, gpumem.ErrOutOfMemory) {
		_ = a.Free(b)
		t.Errorf("50 MiB on the root with 20 of 64 MiB in the pool: %v, want an out-of-memory", err)
	}
	src.fail = true
	_, err = p.Alloc(30*miB, s)
	var oom *gpumem.OutOfMemoryError
	if !errors.As(err, &oom) {
		t.Fatalf("a source out of room: %v, want an out-of-memory", err)
	}
	src.fail = false
	mustCheck(t, p, "a source out of room")
	if err := p.Free(x); err != nil {
		t.Fatal(err)
	}
	if err := p.Free(y); err != nil {
		t.Fatal(err)
	}
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	if src.frees != src.allocs || len(src.sizes) != 0 || len(src.bad) > 0 {
		t.Errorf("Close: %d of %d segments back to the source, %d left, wrong frees %v", src.frees, src.allocs, len(src.sizes), src.bad)
	}
	if _, err := a.Alloc(60*miB, s); err != nil {
		t.Errorf("60 MiB of the 64 MiB limit once the pool is closed: %v", err)
	}
}

// TestPrivateNoSplit: under PrivateConfig.NoSplit every buffer has a
// segment and a block of its own (PyTorch's MemPool(no_split=True)); a
// free segment serves a later request whole, only if at most half of it
// goes unused; a pool without it packs the same requests into one
// segment.
func TestPrivateNoSplit(t *testing.T) {
	dev := newSim(1 << 30)
	a := newAlloc(t, dev, gpumem.Config{CheckInvariants: true})
	s, _ := dev.NewStream()
	split, err := a.NewPrivate()
	if err != nil {
		t.Fatal(err)
	}
	whole, err := a.NewPrivateWith(gpumem.PrivateConfig{NoSplit: true})
	if err != nil {
		t.Fatal(err)
	}
	var bufs []gpumem.Buffer
	for _, p := range []*gpumem.Allocator{split, whole} {
		for _, n := range []uint64{4 * miB, 4 * miB, 3 * miB, 1000} {
			b, err := p.Alloc(n, s)
			if err != nil {
				t.Fatal(err)
			}
			bufs = append(bufs, b)
		}
	}
	segs := func(p *gpumem.Allocator) (n, blocks int, sizes []uint64) {
		for _, seg := range p.Snapshot().Segments {
			n++
			blocks += len(seg.Blocks)
			sizes = append(sizes, seg.Size)
		}
		return
	}
	if n, _, _ := segs(split); n != 2 {
		t.Errorf("the splitting pool has %d segments for 4+4+3 MiB and 1000 bytes, want 2 (one 20 MiB, one 2 MiB)", n)
	}
	n, blocks, sizes := segs(whole)
	if n != 4 || blocks != 4 {
		t.Errorf("no_split pool: %d segments, %d blocks (sizes %v); want 4 and 4", n, blocks, sizes)
	}
	for _, seg := range whole.Snapshot().Segments {
		if want := map[bool]uint64{true: 1024, false: 0}[seg.Pool == "small"]; want != 0 && seg.Size != want {
			t.Errorf("no_split small segment of %d bytes for 1000 requested, want %d", seg.Size, want)
		}
	}
	// Free the 4 MiB buffer of the no_split pool: 3 MiB reuses it whole,
	// 1.5 MiB does not (more than half unused).
	first := bufs[4]
	if err := whole.Free(first); err != nil {
		t.Fatal(err)
	}
	small, err := whole.Alloc(1536*1024, s)
	if err != nil {
		t.Fatal(err)
	}
	if small.Ptr() == first.Ptr() {
		t.Errorf("1.5 MiB took the free 4 MiB segment, over half of it unused")
	}
	again, err := whole.Alloc(3*miB, s)
	if err != nil {
		t.Fatal(err)
	}
	if again.Ptr() != first.Ptr() {
		t.Errorf("3 MiB after the 4 MiB segment was freed: at %#x, want %#x, the whole 4 MiB", again.Ptr(), first.Ptr())
	}
	for _, seg := range whole.Snapshot().Segments {
		if seg.Address == uint64(first.Ptr()) && (len(seg.Blocks) != 1 || seg.Blocks[0].Size != 4*miB) {
			t.Errorf("the reused segment's blocks: %+v, want one of 4 MiB", seg.Blocks)
		}
	}
	mustCheck(t, whole, "no_split allocations")
	frees := map[*gpumem.Allocator][]gpumem.Buffer{split: bufs[:4], whole: {bufs[5], bufs[6], bufs[7], small, again}}
	for p, bs := range frees {
		for _, b := range bs {
			if err := p.Free(b); err != nil {
				t.Fatal(err)
			}
		}
		if err := p.Close(); err != nil {
			t.Fatal(err)
		}
	}
}

// TestReleaseUnused: a private pool keeps its free memory through Trim,
// and ReleaseUnused gives back the segments no buffer uses while the live
// buffer's stays where it is.
func TestReleaseUnused(t *testing.T) {
	dev := newSim(1 << 30)
	a := newAlloc(t, dev, gpumem.Config{CheckInvariants: true})
	s, _ := dev.NewStream()
	p, err := a.NewPrivate()
	if err != nil {
		t.Fatal(err)
	}
	out, err := p.Alloc(12*miB, s)
	if err != nil {
		t.Fatal(err)
	}
	scratch, err := p.Alloc(40*miB, s)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Free(scratch); err != nil {
		t.Fatal(err)
	}
	held := p.Stats().Reserved
	if err := p.Trim(); err != nil || p.Stats().Reserved != held {
		t.Fatalf("Trim of a private pool: %v, %d -> %d bytes; want nothing given back", err, held, p.Stats().Reserved)
	}
	if err := p.ReleaseUnused(); err != nil {
		t.Fatal(err)
	}
	if got := p.Stats().Reserved; got != 12*miB {
		t.Errorf("after ReleaseUnused the pool holds %d bytes, want the live buffer's 12 MiB segment", got)
	}
	mustCheck(t, p, "ReleaseUnused")
	if err := p.Free(out); err != nil {
		t.Fatal(err)
	}
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
}

// TestCaptureReuseAfterJoin follows PyTorch's test_graph_capture_reclaim_2_streams
// and _4_streams on the simulated device's capture graph: a buffer of s1,
// used on s2, s3 and s4 (RecordStream) and freed during a capture, is not
// reused on s1 while any of those streams' work is not yet joined into
// s1's, and is reused (the same address) once all of it is, with no event
// recorded or queried. With reuse off, or with a use on a stream outside
// the capture, it stays pending until the capture ends.
func TestCaptureReuseAfterJoin(t *testing.T) {
	for _, tc := range []struct {
		name      string
		on        bool
		outside   bool // a use on a stream that does not capture
		wantReuse bool
	}{
		{"on", true, false, true},
		{"off", false, false, false},
		{"use outside the capture", true, true, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dev := newSim(1 << 30)
			a := newAlloc(t, dev, gpumem.Config{CheckInvariants: true})
			if !a.SetCaptureReuse(tc.on) {
				t.Fatal("SetCaptureReuse: the simulated device shows no capture graph")
			}
			p, err := a.NewPrivate()
			if err != nil {
				t.Fatal(err)
			}
			var s [6]device.Stream
			for i := range s {
				s[i], _ = dev.NewStream()
			}
			s1, s2, s3, s4, s5 := s[1], s[2], s[3], s[4], s[5]
			alloc := func(st device.Stream) gpumem.Buffer {
				t.Helper()
				b, err := p.Alloc(32, st)
				if err != nil {
					t.Fatal(err)
				}
				return b
			}
			touch := func(st device.Stream, b gpumem.Buffer) {
				t.Helper()
				if err := dev.Touch(st, b.Ptr(), b.Size()); err != nil {
					t.Fatal(err)
				}
			}
			a.BeginCapture()
			dev.BeginCapture(s1)
			data1 := alloc(s1)
			touch(s1, data1) // torch.ones
			sink1, sink3 := alloc(s1), alloc(s1)
			var bufs []gpumem.Buffer
			for _, st := range []device.Stream{s2, s3, s4} {
				dev.JoinCapture(st, s1) // st.wait_stream(s1)
				b := alloc(st)
				bufs = append(bufs, b)
				touch(st, data1) // torch.add(data1, ..., out=b)
				touch(st, b)
				if err := p.RecordStream(data1, st); err != nil {
					t.Fatal(err)
				}
			}
			if tc.outside {
				if err := p.RecordStream(data1, s5); err != nil {
					t.Fatal(err)
				}
			}
			addr1 := data1.Ptr()
			if err := p.Free(data1); err != nil {
				t.Fatal(err)
			}
			dev.JoinCapture(s1, s2) // s1.wait_stream(s2)
			touch(s1, sink1)
			dev.JoinCapture(s3, s4)
			touch(s3, sink3)
			data2 := alloc(s1) // s3's and s4's work not yet joined
			if data2.Ptr() == addr1 {
				t.Errorf("data2 reuses data1's %#x before s3 and s4 are joined into s1", uint64(addr1))
			}
			dev.JoinCapture(s1, s3)
			touch(s1, sink1)
			data3 := alloc(s1)
			if got := data3.Ptr() == addr1; got != tc.wantReuse {
				t.Errorf("data3 at %#x, data1 was at %#x: reused %v, want %v", uint64(data3.Ptr()), uint64(addr1), got, tc.wantReuse)
			}
			mustCheck(t, p, "after the reuse")
			for _, st := range []device.Stream{s4, s3, s2, s1} {
				if err := dev.EndCapture(st); err != nil {
					t.Errorf("the capture was broken: %v", err)
				}
			}
			a.EndCapture()
			if st := dev.Stats(); st.CaptureViolations != 0 || st.Records != 0 {
				t.Errorf("during the capture: %d forbidden calls, %d events recorded, want none", st.CaptureViolations, st.Records)
			}
			// After the capture, a free it kept pending goes back once its
			// streams' work is done (events recorded at the next slow
			// path), with no device synchronize.
			syncs := dev.Stats().Synchronizes
			big, err := p.Alloc(4*miB, s1) // nothing cached fits: the slow path
			if err != nil {
				t.Fatal(err)
			}
			data4 := alloc(s1)
			if !tc.wantReuse && data4.Ptr() != addr1 {
				t.Errorf("after the capture data4 at %#x, want data1's %#x back", uint64(data4.Ptr()), uint64(addr1))
			}
			if d := dev.Stats().Synchronizes - syncs; d != 0 {
				t.Errorf("%d device synchronizes to give back a capture's pending free, want 0 (its events)", d)
			}
			for _, b := range append(bufs, sink1, sink3, data2, data3, data4, big) {
				if err := p.Free(b); err != nil {
					t.Fatal(err)
				}
			}
			if err := p.Close(); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// TestCaptureReuseNeverEarly drives random captures over four streams
// (allocations, uses on other streams named by RecordStream, joins, frees)
// with reuse within a capture on, and checks every address handed out
// again during the capture against the capture's graph, walked here on
// its own: each node that used the earlier buffer (on a stream other than
// the one allocating now, or on any stream for a buffer of another
// stream) must come before the allocating stream's next work.
func TestCaptureReuseNeverEarly(t *testing.T) {
	for seed := uint64(1); seed <= 40; seed++ {
		rng := rand.New(rand.NewPCG(seed, 7))
		dev := newSim(1 << 30)
		a := newAlloc(t, dev, gpumem.Config{CheckInvariants: true})
		a.SetCaptureReuse(true)
		p, err := a.NewPrivate()
		if err != nil {
			t.Fatal(err)
		}
		var ss [4]device.Stream
		for i := range ss {
			ss[i], _ = dev.NewStream()
		}
		type live struct {
			buf   gpumem.Buffer
			owner device.Stream
			uses  map[device.Node]device.Stream // the nodes that used it, by stream
		}
		type gone struct {
			lo, hi uint64
			owner  device.Stream
			uses   map[device.Node]device.Stream
		}
		var lives []*live
		var freed []gone
		a.BeginCapture()
		dev.BeginCapture(ss[0])
		in := []bool{true, false, false, false}
		terminal := func(s device.Stream) device.Node {
			nodes, _, _, err := dev.CaptureTerminals(s, nil)
			if err != nil || len(nodes) != 1 {
				t.Fatalf("seed %d: terminals of %d after a touch: %v, %v", seed, s, nodes, err)
			}
			return nodes[0]
		}
		// follows reports whether every node of uses comes before s's
		// next work: each an ancestor of (or one of) s's terminals.
		follows := func(s device.Stream, uses map[device.Node]device.Stream, skip device.Stream) bool {
			terms, _, _, _ := dev.CaptureTerminals(s, nil)
			seen := map[device.Node]bool{}
			stack := append([]device.Node(nil), terms...)
			for len(stack) > 0 {
				n := stack[len(stack)-1]
				stack = stack[:len(stack)-1]
				if seen[n] {
					continue
				}
				seen[n] = true
				stack, _ = dev.NodeParents(n, stack)
			}
			for n, us := range uses {
				if us != skip && !seen[n] {
					return false
				}
			}
			return true
		}
		for step := 0; step < 300; step++ {
			si := rng.IntN(4)
			s := ss[si]
			if !in[si] {
				dev.JoinCapture(s, ss[0]) // a fork from the origin stream
				in[si] = true
			}
			switch op := rng.IntN(10); {
			case op < 4: // allocate on s
				size := uint64(512 * (1 + rng.IntN(8)))
				b, err := p.Alloc(size, s)
				if err != nil {
					t.Fatalf("seed %d step %d: %v", seed, step, err)
				}
				lo, hi := uint64(b.Ptr()), uint64(b.Ptr())+size
				for _, g := range freed {
					if lo < g.hi && g.lo < hi {
						skip := g.owner
						if s != g.owner {
							skip = device.Stream(^uint64(0)) // another stream's buffer: every use counts
						}
						if !follows(s, g.uses, skip) {
							t.Fatalf("seed %d step %d: [%#x, %#x) handed to stream %d before the work of the buffer freed there was joined into it", seed, step, lo, hi, s)
						}
					}
				}
				if err := dev.Touch(s, b.Ptr(), size); err != nil {
					t.Fatal(err)
				}
				lives = append(lives, &live{buf: b, owner: s, uses: map[device.Node]device.Stream{terminal(s): s}})
			case op < 7 && len(lives) > 0: // use a live buffer on s
				l := lives[rng.IntN(len(lives))]
				if s != l.owner {
					dev.JoinCapture(s, l.owner) // its data is made on the owner
					if err := p.RecordStream(l.buf, s); err != nil {
						t.Fatal(err)
					}
				}
				if err := dev.Touch(s, l.buf.Ptr(), l.buf.Size()); err != nil {
					t.Fatal(err)
				}
				l.uses[terminal(s)] = s
			case op < 8: // join another capturing stream into s
				o := rng.IntN(4)
				if in[o] && o != si {
					dev.JoinCapture(s, ss[o])
				}
			case len(lives) > 0: // free a buffer (on its own stream, as PyTorch does)
				i := rng.IntN(len(lives))
				l := lives[i]
				lives = append(lives[:i], lives[i+1:]...)
				lo := uint64(l.buf.Ptr())
				// Any earlier record of this range is superseded: the
				// range served this buffer since.
				kept := freed[:0]
				for _, g := range freed {
					if !(lo < g.hi && g.lo < lo+l.buf.Size()) {
						kept = append(kept, g)
					}
				}
				freed = append(kept, gone{lo: lo, hi: lo + l.buf.Size(), owner: l.owner, uses: l.uses})
				if err := p.Free(l.buf); err != nil {
					t.Fatal(err)
				}
			}
		}
		mustCheck(t, p, fmt.Sprintf("seed %d", seed))
		for i := 3; i >= 0; i-- {
			if in[i] {
				if err := dev.EndCapture(ss[i]); err != nil {
					t.Fatalf("seed %d: the capture was broken: %v", seed, err)
				}
			}
		}
		a.EndCapture()
		for _, l := range lives {
			if err := p.Free(l.buf); err != nil {
				t.Fatal(err)
			}
		}
		if err := p.Close(); err != nil {
			t.Fatal(err)
		}
	}
}
