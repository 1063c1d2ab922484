package gpumem

// See doc.go for the overview.

import (
	"sync/atomic"
	"time"

	"github.com/gpumem/gpumem/device"
)

// timedVM is the device's virtual memory with the host time of every call
// added to a counter (Stats.DriverNanos), and that of each kind of call to
// its own (Stats.CreateNanos and the others: which call a slow growth
// waited in). Only growth, moves and releases call it: never a cache hit.
// Package device/timed times a whole device by operation for the replay
// (--driver-times), but wraps only devices with every optional capability,
// keeps a map per operation, and sits outside the allocator; this is the
// allocator's own total, for any device.
type timedVM struct {
	device.VirtualMemory
	c *counters
}

// addSince adds the host time since t0 to counter n: the allocator's host
// time counters (Stats.DriverNanos, WaitNanos, MissNanos), never on a
// cache hit.
func addSince(n *atomic.Uint64, t0 time.Time) { n.Add(uint64(time.Since(t0))) }

// since adds the time since t0 to the total and, if not nil, to one call's
// counter.
func (t timedVM) since(t0 time.Time, call *atomic.Uint64) {
	d := uint64(time.Since(t0))
	t.c.driverNanos.Add(d)
	if call != nil {
		call.Add(d)
	}
}

func (t timedVM) Reserve(size, align uint64) (device.Ptr, error) {
	defer t.since(time.Now(), nil)
	return t.VirtualMemory.Reserve(size, align)
}

func (t timedVM) ReleaseAddress(p device.Ptr, size uint64) error {
	defer t.since(time.Now(), nil)
	return t.VirtualMemory.ReleaseAddress(p, size)
}

func (t timedVM) Create(size uint64) (device.Handle, error) {
	defer t.since(time.Now(), &t.c.createNanos)
	return t.VirtualMemory.Create(size)
}

func (t timedVM) Release(h device.Handle) error {
	defer t.since(time.Now(), &t.c.releaseNanos)
	return t.VirtualMemory.Release(h)
}

func (t timedVM) Map(p device.Ptr, size uint64, h device.Handle) error {
	defer t.since(time.Now(), &t.c.mapNanos)
	return t.VirtualMemory.Map(p, size, h)
}

func (t timedVM) SetAccess(p device.Ptr, size uint64) error {
	defer t.since(time.Now(), &t.c.accessNanos)
	return t.VirtualMemory.SetAccess(p, size)
}

func (t timedVM) Unmap(p device.Ptr, size uint64) error {
	defer t.since(time.Now(), &t.c.unmapNanos)
	return t.VirtualMemory.Unmap(p, size)
}

// timedEvents is the device's events with the host time of every call but
// Wait added to Stats.EventNanos and the calls counted in EventCalls: what
// keeping the streams' order costs the host (queries of other streams'
// frees, epochs, stream waits). Wait, the host waiting for the GPU (a
// fence, or the wait for pending frees before a retry), adds to WaitNanos
// instead. No cache hit makes an event call.
type timedEvents struct {
	device.Events
	c *counters
}

func (t timedEvents) since(t0 time.Time) {
	t.c.eventNanos.Add(uint64(time.Since(t0)))
	t.c.eventCalls.Add(1)
}

func (t timedEvents) NewEvent() (device.Event, error) {
	defer t.since(time.Now())
	return t.Events.NewEvent()
}

func (t timedEvents) DestroyEvent(e device.Event) error {
	defer t.since(time.Now())
	return t.Events.DestroyEvent(e)
}

func (t timedEvents) Record(e device.Event, s device.Stream) error {
	defer t.since(time.Now())
	return t.Events.Record(e, s)
}

func (t timedEvents) Query(e device.Event) (bool, error) {
	defer t.since(time.Now())
	return t.Events.Query(e)
}

func (t timedEvents) Wait(e device.Event) error {
	defer addSince(&t.c.waitNanos, time.Now())
	return t.Events.Wait(e)
}

func (t timedEvents) StreamWait(s device.Stream, e device.Event) error {
	defer t.since(time.Now())
	return t.Events.StreamWait(s, e)
}

// timedMarkers is the device's markers with each Mark, NewMarker and
// DestroyMarker counted and timed as an event call is (timedEvents),
// since they stand for a record, and in Stats.MarkCalls and MarkNanos
// too. Reached, a load, is neither.
type timedMarkers struct {
	device.Markers
	c *counters
}

func (t timedMarkers) since(t0 time.Time) {
	d := uint64(time.Since(t0))
	t.c.eventNanos.Add(d) // the total first, the part after: see Stats
	t.c.eventCalls.Add(1)
	t.c.markNanos.Add(d)
	t.c.markCalls.Add(1)
}

// NewMarker counts only where the device made one: a device without
// markers says so at once (device.ErrUnsupported), with no driver call.
func (t timedMarkers) NewMarker() (device.Marker, error) {
	t0 := time.Now()
	m, err := t.Markers.NewMarker()
	if err == nil {
		t.since(t0)
	}
	return m, err
}

func (t timedMarkers) DestroyMarker(m device.Marker) error {
	defer t.since(time.Now())
	return t.Markers.DestroyMarker(m)
}

func (t timedMarkers) Mark(m device.Marker, s device.Stream, v uint64) error {
	defer t.since(time.Now())
	return t.Markers.Mark(m, s, v)
}
