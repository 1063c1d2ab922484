package sim

import (
	"strings"
	"testing"

	"github.com/gpumem/gpumem/device"
)

func query(t *testing.T, d *Device, e device.Event) bool {
	t.Helper()
	done, err := d.Query(e)
	if err != nil {
		t.Fatal(err)
	}
	return done
}

func newStream(t *testing.T, d *Device) device.Stream {
	t.Helper()
	return must1[device.Stream](t)(d.NewStream())
}

func newEvent(t *testing.T, d *Device) device.Event {
	t.Helper()
	return must1[device.Event](t)(d.NewEvent())
}

// mapped returns an accessible VM range of n granules.
func mapped(t *testing.T, d *Device, n int) device.Ptr {
	t.Helper()
	size := uint64(n) * d.Granularity()
	r := must1[device.Ptr](t)(d.Reserve(size, 0))
	h := must1[device.Handle](t)(d.Create(size))
	must(t, d.Map(r, size, h))
	must(t, d.SetAccess(r, size))
	must(t, d.Release(h))
	return r
}

func TestEventsAndStreamsHappyPath(t *testing.T) {
	d := newDev(t, Config{})
	var ev device.Events = d
	var ss device.Streams = d
	s := must1[device.Stream](t)(ss.NewStream())
	s2 := must1[device.Stream](t)(ss.NewStream())
	if s == 0 || s2 == s {
		t.Fatalf("streams %d %d", s, s2)
	}
	e := must1[device.Event](t)(ev.NewEvent())
	if !query(t, d, e) {
		t.Error("an event never recorded is incomplete")
	}
	must(t, ev.Record(e, s))
	if !query(t, d, e) {
		t.Error("an event recorded on an idle stream is incomplete")
	}
	must(t, ev.Record(e, 0)) // stream 0 always exists
	must(t, ev.Wait(e))
	must(t, ev.StreamWait(s2, e))
	must(t, ss.SynchronizeStream(s))
	must(t, ss.SynchronizeStream(0))
	must(t, d.Synchronize())
	must(t, ev.DestroyEvent(e))
	must(t, ss.DestroyStream(s))
	must(t, ss.DestroyStream(s2))
	s3 := must1[device.Stream](t)(ss.NewStream())
	if s3 == s || s3 == s2 {
		t.Errorf("stream id %d reused", s3)
	}
	e2 := must1[device.Event](t)(ev.NewEvent())
	if e2 == e {
		t.Errorf("event id %d reused", e2)
	}
	st := d.Stats()
	if st.Records != 2 || st.Queries != 2 || st.Waits != 1 || st.StreamWaits != 1 || st.Synchronizes != 3 ||
		st.LiveEvents != 1 || st.LiveStreams != 2 || st.Pending != 0 {
		t.Errorf("stats: %+v", st)
	}
}

