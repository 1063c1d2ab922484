package conformance

import (
	"bytes"
	"encoding/json"
	"math/rand/v2"
	"reflect"
	"testing"
	"time"

	"github.com/gpumem/gpumem"
	"github.com/gpumem/gpumem/device"
)

// testStatsIdentities runs a seeded workload; env checks the identities
// after every step, and this test that counters never decrease and peaks
// cover every gauge seen.
func testStatsIdentities(t *testing.T, s *suite) {
	e := s.newEnv(t, nil)
	streams := e.streams(2)
	rng := rand.New(rand.NewPCG(1, 2))
	sizes := []uint64{1, 512, 3000, 64 * kiB, 900 * kiB, 2 * miB, 5*miB + 3, 21 * miB}
	var bufs []gpumem.Buffer
	prev := e.stats()
	var maxAlloc, maxActive, maxReserved, maxLive uint64
	var maxSegs int
	for i := 0; i < 300; i++ {
		switch r := rng.IntN(10); {
		case r < 5 || len(bufs) == 0:
			n := sizes[rng.IntN(len(sizes))]
			if b, err := e.tryAlloc(n, streams[rng.IntN(len(streams))]); err == nil {
				bufs = append(bufs, b)
			} else {
				oomError(t, err)
			}
		case r < 9:
			j := rng.IntN(len(bufs))
			e.free(bufs[j])
			bufs = append(bufs[:j], bufs[j+1:]...)
		default:
			if err := e.a.Trim(); err != nil {
				t.Fatal(err)
			}
			e.verify("Trim")
		}
		st := e.stats()
		maxAlloc, maxActive, maxReserved = max(maxAlloc, st.Allocated), max(maxActive, st.Active), max(maxReserved, st.Reserved)
		maxLive, maxSegs = max(maxLive, st.LiveBuffers), max(maxSegs, st.Segments)
		// PeakSegments is exact; PeakLiveBuffers with one pool (one
		// stream, or ModeVirtual's one arena), else each pool's most.
		if st.PeakSegments < maxSegs || (st.Streams <= 1 || st.PlainBytes == 0) && st.PeakLiveBuffers < maxLive {
			t.Fatalf("step %d: peak segments %d, peak live buffers %d below what was seen: %d, %d", i, st.PeakSegments, st.PeakLiveBuffers, maxSegs, maxLive)
		}
		// PeakAllocated and PeakActive are exact with one stream; with
		// several they may miss a momentary high by up to 4 MiB per stream
		// (see Stats). PeakReserved is exact.
		var slack uint64
		if st.Streams > 1 {
			slack = uint64(st.Streams) * 4 * miB
		}
		if st.PeakAllocated+slack < maxAlloc || st.PeakActive+slack < maxActive || st.PeakReserved < maxReserved {
			t.Fatalf("step %d: peaks %d/%d/%d below gauges seen %d/%d/%d", i, st.PeakAllocated, st.PeakActive, st.PeakReserved, maxAlloc, maxActive, maxReserved)
		}
		if err := countersGrew(prev, st); err != "" {
			t.Fatalf("step %d: counter %s decreased", i, err)
		}
		prev = st
	}
	for _, b := range bufs {
		e.free(b)
	}
	e.finish()
}

// counters lists the counter fields of Stats (they never decrease).
var counters = []string{"Allocs", "Frees", "AllocBytes", "FreeBytes", "AllocRequested", "FreeRequested", "DeviceAllocs", "DeviceFrees", "Creates", "Releases", "Maps", "Unmaps",
	"SetAccess", "Reserves", "Fences", "Handoffs", "Orders", "OOMs", "Retries", "Trims", "Revived", "SlackCreates",
	"Splits", "Copies", "CopiedBytes", "SplitNanos", "GateRefusals", "DriverNanos", "WaitNanos", "Misses", "MissNanos",
	"CreateNanos", "MapNanos", "SetAccessNanos", "UnmapNanos", "ReleaseNanos", "EventCalls", "EventNanos", "MarkCalls", "MarkNanos"}

// gauges lists the gauge fields of Stats, checked by statsIdentities.
var gauges = []string{"Allocated", "PeakAllocated", "Active", "PeakActive", "Reserved", "PeakReserved", "Cached", "Releasable",
	"PlainBytes", "MappedBytes", "SpareBytes", "AddressSpace", "LiveBuffers", "PeakLiveBuffers", "Segments", "PeakSegments", "PendingFrees", "Streams",
	"LargestFree", "Fragmentation", "DormantMappings"}

func countersGrew(before, after gpumem.Stats) string {
	b, a := reflect.ValueOf(before), reflect.ValueOf(after)
	for _, name := range counters {
		if a.FieldByName(name).Uint() < b.FieldByName(name).Uint() {
			return name
		}
	}
	return ""
}

