package gpumem_test

import (
	"fmt"
	"testing"

	"github.com/gpumem/gpumem"
	"github.com/gpumem/gpumem/device"
	"github.com/gpumem/gpumem/device/sim"
)

// TestStreamsShareFreeMemory: memory one stream freed serves another
// stream's request without a driver call once the first stream's work is
// done; before that, behind a wait on the GPU for that work (an order)
// rather than new memory; a stream reuses its own frees at once. The
// simulated device checks every hand-over against the work still pending
// on other streams and the waits that order it.
func TestStreamsShareFreeMemory(t *testing.T) {
	dev := newSim(8 << 30)
	a := newAlloc(t, dev, gpumem.Config{Mode: gpumem.ModeVirtual})
	sa, _ := dev.NewStream()
	sb, _ := dev.NewStream()
	const n = 96 * miB
	keep, err := a.Alloc(64*miB, sa) // a live neighbour
	if err != nil {
		t.Fatal(err)
	}
	x, err := a.Alloc(n, sa)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := a.Alloc(miB, sb); err != nil { // stream b has a pool of its own
		t.Fatal(err)
	}
	dev.Hold(sa)
	if err := dev.Touch(sa, x.Ptr(), n); err != nil { // a's work on x still pending
		t.Fatal(err)
	}
	if err := a.Free(x); err != nil {
		t.Fatal(err)
	}

	// Once a's work is done, b's next request is served from a's free
	// memory, without a driver call.
	dev.Drain(sa)
	before := a.Stats()
	y, err := a.Alloc(n, sb)
	if err != nil {
		t.Fatal(err)
	}
	after := a.Stats()
	if y.Ptr() != x.Ptr() {
		t.Errorf("stream b got 0x%x, want the 0x%x stream a freed", y.Ptr(), x.Ptr())
	}
	if d := after.DeviceCalls() - before.DeviceCalls(); d != 0 {
		t.Errorf("lending a's free memory to b made %d device calls, want 0", d)
	}
	if after.Handoffs != before.Handoffs+1 {
		t.Errorf("handoffs %d -> %d, want one more", before.Handoffs, after.Handoffs)
	}
	if err := dev.CheckHandoff(y.Ptr(), n, sb); err != nil {
		t.Fatalf("b may use the memory before a's work on it is done: %v", err)
	}
	snap := a.Snapshot()
	found := false
	for _, seg := range snap.Segments {
		for _, b := range seg.Blocks {
			if b.Address == uint64(y.Ptr()) && b.State == "allocated" {
				found = true
				if b.Stream != uint64(sb) {
					t.Errorf("the lent block shows stream %d in a snapshot, want b's %d", b.Stream, sb)
				}
			}
		}
	}
	if !found {
		t.Errorf("the lent block 0x%x is not in the snapshot", y.Ptr())
	}
	if err := a.ReleaseStream(sb); err == nil {
		t.Fatal("ReleaseStream(b) succeeded while b's buffer lives in a's memory")
	}
	mustCheck(t, a, "a lend")

	// b uses y and frees it while its work is pending: b itself may take
	// it back at once, with no driver call.
	dev.Hold(sb)
	if err := dev.Touch(sb, y.Ptr(), n); err != nil {
		t.Fatal(err)
	}
	if err := a.Free(y); err != nil {
		t.Fatal(err)
	}
	before = a.Stats()
	w, err := a.Alloc(n, sb)
	if err != nil {
		t.Fatal(err)
	}
	after = a.Stats()
	if w.Ptr() != y.Ptr() {
		t.Errorf("b's next request got 0x%x, want the 0x%x it freed itself", w.Ptr(), y.Ptr())
	}
	if d := after.DeviceCalls() - before.DeviceCalls(); d != 0 {
		t.Errorf("b's reuse of its own free made %d device calls, want 0", d)
	}
	if after.Orders != before.Orders {
		t.Errorf("b's reuse of its own free waited for another stream (%d orders)", after.Orders-before.Orders)
	}
	mustCheck(t, a, "a relend")

	// b frees it again, its work still pending: a's request is served
	// from it behind a wait on the GPU for b's work (an order), with no
	// driver call and no host wait, rather than growing.
	if err := dev.Touch(sb, w.Ptr(), n); err != nil {
		t.Fatal(err)
	}
	if err := a.Free(w); err != nil {
		t.Fatal(err)
	}
	before = a.Stats()
	z, err := a.Alloc(n, sa)
	if err != nil {
		t.Fatal(err)
	}
	after = a.Stats()
	if err := dev.CheckHandoff(z.Ptr(), n, sa); err != nil {
		t.Fatalf("a uses memory b freed, not ordered after b's work: %v", err)
	}
	if z.Ptr() != y.Ptr() || after.DeviceCalls() != before.DeviceCalls() || after.Reserved != before.Reserved {
		t.Errorf("a got 0x%x with %d device calls, reserved %d -> %d; want b's pending free 0x%x, no call, no growth",
			z.Ptr(), after.DeviceCalls()-before.DeviceCalls(), before.Reserved, after.Reserved, y.Ptr())
	}
	if after.Orders != before.Orders+1 || after.Fences != before.Fences {
		t.Errorf("orders %d -> %d, fences %d -> %d: want one order on the GPU, no host wait",
			before.Orders, after.Orders, before.Fences, after.Fences)
	}
	mustCheck(t, a, "an order")
	dev.Drain(sb)

	// While a's work is pending, what a freed since serves b the same way.
	dev.Hold(sa)
	if err := dev.Touch(sa, z.Ptr(), n); err != nil {
		t.Fatal(err)
	}
	if err := a.Free(z); err != nil {
		t.Fatal(err)
	}
	before = a.Stats()
	v, err := a.Alloc(n, sb)
	if err != nil {
		t.Fatal(err)
	}
	after = a.Stats()
	if err := dev.CheckHandoff(v.Ptr(), n, sb); err != nil {
		t.Fatalf("b may use memory before a's work on it is done: %v", err)
	}
	if v.Ptr() != z.Ptr() || after.Orders != before.Orders+1 || after.Fences != before.Fences || after.Reserved != before.Reserved {
		t.Errorf("b got 0x%x (a freed 0x%x), orders +%d, fences +%d, reserved %d -> %d: want a's free behind one order, no host wait, no growth",
			v.Ptr(), z.Ptr(), after.Orders-before.Orders, after.Fences-before.Fences, before.Reserved, after.Reserved)
	}
	dev.Drain(sa)

	// Memory a freed before an event a recorded after it completed stays
	// lendable while a is busy with other work: no wait is needed.
	var us [3]gpumem.Buffer
	for i := range us {
		if us[i], err = a.Alloc(n, sa); err != nil {
			t.Fatal(err)
		}
	}
	for _, i := range []int{0, 2} { // a is idle; us[1] keeps the two apart
		if err := a.Free(us[i]); err != nil {
			t.Fatal(err)
		}
	}
	first, err := a.Alloc(n, sb) // lent at once: a is idle
	if err != nil {
		t.Fatal(err)
	}
	if first.Ptr() != us[0].Ptr() && first.Ptr() != us[2].Ptr() {
		t.Errorf("b got 0x%x while idle a held 0x%x and 0x%x free", first.Ptr(), us[0].Ptr(), us[2].Ptr())
	}
	dev.Hold(sa)
	if err := dev.Touch(sa, keep.Ptr(), keep.Size()); err != nil { // a busy elsewhere
		t.Fatal(err)
	}
	before = a.Stats()
	r, err := a.Alloc(n, sb)
	if err != nil {
		t.Fatal(err)
	}
	if err := dev.CheckHandoff(r.Ptr(), n, sb); err != nil {
		t.Fatal(err)
	}
	if r.Ptr() != us[0].Ptr() && r.Ptr() != us[2].Ptr() || a.Stats().DeviceCalls() != before.DeviceCalls() {
		t.Errorf("a busy with other work did not lend memory whose use was done (got 0x%x, a freed 0x%x and 0x%x)", r.Ptr(), us[0].Ptr(), us[2].Ptr())
	}
	dev.Drain(sa)
	for _, buf := range []gpumem.Buffer{v, keep, first, us[1], r} {
		if err := a.Free(buf); err != nil {
			t.Fatal(err)
		}
	}
	mustCheck(t, a, "the frees")
}

