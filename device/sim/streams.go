package sim

import (
	"fmt"

	"github.com/gpumem/gpumem/device"
)

// A stream's work is numbered 1, 2, ... in enqueue order. enq is the number
// of the last item enqueued, done that of the last completed; items
// done+1..enq are pending and sit in q[head:], in order. Items complete in
// order, so "the work before seq k has completed" is simply done >= k.
type stream struct {
	id        device.Stream
	held      bool
	destroyed bool
	enq, done uint64
	q         []item
	head      int
	busyIdx   int           // index in Device.busy, or -1
	capture   uint64        // the capture it is part of (capture.go), 0 if none
	terminals []device.Node // while capturing: what its next captured work depends on

	visitEpoch, visitUpto uint64 // CheckHandoff's search marks
}

type itemKind uint8

const (
	itemMarker itemKind = iota // left by Record on a held or blocked stream
	itemTouch                  // [a, a+b) is read and written
	itemWait                   // waits until stream dep has completed item a
)

type item struct {
	seq  uint64
	kind itemKind
	dep  device.Stream
	a, b uint64
	// phys: for a touch, the physical chunks under [a, a+b) when it was
	// enqueued (the mappings there), so that CheckHandoff follows the
	// memory, not only the address: a handle moved to another address
	// with this work pending is still this work's.
	phys []physRange
}

// A physRange is [lo, hi) of VM chunk h.
type physRange struct {
	h      device.Handle
	lo, hi uint64
}

// physOf returns the physical ranges under the mappings that [p, end)
// overlaps (plain allocations have none).
func (d *Device) physOf(p, end uint64) []physRange {
	var out []physRange
	j := d.maps.floor(p)
	if j == 0 {
		j = d.maps.ceil(p)
	}
	for ; j != 0; j = d.maps.ceil(d.maps.key(j) + 1) {
		mp, m := d.maps.key(j), d.maps.val(j)
		if mp >= end {
			break
		}
		if mp+m.size <= p {
			continue
		}
		out = append(out, physRange{h: m.h, lo: max(p, mp) - mp, hi: min(end, mp+m.size) - mp})
	}
	return out
}

// physOverlap reports whether two sets of physical ranges share a byte.
func physOverlap(x, y []physRange) bool {
	for _, a := range x {
		for _, b := range y {
			if a.h == b.h && a.lo < b.hi && b.lo < a.hi {
				return true
			}
		}
	}
	return false
}

type eventRec struct {
	recorded bool
	stream   device.Stream
	seq      uint64 // complete when stream's done >= seq
	lag      int    // queries left that report it not done (Config.QueryLag)
	ready    uint64 // no query before this time finds it done (Config.RunAhead)
}

type frame struct {
	s    device.Stream
	upto uint64
}

// lookup returns stream s, destroyed or not, or nil if it never existed or
// is gone (destroyed with no pending work).
func (d *Device) lookup(s device.Stream) *stream {
	if uint64(s) < uint64(len(d.streams)) {
		return d.streams[s]
	}
	return nil
}

// live returns stream s if it exists and is not destroyed.
func (d *Device) live(s device.Stream) (*stream, error) {
	if uint64(s) >= uint64(len(d.streams)) {
		return nil, errf(device.ErrInvalid, "unknown stream %d", s)
	}
	st := d.streams[s]
	if st == nil || st.destroyed {
		return nil, errf(device.ErrInvalid, "stream %d was destroyed", s)
	}
	return st, nil
}

// reached reports whether stream s has completed its item seq.
func (d *Device) reached(s device.Stream, seq uint64) bool {
	st := d.lookup(s)
	return st == nil || st.done >= seq
}

// enqueue adds work to st. Work on a stream that is neither held nor
// blocked completes at once (and is not stored); otherwise it is queued.
// It returns the item's number.
func (d *Device) enqueue(st *stream, it item) uint64 {
	st.enq++
	if !st.held && st.head == len(st.q) && (it.kind != itemWait || d.reached(it.dep, it.a)) {
		st.done = st.enq
		return st.enq
	}
	it.seq = st.enq
	if st.head == len(st.q) {
		st.busyIdx = len(d.busy)
		d.busy = append(d.busy, st)
	}
	st.q = append(st.q, it)
	if it.kind == itemTouch {
		d.pendingTouches++
	}
	return st.enq
}

