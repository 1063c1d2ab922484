package gpumem_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/gpumem/gpumem"
	"github.com/gpumem/gpumem/device"
	"github.com/gpumem/gpumem/device/sim"
	"github.com/gpumem/gpumem/internal/conformance"
)

// TestPeaksNeverExceedReserved: with several streams the allocator's peaks
// of Allocated and Active may lag (see Stats), but they must never claim
// more than was ever held: PeakAllocated <= PeakActive <= PeakReserved.
// Found by FuzzOps: a stream's free not yet published while another
// stream's allocation is published added the two.
func TestPeaksNeverExceedReserved(t *testing.T) {
	for _, mode := range []gpumem.Mode{gpumem.ModeVirtual, gpumem.ModePlain} {
		t.Run(mode.String(), func(t *testing.T) {
			dev := newSim(64 * miB)
			a := newAlloc(t, dev, gpumem.Config{Mode: mode})
			s1, err := dev.NewStream()
			if err != nil {
				t.Fatal(err)
			}
			b, err := a.Alloc(1536*kiB, s1)
			if err != nil {
				t.Fatal(err)
			}
			if err := a.Trim(); err != nil {
				t.Fatal(err)
			}
			if err := a.Free(b); err != nil {
				t.Fatal(err)
			}
			if _, err := a.Alloc(4*miB, 0); err != nil {
				t.Fatal(err)
			}
			st := a.Stats()
			if err := conformance.StatsIdentities(st); err != nil {
				t.Fatalf("%v\n%+v", err, st)
			}
			if st.PeakActive > 4*miB+2*miB {
				t.Fatalf("PeakActive %d: never more than %d bytes were live at once", st.PeakActive, 4*miB)
			}
		})
	}
}

// TestStatsSingleStreamExact: with one stream every gauge and peak is exact
// after every operation.
func TestStatsSingleStreamExact(t *testing.T) {
	for _, mode := range []gpumem.Mode{gpumem.ModeVirtual, gpumem.ModePlain} {
		t.Run(mode.String(), func(t *testing.T) {
			a := newAlloc(t, newSim(256*miB), gpumem.Config{Mode: mode})
			sizes := []uint64{100, 3 * miB, 700 * kiB, 9*miB + 1, 1}
			var live []gpumem.Buffer
			var allocated, active, peakAlloc, peakActive uint64
			check := func() {
				t.Helper()
				st := a.Stats()
				peakAlloc, peakActive = max(peakAlloc, allocated), max(peakActive, active)
				if st.Allocated != allocated || st.Active != active || st.PeakAllocated != peakAlloc || st.PeakActive != peakActive {
					t.Fatalf("stats %+v; want allocated %d active %d peaks %d %d", st, allocated, active, peakAlloc, peakActive)
				}
				if err := conformance.StatsIdentities(st); err != nil {
					t.Fatal(err)
				}
			}
			for round := 0; round < 3; round++ {
				for _, n := range sizes {
					b, err := a.Alloc(n*uint64(round+1), 0)
					if err != nil {
						t.Fatal(err)
					}
					live = append(live, b)
					allocated += b.Size()
					active += (b.Size() + 511) &^ 511
					check()
				}
				for i := 0; i < len(live); i += 2 {
					if err := a.Free(live[i]); err != nil {
						t.Fatal(err)
					}
					allocated -= live[i].Size()
					active -= (live[i].Size() + 511) &^ 511
					live = append(live[:i], live[i+1:]...)
					check()
				}
			}
		})
	}
}

