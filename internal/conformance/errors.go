package conformance

import (
	"errors"
	"fmt"
	"reflect"
	"strings"
	"testing"

	"github.com/gpumem/gpumem"
	"github.com/gpumem/gpumem/device"
)

// expectBufferError checks that err is a *BufferError matching want.
func expectBufferError(t *testing.T, err, want error) {
	t.Helper()
	if !errors.Is(err, want) {
		t.Fatalf("want an error matching %v, got %v", want, err)
	}
	var be *gpumem.BufferError
	if !errors.As(err, &be) {
		t.Fatalf("want a *BufferError, got %T: %v", err, err)
	}
	if be.Op == "" || be.Why == "" || !strings.Contains(err.Error(), be.Op) {
		t.Errorf("BufferError does not say what happened: %q", err)
	}
}

// sameStats fails if st changed from before (a failed call changes nothing).
func sameStats(t *testing.T, what string, before, after gpumem.Stats) {
	t.Helper()
	if !reflect.DeepEqual(before, after) {
		t.Fatalf("%s changed the stats:\nbefore %+v\nafter  %+v", what, before, after)
	}
}

// testDeviceOOM: the device running out (another process took its memory)
// gives ErrOutOfMemory with CauseDevice after one retry, leaves the
// allocator consistent, and later requests that fit succeed.
func testDeviceOOM(t *testing.T, s *suite) {
	e := s.newEnv(t, nil)
	sh, ok := e.dev.(Shrinker)
	if !ok {
		t.Skip("device cannot be shrunk (no Shrinker)")
	}
	keep := e.alloc(3*miB, 0)
	free, _, err := e.dev.MemInfo()
	if err != nil {
		t.Fatal(err)
	}
	// A real driver spends some memory of its own on what Shrink takes
	// (on the H100, all but 4 MiB taken left 2.19 MiB free, too little
	// for a 2 MiB cuMemAlloc): leave 8 MiB, so that a small request
	// still fits beside that.
	const room = 8 * miB
	taken := free - room
	if err := sh.Shrink(taken); err != nil {
		t.Fatalf("Shrink(%d): %v", taken, err)
	}
	before := e.stats()
	want := room + before.Cached + 16*miB
	_, err = e.tryAlloc(want, 0)
	oe := oomError(t, err)
	after := e.stats()
	if oe.Cause != gpumem.CauseDevice {
		t.Errorf("device exhausted: cause %v, want %v (%v)", oe.Cause, gpumem.CauseDevice, err)
	}
	if !errors.Is(err, device.ErrOutOfMemory) {
		t.Errorf("the error does not wrap the device's error: %v", err)
	}
	if oe.Requested != want || oe.DeviceFree > room || oe.Allocated != after.Allocated || oe.Stream != 0 {
		t.Errorf("wrong numbers in %+v (stats %+v)", oe, after)
	}
	if after.Retries != before.Retries+1 || after.OOMs != before.OOMs+1 {
		t.Errorf("Retries %d → %d, OOMs %d → %d; want +1 each", before.Retries, after.Retries, before.OOMs, after.OOMs)
	}
	// What fits still works, and everything works once memory is back.
	small := e.alloc(miB, 0)
	if err := sh.Grow(taken); err != nil {
		t.Fatal(err)
	}
	big := e.alloc(want, 0)
	e.free(big)
	e.free(small)
	e.free(keep)
	e.finish()
}

// testDeviceOOMInjected: one device OOM is absorbed by the retry after a
// reclaim; two in a row fail the request with CauseDevice.
func testDeviceOOMInjected(t *testing.T, s *suite) {
	e := s.newEnv(t, nil)
	f := e.needFault()
	op := "Alloc"
	if e.virtual() {
		op = "Create"
	}
	b0 := e.alloc(16*miB, 0)
	before := e.stats()
	f.FailOOM(op, 1)
	b1 := e.alloc(16*miB, 0)
	after := e.stats()
	if after.Retries != before.Retries+1 || after.OOMs != before.OOMs {
		t.Errorf("one injected device OOM: Retries %d → %d (want +1), OOMs %d → %d (want +0)",
			before.Retries, after.Retries, before.OOMs, after.OOMs)
	}
	before = after
	f.FailOOM(op, 1)
	f.FailOOM(op, 2)
	_, err := e.tryAlloc(16*miB, 0)
	oe := oomError(t, err)
	after = e.stats()
	if !errors.Is(err, device.ErrOutOfMemory) || !errors.Is(err, device.ErrInjected) {
		t.Errorf("the error does not wrap the device's error: %v", err)
	}
	if oe.Cause != gpumem.CauseDevice {
		t.Errorf("the device refused twice: cause %v, want %v (%v)", oe.Cause, gpumem.CauseDevice, err)
	}
	if after.Retries != before.Retries+1 || after.OOMs != before.OOMs+1 {
		t.Errorf("Retries %d → %d, OOMs %d → %d; want +1 each", before.Retries, after.Retries, before.OOMs, after.OOMs)
	}
	f.ClearFaults()
	b2 := e.alloc(16*miB, 0)
	e.free(b0)
	e.free(b1)
	e.free(b2)
	e.finish()
}