func TestEventAndStreamPreconditions(t *testing.T) {
	d := newDev(t, Config{})
	s := newStream(t, d)
	e := newEvent(t, d)
	dead := newEvent(t, d)
	must(t, d.DestroyEvent(dead))
	gone := newStream(t, d)
	must(t, d.DestroyStream(gone))

	wantErr(t, d.Record(99, s), "sim.Record", device.ErrInvalid, "unknown event 99")
	wantErr(t, d.Record(dead, s), "sim.Record", device.ErrInvalid, "was destroyed")
	wantErr(t, d.Record(e, 42), "sim.Record", device.ErrInvalid, "unknown stream 42")
	wantErr(t, d.Record(e, gone), "sim.Record", device.ErrInvalid, "stream 2 was destroyed")
	_, err := d.Query(dead)
	wantErr(t, err, "sim.Query", device.ErrInvalid, "was destroyed")
	_, err = d.Query(0)
	wantErr(t, err, "sim.Query", device.ErrInvalid, "unknown event 0")
	wantErr(t, d.Wait(99), "sim.Wait", device.ErrInvalid, "unknown event")
	wantErr(t, d.StreamWait(s, dead), "sim.StreamWait", device.ErrInvalid, "was destroyed")
	wantErr(t, d.StreamWait(gone, e), "sim.StreamWait", device.ErrInvalid, "was destroyed")
	wantErr(t, d.DestroyEvent(dead), "sim.DestroyEvent", device.ErrInvalid, "was destroyed")
	wantErr(t, d.DestroyStream(0), "sim.DestroyStream", device.ErrInvalid, "default stream 0 cannot be destroyed")
	wantErr(t, d.DestroyStream(gone), "sim.DestroyStream", device.ErrInvalid, "was destroyed")
	wantErr(t, d.DestroyStream(7), "sim.DestroyStream", device.ErrInvalid, "unknown stream 7")
	wantErr(t, d.SynchronizeStream(gone), "sim.SynchronizeStream", device.ErrInvalid, "was destroyed")
	wantErr(t, d.Touch(gone, 0, 1), "sim.Touch", device.ErrInvalid, "was destroyed")
	wantErr(t, d.CheckHandoff(0, 1, 9), "sim.CheckHandoff", device.ErrInvalid, "unknown stream 9")

	mustPanic(t, "Hold of a destroyed stream", func() { d.Hold(gone) })
	mustPanic(t, "Hold of an unknown stream", func() { d.Hold(9) })
	mustPanic(t, "Drain of an unknown stream", func() { d.Drain(9) })
	d.Drain(gone) // destroyed and idle: nothing to do
	if st := d.Stats(); st.Records != 0 || st.Queries != 0 || st.Waits != 0 || st.StreamWaits != 0 {
		t.Errorf("failed calls were counted: %+v", st)
	}
}

func mustPanic(t *testing.T, what string, f func()) {
	t.Helper()
	defer func() {
		if recover() == nil {
			t.Errorf("%s did not panic", what)
		}
	}()
	f()
}

func TestHoldDrain(t *testing.T) {
	d := newDev(t, Config{})
	s := newStream(t, d)
	e := newEvent(t, d)
	d.Hold(s)
	must(t, d.Record(e, s))
	if query(t, d, e) {
		t.Fatal("an event recorded on a held stream is complete")
	}
	if d.Pending(s) != 1 {
		t.Errorf("Pending = %d, want 1", d.Pending(s))
	}
	// Other streams are unaffected.
	e0 := newEvent(t, d)
	must(t, d.Record(e0, 0))
	if !query(t, d, e0) {
		t.Error("stream 0 held by Hold(s)")
	}
	d.Drain(s)
	if !query(t, d, e) || d.Pending(s) != 0 {
		t.Fatal("Drain did not complete the stream")
	}
	// Drain lifts the hold.
	must(t, d.Record(e, s))
	if !query(t, d, e) {
		t.Error("stream still held after Drain")
	}
	// Hold of stream 0.
	d.Hold(0)
	must(t, d.Record(e0, 0))
	if query(t, d, e0) {
		t.Error("Hold(0) had no effect")
	}
	d.Drain(0)
	if !query(t, d, e0) {
		t.Error("Drain(0) had no effect")
	}
}

func TestWaitCompletesUpToTheEvent(t *testing.T) {
	d := newDev(t, Config{})
	s := newStream(t, d)
	a := must1[device.Ptr](t)(d.Alloc(4096))
	b := must1[device.Ptr](t)(d.Alloc(4096))
	e1, e2 := newEvent(t, d), newEvent(t, d)
	d.Hold(s)
	must(t, d.Touch(s, a, 4096))
	must(t, d.Record(e1, s))
	must(t, d.Touch(s, b, 4096))
	must(t, d.Record(e2, s))
	if query(t, d, e1) || query(t, d, e2) {
		t.Fatal("events complete on a held stream")
	}
	must(t, d.Wait(e1))
	if !query(t, d, e1) || query(t, d, e2) {
		t.Fatal("Wait(e1) must complete exactly the work up to e1")
	}
	must(t, d.Free(a))
	wantErr(t, d.Free(b), "sim.Free", device.ErrInvalid, "in use by pending work on stream 1")
	// The hold stays in force for new work.
	e3 := newEvent(t, d)
	must(t, d.SynchronizeStream(s))
	if !query(t, d, e2) {
		t.Error("SynchronizeStream left work pending")
	}
	must(t, d.Record(e3, s))
	if query(t, d, e3) {
		t.Error("SynchronizeStream lifted the hold")
	}
	must(t, d.Synchronize())
	if !query(t, d, e3) {
		t.Error("Synchronize left work pending")
	}
	must(t, d.Free(b))
	must(t, d.Record(e3, s))
	if query(t, d, e3) {
		t.Error("Synchronize lifted the hold")
	}
	d.Drain(s)
}