// TestResetPeaks: after ResetPeaks the peaks are the current gauges, and
// they grow again from there.
func TestResetPeaks(t *testing.T) {
	a := newAlloc(t, newSim(1<<30), gpumem.Config{})
	big, err := a.Alloc(256*miB, 0)
	if err != nil {
		t.Fatal(err)
	}
	small, err := a.Alloc(miB, 0)
	if err != nil {
		t.Fatal(err)
	}
	if err := a.Free(big); err != nil {
		t.Fatal(err)
	}
	if err := a.Trim(); err != nil {
		t.Fatal(err)
	}
	if st := a.Stats(); st.PeakAllocated < 257*miB || st.PeakReserved < 257*miB {
		t.Fatalf("before reset: peaks %d allocated, %d reserved; want at least 257 MiB", st.PeakAllocated, st.PeakReserved)
	}
	a.ResetPeaks()
	st := a.Stats()
	if st.PeakAllocated != st.Allocated || st.PeakActive != st.Active || st.PeakReserved != st.Reserved {
		t.Errorf("after reset: peaks %d/%d/%d, want the gauges %d/%d/%d (allocated/active/reserved)",
			st.PeakAllocated, st.PeakActive, st.PeakReserved, st.Allocated, st.Active, st.Reserved)
	}
	if st.Allocs != 2 || st.Frees != 1 {
		t.Errorf("counters changed by ResetPeaks: %d allocs, %d frees", st.Allocs, st.Frees)
	}
	mid, err := a.Alloc(64*miB, 0)
	if err != nil {
		t.Fatal(err)
	}
	if st := a.Stats(); st.PeakAllocated != miB+64*miB {
		t.Errorf("peak after a new allocation: %d, want %d", st.PeakAllocated, miB+64*miB)
	}
	_ = a.Free(mid)
	_ = a.Free(small)
	mustCheck(t, a, "ResetPeaks")
}

// TestStatsPeakCounts: PeakLiveBuffers and PeakSegments hold the most
// buffers and segments seen since the last ResetPeaks, which brings them
// down to what is there now (PyTorch's allocation.all.peak and
// segment.all.peak).
func TestStatsPeakCounts(t *testing.T) {
	a := newAlloc(t, newSim(1<<30), gpumem.Config{Mode: gpumem.ModePlain})
	var bufs []gpumem.Buffer
	for i := 0; i < 3; i++ {
		b, err := a.Alloc(24*miB, 0) // a plain segment each
		if err != nil {
			t.Fatal(err)
		}
		bufs = append(bufs, b)
	}
	for _, b := range bufs[1:] {
		if err := a.Free(b); err != nil {
			t.Fatal(err)
		}
	}
	if err := a.Trim(); err != nil {
		t.Fatal(err)
	}
	st := a.Stats()
	if st.LiveBuffers != 1 || st.PeakLiveBuffers != 3 || st.PeakSegments < 3 || st.Segments >= st.PeakSegments {
		t.Errorf("live %d (peak %d), segments %d (peak %d): want 1 (3) and fewer than at the peak of at least 3",
			st.LiveBuffers, st.PeakLiveBuffers, st.Segments, st.PeakSegments)
	}
	a.ResetPeaks()
	st = a.Stats()
	if st.PeakLiveBuffers != 1 || st.PeakSegments != st.Segments {
		t.Errorf("after ResetPeaks: peak live %d, peak segments %d; want 1 and the %d there now", st.PeakLiveBuffers, st.PeakSegments, st.Segments)
	}
	if err := a.Free(bufs[0]); err != nil {
		t.Fatal(err)
	}
}

// slowSim is the simulated device with a create and a host wait that take
// a known time, for the host-time counters.
type slowSim struct {
	*sim.Device
	create, wait, query time.Duration
}

func (d slowSim) Create(size uint64) (device.Handle, error) {
	time.Sleep(d.create)
	return d.Device.Create(size)
}

func (d slowSim) Wait(e device.Event) error {
	time.Sleep(d.wait)
	return d.Device.Wait(e)
}

func (d slowSim) Query(e device.Event) (bool, error) {
	time.Sleep(d.query)
	return d.Device.Query(e)
}

// Mark sleeps as Query does: with markers it stands for the record.
func (d slowSim) Mark(m device.Marker, s device.Stream, v uint64) error {
	time.Sleep(d.query)
	return d.Device.Mark(m, s, v)
}

func (d slowSim) Synchronize() error {
	time.Sleep(d.wait)
	return d.Device.Synchronize()
}