// completeHead completes st's first pending item.
func (d *Device) completeHead(st *stream) {
	it := &st.q[st.head]
	st.done = it.seq
	if it.kind == itemTouch {
		d.pendingTouches--
	}
	st.head++
	switch {
	case st.head == len(st.q):
		st.q, st.head = st.q[:0], 0
		last := d.busy[len(d.busy)-1]
		d.busy[st.busyIdx] = last
		last.busyIdx = st.busyIdx
		d.busy[len(d.busy)-1] = nil
		d.busy = d.busy[:len(d.busy)-1]
		st.busyIdx = -1
		if st.destroyed {
			d.streams[st.id] = nil
		}
	case st.head >= 64 && 2*st.head >= len(st.q):
		n := copy(st.q, st.q[st.head:])
		st.q, st.head = st.q[:n], 0
	}
}

// force completes stream s's work up to item upto, first completing
// whatever work on other streams it waits for. It ignores holds. There are
// no cycles: a wait only ever depends on work enqueued before it.
func (d *Device) force(s device.Stream, upto uint64) {
	d.stack = append(d.stack[:0], frame{s, upto})
	for len(d.stack) > 0 {
		f := d.stack[len(d.stack)-1]
		st := d.lookup(f.s)
		if st == nil || st.done >= f.upto {
			d.stack = d.stack[:len(d.stack)-1]
			continue
		}
		it := &st.q[st.head] // done < upto <= enq: something is pending
		if it.kind == itemWait && !d.reached(it.dep, it.a) {
			d.stack = append(d.stack, frame{it.dep, it.a})
			continue
		}
		d.completeHead(st)
	}
	d.settle()
}

// settle lets every stream that is not held make all the progress it can.
func (d *Device) settle() {
	for len(d.busy) > 0 {
		progress := false
		d.scratch = append(d.scratch[:0], d.busy...)
		for _, st := range d.scratch {
			for !st.held && st.head < len(st.q) {
				it := &st.q[st.head]
				if it.kind == itemWait && !d.reached(it.dep, it.a) {
					break
				}
				d.completeHead(st)
				progress = true
			}
		}
		if !progress {
			break
		}
	}
	clear(d.scratch)
}

// completeAll completes all pending work on every stream.
func (d *Device) completeAll() {
	for len(d.busy) > 0 {
		st := d.busy[len(d.busy)-1]
		d.force(st.id, st.enq)
	}
}

// NewStream creates a stream. Stream ids are never reused.
func (d *Device) NewStream() (device.Stream, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if err := d.fault(opNewStream); err != nil {
		return 0, &device.OpError{Op: "sim.NewStream", Err: err}
	}
	s := device.Stream(len(d.streams))
	d.streams = append(d.streams, &stream{id: s, busyIdx: -1})
	return s, nil
}

// DestroyStream destroys stream s (not 0): it accepts no more work. Work
// already pending on it stays pending, as in CUDA, until Drain(s), a Wait on
// an event recorded on it, or Synchronize completes it.
func (d *Device) DestroyStream(s device.Stream) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	err := d.fault(opDestroyStream)
	if err == nil {
		err = d.destroyStream(s)
	}
	if err != nil {
		return &device.OpError{Op: "sim.DestroyStream", Args: fmt.Sprintf("s=%d", s), Err: err}
	}
	return nil
}

func (d *Device) destroyStream(s device.Stream) error {
	if s == 0 {
		return errf(device.ErrInvalid, "the default stream 0 cannot be destroyed")
	}
	st, err := d.live(s)
	if err != nil {
		return err
	}
	st.destroyed = true
	if st.head == len(st.q) {
		d.streams[s] = nil
	}
	return nil
}