func TestStreamWait(t *testing.T) {
	d := newDev(t, Config{})
	s1, s2 := newStream(t, d), newStream(t, d)
	e1, e2 := newEvent(t, d), newEvent(t, d)
	p := must1[device.Ptr](t)(d.Alloc(4096))

	d.Hold(s1)
	must(t, d.Record(e1, s1))
	must(t, d.StreamWait(s2, e1))
	must(t, d.Record(e2, s2)) // s2 is not held, but blocked behind e1
	if query(t, d, e2) {
		t.Fatal("an event recorded after a StreamWait on an incomplete event is complete")
	}
	must(t, d.Touch(s2, p, 4096))
	wantErr(t, d.Free(p), "sim.Free", device.ErrInvalid, "in use by pending work on stream 2")
	if d.Pending(s2) != 3 {
		t.Errorf("Pending(s2) = %d, want 3 (wait, record, touch)", d.Pending(s2))
	}
	d.Drain(s1) // s2 proceeds by itself once e1 completes
	if !query(t, d, e2) || d.Pending(s2) != 0 {
		t.Fatal("s2 did not proceed when e1 completed")
	}
	must(t, d.Free(p))

	// StreamWait on a complete or never-recorded event orders nothing.
	e3 := newEvent(t, d)
	must(t, d.StreamWait(s2, e3))
	must(t, d.StreamWait(s2, e1))
	must(t, d.Record(e2, s2))
	if !query(t, d, e2) || d.Pending(s2) != 0 {
		t.Error("StreamWait on a complete event blocked the stream")
	}

	// StreamWait captures the event as recorded at the time of the call.
	d.Hold(s1)
	must(t, d.Record(e1, s1))
	must(t, d.StreamWait(s2, e1))
	must(t, d.Record(e1, 0)) // re-record elsewhere: complete at once
	must(t, d.Record(e2, s2))
	if !query(t, d, e1) || query(t, d, e2) {
		t.Error("re-recording an event changed an earlier StreamWait")
	}
	// Destroying the event does not release the waiter either.
	must(t, d.DestroyEvent(e1))
	if query(t, d, e2) {
		t.Error("destroying the event released the waiter")
	}
	d.Drain(s1)
	if !query(t, d, e2) {
		t.Error("waiter not released by Drain")
	}
}

func TestStreamWaitChain(t *testing.T) {
	d := newDev(t, Config{})
	s1, s2, s3 := newStream(t, d), newStream(t, d), newStream(t, d)
	e1, e2, e3, late := newEvent(t, d), newEvent(t, d), newEvent(t, d), newEvent(t, d)
	d.Hold(s1)
	must(t, d.Record(e1, s1))
	must(t, d.Record(late, s1)) // after e1 on s1
	must(t, d.StreamWait(s2, e1))
	must(t, d.Record(e2, s2))
	must(t, d.StreamWait(s3, e2))
	must(t, d.Record(e3, s3))
	if query(t, d, e1) || query(t, d, e2) || query(t, d, e3) {
		t.Fatal("chain complete while its head is held")
	}
	// Waiting on the tail completes the chain back to e1, but no more.
	must(t, d.Wait(e3))
	if !query(t, d, e1) || !query(t, d, e2) || !query(t, d, e3) {
		t.Fatal("Wait(e3) did not complete the chain")
	}
	if query(t, d, late) {
		t.Fatal("Wait(e3) completed work on s1 after e1")
	}
	// s1 is still held.
	must(t, d.Record(e1, s1))
	if query(t, d, e1) {
		t.Fatal("Wait lifted the hold on s1")
	}

	// Drain of a waiter completes what it waits for, even on a held stream,
	// and lifts only its own hold.
	d.Hold(s2)
	must(t, d.StreamWait(s2, e1))
	must(t, d.Record(e2, s2))
	d.Drain(s2)
	if !query(t, d, e2) || !query(t, d, e1) || !query(t, d, late) {
		t.Fatal("Drain(s2) did not complete s1 up to e1")
	}
	must(t, d.Record(e1, s1))
	if query(t, d, e1) {
		t.Fatal("Drain(s2) lifted the hold on s1")
	}
	d.Drain(s1)
	if st := d.Stats(); st.Pending != 0 {
		t.Errorf("pending after draining everything: %d", st.Pending)
	}
}