// TestStreamsShareOneArena: in ModeVirtual all streams share one address
// range, so free ranges freed by two streams coalesce: once both streams'
// work is done, a request as large as both on either stream is served
// from them without a driver call. ReleaseStream of one stream keeps what
// it freed cached for the others.
func TestStreamsShareOneArena(t *testing.T) {
	dev := newSim(8 << 30)
	a := newAlloc(t, dev, gpumem.Config{Mode: gpumem.ModeVirtual})
	sa, _ := dev.NewStream()
	sb, _ := dev.NewStream()
	const n = 64 * miB
	x, err := a.Alloc(n, sa)
	if err != nil {
		t.Fatal(err)
	}
	y, err := a.Alloc(n, sb)
	if err != nil {
		t.Fatal(err)
	}
	if y.Ptr() != x.Ptr()+device.Ptr(n) {
		t.Fatalf("b's first block at 0x%x, want it next to a's 0x%x in one arena", y.Ptr(), x.Ptr())
	}
	keep, err := a.Alloc(miB, sa) // a live neighbour after both
	if err != nil {
		t.Fatal(err)
	}
	dev.Hold(sb)
	if err := dev.Touch(sb, y.Ptr(), n); err != nil {
		t.Fatal(err)
	}
	for _, buf := range []gpumem.Buffer{x, y} {
		if err := a.Free(buf); err != nil {
			t.Fatal(err)
		}
	}
	mustCheck(t, a, "frees of two streams")
	if st := a.Stats(); st.Streams != 2 || st.Reserves != 1 {
		t.Errorf("two streams: Stats says %d streams, %d address reservations; want 2 and one arena", st.Streams, st.Reserves)
	}
	// b's work on y is pending: a's request for both must not get y.
	z, err := a.Alloc(2*n, sa)
	if err != nil {
		t.Fatal(err)
	}
	if err := dev.CheckHandoff(z.Ptr(), 2*n, sa); err != nil {
		t.Fatalf("a may use memory before b's work on it is done: %v", err)
	}
	if err := a.Free(z); err != nil {
		t.Fatal(err)
	}
	dev.Drain(sb)
	before := a.Stats()
	w, err := a.Alloc(2*n, sb)
	if err != nil {
		t.Fatal(err)
	}
	if w.Ptr() != x.Ptr() {
		t.Errorf("b's request for both got 0x%x, want the coalesced range at 0x%x", w.Ptr(), x.Ptr())
	}
	if d := a.Stats().DeviceCalls() - before.DeviceCalls(); d != 0 {
		t.Errorf("b's request over both streams' frees made %d device calls, want 0", d)
	}
	if err := dev.CheckHandoff(w.Ptr(), 2*n, sb); err != nil {
		t.Fatal(err)
	}
	if err := a.Free(w); err != nil {
		t.Fatal(err)
	}
	// b goes; what it freed serves a at once.
	if err := a.ReleaseStream(sb); err != nil {
		t.Fatal(err)
	}
	mustCheck(t, a, "ReleaseStream with another stream left")
	before = a.Stats()
	if before.Streams != 1 {
		t.Errorf("%d streams after one of two was released", before.Streams)
	}
	v, err := a.Alloc(2*n, sa)
	if err != nil {
		t.Fatal(err)
	}
	if v.Ptr() != x.Ptr() || a.Stats().DeviceCalls() != before.DeviceCalls() {
		t.Errorf("after ReleaseStream(b), a's request got 0x%x with %d device calls, want 0x%x with none", v.Ptr(), a.Stats().DeviceCalls()-before.DeviceCalls(), x.Ptr())
	}
	for _, buf := range []gpumem.Buffer{v, keep} {
		if err := a.Free(buf); err != nil {
			t.Fatal(err)
		}
	}
	mustCheck(t, a, "the end")
}