// SynchronizeStream completes all work enqueued on s so far (and the work
// it waits for). It never blocks; a hold on s stays in force.
func (d *Device) SynchronizeStream(s device.Stream) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	err := d.fault(opSynchronizeStream)
	var st *stream
	if err == nil {
		st, err = d.live(s)
	}
	if err != nil {
		return &device.OpError{Op: "sim.SynchronizeStream", Args: fmt.Sprintf("s=%d", s), Err: err}
	}
	if err := d.refuseCaptured(st, "sim.SynchronizeStream"); err != nil {
		return err
	}
	d.force(s, st.enq)
	d.caughtUp(s, false)
	d.st.Synchronizes++
	return nil
}

// caughtUp marks the events recorded on stream s (every stream's, with
// all) as reached by the GPU: the host has waited for all of it
// (Config.RunAhead).
func (d *Device) caughtUp(s device.Stream, all bool) {
	if d.runAhead == 0 {
		return
	}
	d.markersCaughtUp(s, all)
	for e, r := range d.events {
		if r.ready > 0 && (all || r.stream == s) {
			r.ready = 0
			d.events[e] = r
		}
	}
}

// NewEvent creates an event. Event ids are never reused.
func (d *Device) NewEvent() (device.Event, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if err := d.fault(opNewEvent); err != nil {
		return 0, &device.OpError{Op: "sim.NewEvent", Err: err}
	}
	d.nextE++
	d.events[d.nextE] = eventRec{}
	return d.nextE, nil
}

func (d *Device) event(e device.Event) (eventRec, error) {
	r, ok := d.events[e]
	if !ok {
		if e != 0 && e <= d.nextE {
			return r, errf(device.ErrInvalid, "event %d was destroyed", e)
		}
		return r, errf(device.ErrInvalid, "unknown event %d", e)
	}
	return r, nil
}

// DestroyEvent destroys e. Work already waiting for it is unaffected.
func (d *Device) DestroyEvent(e device.Event) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	err := d.fault(opDestroyEvent)
	if err == nil {
		_, err = d.event(e)
	}
	if err != nil {
		return &device.OpError{Op: "sim.DestroyEvent", Args: fmt.Sprintf("e=%d", e), Err: err}
	}
	delete(d.events, e)
	return nil
}

// Record records e at the current end of s: e completes when all work
// enqueued on s so far has. On a held stream the record itself is pending
// work, so e stays incomplete until the stream is drained (or waited for).
func (d *Device) Record(e device.Event, s device.Stream) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	err := d.fault(opRecord)
	var st *stream
	if err == nil {
		_, err = d.event(e)
	}
	if err == nil {
		st, err = d.live(s)
	}
	if err != nil {
		return &device.OpError{Op: "sim.Record", Args: fmt.Sprintf("e=%d, s=%d", e, s), Err: err}
	}
	if err := d.refuseCaptured(st, "sim.Record"); err != nil {
		return err
	}
	seq := st.enq
	if st.held || st.head < len(st.q) {
		seq = d.enqueue(st, item{kind: itemMarker})
	}
	r := eventRec{recorded: true, stream: s, seq: seq, lag: d.queryLag}
	if d.runAhead > 0 {
		r.ready = d.now + d.runAhead
	}
	d.events[e] = r
	d.st.Records++
	return nil
}

// Query reports whether e has completed. An event never recorded has.
func (d *Device) Query(e device.Event) (bool, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	err := d.fault(opQuery)
	var r eventRec
	if err == nil {
		r, err = d.event(e)
	}
	if err != nil {
		return false, &device.OpError{Op: "sim.Query", Args: fmt.Sprintf("e=%d", e), Err: err}
	}
	d.st.Queries++
	if r.recorded && r.lag > 0 {
		r.lag--
		d.events[e] = r
		return false, nil
	}
	if r.recorded && d.now < r.ready {
		return false, nil // the GPU has not reached the record yet (Config.RunAhead)
	}
	return !r.recorded || d.reached(r.stream, r.seq), nil
}