func TestTouchBlocksFreeAndUnmap(t *testing.T) {
	d := newDev(t, Config{})
	s := newStream(t, d)
	p := must1[device.Ptr](t)(d.Alloc(8192))
	r := mapped(t, d, 2)
	// Work that completes at once leaves nothing pending.
	must(t, d.Touch(s, p, 8192))
	must(t, d.Touch(0, r, 2*G))
	if st := d.Stats(); st.Pending != 0 || st.Touches != 2 {
		t.Fatalf("stats: %+v", st)
	}
	d.Hold(s)
	must(t, d.Touch(s, p+4096, 4096))
	must(t, d.Touch(s, r+G-4096, 8192)) // the middle of the one mapping
	wantErr(t, d.Free(p), "sim.Free", device.ErrInvalid, "in use by pending work on stream 1")
	wantErr(t, d.Unmap(r, 2*G), "sim.Unmap", device.ErrInvalid, "in use by pending work on stream 1")
	if st := d.Stats(); st.Allocs != 1 || st.Frees != 0 || st.Unmaps != 0 || st.LiveMappings != 1 {
		t.Errorf("failed Free/Unmap changed state: %+v", st)
	}
	d.Drain(s)
	must(t, d.Free(p))
	must(t, d.Unmap(r, 2*G))
	must(t, d.ReleaseAddress(r, 2*G))
	must(t, d.Leaks())

	// Touch of memory that is not accessible fails.
	r2 := must1[device.Ptr](t)(d.Reserve(2*G, 0))
	h := must1[device.Handle](t)(d.Create(G))
	must(t, d.Map(r2, G, h))
	wantErr(t, d.Touch(s, r2, G), "sim.Touch", device.ErrInvalid, "not accessible")
	must(t, d.SetAccess(r2, G))
	must(t, d.Touch(s, r2, G))
	wantErr(t, d.Touch(s, r2, G+1), "sim.Touch", device.ErrInvalid, "not accessible")
	wantErr(t, d.Touch(s, p, 1), "sim.Touch", device.ErrInvalid, "not accessible") // freed
	wantErr(t, d.Touch(s, r2, 0), "sim.Touch", device.ErrInvalid, "size is 0")
}

func TestTouchAcrossMappings(t *testing.T) {
	d := newDev(t, Config{})
	s := newStream(t, d)
	r := must1[device.Ptr](t)(d.Reserve(4*G, 0))
	for i := 0; i < 2; i++ {
		h := must1[device.Handle](t)(d.Create(G))
		must(t, d.Map(r+device.Ptr(i)*G, G, h))
		must(t, d.Release(h))
	}
	must(t, d.SetAccess(r, 2*G))
	d.Hold(s)
	must(t, d.Touch(s, r+G-4096, 8192)) // spans both mappings
	wantErr(t, d.Unmap(r, G), "sim.Unmap", device.ErrInvalid, "in use by pending work on stream 1")
	wantErr(t, d.Unmap(r+G, G), "sim.Unmap", device.ErrInvalid, "in use by pending work on stream 1")
	d.Drain(s)
	must(t, d.Unmap(r, G))
	must(t, d.Unmap(r+G, G))
}