// TestStreamsPollJustRecordedEpoch: on a GPU an event recorded on an idle
// stream is not done at the query right after the record
// (sim.Config.QueryLag models it). Memory stream a freed, its work long
// done, must serve stream b's request as done: the allocator polls the
// event it has just recorded a little first. Past the bound of that
// polling (a stream that stays busy) b waits for a's work on the GPU (an
// order) and takes the memory all the same: the pool never grows.
// The same with the epochs as markers (device.Markers) and as events.
func TestStreamsPollJustRecordedEpoch(t *testing.T) {
	for _, c := range []struct {
		lag     int
		order   bool
		markers bool
	}{{0, false, true}, {4, false, true}, {1000, true, true}, {0, false, false}, {4, false, false}, {1000, true, false}} {
		// The polling is bounded in time too (epochPollTime, 20 µs): on a
		// loaded machine under the race detector four queries can take
		// longer, and b is ordered where it need not be. So a lag within
		// the bound gets up to five tries, and fails only if every try
		// ordered (the CI failed once so, beside another test's load).
		tries := 1
		if c.lag > 0 && !c.order {
			tries = 5
		}
		var why string
		for try := 0; try < tries; try++ {
			if why = pollJustRecorded(t, c.lag, c.order, c.markers); why == "" {
				break
			}
		}
		if why != "" {
			t.Error(why)
		}
	}
}