// Wait completes the work before e's last record (and the work that work
// waits for), as the GPU would while the host blocks. It never blocks.
func (d *Device) Wait(e device.Event) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	err := d.fault(opWait)
	var r eventRec
	if err == nil {
		r, err = d.event(e)
	}
	if err != nil {
		return &device.OpError{Op: "sim.Wait", Args: fmt.Sprintf("e=%d", e), Err: err}
	}
	if r.recorded && !d.reached(r.stream, r.seq) {
		d.force(r.stream, r.seq)
	}
	if r.lag > 0 || r.ready > 0 { // the host waited: the GPU has reached the record
		r.lag, r.ready = 0, 0
		d.events[e] = r
	}
	d.st.Waits++
	return nil
}

// StreamWait makes all work enqueued on s from now on wait until e (as last
// recorded) has completed. It does not block the host.
func (d *Device) StreamWait(s device.Stream, e device.Event) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	err := d.fault(opStreamWait)
	var r eventRec
	var st *stream
	if err == nil {
		r, err = d.event(e)
	}
	if err == nil {
		st, err = d.live(s)
	}
	if err != nil {
		return &device.OpError{Op: "sim.StreamWait", Args: fmt.Sprintf("s=%d, e=%d", s, e), Err: err}
	}
	if err := d.refuseCaptured(st, "sim.StreamWait"); err != nil {
		return err
	}
	if r.recorded && !d.reached(r.stream, r.seq) {
		d.enqueue(st, item{kind: itemWait, dep: r.stream, a: r.seq})
	}
	d.st.StreamWaits++
	return nil
}

// Hold makes stream s stop completing work: everything enqueued on it from
// now on stays pending until Drain(s) (or until the host waits for it with
// Wait, SynchronizeStream or Synchronize). Hold panics if s does not exist
// or was destroyed.
func (d *Device) Hold(s device.Stream) {
	d.mu.Lock()
	defer d.mu.Unlock()
	st, err := d.live(s)
	if err != nil {
		panic("sim.Hold: " + err.Error())
	}
	st.held = true
}

// Drain lifts the hold on s and completes all work enqueued on it, together
// with the work on other streams it waits for. Draining a destroyed stream
// completes its remaining work. Drain panics if s never existed.
func (d *Device) Drain(s device.Stream) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if uint64(s) >= uint64(len(d.streams)) {
		panic(fmt.Sprintf("sim.Drain: unknown stream %d", s))
	}
	st := d.streams[s]
	if st == nil {
		return
	}
	st.held = false
	d.force(s, st.enq)
}

// Pending returns the number of work items pending on stream s (0 for a
// stream that does not exist).
func (d *Device) Pending(s device.Stream) int {
	d.mu.Lock()
	defer d.mu.Unlock()
	if st := d.lookup(s); st != nil {
		return len(st.q) - st.head
	}
	return 0
}

// Touch enqueues on s work that reads and writes [p, p+size), which must be
// accessible (see Accessible). On a stream that is not held or blocked the
// work completes at once; otherwise it is pending, and the memory may not be
// freed or unmapped until it completes.
func (d *Device) Touch(s device.Stream, p device.Ptr, size uint64) error {
	d.mu.Lock()
	err := d.touch(s, uint64(p), size)
	d.mu.Unlock()
	if err != nil {
		return &device.OpError{Op: "sim.Touch", Args: fmt.Sprintf("s=%d, p=%#x, size=%d", s, uint64(p), size), Err: err}
	}
	return nil
}

func (d *Device) touch(s device.Stream, p, size uint64) error {
	st, err := d.live(s)
	if err != nil {
		return err
	}
	if size == 0 {
		return errf(device.ErrInvalid, "size is 0")
	}
	if at, ok := d.inaccessible(p, size); !ok {
		return errf(device.ErrInvalid, "[%#x, +%#x) is not accessible: %#x is neither in a live allocation nor mapped with access set", p, size, at)
	}
	d.enqueue(st, item{kind: itemTouch, a: p, b: size, phys: d.physOf(p, p+size)})
	if st.capture != 0 {
		d.addNode(st)
	}
	d.st.Touches++
	return nil
}