func TestCheckHandoff(t *testing.T) {
	d := newDev(t, Config{})
	s1, s2, s3, s4 := newStream(t, d), newStream(t, d), newStream(t, d), newStream(t, d)
	p := must1[device.Ptr](t)(d.Alloc(G))
	q := must1[device.Ptr](t)(d.Alloc(G))
	before, after, early, via := newEvent(t, d), newEvent(t, d), newEvent(t, d), newEvent(t, d)

	// Nothing pending: any handoff is fine.
	must(t, d.CheckHandoff(p, G, s2))

	d.Hold(s1)
	must(t, d.Record(before, s1))
	must(t, d.Touch(s1, p, G))
	must(t, d.Record(after, s1))

	wantErr(t, d.CheckHandoff(p, G, s2), "sim.CheckHandoff", device.ErrInvalid,
		"in use by pending work on stream 1", "stream 2 is not ordered after it")
	wantErr(t, d.CheckHandoff(p+4096, 1, s2), "sim.CheckHandoff", device.ErrInvalid, "stream 1")
	must(t, d.CheckHandoff(q, G, s2)) // other memory
	must(t, d.CheckHandoff(p, G, s1)) // same stream: ordered by the stream
	// An event recorded before the work does not help.
	must(t, d.StreamWait(s2, before))
	wantErr(t, d.CheckHandoff(p, G, s2), "sim.CheckHandoff", device.ErrInvalid, "not ordered after it")
	must(t, d.Record(early, s2)) // on s2 before its wait for "after"
	must(t, d.StreamWait(s2, after))
	must(t, d.CheckHandoff(p, G, s2))

	// Transitively: s3 waits for an event on s2 recorded after s2's wait.
	wantErr(t, d.CheckHandoff(p, G, s3), "sim.CheckHandoff", device.ErrInvalid, "stream 3 is not ordered")
	must(t, d.Record(via, s2))
	must(t, d.StreamWait(s3, via))
	must(t, d.CheckHandoff(p, G, s3))
	// An event on s2 recorded before s2's wait does not order s4.
	must(t, d.StreamWait(s4, early))
	wantErr(t, d.CheckHandoff(p, G, s4), "sim.CheckHandoff", device.ErrInvalid, "stream 4 is not ordered")
	// Nor does a later wait on another stream's early event.
	must(t, d.StreamWait(s4, before))
	wantErr(t, d.CheckHandoff(p, G, s4), "sim.CheckHandoff", device.ErrInvalid, "stream 4 is not ordered")
	must(t, d.StreamWait(s4, via))
	must(t, d.CheckHandoff(p, G, s4))

	// Host wait: once the work has completed, any stream may have it.
	s5 := newStream(t, d)
	must(t, d.Touch(s1, q, G))
	must(t, d.Record(after, s1))
	wantErr(t, d.CheckHandoff(q, G, s5), "sim.CheckHandoff", device.ErrInvalid, "not ordered after it")
	must(t, d.Wait(after))
	must(t, d.CheckHandoff(q, G, s5))
	must(t, d.CheckHandoff(p, G, s5))
	d.Drain(s1)
	if st := d.Stats(); st.Pending != 0 {
		t.Errorf("Pending = %d", st.Pending)
	}
}

// TestCheckHandoffFollowsTheMemory: a VM chunk with pending work, mapped at
// a second address as well, is that work's there too: CheckHandoff of the
// second address fails for an unordered stream, and passes once it is
// ordered. (An allocator that moves a handle must order the new user
// after the old work wherever the handle is mapped.)
func TestCheckHandoffFollowsTheMemory(t *testing.T) {
	d := newDev(t, Config{})
	s1, s2 := newStream(t, d), newStream(t, d)
	g := d.Granularity()
	r := must1[device.Ptr](t)(d.Reserve(4*g, 0))
	h := must1[device.Handle](t)(d.Create(2 * g))
	must(t, d.Map(r, 2*g, h))
	must(t, d.SetAccess(r, 2*g))
	d.Hold(s1)
	must(t, d.Touch(s1, r+device.Ptr(g), 4096)) // the chunk's second granule
	after := newEvent(t, d)
	must(t, d.Record(after, s1))
	must(t, d.Map(r+device.Ptr(2*g), 2*g, h)) // the same chunk, at another address
	must(t, d.SetAccess(r+device.Ptr(2*g), 2*g))
	wantErr(t, d.CheckHandoff(r+device.Ptr(3*g), g, s2), "sim.CheckHandoff", device.ErrInvalid,
		"in use by pending work on stream 1", "stream 2 is not ordered after it")
	must(t, d.CheckHandoff(r+device.Ptr(2*g), g, s2)) // the first granule: no pending work there
	must(t, d.StreamWait(s2, after))
	must(t, d.CheckHandoff(r+device.Ptr(3*g), g, s2))
	d.Drain(s1)
	must(t, d.Unmap(r+device.Ptr(2*g), 2*g))
	must(t, d.Unmap(r, 2*g))
	must(t, d.Release(h))
}