// pollJustRecorded runs TestStreamsPollJustRecordedEpoch's case with the
// given query lag and returns what went wrong about the order ("" if
// nothing); other failures are fatal.
func pollJustRecorded(t *testing.T, lag int, order, markers bool) string {
	t.Helper()
	dev := sim.MustNew(sim.Config{Capacity: 8 << 30, QueryLag: lag, NoMarkers: !markers})
	a := newAlloc(t, dev, gpumem.Config{Mode: gpumem.ModeVirtual})
	sa, _ := dev.NewStream()
	sb, _ := dev.NewStream()
	keep, err := a.Alloc(64*miB, sa) // a live neighbour
	if err != nil {
		t.Fatal(err)
	}
	x, err := a.Alloc(96*miB, sa)
	if err != nil {
		t.Fatal(err)
	}
	own, err := a.Alloc(miB, sb) // stream b's own memory
	if err != nil {
		t.Fatal(err)
	}
	if err := a.Free(x); err != nil {
		t.Fatal(err)
	}
	before, reads := a.Stats(), dev.Stats().MarkerReads
	y, err := a.Alloc(96*miB, sb)
	if err != nil {
		t.Fatal(err)
	}
	after := a.Stats()
	// With markers the poll reads epochPolls (16) times, however fast the
	// host (time bounded it once: about 200 reads in 20 us here, fewer on
	// a loaded host, so a replay under a query lag was not repeatable).
	if reads = dev.Stats().MarkerReads - reads; markers && lag >= 16 && reads != 16 {
		t.Errorf("query lag %d: %d reads of the marker in stream b's miss, want the poll's 16", lag, reads)
	}
	t.Logf("query lag %d, markers %v: %d marker reads in stream b's miss", lag, markers, reads)
	if after.Reserved != before.Reserved || y.Ptr() != x.Ptr() {
		t.Errorf("query lag %d: stream b got 0x%x, reserved %d -> %d; want a's free 0x%x, no growth",
			lag, y.Ptr(), before.Reserved, after.Reserved, x.Ptr())
	}
	if err := dev.CheckHandoff(y.Ptr(), 96*miB, sb); err != nil {
		t.Fatal(err)
	}
	for _, b := range []gpumem.Buffer{keep, y, own} {
		if err := a.Free(b); err != nil {
			t.Fatal(err)
		}
	}
	if ordered := after.Orders > before.Orders; ordered != order {
		return fmt.Sprintf("query lag %d, markers %v: stream b waited on the GPU for a's work: %v, want %v", lag, markers, ordered, order)
	}
	if st := dev.Stats(); markers != (st.Marks > 0) {
		t.Fatalf("markers %v: %d marks", markers, st.Marks)
	}
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	if st := dev.Stats(); st.LiveMarkers+st.LiveEvents != 0 {
		t.Fatalf("after Close: %d markers and %d events live", st.LiveMarkers, st.LiveEvents)
	}
	return ""
}

