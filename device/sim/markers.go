package sim

import (
	"fmt"

	"github.com/gpumem/gpumem/device"
)

// A marker (device.Markers) is modelled as its events are: a write lands
// when its stream has completed the work enqueued before it, and, so that
// a replay's decisions do not depend on which of the two an allocator
// uses, the host sees it land under the same rules as an event recorded
// there completes: not to the first Config.QueryLag reads after the write
// (each read counts for every write it does not see, as each query of an
// event re-recorded counts from its last record), nor before
// Config.RunAhead has passed unless the host has waited for the stream
// since. A read here is one call of Reached.
//
// Invariants: pend holds the writes not yet seen, in the order they were
// enqueued; value is the last one seen (0 before any).
type markerRec struct {
	value uint64
	pend  []markWrite
}

// A markWrite is a write of v, enqueued as item seq of stream (or already
// complete then: seq <= done).
type markWrite struct {
	v      uint64
	stream device.Stream
	seq    uint64
	lag    int    // reads left that do not see it (Config.QueryLag)
	ready  uint64 // no read before this time sees it (Config.RunAhead)
}

// NewMarker creates a marker, unless Config.NoMarkers says the device has
// none (then the error matches device.ErrUnsupported).
func (d *Device) NewMarker() (device.Marker, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	err := d.fault(opNewMarker)
	if err == nil && d.noMarkers {
		err = errf(device.ErrUnsupported, "the device has no stream memory operations (Config.NoMarkers)")
	}
	if err != nil {
		return 0, &device.OpError{Op: "sim.NewMarker", Err: err}
	}
	d.nextM++
	d.markers[d.nextM] = &markerRec{}
	return d.nextM, nil
}

func (d *Device) marker(m device.Marker) (*markerRec, error) {
	r, ok := d.markers[m]
	if !ok {
		if m != 0 && m <= d.nextM {
			return nil, errf(device.ErrInvalid, "marker %d was destroyed", m)
		}
		return nil, errf(device.ErrInvalid, "unknown marker %d", m)
	}
	return r, nil
}

// DestroyMarker destroys m. Its writes still pending land nowhere (marker
// ids are never reused).
func (d *Device) DestroyMarker(m device.Marker) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	err := d.fault(opDestroyMarker)
	if err == nil {
		_, err = d.marker(m)
	}
	if err != nil {
		return &device.OpError{Op: "sim.DestroyMarker", Args: fmt.Sprintf("m=%d", m), Err: err}
	}
	delete(d.markers, m)
	return nil
}

// Mark enqueues on s a write of v to m (see Record: on a held or busy
// stream the write is pending work).
func (d *Device) Mark(m device.Marker, s device.Stream, v uint64) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	err := d.fault(opMark)
	var r *markerRec
	var st *stream
	if err == nil {
		r, err = d.marker(m)
	}
	if err == nil {
		st, err = d.live(s)
	}
	if err != nil {
		return &device.OpError{Op: "sim.Mark", Args: fmt.Sprintf("m=%d, s=%d, v=%d", m, s, v), Err: err}
	}
	if err := d.refuseCaptured(st, "sim.Mark"); err != nil {
		return err
	}
	seq := st.enq
	if st.held || st.head < len(st.q) {
		seq = d.enqueue(st, item{kind: itemMarker})
	}
	w := markWrite{v: v, stream: s, seq: seq, lag: d.queryLag}
	if d.runAhead > 0 {
		w.ready = d.now + d.runAhead
	}
	r.pend = append(r.pend, w)
	d.st.Marks++
	return nil
}

// Reached returns the last value written to m that the host sees. It
// panics on a marker the device never gave out or that was destroyed: a
// load of memory that is not a marker's is a bug of the caller.
func (d *Device) Reached(m device.Marker) uint64 {
	d.mu.Lock()
	defer d.mu.Unlock()
	r, err := d.marker(m)
	if err != nil {
		panic("sim.Reached: " + err.Error())
	}
	d.st.MarkerReads++
	n, seen := 0, true
	for i := range r.pend {
		w := &r.pend[i]
		if w.lag > 0 {
			w.lag-- // this read counts for every write it does not see
			seen = false
			continue
		}
		if seen = seen && d.now >= w.ready && d.reached(w.stream, w.seq); seen {
			r.value = w.v
			n = i + 1
		}
	}
	if n > 0 {
		r.pend = append(r.pend[:0], r.pend[n:]...)
	}
	return r.value
}

// markersCaughtUp is caughtUp for the markers' writes.
func (d *Device) markersCaughtUp(s device.Stream, all bool) {
	for _, r := range d.markers {
		for i := range r.pend {
			if w := &r.pend[i]; all || w.stream == s {
				w.ready = 0
			}
		}
	}
}