// faultOps are the device operations the allocator may call.
var faultOps = []string{
	"Alloc", "Free", "MemInfo", "Synchronize",
	"Reserve", "ReleaseAddress", "Create", "Release", "Map", "SetAccess", "Unmap",
	"NewEvent", "DestroyEvent", "Record", "Query", "Wait", "StreamWait", "SynchronizeStream",
}

// faultLimit is the limit of the fault tests: small, so that reclaims and
// moves between streams happen.
const faultLimit = 64 * miB

// acceptable reports whether err is what an injected fault may cause.
func acceptable(err error) bool {
	return err == nil || errors.Is(err, device.ErrInjected) || errors.Is(err, gpumem.ErrOutOfMemory)
}

// faultWorkload exercises every device operation the allocator uses while
// running: growth, RecordStream and pending frees, moves between streams,
// reclaim on a shortage, Trim. Errors are allowed only if injected.
func faultWorkload(e *env, a, b device.Stream) {
	t := e.t
	t.Helper()
	check := func(what string, err error) {
		t.Helper()
		if !acceptable(err) {
			t.Fatalf("%s: %v (not an injected fault nor out of memory)", what, err)
		}
	}
	alloc := func(n uint64, s device.Stream) gpumem.Buffer {
		t.Helper()
		buf, err := e.tryAlloc(n, s)
		check(fmt.Sprintf("Alloc(%d, %d)", n, s), err)
		return buf
	}
	freeIf := func(bufs ...gpumem.Buffer) {
		t.Helper()
		for _, x := range bufs {
			if !x.IsZero() {
				e.free(x)
			}
		}
	}
	b1 := alloc(300*kiB, a)
	b2 := alloc(6*miB, a)
	if !b2.IsZero() {
		if err := e.a.RecordStream(b2, b); err != nil {
			t.Fatalf("RecordStream: %v", err)
		}
		if e.pend != nil {
			e.hold(b)
			if err := e.pend.Touch(b, b2.Ptr(), b2.Size()); err != nil {
				t.Fatal(err)
			}
		}
		e.free(b2)
	}
	b3 := alloc(6*miB, a) // looks at the pending free
	if e.pend != nil {
		e.drain(b)
	}
	b4 := alloc(6*miB, a) // the pending free is done now
	freeIf(b1, b3, b4)
	if e.pend != nil {
		e.hold(a)
	}
	b5 := alloc(10*miB, a)
	freeIf(b5)
	b6 := alloc(10*miB, b) // A's memory moves to B
	b7 := alloc(200*kiB, b)
	if e.pend != nil {
		e.drain(a)
	}
	_, err := e.tryAlloc(2*faultLimit, 0) // a shortage: reclaim, retry, OOM
	if err == nil {
		t.Fatalf("Alloc(%d) above the limit %d succeeded", 2*faultLimit, faultLimit)
	}
	check("Alloc above the limit", err)
	check("Trim", e.a.Trim())
	e.verify("Trim")
	b8 := alloc(miB, 0)
	b9 := alloc(5*miB, a)
	freeIf(b6, b7, b8)
	check("Trim", e.a.Trim())
	e.verify("Trim")
	freeIf(b9)
}

// testFaults: a failure injected into any call of any device operation
// gives a clear error (never a violated precondition on the device), leaves
// the allocator consistent, and once the faults are cleared everything can
// be freed, trimmed and closed with nothing left on the device.
func testFaults(t *testing.T, s *suite) {
	probe := s.newEnv(t, nil)
	probe.needFault()
	_, counted := probe.dev.(FaultCounter)
	for _, op := range faultOps {
		t.Run(op, func(t *testing.T) {
			for n := 1; n <= 200; n++ {
				fired := runFault(t, s, op, n)
				if counted && !fired || !counted && n == 3 {
					return
				}
			}
		})
	}
}

// runFault runs faultWorkload with the n-th call of op failing and reports
// whether the fault fired (always true without a FaultCounter).
func runFault(t *testing.T, s *suite, op string, n int) bool {
	t.Helper()
	var fired bool
	t.Run(fmt.Sprintf("call%d", n), func(t *testing.T) {
		e := s.newEnv(t, func(c *gpumem.Config) {
			if c.Limit == 0 || c.Limit > faultLimit {
				c.Limit = faultLimit
			}
		})
		a, b := e.newStream(), e.newStream()
		fc, counted := e.dev.(FaultCounter)
		var before uint64
		if counted {
			before = fc.InjectedFaults()
		}
		e.fault.FailNth(op, n)
		faultWorkload(e, a, b)
		fired = !counted || fc.InjectedFaults() > before
		e.fault.ClearFaults()
		e.finish()
	})
	return fired
}