func TestDestroyStreamWithPendingWork(t *testing.T) {
	d := newDev(t, Config{})
	s := newStream(t, d)
	e := newEvent(t, d)
	p := must1[device.Ptr](t)(d.Alloc(4096))
	d.Hold(s)
	must(t, d.Touch(s, p, 4096))
	must(t, d.Record(e, s))
	must(t, d.DestroyStream(s))
	if query(t, d, e) || d.Pending(s) != 2 {
		t.Fatal("destroying a stream dropped its pending work")
	}
	wantErr(t, d.Free(p), "sim.Free", device.ErrInvalid, "in use by pending work on stream 1")
	wantErr(t, d.Touch(s, p, 1), "sim.Touch", device.ErrInvalid, "destroyed")
	must(t, d.Wait(e))
	must(t, d.Free(p))
	if d.Pending(s) != 0 {
		t.Error("work left")
	}
	if st := d.Stats(); st.LiveStreams != 1 {
		t.Errorf("LiveStreams = %d", st.LiveStreams)
	}
	// Drain completes a destroyed stream's work as well.
	s2 := newStream(t, d)
	d.Hold(s2)
	must(t, d.Record(e, s2))
	must(t, d.DestroyStream(s2))
	d.Drain(s2)
	if !query(t, d, e) {
		t.Error("Drain of a destroyed stream did not complete it")
	}
}

func TestErrorMessagesNameTheOperation(t *testing.T) {
	d := newDev(t, Config{})
	err := d.Map(device.Ptr(vaBase), G, 5)
	if err == nil || !strings.HasPrefix(err.Error(), "sim.Map(p=0x1000000000000000, size=2097152, h=5): invalid argument: ") {
		t.Errorf("error text %q", err)
	}
}

// checkInvariants checks the stream model's internal consistency.
func checkInvariants(t *testing.T, d *Device, step int) {
	t.Helper()
	d.mu.Lock()
	defer d.mu.Unlock()
	touches := 0
	for i, st := range d.busy {
		if st.busyIdx != i || st.head >= len(st.q) {
			t.Fatalf("step %d: busy list corrupt at %d", step, i)
		}
	}
	for id, st := range d.streams {
		if st == nil {
			continue
		}
		if st.id != device.Stream(id) {
			t.Fatalf("step %d: stream %d has id %d", step, id, st.id)
		}
		pending := len(st.q) - st.head
		if (pending > 0) != (st.busyIdx >= 0) {
			t.Fatalf("step %d: stream %d busy flag wrong", step, id)
		}
		if uint64(pending) != st.enq-st.done {
			t.Fatalf("step %d: stream %d has %d pending items, enq-done = %d", step, id, pending, st.enq-st.done)
		}
		for i := st.head; i < len(st.q); i++ {
			if st.q[i].seq != st.done+uint64(i-st.head)+1 {
				t.Fatalf("step %d: stream %d items out of sequence", step, id)
			}
			if st.q[i].kind == itemTouch {
				touches++
			}
		}
		// Maximal progress: an unheld stream is only ever blocked by a wait.
		if !st.held && pending > 0 {
			it := st.q[st.head]
			if it.kind != itemWait || d.reached(it.dep, it.a) {
				t.Fatalf("step %d: stream %d is not held, yet stuck on %+v", step, id, it)
			}
		}
		if st.destroyed && pending == 0 {
			t.Fatalf("step %d: destroyed idle stream %d not removed", step, id)
		}
	}
	if touches != d.pendingTouches {
		t.Fatalf("step %d: %d pending touches counted, %d found", step, d.pendingTouches, touches)
	}
}

