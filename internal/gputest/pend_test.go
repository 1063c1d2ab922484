package gputest

import (
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/gpumem/gpumem/device"
	"github.com/gpumem/gpumem/device/cuda"
	"github.com/gpumem/gpumem/internal/faults"
)

// Holds on the GPU (conformance.Pender).
//
// Hold(s) enqueues on s a kernel that waits for a flag in device memory
// (cuda.Device.HoldUntil); releasing the hold writes the flag from a
// non-blocking stream of the suite's own. Work enqueued on s after it, and
// on streams made to wait for s, stays pending until then, as on the
// simulated device.
//
// Where the host blocks on held work (Wait on an event, SynchronizeStream,
// Synchronize, and Free: cuMemFree waits for all work on the device),
// suiteGPU releases the holds that work waits for, which it knows from the
// Record and StreamWait calls it passes on, as the simulated device
// completes held work a host waits for; the host would otherwise wait for
// the kernel's bound (holdCycles). A hold that ends by its bound is reported
// as a test error.
//
// CheckHandoff asks the GPU: when a range still has work pending on another
// stream, it records an event on the new stream and polls it; if the event
// completes while that work is still held, the new stream's work is not
// ordered after it.

// holdCycles bounds a hold: about 10 s of SM clock on an H100.
const holdCycles = 20_000_000_000

// handoffPoll is how long CheckHandoff waits for work that is not held back
// to complete (it completes in microseconds).
const handoffPoll = 20 * time.Millisecond

type pendState struct {
	mu     sync.Mutex
	t      *testing.T
	ctrl   device.Stream                    // non-blocking: writes the flags
	flags  device.Ptr                       // 512 Ki flags of 4 bytes
	next   int                              // next flag
	probe  device.Event                     // CheckHandoff's
	holds  map[device.Stream]*hold          // the holds on now
	deps   map[device.Stream]map[*hold]bool // stream -> holds its future work waits for
	evDeps map[device.Event]map[*hold]bool  // event -> holds it waits for
	work   []touch                          // Touches enqueued while a hold was on
}

// A hold is one Hold of one stream; a stream held again gets a new one, so
// that work ordered after an earlier hold is not taken to wait for a later.
type hold struct {
	s    device.Stream
	flag device.Ptr
	end  device.Event // recorded right after the hold kernel
	on   bool
}

// A touch is a Touch enqueued behind holds: pending while one of them is on.
type touch struct {
	s      device.Stream
	lo, hi uint64
	waits  []*hold // the holds it waits for, as enqueued
}

func (w *touch) pending() bool {
	return slices.ContainsFunc(w.waits, func(h *hold) bool { return h.on })
}

// newSuiteGPU wraps d for one test; what it takes from the device (a page
// of flags, a stream, events) is given back when the test ends.
func newSuiteGPU(t *testing.T, d *cuda.Device) *suiteGPU {
	g := &suiteGPU{Device: d, faults: faults.New(faults.DeviceOps...)}
	p := &g.pend
	p.t = t
	p.holds = map[device.Stream]*hold{}
	p.deps = map[device.Stream]map[*hold]bool{}
	p.evDeps = map[device.Event]map[*hold]bool{}
	var err error
	if p.flags, err = d.Alloc(2 * miB); err != nil {
		t.Fatalf("suiteGPU: flags: %v", err)
	}
	if p.ctrl, err = d.NewStream(); err != nil {
		t.Fatalf("suiteGPU: stream: %v", err)
	}
	if p.probe, err = d.NewEvent(); err != nil {
		t.Fatalf("suiteGPU: event: %v", err)
	}
	t.Cleanup(func() {
		g.growAll()
		g.releaseAll()
		if err := d.Synchronize(); err != nil {
			t.Errorf("suiteGPU: Synchronize: %v", err)
		}
		d.DestroyEvent(p.probe)
		d.DestroyStream(p.ctrl)
		d.Free(p.flags)
	})
	return g
}

func (d *suiteGPU) Hold(s device.Stream) {
	p := &d.pend
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.holds[s] != nil {
		return
	}
	flag := p.flags + device.Ptr(4*(p.next%(512<<10)))
	p.next++
	must(p.t, "clear the flag", d.Device.MemsetAsync(flag, 0, 4, p.ctrl))
	must(p.t, "clear the flag", d.Device.SynchronizeStream(p.ctrl))
	must(p.t, "HoldUntil", d.Device.HoldUntil(s, flag, holdCycles))
	end, err := d.Device.NewEvent()
	must(p.t, "NewEvent", err)
	must(p.t, "Record", d.Device.Record(end, s))
	p.holds[s] = &hold{s: s, flag: flag, end: end, on: true}
}

func (d *suiteGPU) Drain(s device.Stream) {
	d.releaseStream(s)
	must(d.pend.t, "SynchronizeStream", d.Device.SynchronizeStream(s))
}

func (d *suiteGPU) Touch(s device.Stream, ptr device.Ptr, size uint64) error {
	if size == 0 {
		return &device.OpError{Op: "gputest.Touch", Err: fmt.Errorf("size is 0: %w", device.ErrInvalid)}
	}
	p := &d.pend
	p.mu.Lock()
	if waits := p.waitsOf(s); len(waits) > 0 {
		p.work = append(p.work, touch{s, uint64(ptr), uint64(ptr) + size, waits})
	}
	p.mu.Unlock()
	return d.Device.MemsetAsync(ptr, 0x5a, size, s)
}