// testFaultsDuringClose: a failure injected into Close's device calls is
// reported by Close; a Close that reports no error left nothing behind.
func testFaultsDuringClose(t *testing.T, s *suite) {
	probe := s.newEnv(t, nil)
	probe.needFault()
	for _, op := range faultOps {
		t.Run(op, func(t *testing.T) {
			e := s.newEnv(t, nil)
			a, b := e.newStream(), e.newStream()
			x := e.alloc(300*kiB, a)
			e.alloc(6*miB, a) // left live: Close frees it
			y := e.alloc(6*miB, b)
			e.alloc(100, b)
			if err := e.a.RecordStream(y, a); err != nil {
				t.Fatal(err)
			}
			e.free(x)
			e.free(y)
			e.fault.FailNth(op, 1)
			err := e.a.Close()
			e.done = true
			e.fault.ClearFaults()
			var le *gpumem.LeakError
			if !errors.As(err, &le) || len(le.Buffers) != 2 {
				t.Errorf("Close with 2 live buffers: %v, want a *LeakError listing 2", err)
			}
			rest := errors.Join(withoutLeak(err)...)
			if rest != nil && !errors.Is(rest, device.ErrInjected) {
				t.Errorf("Close failed with %v, not the injected fault", rest)
			}
			// Failing or not, the allocator never breaks a precondition
			// of the device (such as releasing address space that still
			// has mappings in it).
			if errors.Is(rest, device.ErrInvalid) {
				t.Errorf("after an injected %s fault, Close violated a device precondition: %v", op, rest)
			}
			if rest == nil {
				e.checkDeviceClean()
			} else if lc, ok := e.dev.(LeakChecker); ok {
				if err := lc.Leaks(); err != nil {
					t.Logf("Close failed (%v); left on the device: %v", rest, err)
				}
			}
		})
	}
}

// withoutLeak returns the errors joined in err other than the *LeakError.
func withoutLeak(err error) []error {
	if err == nil {
		return nil
	}
	var out []error
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		for _, x := range j.Unwrap() {
			out = append(out, withoutLeak(x)...)
		}
		return out
	}
	var le *gpumem.LeakError
	if errors.As(err, &le) && err == error(le) {
		return nil
	}
	return []error{err}
}

// testDoubleFree: freeing a buffer twice, or a stale copy of a buffer whose
// memory was given out again, fails with ErrDoubleFree and changes nothing.
func testDoubleFree(t *testing.T, s *suite) {
	e := s.newEnv(t, nil)
	for _, n := range []uint64{4 * kiB, 6 * miB} {
		b := e.alloc(n, 0)
		e.free(b)
		before := e.stats()
		expectBufferError(t, e.a.Free(b), gpumem.ErrDoubleFree)
		sameStats(t, "double Free", before, e.stats())
		e.verify("double Free")
		// The same memory given out again: the stale copy must not free it.
		b2 := e.alloc(n, 0)
		before = e.stats()
		expectBufferError(t, e.a.Free(b), gpumem.ErrDoubleFree)
		sameStats(t, "Free of a stale buffer", before, e.stats())
		e.verify("Free of a stale buffer")
		// A buffer freed through its scope, then again.
		sc := e.a.NewScope("df", 0)
		b3 := e.scopeAlloc(sc, n, 0)
		if err := sc.Free(b3); err != nil {
			t.Fatal(err)
		}
		delete(e.live, b3.Ptr())
		e.verify("Scope.Free")
		before = e.stats()
		expectBufferError(t, sc.Free(b3), gpumem.ErrDoubleFree)
		expectBufferError(t, e.a.Free(b3), gpumem.ErrDoubleFree)
		sameStats(t, "double Scope.Free", before, e.stats())
		if err := e.closeScope(sc); err != nil {
			t.Fatalf("closing an empty scope: %v", err)
		}
		e.free(b2)
	}
	e.finish()
}