// TestRandomStreamModel drives random Hold/Drain/Record/StreamWait/Wait/
// Touch/Synchronize sequences and checks the model's invariants, that a
// waited-for event is complete, and that the device settles when
// synchronized.
func TestRandomStreamModel(t *testing.T) {
	for seed := int64(1); seed <= 20; seed++ {
		d := newDev(t, Config{})
		r := mapped(t, d, 4)
		streams := []device.Stream{0}
		for i := 0; i < 4; i++ {
			streams = append(streams, newStream(t, d))
		}
		var evs []device.Event
		for i := 0; i < 5; i++ {
			evs = append(evs, newEvent(t, d))
		}
		hist := map[device.Stream][]edge{}
		rng := newRand(seed)
		for step := 0; step < 3000; step++ {
			s := streams[rng.Intn(len(streams))]
			e := evs[rng.Intn(len(evs))]
			switch rng.Intn(10) {
			case 0:
				d.Hold(s)
			case 1:
				if rng.Intn(4) == 0 {
					d.Drain(s)
				}
			case 2, 3:
				must(t, d.Record(e, s))
			case 4, 5:
				d.mu.Lock()
				er, pos := d.events[e], d.streams[s].enq
				d.mu.Unlock()
				must(t, d.StreamWait(s, e))
				if er.recorded {
					hist[s] = append(hist[s], edge{pos, er.stream, er.seq})
				}
			case 6:
				must(t, d.Wait(e))
				if !query(t, d, e) {
					t.Fatalf("seed %d step %d: event incomplete after Wait", seed, step)
				}
			case 7:
				off := device.Ptr(rng.Intn(4)) * G
				must(t, d.Touch(s, r+off, G))
			case 8:
				off := device.Ptr(rng.Intn(4)) * G
				got := d.CheckHandoff(r+off, G, s)
				want := handoffRef(d, hist, uint64(r+off), G, s)
				if (got == nil) != want {
					t.Fatalf("seed %d step %d: CheckHandoff = %v, reference says ok=%v", seed, step, got, want)
				}
				_, _ = d.Query(e)
			case 9:
				if rng.Intn(20) == 0 {
					must(t, d.Synchronize())
					if st := d.Stats(); st.Pending != 0 {
						t.Fatalf("seed %d step %d: %d pending after Synchronize", seed, step, st.Pending)
					}
				} else if rng.Intn(5) == 0 {
					must(t, d.SynchronizeStream(s))
					if d.Pending(s) != 0 {
						t.Fatalf("seed %d step %d: pending after SynchronizeStream", seed, step)
					}
				}
			}
			checkInvariants(t, d, step)
		}
		for _, s := range streams {
			d.Drain(s)
		}
		if st := d.Stats(); st.Pending != 0 {
			t.Fatalf("seed %d: %d pending after draining every stream", seed, st.Pending)
		}
		for _, e := range evs {
			if !query(t, d, e) {
				t.Fatalf("seed %d: event incomplete after draining every stream", seed)
			}
		}
	}
}

// edge is a StreamWait in the whole history of a stream: work enqueued on
// the stream after item pos waits for item k of stream dep.
type edge struct {
	pos uint64
	dep device.Stream
	k   uint64
}