// TestStreamsMoveOnlyTheirOwnEmptySpans: a span emptied by a stream whose
// work is not yet known done moves for that stream's own requests (its
// later work is ordered after its earlier work), and not for another
// stream's, which takes new memory rather than wait for it (pool.stalls,
// with the asking stream passed down from placement).
func TestStreamsMoveOnlyTheirOwnEmptySpans(t *testing.T) {
	for _, own := range []bool{true, false} {
		dev := newSim(8 << 30)
		a := newAlloc(t, dev, gpumem.Config{Mode: gpumem.ModeVirtual, SpanSize: 16 * miB})
		sa, _ := dev.NewStream()
		sb, _ := dev.NewStream()
		if _, err := a.Alloc(64*miB, sa); err != nil { // a live neighbour
			t.Fatal(err)
		}
		x, err := a.Alloc(16*miB, sa) // one span of its own
		if err != nil {
			t.Fatal(err)
		}
		if _, err := a.Alloc(64*miB, sa); err != nil { // keeps x's range from the frontier
			t.Fatal(err)
		}
		if _, err := a.Alloc(miB, sb); err != nil { // a second stream
			t.Fatal(err)
		}
		dev.Hold(sa)
		if err := dev.Touch(sa, x.Ptr(), x.Size()); err != nil { // a's work on x still pending
			t.Fatal(err)
		}
		if err := a.Free(x); err != nil { // x's span empties; a's work not done
			t.Fatal(err)
		}
		asker := sb
		if own {
			asker = sa
		}
		before := a.Stats()
		if _, err := a.Alloc(18*miB, asker); err != nil { // 9 chunks at the frontier: spans of 8 and 1
			t.Fatal(err)
		}
		after := a.Stats()
		creates := after.Creates - before.Creates
		want := uint64(2) // another stream's request: x's span stays, two new
		if own {
			want = 1 // x's span moved over the first 8 chunks
		}
		if creates != want {
			t.Errorf("own stream %v: %d creates, want %d", own, creates, want)
		}
		mustCheck(t, a, "after the request")
		dev.Drain(sa)
	}
}

// TestStreamsNoStreamWaits: under Config.NoStreamWaits a stream never waits
// on the GPU for another's work: memory another stream freed, its work
// pending, is not handed over, and the request maps new memory instead.
func TestStreamsNoStreamWaits(t *testing.T) {
	dev := newSim(8 << 30)
	a := newAlloc(t, dev, gpumem.Config{Mode: gpumem.ModeVirtual, NoStreamWaits: true})
	sa, _ := dev.NewStream()
	sb, _ := dev.NewStream()
	const n = 96 * miB
	keep, err := a.Alloc(64*miB, sa)
	if err != nil {
		t.Fatal(err)
	}
	x, err := a.Alloc(n, sa)
	if err != nil {
		t.Fatal(err)
	}
	dev.Hold(sa)
	if err := dev.Touch(sa, x.Ptr(), n); err != nil {
		t.Fatal(err)
	}
	if err := a.Free(x); err != nil {
		t.Fatal(err)
	}
	before := a.Stats()
	y, err := a.Alloc(n, sb)
	if err != nil {
		t.Fatal(err)
	}
	after := a.Stats()
	if err := dev.CheckHandoff(y.Ptr(), n, sb); err != nil {
		t.Fatal(err)
	}
	if y.Ptr() < x.Ptr()+device.Ptr(n) && x.Ptr() < y.Ptr()+device.Ptr(n) || after.Orders != before.Orders || after.Reserved <= before.Reserved {
		t.Errorf("b got 0x%x (a freed 0x%x, pending), orders +%d, reserved %d -> %d; want new memory, no order",
			y.Ptr(), x.Ptr(), after.Orders-before.Orders, before.Reserved, after.Reserved)
	}
	dev.Drain(sa)
	for _, b := range []gpumem.Buffer{keep, y} {
		if err := a.Free(b); err != nil {
			t.Fatal(err)
		}
	}
	mustCheck(t, a, "the frees")
}

// TestStreamsMoveSpanBehindAnOrder: an empty span another stream emptied,
// its work pending, moves for a stream that needs a span of its size
// elsewhere: behind a wait on the GPU for that work (an order), leaving
// its old mapping dormant, rather than a host wait or new memory. The
// dormant mapping is unmapped only after a fence, which the simulated
// device checks (it refuses to unmap memory that pending work uses).
func TestStreamsMoveSpanBehindAnOrder(t *testing.T) {
	for _, compact := range []bool{false, true} {
		testMoveSpanBehindAnOrder(t, compact)
	}
}