// testStatsKnownFields fails on a Stats field the suite does not know, as
// the Go runtime's TestMemStats does: a new statistic needs its identity
// tested here.
func testStatsKnownFields(t *testing.T, s *suite) {
	known := map[string]bool{}
	for _, n := range append(append([]string{}, counters...), gauges...) {
		known[n] = true
	}
	typ := reflect.TypeOf(gpumem.Stats{})
	for i := 0; i < typ.NumField(); i++ {
		if f := typ.Field(i); !known[f.Name] {
			t.Errorf("Stats.%s is unknown to the conformance suite: add it to counters or gauges and test its identities", f.Name)
		}
		delete(known, typ.Field(i).Name)
	}
	for n := range known {
		t.Errorf("the suite knows Stats.%s, which no longer exists", n)
	}
}

// testSnapshot: a snapshot round-trips through JSON unchanged, lists every
// live buffer (and pending free) with its numbers, and its blocks tile
// their segments.
func testSnapshot(t *testing.T, s *suite) {
	e := s.newEnv(t, nil)
	streams := e.streams(2)
	sc := e.a.NewScope("snap", 0)
	e.scopeAlloc(sc, 4000, streams[0])
	for i, n := range []uint64{1, 600 * kiB, 3 * miB, 12 * miB} {
		e.alloc(n, streams[i%len(streams)])
	}
	pendingAt := device.Ptr(0)
	_, hasEvents := device.AsEvents(e.dev)
	if e.pend != nil && len(streams) > 2 && hasEvents {
		pendingAt = e.pendingFree(8*kiB, streams[1], streams[2])
	}
	snap := e.a.Snapshot()

	var buf bytes.Buffer
	if err := snap.WriteJSON(&buf); err != nil {
		t.Fatal(err)
	}
	var back gpumem.Snapshot
	if err := json.Unmarshal(buf.Bytes(), &back); err != nil {
		t.Fatalf("the snapshot's JSON does not decode: %v", err)
	}
	if !reflect.DeepEqual(snap, back) {
		t.Errorf("the snapshot changed in a JSON round trip:\n%+v\n%+v", snap, back)
	}
	raw, err := json.Marshal(snap)
	if err != nil {
		t.Fatal(err)
	}
	var generic map[string]any
	if err := json.Unmarshal(raw, &generic); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"mode", "granularity", "limit", "stats", "segments"} {
		if _, ok := generic[k]; !ok {
			t.Errorf("snapshot JSON lacks key %q", k)
		}
	}

	if snap.Mode != e.a.Mode().String() {
		t.Errorf("snapshot mode %q, allocator %v", snap.Mode, e.a.Mode())
	}
	if err := statsIdentities(snap.Stats); err != nil {
		t.Errorf("snapshot stats: %v", err)
	}
	found := map[device.Ptr]gpumem.BlockSnapshot{}
	allocated, pending := 0, 0
	for _, seg := range snap.Segments {
		addr, sum := seg.Address, uint64(0)
		for _, b := range seg.Blocks {
			if b.Address != addr {
				t.Errorf("segment 0x%x: block at 0x%x, expected 0x%x", seg.Address, b.Address, addr)
			}
			addr += b.Size
			sum += b.Size
			switch b.State {
			case "allocated":
				allocated++
				found[device.Ptr(b.Address)] = b
			case "pending":
				pending++
				found[device.Ptr(b.Address)] = b
			case "free":
			default:
				t.Errorf("block 0x%x: state %q", b.Address, b.State)
			}
		}
		if sum != seg.Size {
			t.Errorf("segment 0x%x of %d bytes: blocks cover %d", seg.Address, seg.Size, sum)
		}
		if seg.Kind != "plain" && seg.Kind != "virtual" || seg.Pool != "small" && seg.Pool != "large" {
			t.Errorf("segment 0x%x: kind %q pool %q", seg.Address, seg.Kind, seg.Pool)
		}
		// A span's live_chunk_bytes: its chunks that a non-free block touches.
		g := snap.Granularity
		for _, sp := range seg.Spans {
			var want uint64
			for c := sp.Address; c < sp.Address+sp.Size; c += g {
				for _, b := range seg.Blocks {
					if b.State != "free" && b.Address < c+g && c < b.Address+b.Size {
						want += g
						break
					}
				}
			}
			if sp.LiveBytes != want {
				t.Errorf("span 0x%x of %d bytes: live_chunk_bytes %d, its blocks touch %d", sp.Address, sp.Size, sp.LiveBytes, want)
			}
		}
	}
	if allocated != len(e.live) || uint64(allocated) != snap.Stats.LiveBuffers {
		t.Errorf("snapshot lists %d allocated blocks; %d buffers are live (stats %d)", allocated, len(e.live), snap.Stats.LiveBuffers)
	}
	for p, l := range e.live {
		b, ok := found[p]
		if !ok {
			t.Errorf("live buffer 0x%x is not in the snapshot", p)
			continue
		}
		if b.State != "allocated" || b.Requested != l.buf.Size() || b.Size != round512(l.buf.Size()) || b.Stream != uint64(l.s) || b.Seq == 0 {
			t.Errorf("live buffer 0x%x (%d bytes, stream %d) appears as %+v", p, l.buf.Size(), l.s, b)
		}
		if l.scope != nil && b.Scope != l.scope.Name() {
			t.Errorf("buffer 0x%x of scope %s appears with scope %q", p, l.scope.Name(), b.Scope)
		}
	}
	if pendingAt != 0 {
		if b := found[pendingAt]; b.State != "pending" || pending != 1 {
			t.Errorf("the pending free at 0x%x appears as %+v (%d pending)", pendingAt, b, pending)
		}
	}
	e.finish()
}