func (d *suiteGPU) CheckHandoff(ptr device.Ptr, size uint64, s device.Stream) error {
	p := &d.pend
	p.mu.Lock()
	lo, hi := uint64(ptr), uint64(ptr)+size
	var other *touch // a copy: p.work changes once mu is released
	for _, w := range p.work {
		if w.s != s && w.lo < hi && lo < w.hi && w.pending() {
			other = &w
			break
		}
	}
	if other == nil {
		p.mu.Unlock()
		return nil
	}
	blocked := p.holds[s] != nil
	ordered := p.waitsFor(s, other)
	p.mu.Unlock()
	fail := func(how string) error {
		return &device.OpError{Op: "gputest.CheckHandoff", Args: fmt.Sprintf("p=%#x, size=%d, s=%#x", uint64(ptr), size, uint64(s)),
			Err: fmt.Errorf("[%#x, %#x) is still used by pending work of stream %#x, and %s", other.lo, other.hi, uint64(other.s), how)}
	}
	if blocked {
		// s is held itself: the GPU cannot tell; the calls it was given can.
		if !ordered {
			return fail("stream s never waited for it")
		}
		return nil
	}
	if err := d.Device.Record(p.probe, s); err != nil {
		return err
	}
	for deadline := time.Now().Add(handoffPoll); time.Now().Before(deadline); time.Sleep(time.Millisecond) {
		done, err := d.Device.Query(p.probe)
		if err != nil {
			return err
		}
		if done {
			return fail("work enqueued on stream s now completes before it")
		}
	}
	return nil
}

// recorded notes the holds an event recorded on s waits for.
func (d *suiteGPU) recorded(e device.Event, s device.Stream) {
	p := &d.pend
	p.mu.Lock()
	defer p.mu.Unlock()
	set := map[*hold]bool{}
	if h := p.holds[s]; h != nil {
		set[h] = true
	}
	for h := range p.deps[s] {
		if h.on {
			set[h] = true
		}
	}
	p.evDeps[e] = set
}

// waited notes that s's future work waits for what e waits for.
func (d *suiteGPU) waited(s device.Stream, e device.Event) {
	p := &d.pend
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.deps[s] == nil {
		p.deps[s] = map[*hold]bool{}
	}
	for h := range p.evDeps[e] {
		if h.on {
			p.deps[s][h] = true
		}
	}
}

// releaseFor releases the holds event e waits for.
func (d *suiteGPU) releaseFor(e device.Event) {
	p := &d.pend
	p.mu.Lock()
	defer p.mu.Unlock()
	for h := range p.evDeps[e] {
		p.release(d.Device, h)
	}
	delete(p.evDeps, e)
}

// releaseStream releases the hold of s and those its work waits for.
func (d *suiteGPU) releaseStream(s device.Stream) {
	p := &d.pend
	p.mu.Lock()
	defer p.mu.Unlock()
	if h := p.holds[s]; h != nil {
		p.release(d.Device, h)
	}
	for h := range p.deps[s] {
		p.release(d.Device, h)
	}
	delete(p.deps, s)
}

func (d *suiteGPU) releaseAll() {
	p := &d.pend
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, h := range p.holds {
		p.release(d.Device, h)
	}
}

// release ends hold h, if it is on: it writes the flag and waits for the
// write (not for the held stream). Called with mu held.
func (p *pendState) release(d *cuda.Device, h *hold) {
	if !h.on {
		return
	}
	h.on = false
	s := h.s
	if p.holds[s] == h {
		delete(p.holds, s)
	}
	if done, err := d.Query(h.end); err == nil && done {
		p.t.Errorf("the hold on stream %#x ended by its bound (%d cycles) before the suite released it: a call blocked on held work", uint64(s), uint64(holdCycles))
	}
	if err := d.MemsetAsync(h.flag, 1, 4, p.ctrl); err != nil {
		p.t.Errorf("releasing the hold on stream %#x: %v", uint64(s), err)
	} else if err := d.SynchronizeStream(p.ctrl); err != nil {
		p.t.Errorf("releasing the hold on stream %#x: %v", uint64(s), err)
	}
	d.DestroyEvent(h.end)
	p.work = slices.DeleteFunc(p.work, func(w touch) bool { return !w.pending() })
}

// waitsOf returns the holds that work enqueued on s now waits for.
func (p *pendState) waitsOf(s device.Stream) []*hold {
	var waits []*hold
	if h := p.holds[s]; h != nil {
		waits = append(waits, h)
	}
	for h := range p.deps[s] {
		if h.on {
			waits = append(waits, h)
		}
	}
	return waits
}

// waitsFor reports whether s's future work waits for every hold that w,
// pending work of another stream, still waits for.
func (p *pendState) waitsFor(s device.Stream, w *touch) bool {
	for _, h := range w.waits {
		if h.on && !p.deps[s][h] {
			return false
		}
	}
	return true
}

func must(t *testing.T, what string, err error) {
	t.Helper()
	if err != nil {
		t.Fatalf("suiteGPU: %s: %v", what, err)
	}
}