func testMoveSpanBehindAnOrder(t *testing.T, compact bool) {
	dev := newSim(8 << 30)
	a := newAlloc(t, dev, gpumem.Config{Mode: gpumem.ModeVirtual, Compact: compact, CheckInvariants: true})
	sa, _ := dev.NewStream()
	sb, _ := dev.NewStream()
	const span = 16 * miB // the default span
	var keep []gpumem.Buffer
	alloc := func(n uint64, s device.Stream) gpumem.Buffer { t.Helper(); return mustAllocOn(t, a, n, s) }
	keep = append(keep, alloc(span, sa))
	x := alloc(span, sa) // a span of its own, between two live ones
	keep = append(keep, alloc(span, sa), alloc(miB, sb))
	dev.Hold(sa)
	if err := dev.Touch(sa, x.Ptr(), span); err != nil {
		t.Fatal(err)
	}
	if err := a.Free(x); err != nil {
		t.Fatal(err)
	}
	before := a.Stats()
	y := alloc(span+span/2, sb) // does not fit x's place: x's span moves under it
	after := a.Stats()
	if err := dev.CheckHandoff(y.Ptr(), span+span/2, sb); err != nil {
		t.Fatalf("b uses a's memory, not ordered after a's work: %v", err)
	}
	if after.Fences != before.Fences || after.Orders == before.Orders || after.DormantMappings == 0 {
		t.Errorf("compact %v: fences +%d, orders +%d, dormant mappings %d: want the span moved behind an order, its old mapping dormant, no host wait",
			compact, after.Fences-before.Fences, after.Orders-before.Orders, after.DormantMappings)
	}
	if grew := after.Reserved - before.Reserved; grew > span {
		t.Errorf("compact %v: reserved grew by %d for a request of %d with a %d span empty: want the span moved", compact, grew, span+span/2, span)
	}
	mustCheck(t, a, "a move behind an order")
	// Giving the cache back unmaps the dormant mapping: a fence first,
	// while a's work is still held (the host wait completes it).
	if err := a.Free(y); err != nil {
		t.Fatal(err)
	}
	if err := a.Trim(); err != nil {
		t.Fatalf("trim with a dormant mapping whose work was pending: %v", err)
	}
	if st := a.Stats(); st.DormantMappings != 0 || st.Fences == after.Fences {
		t.Errorf("after Trim: %d dormant mappings, fences %d -> %d; want none left, a fence taken", st.DormantMappings, after.Fences, st.Fences)
	}
	dev.Drain(sa)
	for _, b := range keep {
		if err := a.Free(b); err != nil {
			t.Fatal(err)
		}
	}
	mustCheck(t, a, "the frees")
}

// TestFailedBackKeepsMovedSpanUnclean: a span moved for a request without
// a fence (an ordered move: only the asking stream waits for the work of
// the stream that used it) is not "clean" when that request fails, so a
// third stream that later takes the span waits for that work too. Before
// f707a7e a failed back called every span it had moved clean, and the
// third stream got the handle with the first stream's work still pending
// on it (found by TestStress under -race; this is its path, made
// deterministic: stream a's touch pending on span S; b's 24 MiB request
// moves S into an unmapped hole, ordered after a, then fails on the create
// of its second span; c's 28 MiB request at the frontier moves S again).
// It fails without f707a7e: c unordered after a's touch.
func TestFailedBackKeepsMovedSpanUnclean(t *testing.T) {
	dev := newSim(1 << 30)
	// Compact (which the default becomes while tight) places c's request
	// at its best fit's start without a search, so nothing on its way
	// orders c after a: only the span's own state can. 16 MiB spans, so
	// that one span is moved whole each time.
	a := newAlloc(t, dev, gpumem.Config{Compact: true, SpanSize: 16 * miB})
	sa, _ := dev.NewStream()
	sb, _ := dev.NewStream()
	sc, _ := dev.NewStream()
	alloc := func(n uint64, s device.Stream) gpumem.Buffer { t.Helper(); return mustAllocOn(t, a, n, s) }
	// Stream a: live blocks around a 24 MiB block H and a 16 MiB block X
	// (one span of the default 16 MiB: S).
	alloc(2*miB, sa)
	h := alloc(24*miB, sa)
	alloc(2*miB, sa)
	x := alloc(16*miB, sa)
	alloc(2*miB, sa)
	alloc(miB, sb) // b and c known to the pool
	alloc(miB, sc)
	// H's spans given back: an unmapped 24 MiB hole.
	if err := a.Free(h); err != nil {
		t.Fatal(err)
	}
	if err := a.Trim(); err != nil {
		t.Fatal(err)
	}
	// a's work on X pending, X freed: S empty, its handle busy.
	dev.Hold(sa)
	if err := dev.Touch(sa, x.Ptr(), 16*miB); err != nil {
		t.Fatal(err)
	}
	if err := a.Free(x); err != nil {
		t.Fatal(err)
	}
	// b's 24 MiB goes to the hole: S (exact) moves there for its first
	// 16 MiB, ordered after a; the 8 MiB span after it cannot be made.
	before := a.Stats()
	dev.FailNth("Create", 1)
	if _, err := a.Alloc(24*miB, sb); err == nil {
		t.Fatal("b's request succeeded with its span's create failing")
	}
	dev.ClearFaults()
	if st := a.Stats(); st.Orders == before.Orders || st.Maps == before.Maps {
		t.Fatalf("b's failed request made %d orders and %d maps, want S moved behind an order (the case under test)",
			st.Orders-before.Orders, st.Maps-before.Maps)
	}
	mustCheck(t, a, "a failed back")
	// c's 28 MiB fits no hole: at the frontier, S moves again for its
	// first 16 MiB. c must be ordered after a's pending touch of S's
	// memory (or the host must have waited for it).
	y := alloc(28*miB, sc)
	if err := dev.CheckHandoff(y.Ptr(), 28*miB, sc); err != nil {
		t.Fatalf("c uses memory whose handle a's work still touches, unordered: %v", err)
	}
	mustCheck(t, a, "c's request")
	dev.Drain(sa)
}