// testForeign: a buffer of another allocator and the zero Buffer are
// refused with ErrForeign and change nothing, on either side.
func testForeign(t *testing.T, s *suite) {
	e := s.newEnv(t, nil)
	mine := e.alloc(4*kiB, 0)
	other, err := gpumem.New(e.dev, gpumem.Config{Mode: e.a.Mode()})
	if err != nil {
		t.Fatal(err)
	}
	ob, err := other.Alloc(4*kiB, 0)
	if err != nil {
		t.Fatal(err)
	}
	before, obefore := e.stats(), other.Stats()
	expectBufferError(t, e.a.Free(ob), gpumem.ErrForeign)
	expectBufferError(t, e.a.Free(gpumem.Buffer{}), gpumem.ErrForeign)
	expectBufferError(t, e.a.NewScope("f", 0).Free(ob), gpumem.ErrForeign)
	expectBufferError(t, other.Free(mine), gpumem.ErrForeign)
	sameStats(t, "foreign Free", before, e.stats())
	sameStats(t, "foreign Free (other allocator)", obefore, other.Stats())
	e.verify("foreign Free")
	if err := other.Check(); err != nil {
		t.Fatal(err)
	}
	if !(gpumem.Buffer{}).IsZero() || mine.IsZero() {
		t.Error("IsZero is wrong")
	}
	if err := other.Free(ob); err != nil {
		t.Fatalf("the owner cannot free its buffer after a foreign Free was refused: %v", err)
	}
	if err := other.Close(); err != nil {
		t.Fatal(err)
	}
	e.free(mine)
	e.finish()
}

// testInvalidSize: sizes of 0 and absurd sizes are programming errors
// (ErrInvalidSize), not memory pressure: no OOM is counted.
func testInvalidSize(t *testing.T, s *suite) {
	e := s.newEnv(t, nil)
	before := e.stats()
	for _, n := range []uint64{0, 1 << 60, ^uint64(0)} {
		b, err := e.a.Alloc(n, 0)
		if !errors.Is(err, gpumem.ErrInvalidSize) || !b.IsZero() {
			t.Errorf("Alloc(%d): %v, want ErrInvalidSize", n, err)
		}
		if errors.Is(err, gpumem.ErrOutOfMemory) {
			t.Errorf("Alloc(%d) counts as out of memory: %v", n, err)
		}
	}
	sameStats(t, "invalid sizes", before, e.stats())
	e.verify("invalid sizes")
	e.finish()
}

// testClose: Close frees every buffer, reports them as a *LeakError with
// their addresses, sizes and streams, leaves nothing on the device, and
// makes later calls fail with ErrClosed.
func testClose(t *testing.T, s *suite) {
	e := s.newEnv(t, nil)
	streams := e.streams(2)
	sc := e.a.NewScope("closing", 0)
	e.scopeAlloc(sc, 5*kiB, streams[0])
	for i, n := range []uint64{1, 4 * kiB, 3 * miB, 12 * miB} {
		e.alloc(n, streams[i%len(streams)])
	}
	if e.pend != nil && len(streams) > 2 {
		// One buffer with work still pending on its stream, one freed
		// with work pending on another stream.
		e.hold(streams[1])
		e.alloc(2*miB, streams[1])
		e.pendingFree(64*kiB, streams[0], streams[2])
	}
	live := map[device.Ptr]liveBuf{}
	for p, l := range e.live {
		live[p] = l
	}
	err := e.a.Close()
	e.done = true
	if !errors.Is(err, gpumem.ErrLeak) {
		t.Fatalf("Close with %d live buffers: %v, want an error matching ErrLeak", len(live), err)
	}
	var le *gpumem.LeakError
	if !errors.As(err, &le) {
		t.Fatalf("Close: %T, want a *LeakError", err)
	}
	if rest := withoutLeak(err); len(rest) > 0 {
		t.Errorf("Close failed besides the leaks: %v", errors.Join(rest...))
	}
	if len(le.Buffers) != len(live) {
		t.Errorf("LeakError lists %d buffers, %d were live: %v", len(le.Buffers), len(live), err)
	}
	for _, l := range le.Buffers {
		w, ok := live[device.Ptr(l.Ptr)]
		if !ok || l.Size != w.buf.Size() || l.Stream != uint64(w.s) {
			t.Errorf("LeakError lists 0x%x (%d bytes, stream %d), which does not match a live buffer", l.Ptr, l.Size, l.Stream)
		}
		delete(live, device.Ptr(l.Ptr))
	}
	if !strings.Contains(err.Error(), "allocator") {
		t.Errorf("the leak report does not name its owner: %v", err)
	}
	e.releaseHolds()
	e.checkDeviceClean()
	// Everything after Close fails cleanly.
	if _, err := e.a.Alloc(4*kiB, 0); !errors.Is(err, gpumem.ErrClosed) {
		t.Errorf("Alloc after Close: %v, want ErrClosed", err)
	}
	if _, err := sc.Alloc(4*kiB, 0); !errors.Is(err, gpumem.ErrClosed) {
		t.Errorf("Scope.Alloc after Close: %v, want ErrClosed", err)
	}
	for _, l := range e.live {
		if err := e.a.Free(l.buf); err == nil {
			t.Errorf("Free of 0x%x after Close succeeded", l.buf.Ptr())
		}
	}
	if err := e.a.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
	if err := e.a.Trim(); err != nil {
		t.Errorf("Trim after Close: %v", err)
	}
	e.checkDeviceClean()
}