// TestStatsDriverAndWaitTime: Stats.DriverNanos counts the host time of
// the driver's memory calls, Stats.WaitNanos that of the waits for the
// GPU (fences), Stats.Misses and MissNanos the allocations the cache did
// not serve at once and their time, and nothing else: a cache hit adds to
// none of them.
func TestStatsDriverAndWaitTime(t *testing.T) {
	const create, wait = 3 * time.Millisecond, 5 * time.Millisecond
	for _, mode := range []gpumem.Mode{gpumem.ModeVirtual, gpumem.ModePlain} {
		t.Run(mode.String(), func(t *testing.T) {
			dev := slowSim{sim.MustNew(sim.Config{Capacity: 256 * miB}), create, wait, 0}
			a := newAlloc(t, dev, gpumem.Config{Mode: mode})
			b, err := a.Alloc(8*miB, 0)
			if err != nil {
				t.Fatal(err)
			}
			st := a.Stats()
			if mode == gpumem.ModeVirtual && (st.Creates == 0 || st.DriverNanos < uint64(st.Creates)*uint64(create)) {
				t.Errorf("%d creates of %v each, DriverNanos %v", st.Creates, create, time.Duration(st.DriverNanos))
			}
			if mode == gpumem.ModeVirtual {
				// Each call's part: the creates' is at least their
				// known time, every call made has a part, and the
				// parts add up to no more than the total.
				parts := st.CreateNanos + st.MapNanos + st.SetAccessNanos + st.UnmapNanos + st.ReleaseNanos
				if st.CreateNanos < uint64(st.Creates)*uint64(create) || st.Maps > 0 && st.MapNanos == 0 || st.SetAccess > 0 && st.SetAccessNanos == 0 || parts > st.DriverNanos {
					t.Errorf("%d creates (%v each): CreateNanos %d, MapNanos %d (%d maps), SetAccessNanos %d (%d grants), their sum %d against DriverNanos %d",
						st.Creates, create, st.CreateNanos, st.MapNanos, st.Maps, st.SetAccessNanos, st.SetAccess, parts, st.DriverNanos)
				}
				if st.UnmapNanos != 0 || st.ReleaseNanos != 0 {
					t.Errorf("before any unmap or release: UnmapNanos %d, ReleaseNanos %d", st.UnmapNanos, st.ReleaseNanos)
				}
			} else if st.CreateNanos+st.MapNanos+st.SetAccessNanos != 0 {
				t.Errorf("plain mode made virtual-memory calls: %+v", st)
			}
			if st.DeviceCalls() == 0 || st.DriverNanos == 0 || st.WaitNanos != 0 || st.Fences != 0 {
				t.Errorf("after one growth: %d calls, DriverNanos %d, %d fences, WaitNanos %d", st.DeviceCalls(), st.DriverNanos, st.Fences, st.WaitNanos)
			}
			if st.Misses != 1 || st.MissNanos < st.DriverNanos {
				t.Errorf("after one growth: %d misses, MissNanos %d; want 1, at least DriverNanos %d", st.Misses, st.MissNanos, st.DriverNanos)
			}
			if err := a.Free(b); err != nil {
				t.Fatal(err)
			}
			before := a.Stats()
			for i := 0; i < 100; i++ { // cache hits
				b, err := a.Alloc(8*miB, 0)
				if err != nil {
					t.Fatal(err)
				}
				if err := a.Free(b); err != nil {
					t.Fatal(err)
				}
			}
			if hit := a.Stats(); hit.DriverNanos != before.DriverNanos || hit.WaitNanos != before.WaitNanos || hit.Misses != before.Misses || hit.MissNanos != before.MissNanos ||
				hit.EventCalls != before.EventCalls || hit.EventNanos != before.EventNanos {
				t.Errorf("cache hits added DriverNanos %d -> %d, WaitNanos %d -> %d, Misses %d -> %d, EventCalls %d -> %d", before.DriverNanos, hit.DriverNanos, before.WaitNanos, hit.WaitNanos, before.Misses, hit.Misses, before.EventCalls, hit.EventCalls)
			}
			if err := a.Trim(); err != nil { // gives the span back after a fence
				t.Fatal(err)
			}
			st = a.Stats()
			if st.Fences == 0 || st.WaitNanos < uint64(st.Fences)*uint64(wait) {
				t.Errorf("%d fences of %v each, WaitNanos %v", st.Fences, wait, time.Duration(st.WaitNanos))
			}
			if st.DriverNanos <= before.DriverNanos {
				t.Errorf("the release added no DriverNanos (%d)", st.DriverNanos)
			}
			if mode == gpumem.ModeVirtual && (st.Releases == 0 || st.ReleaseNanos == 0 || st.UnmapNanos == 0) {
				t.Errorf("after the trim: %d releases, ReleaseNanos %d, UnmapNanos %d", st.Releases, st.ReleaseNanos, st.UnmapNanos)
			}
		})
	}
}