// mustAllocOn is mustAlloc on stream s.
func mustAllocOn(t *testing.T, a *gpumem.Allocator, size uint64, s device.Stream) gpumem.Buffer {
	t.Helper()
	b, err := a.Alloc(size, s)
	if err != nil {
		t.Fatalf("Alloc(%d, stream %d): %v", size, s, err)
	}
	return b
}

// TestStreamsMarkerRefusedUsesEvents: where the device refuses a stream a
// marker (pinned host memory refused; here an injected fault), that
// stream's epochs are events: the memory it freed still serves another
// stream without growth, the device saw a record and no mark, and nothing
// is left live after Close.
func TestStreamsMarkerRefusedUsesEvents(t *testing.T) {
	dev := sim.MustNew(sim.Config{Capacity: 8 << 30})
	a := newAlloc(t, dev, gpumem.Config{Mode: gpumem.ModeVirtual})
	sa, _ := dev.NewStream()
	sb, _ := dev.NewStream()
	keep, err := a.Alloc(64*miB, sa)
	if err != nil {
		t.Fatal(err)
	}
	x, err := a.Alloc(96*miB, sa)
	if err != nil {
		t.Fatal(err)
	}
	own, err := a.Alloc(miB, sb)
	if err != nil {
		t.Fatal(err)
	}
	if err := a.Free(x); err != nil {
		t.Fatal(err)
	}
	dev.FailNth("NewMarker", 1)
	before, records := a.Stats(), dev.Stats().Records
	y, err := a.Alloc(96*miB, sb)
	if err != nil {
		t.Fatal(err)
	}
	after, ds := a.Stats(), dev.Stats()
	if ds.Injected != 1 || ds.Marks != 0 || ds.Records == records {
		t.Errorf("%d faults fired, %d marks, records %d -> %d; want the refused marker, no mark, a record", ds.Injected, ds.Marks, records, ds.Records)
	}
	if after.Reserved != before.Reserved || y.Ptr() != x.Ptr() || after.Orders != before.Orders {
		t.Errorf("stream b got 0x%x, reserved %d -> %d, stream waits %d -> %d; want a's free 0x%x through an epoch's event: no growth, no wait",
			y.Ptr(), before.Reserved, after.Reserved, before.Orders, after.Orders, x.Ptr())
	}
	for _, b := range []gpumem.Buffer{keep, y, own} {
		if err := a.Free(b); err != nil {
			t.Fatal(err)
		}
	}
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	if st := dev.Stats(); st.LiveMarkers+st.LiveEvents != 0 {
		t.Errorf("after Close: %d markers and %d events live", st.LiveMarkers, st.LiveEvents)
	}
}