// handoffRef is a brute-force CheckHandoff: it decides ordering over the
// whole StreamWait history (not just pending waits) and reports whether
// handing [p, p+size) to s is safe.
func handoffRef(d *Device, hist map[device.Stream][]edge, p, size uint64, s device.Stream) bool {
	// reach: is (y, u), "y's work up to item u", ordered after item t of
	// x? Memoized on the largest u explored per stream.
	reach := func(y device.Stream, u uint64, x device.Stream, t uint64) bool {
		seen := map[device.Stream]uint64{}
		type node struct {
			y device.Stream
			u uint64
		}
		work := []node{{y, u}}
		for len(work) > 0 {
			n := work[len(work)-1]
			work = work[:len(work)-1]
			if n.y == x && n.u >= t {
				return true
			}
			if v, ok := seen[n.y]; ok && v >= n.u {
				continue
			}
			seen[n.y] = n.u
			for _, e := range hist[n.y] {
				if e.pos < n.u {
					work = append(work, node{e.dep, e.k})
				}
			}
		}
		return false
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, x := range d.streams {
		if x == nil || x.id == s {
			continue
		}
		for i := x.head; i < len(x.q); i++ {
			it := x.q[i]
			if it.kind == itemTouch && it.a < p+size && p < it.a+it.b && !reach(s, ^uint64(0), x.id, it.seq) {
				return false
			}
		}
	}
	return true
}

// TestQueryLag: with Config.QueryLag an event recorded on an idle stream
// reports not done to its first queries, then done; a host wait ends the
// lag at once; a new record starts it again.
func TestQueryLag(t *testing.T) {
	d := MustNew(Config{QueryLag: 2})
	s, err := d.NewStream()
	if err != nil {
		t.Fatal(err)
	}
	e, err := d.NewEvent()
	if err != nil {
		t.Fatal(err)
	}
	if done, _ := d.Query(e); !done {
		t.Fatal("an event never recorded reports not done")
	}
	query := func() bool { t.Helper(); return mustQuery(t, d, e) }
	if err := d.Record(e, s); err != nil {
		t.Fatal(err)
	}
	if got := []bool{query(), query(), query()}; got[0] || got[1] || !got[2] {
		t.Fatalf("queries after a record on an idle stream with QueryLag 2: %v, want [false false true]", got)
	}
	if err := d.Record(e, s); err != nil {
		t.Fatal(err)
	}
	if query() {
		t.Fatal("a new record reports done at its first query")
	}
	if err := d.Wait(e); err != nil {
		t.Fatal(err)
	}
	if !query() {
		t.Fatal("after a host wait the event reports not done")
	}
}

// TestRunAhead: with Config.RunAhead an event recorded at time t reports
// not done before t+RunAhead, done after; a host wait, a synchronize of
// its stream or of the device ends that at once; a clock that goes back
// (a trace's next pass) goes on after the last time instead.
func TestRunAhead(t *testing.T) {
	d := MustNew(Config{RunAhead: 100})
	s, _ := d.NewStream()
	other, _ := d.NewStream()
	e, _ := d.NewEvent()
	query := func() bool { t.Helper(); return mustQuery(t, d, e) }
	record := func(on device.Stream) {
		t.Helper()
		if err := d.Record(e, on); err != nil {
			t.Fatal(err)
		}
	}
	d.SetTime(1000)
	record(s)
	if d.SetTime(1099); query() {
		t.Fatal("done 99 us after its record with RunAhead 100")
	}
	if d.SetTime(1100); !query() {
		t.Fatal("not done 100 us after its record")
	}
	for _, tc := range []struct {
		name  string
		catch func() error
	}{
		{"Wait", func() error { return d.Wait(e) }},
		{"SynchronizeStream", func() error { return d.SynchronizeStream(s) }},
		{"Synchronize", d.Synchronize},
	} {
		record(s)
		if query() {
			t.Fatalf("%s: done at its record", tc.name)
		}
		if err := tc.catch(); err != nil {
			t.Fatal(err)
		}
		if !query() {
			t.Errorf("%s: not done after the host waited", tc.name)
		}
	}
	record(s)
	if err := d.SynchronizeStream(other); err != nil {
		t.Fatal(err)
	}
	if query() {
		t.Error("done after a synchronize of another stream")
	}
	d.SetTime(5) // a new pass: the clock goes on from 1100
	record(s)
	if d.SetTime(50); query() {
		t.Error("done 45 us into the next pass")
	}
	if d.SetTime(105); !query() {
		t.Error("not done 100 us into the next pass")
	}
}

// mustQuery is d.Query(e), failing the test on an error.
func mustQuery(t *testing.T, d *Device, e device.Event) bool {
	t.Helper()
	done, err := d.Query(e)
	if err != nil {
		t.Fatal(err)
	}
	return done
}