// TestStatsEventTime: Stats.EventCalls and EventNanos count the event calls
// that keep the streams' order (here: stream b's miss records an epoch on
// stream a, whose frees it could reuse, and queries it) and their host
// time, and a cache hit makes none. With markers the record is a marker's
// write, counted as an event call, and the queries are reads, no calls.
func TestStatsEventTime(t *testing.T) {
	for _, markers := range []bool{false, true} {
		t.Run(fmt.Sprintf("markers=%v", markers), func(t *testing.T) { testStatsEventTime(t, markers) })
	}
}

func testStatsEventTime(t *testing.T, markers bool) {
	const query = 2 * time.Millisecond
	dev := slowSim{sim.MustNew(sim.Config{Capacity: 1 << 30, NoMarkers: !markers}), 0, 0, query}
	a := newAlloc(t, dev, gpumem.Config{Mode: gpumem.ModeVirtual})
	sa, _ := dev.NewStream()
	sb, _ := dev.NewStream()
	x, err := a.Alloc(64*miB, sa)
	if err != nil {
		t.Fatal(err)
	}
	if err := a.Free(x); err != nil {
		t.Fatal(err)
	}
	st := a.Stats()
	if st.EventCalls != 0 || st.EventNanos != 0 {
		t.Errorf("one stream's alloc and free: EventCalls %d, EventNanos %d; want none", st.EventCalls, st.EventNanos)
	}
	y, err := a.Alloc(64*miB, sb) // a miss: stream a's frees are looked at
	if err != nil {
		t.Fatal(err)
	}
	st = a.Stats()
	if st.EventCalls == 0 {
		t.Fatalf("stream b's miss beside stream a's free made no event call (%+v)", st)
	}
	// Every query sleeps: EventNanos holds at least one query's time, and
	// the miss's time holds the event time.
	if st.EventNanos < uint64(query) || st.MissNanos < st.EventNanos {
		t.Errorf("EventCalls %d: EventNanos %v, MissNanos %v; want at least one query or mark (%v), within MissNanos", st.EventCalls, time.Duration(st.EventNanos), time.Duration(st.MissNanos), query)
	}
	// The writes' part: with markers the mark that stood for the record
	// (it sleeps as a query does), none with events.
	if markers && (st.MarkCalls == 0 || st.MarkCalls > st.EventCalls || st.MarkNanos < uint64(query) || st.MarkNanos > st.EventNanos) ||
		!markers && st.MarkCalls+st.MarkNanos != 0 {
		t.Errorf("markers %v: MarkCalls %d in %v of EventCalls %d in %v", markers, st.MarkCalls, time.Duration(st.MarkNanos), st.EventCalls, time.Duration(st.EventNanos))
	}
	if ds := dev.Stats(); markers && (ds.Marks == 0 || ds.MarkerReads == 0 || ds.Records+ds.Queries != 0) ||
		!markers && (ds.Marks+ds.MarkerReads != 0 || ds.Records == 0 || ds.Queries == 0) {
		t.Errorf("markers %v: the device saw %d records, %d queries, %d marks, %d marker reads", markers, ds.Records, ds.Queries, ds.Marks, ds.MarkerReads)
	}
	if err := a.Free(y); err != nil {
		t.Fatal(err)
	}
	before := a.Stats()
	for i := 0; i < 50; i++ { // cache hits on stream b
		b, err := a.Alloc(64*miB, sb)
		if err != nil {
			t.Fatal(err)
		}
		if err := a.Free(b); err != nil {
			t.Fatal(err)
		}
	}
	if hit := a.Stats(); hit.EventCalls != before.EventCalls || hit.EventNanos != before.EventNanos {
		t.Errorf("cache hits made event calls: EventCalls %d -> %d, EventNanos %d -> %d", before.EventCalls, hit.EventCalls, before.EventNanos, hit.EventNanos)
	}
}