// eventually polls cond every few milliseconds until it holds or the
// deadline passes.
func eventually(d time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(d)
	for {
		if cond() {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// testIdleRelease: with IdleRelease set, cached memory goes back to the
// device soon after the allocator falls idle (preallocated memory stays),
// and live buffers are untouched.
func testIdleRelease(t *testing.T, s *suite) {
	e := s.newEnv(t, func(c *gpumem.Config) { c.IdleRelease = 50 * time.Millisecond })
	base := e.stats().Reserved // preallocated
	keep := e.alloc(4*kiB, 0)
	for _, n := range []uint64{64 * kiB, 3 * miB, 24 * miB} {
		e.free(e.alloc(n, 0))
	}
	if e.stats().Cached <= base {
		t.Fatalf("nothing cached to release: %+v", e.stats())
	}
	var st gpumem.Stats
	ok := eventually(time.Second, func() bool {
		st = e.a.Stats()
		return st.Reserved <= base+st.Active+e.gran()
	})
	if !ok {
		t.Fatalf("1s after the last operation with IdleRelease 50ms the allocator still caches: %+v (preallocated %d)", st, base)
	}
	if st.Trims != 0 {
		t.Errorf("idle release counted as Trim: %d", st.Trims)
	}
	e.verify("idle release")
	e.free(keep)
	// It keeps working, and releases again.
	b := e.alloc(10*miB, 0)
	e.free(b)
	if !eventually(time.Second, func() bool { st = e.a.Stats(); return st.Reserved <= base }) {
		t.Fatalf("second idle period: still caching %+v", st)
	}
	e.finish()
}

// testReleaseThreshold: with ReleaseThreshold set, what stays cached after
// a free is bounded by it (plus preallocated memory, which is kept).
func testReleaseThreshold(t *testing.T, s *suite) {
	const threshold = 4 * miB
	e := s.newEnv(t, func(c *gpumem.Config) { c.ReleaseThreshold = threshold })
	streams := e.streams(1)
	// Sizes of whole granules, each in its own segment in ModePlain, so
	// that every byte freed is releasable.
	var bufs []gpumem.Buffer
	for i := 0; i < 6; i++ {
		bufs = append(bufs, e.alloc(10*miB+uint64(i%2)*2*miB, streams[i%len(streams)]))
	}
	// kept is the preallocated memory that is idle: the threshold keeps it.
	kept := func() uint64 {
		var n uint64
		for _, seg := range e.a.Snapshot().Segments {
			if seg.Preallocate && len(seg.Blocks) == 1 && seg.Blocks[0].State == "free" {
				n += seg.Size
			}
			for _, sp := range seg.Spans {
				if sp.Preallocate && sp.LiveBytes == 0 {
					n += sp.Size
				}
			}
		}
		return n
	}
	// Over the threshold after a free, nothing releasable may be left but
	// idle preallocated memory (memory in spans or segments that still hold
	// live buffers cannot be released; these sizes leave none).
	over := func(st gpumem.Stats) bool {
		return st.Cached > threshold+kept() && st.Releasable > kept()
	}
	for _, b := range bufs {
		e.free(b)
		if st := e.stats(); over(st) {
			t.Fatalf("after a free %d bytes are cached (%d releasable), threshold %d (+%d preallocated): %+v", st.Cached, st.Releasable, threshold, kept(), st)
		}
	}
	// The allocator still serves requests.
	e.free(e.alloc(20*miB, 0))
	if st := e.stats(); over(st) {
		t.Fatalf("after a free %d bytes are cached (%d releasable), threshold %d", st.Cached, st.Releasable, threshold)
	}
	e.finish()
}