// pendingUser returns the pending touch of [p, p+size) on the lowest-numbered
// stream, if any.
func (d *Device) pendingUser(p, size uint64, skip *stream) (*stream, *item) {
	if d.pendingTouches == 0 {
		return nil, nil
	}
	end := p + size
	var bs *stream
	var bi *item
	for _, st := range d.busy {
		if st == skip || (bs != nil && st.id > bs.id) {
			continue
		}
		for i := st.head; i < len(st.q); i++ {
			it := &st.q[i]
			if it.kind == itemTouch && it.a < end && p < it.a+it.b {
				bs, bi = st, it
				break
			}
		}
	}
	return bs, bi
}

// checkIdle fails if pending work uses [p, p+size).
func (d *Device) checkIdle(p, size uint64) error {
	if st, it := d.pendingUser(p, size, nil); st != nil {
		return errf(device.ErrInvalid, "[%#x, %#x) is in use by pending work on stream %d (touch of [%#x, %#x))",
			p, p+size, st.id, it.a, it.a+it.b)
	}
	return nil
}

// CheckHandoff reports whether [p, p+size) may be used by work enqueued on s
// from now on: it returns an *device.OpError wrapping device.ErrInvalid if
// pending work on another stream touches the range, or the VM chunks mapped
// under it (wherever that work touched them: a chunk may be mapped at
// several addresses), and s's future work is not ordered after that work
// (by StreamWait, directly or through other streams, on an event recorded
// after it). Pending work on s itself is ordered by the stream.
func (d *Device) CheckHandoff(p device.Ptr, size uint64, s device.Stream) error {
	d.mu.Lock()
	err := d.checkHandoff(uint64(p), size, s)
	d.mu.Unlock()
	if err != nil {
		return &device.OpError{Op: "sim.CheckHandoff", Args: fmt.Sprintf("p=%#x, size=%d, s=%d", uint64(p), size, s), Err: err}
	}
	return nil
}

func (d *Device) checkHandoff(p, size uint64, s device.Stream) error {
	st, err := d.live(s)
	if err != nil {
		return err
	}
	end, ok := rangeEnd(p, size)
	if !ok || size == 0 {
		return errf(device.ErrInvalid, "bad range [%#x, +%#x)", p, size)
	}
	if d.pendingTouches == 0 {
		return nil
	}
	var bs *stream
	var bi *item
	phys := d.physOf(p, end)
	for _, x := range d.busy {
		if x == st || (bs != nil && x.id > bs.id) {
			continue
		}
		for i := x.head; i < len(x.q); i++ {
			it := &x.q[i]
			if it.kind == itemTouch && (it.a < end && p < it.a+it.b || physOverlap(it.phys, phys)) && !d.orderedAfter(st, x.id, it.seq) {
				bs, bi = x, it
				break
			}
		}
	}
	if bs != nil {
		return errf(device.ErrInvalid, "[%#x, %#x) is in use by pending work on stream %d (touch of [%#x, %#x)) and stream %d is not ordered after it: "+
			"record an event on stream %d after that work and StreamWait on it, or wait for it on the host",
			p, end, bs.id, bi.a, bi.a+bi.b, s, bs.id)
	}
	return nil
}

// orderedAfter reports whether work enqueued on st from now on is ordered
// after item seq of stream x. Only pending waits can order it: a wait that
// completed did so after its event's work, and work before a pending item
// cannot have completed.
func (d *Device) orderedAfter(st *stream, x device.Stream, seq uint64) bool {
	d.epoch++
	d.stack = append(d.stack[:0], frame{st.id, st.enq})
	for len(d.stack) > 0 {
		f := d.stack[len(d.stack)-1]
		d.stack = d.stack[:len(d.stack)-1]
		if f.s == x && f.upto >= seq {
			return true
		}
		y := d.lookup(f.s)
		if y == nil || (y.visitEpoch == d.epoch && y.visitUpto >= f.upto) {
			continue
		}
		y.visitEpoch, y.visitUpto = d.epoch, f.upto
		for i := y.head; i < len(y.q) && y.q[i].seq <= f.upto; i++ {
			if it := &y.q[i]; it.kind == itemWait {
				d.stack = append(d.stack, frame{it.dep, it.a})
			}
		}
	}
	return false
}
