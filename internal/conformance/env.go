package conformance

import (
	"errors"
	"fmt"
	"sort"
	"testing"

	"github.com/gpumem/gpumem"
	"github.com/gpumem/gpumem/device"
)

const (
	kiB = 1 << 10
	miB = 1 << 20
)

// round512 is the allocator's rounding of a request (doc.go, "Rounding").
func round512(n uint64) uint64 { return (n + 511) &^ 511 }

// env is one allocator on one fresh device, with the buffers the test
// believes live. Every operation through env checks the allocator after it.
type env struct {
	t     *testing.T
	dev   Device
	a     *gpumem.Allocator
	cfg   gpumem.Config
	pend  Pender  // nil if the device cannot leave work pending
	fault Faulter // nil if it cannot inject faults
	free0 uint64  // device free memory before New
	live  map[device.Ptr]liveBuf
	held  map[device.Stream]bool
	made  []device.Stream // streams created by newStream
	done  bool            // closed and checked
}

type liveBuf struct {
	buf   gpumem.Buffer
	s     device.Stream
	scope *gpumem.Scope
}

// newEnv makes a device and an allocator with the suite's configuration,
// changed by mod.
func (s *suite) newEnv(t *testing.T, mod func(*gpumem.Config)) *env {
	t.Helper()
	cfg := s.conf.Config
	if mod != nil {
		mod(&cfg)
	}
	dev := s.newDevice(t)
	e := &env{t: t, dev: dev, cfg: cfg, live: map[device.Ptr]liveBuf{}, held: map[device.Stream]bool{}}
	e.pend, _ = dev.(Pender)
	e.fault, _ = dev.(Faulter)
	free, _, err := dev.MemInfo()
	if err != nil {
		t.Fatalf("MemInfo: %v", err)
	}
	e.free0 = free
	a, err := gpumem.New(dev, cfg)
	if err != nil {
		t.Fatalf("gpumem.New(%+v): %v", cfg, err)
	}
	e.a = a
	t.Cleanup(func() {
		if e.done {
			return
		}
		e.releaseHolds()
		if e.fault != nil {
			e.fault.ClearFaults()
		}
		_ = e.a.Close()
	})
	e.verify("New")
	return e
}

// virtual reports whether the allocator runs in ModeVirtual.
func (e *env) virtual() bool { return e.a.Mode() == gpumem.ModeVirtual }

// gran is the unit in which the allocator takes memory from the device.
func (e *env) gran() uint64 {
	if vm, ok := device.AsVirtualMemory(e.dev); ok && e.virtual() {
		return vm.Granularity()
	}
	return 2 * miB
}

// prealloc is Config.Preallocate as the allocator rounds it.
func (e *env) prealloc() uint64 {
	g := e.gran()
	return (e.cfg.Preallocate + g - 1) &^ (g - 1)
}

// streams returns the default stream and n new ones, or the default stream
// alone if the device cannot make streams.
func (e *env) streams(n int) []device.Stream {
	out := []device.Stream{0}
	if _, ok := device.AsStreams(e.dev); ok {
		for range n {
			out = append(out, e.newStream())
		}
	}
	return out
}

// newStream creates a stream, or skips the test if the device cannot.
func (e *env) newStream() device.Stream {
	e.t.Helper()
	st, ok := device.AsStreams(e.dev)
	if !ok {
		e.t.Skip("device cannot create streams")
	}
	s, err := st.NewStream()
	if err != nil {
		e.t.Fatalf("NewStream: %v", err)
	}
	e.made = append(e.made, s)
	return s
}

// needPend skips the test if the device cannot leave work pending.
func (e *env) needPend() Pender {
	e.t.Helper()
	if e.pend == nil {
		e.t.Skip("device cannot leave work pending (no Pender)")
	}
	return e.pend
}

func (e *env) needFault() Faulter {
	e.t.Helper()
	if e.fault == nil {
		e.t.Skip("device cannot inject faults (no Faulter)")
	}
	return e.fault
}

func (e *env) hold(s device.Stream) {
	e.needPend().Hold(s)
	e.held[s] = true
}

func (e *env) drain(s device.Stream) {
	e.needPend().Drain(s)
	delete(e.held, s)
	e.verify(fmt.Sprintf("Drain(%d)", s))
}

func (e *env) releaseHolds() {
	for s := range e.held {
		e.pend.Drain(s)
		delete(e.held, s)
	}
}

// alloc allocates and fails the test on an error.
func (e *env) alloc(size uint64, s device.Stream) gpumem.Buffer {
	e.t.Helper()
	b, err := e.tryAlloc(size, s)
	if err != nil {
		e.t.Fatalf("Alloc(%d, stream %d): %v", size, s, err)
	}
	return b
}

// tryAlloc allocates; on success it checks the buffer (admit).
func (e *env) tryAlloc(size uint64, s device.Stream) (gpumem.Buffer, error) {
	e.t.Helper()
	b, err := e.a.Alloc(size, s)
	if err != nil {
		if !b.IsZero() {
			e.t.Fatalf("Alloc(%d) failed with %v but returned a buffer", size, err)
		}
		e.verify(fmt.Sprintf("failed Alloc(%d, %d)", size, s))
		return b, err
	}
	e.admit(b, size, s, nil)
	return b, nil
}

// scopeAlloc allocates through a scope.
func (e *env) scopeAlloc(sc *gpumem.Scope, size uint64, s device.Stream) gpumem.Buffer {
	e.t.Helper()
	b, err := e.tryScopeAlloc(sc, size, s)
	if err != nil {
		e.t.Fatalf("scope %s: Alloc(%d, stream %d): %v", sc.Name(), size, s, err)
	}
	return b
}

func (e *env) tryScopeAlloc(sc *gpumem.Scope, size uint64, s device.Stream) (gpumem.Buffer, error) {
	e.t.Helper()
	b, err := sc.Alloc(size, s)
	if err != nil {
		e.verify(fmt.Sprintf("failed scope Alloc(%d, %d)", size, s))
		return b, err
	}
	e.admit(b, size, s, sc)
	return b, nil
}

// admit checks a new buffer: its size, alignment, that it overlaps no live
// buffer, that it is accessible from its stream and that its stream may use
// it now (no unordered pending work of another stream on it).
func (e *env) admit(b gpumem.Buffer, size uint64, s device.Stream, sc *gpumem.Scope) {
	e.t.Helper()
	p := b.Ptr()
	switch {
	case b.IsZero():
		e.t.Fatalf("Alloc(%d) returned the zero Buffer and no error", size)
	case p == 0:
		e.t.Fatalf("Alloc(%d) returned address 0", size)
	case p%512 != 0:
		e.t.Fatalf("Alloc(%d) returned 0x%x, not 512-byte aligned", size, p)
	case b.Size() != size:
		e.t.Fatalf("Alloc(%d) returned a buffer of Size %d", size, b.Size())
	}
	lo, hi := uint64(p), uint64(p)+round512(size)
	for q, l := range e.live {
		qlo, qhi := uint64(q), uint64(q)+round512(l.buf.Size())
		if lo < qhi && qlo < hi {
			e.t.Fatalf("Alloc(%d, stream %d) = [0x%x, 0x%x) overlaps live buffer [0x%x, 0x%x) of stream %d", size, s, lo, hi, qlo, qhi, l.s)
		}
	}
	if e.pend != nil {
		if err := e.pend.CheckHandoff(p, size, s); err != nil {
			e.t.Fatalf("Alloc(%d, stream %d) = 0x%x: memory still in use by another stream: %v", size, s, p, err)
		}
		if err := e.pend.Touch(s, p, size); err != nil {
			e.t.Fatalf("Alloc(%d, stream %d) = 0x%x: not usable: %v", size, s, p, err)
		}
	}
	e.live[p] = liveBuf{buf: b, s: s, scope: sc}
	e.verify(fmt.Sprintf("Alloc(%d, %d)", size, s))
}

// pendingFree allocates size bytes on stream s, records their use on stream
// other (RecordStream), holds other with work on them pending, and frees
// them: a free the allocator must not reuse until other's work is done. It
// returns the freed buffer's address.
func (e *env) pendingFree(size uint64, s, other device.Stream) device.Ptr {
	e.t.Helper()
	x := e.alloc(size, s)
	if err := e.a.RecordStream(x, other); err != nil {
		e.t.Fatalf("RecordStream: %v", err)
	}
	e.hold(other)
	if err := e.pend.Touch(other, x.Ptr(), x.Size()); err != nil {
		e.t.Fatalf("Touch on stream %d: %v", other, err)
	}
	e.free(x)
	return x.Ptr()
}

// free frees b through the allocator and fails the test on an error.
func (e *env) free(b gpumem.Buffer) {
	e.t.Helper()
	if err := e.a.Free(b); err != nil {
		e.t.Fatalf("Free(0x%x): %v", b.Ptr(), err)
	}
	delete(e.live, b.Ptr())
	e.verify(fmt.Sprintf("Free(0x%x)", b.Ptr()))
}

// freeAll frees every live buffer, in address order.
func (e *env) freeAll() {
	e.t.Helper()
	ptrs := make([]device.Ptr, 0, len(e.live))
	for p := range e.live {
		ptrs = append(ptrs, p)
	}
	sort.Slice(ptrs, func(i, j int) bool { return ptrs[i] < ptrs[j] })
	for _, p := range ptrs {
		e.free(e.live[p].buf)
	}
}

// closeScope closes sc and forgets the buffers it reports as leaked (the
// scope freed them). It returns Close's error.
func (e *env) closeScope(sc *gpumem.Scope) error {
	e.t.Helper()
	err := sc.Close()
	var le *gpumem.LeakError
	if errors.As(err, &le) {
		for _, l := range le.Buffers {
			if _, ok := e.live[device.Ptr(l.Ptr)]; !ok {
				e.t.Fatalf("scope %s: Close reports 0x%x leaked, which is not live", sc.Name(), l.Ptr)
			}
			delete(e.live, device.Ptr(l.Ptr))
		}
	}
	e.verify("Scope.Close " + sc.Name())
	return err
}

// stats returns the allocator's stats.
func (e *env) stats() gpumem.Stats { return e.a.Stats() }

// verify runs the whole-structure checker, the stats identities and a
// comparison of the stats with the buffers the test holds.
func (e *env) verify(after string) {
	e.t.Helper()
	if err := e.a.Check(); err != nil {
		e.t.Fatalf("after %s: Check: %v", after, err)
	}
	st := e.a.Stats()
	if err := statsIdentities(st); err != nil {
		e.t.Fatalf("after %s: %v\nstats: %+v", after, err, st)
	}
	var allocated, active uint64
	for _, l := range e.live {
		allocated += l.buf.Size()
		active += round512(l.buf.Size())
	}
	if st.LiveBuffers != uint64(len(e.live)) || st.Allocated != allocated || st.Active != active {
		e.t.Fatalf("after %s: stats say %d live buffers, %d allocated, %d active; the test holds %d buffers, %d requested, %d rounded",
			after, st.LiveBuffers, st.Allocated, st.Active, len(e.live), allocated, active)
	}
	if e.cfg.Limit > 0 && st.Reserved > e.cfg.Limit {
		e.t.Fatalf("after %s: reserved %d > limit %d", after, st.Reserved, e.cfg.Limit)
	}
}

// StatsIdentities checks the identities documented on gpumem.Stats (exact
// when no operation is in flight). Other tests of the allocator use it too.
func StatsIdentities(st gpumem.Stats) error { return statsIdentities(st) }

// statsIdentities checks the identities documented on gpumem.Stats.
func statsIdentities(st gpumem.Stats) error {
	var errs []error
	bad := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }
	if st.Reserved != st.Active+st.Cached {
		bad("Reserved %d != Active %d + Cached %d", st.Reserved, st.Active, st.Cached)
	}
	if !(st.Allocated <= st.Active && st.Active <= st.Reserved) {
		bad("want Allocated %d <= Active %d <= Reserved %d", st.Allocated, st.Active, st.Reserved)
	}
	if st.Allocs-st.Frees != st.LiveBuffers {
		bad("Allocs %d - Frees %d != LiveBuffers %d", st.Allocs, st.Frees, st.LiveBuffers)
	}
	if st.AllocBytes-st.FreeBytes != st.Active || st.AllocRequested-st.FreeRequested != st.Allocated {
		bad("AllocBytes %d - FreeBytes %d != Active %d, or AllocRequested %d - FreeRequested %d != Allocated %d",
			st.AllocBytes, st.FreeBytes, st.Active, st.AllocRequested, st.FreeRequested, st.Allocated)
	}
	if st.Reserved != st.PlainBytes+st.MappedBytes+st.SpareBytes {
		bad("Reserved %d != PlainBytes %d + MappedBytes %d + SpareBytes %d", st.Reserved, st.PlainBytes, st.MappedBytes, st.SpareBytes)
	}
	if st.PeakAllocated < st.Allocated || st.PeakActive < st.Active || st.PeakReserved < st.Reserved {
		bad("a peak is below its gauge: allocated %d/%d active %d/%d reserved %d/%d",
			st.Allocated, st.PeakAllocated, st.Active, st.PeakActive, st.Reserved, st.PeakReserved)
	}
	if st.PeakLiveBuffers < st.LiveBuffers || st.PeakSegments < st.Segments {
		bad("want LiveBuffers %d <= PeakLiveBuffers %d, Segments %d <= PeakSegments %d", st.LiveBuffers, st.PeakLiveBuffers, st.Segments, st.PeakSegments)
	}
	if st.PeakAllocated > st.PeakActive || st.PeakActive > st.PeakReserved {
		bad("want PeakAllocated %d <= PeakActive %d <= PeakReserved %d", st.PeakAllocated, st.PeakActive, st.PeakReserved)
	}
	if st.Releasable > st.Cached || st.Releasable < st.SpareBytes {
		bad("want SpareBytes %d <= Releasable %d <= Cached %d", st.SpareBytes, st.Releasable, st.Cached)
	}
	// A split copies at least one live run, into a handle of its own:
	// once (through the scratch range) or twice per piece of free memory
	// it is staged in, at most eight pieces a run (defrag.go).
	if st.Copies < st.Splits || (st.Copies == 0) != (st.CopiedBytes == 0) || st.Copies > 16*st.Creates {
		bad("Splits %d, Copies %d, CopiedBytes %d, Creates %d: want Splits <= Copies <= 16 Creates, and bytes with copies", st.Splits, st.Copies, st.CopiedBytes, st.Creates)
	}
	// Splits take time (SplitNanos counts failed ones too).
	if st.Splits > 0 && st.SplitNanos == 0 {
		bad("Splits %d took SplitNanos %d", st.Splits, st.SplitNanos)
	}
	// The virtual-memory calls' parts of the driver's time are within it
	// (Stats reads them first); a kind of call never made took no time
	// unless one failed (a failed call is timed, not counted), which
	// the fault-free identities cannot tell: only the sum is checked.
	if parts := st.CreateNanos + st.MapNanos + st.SetAccessNanos + st.UnmapNanos + st.ReleaseNanos; parts > st.DriverNanos {
		bad("CreateNanos %d + MapNanos %d + SetAccessNanos %d + UnmapNanos %d + ReleaseNanos %d > DriverNanos %d",
			st.CreateNanos, st.MapNanos, st.SetAccessNanos, st.UnmapNanos, st.ReleaseNanos, st.DriverNanos)
	}
	// The markers' writes are among the event calls, their time within
	// the events' (Stats reads the part first).
	if st.MarkCalls > st.EventCalls || st.MarkNanos > st.EventNanos {
		bad("MarkCalls %d in %d ns beyond EventCalls %d in %d ns", st.MarkCalls, st.MarkNanos, st.EventCalls, st.EventNanos)
	}
	// Every mapping the driver holds is a span's or a dormant one
	// (Config.Compact); with no span mapped there is neither.
	if st.Maps < st.Unmaps || uint64(max(st.DormantMappings, 0)) > st.Maps-st.Unmaps || st.DormantMappings < 0 {
		bad("Maps %d - Unmaps %d does not cover DormantMappings %d", st.Maps, st.Unmaps, st.DormantMappings)
	}
	if st.MappedBytes == 0 && (st.DormantMappings != 0 || st.Maps != st.Unmaps) {
		bad("no span mapped, yet Maps %d, Unmaps %d, DormantMappings %d", st.Maps, st.Unmaps, st.DormantMappings)
	}
	if st.LargestFree > st.Cached {
		bad("LargestFree %d > Cached %d", st.LargestFree, st.Cached)
	}
	if st.Fragmentation < 0 || st.Fragmentation > 1 {
		bad("Fragmentation %v outside [0, 1]", st.Fragmentation)
	}
	if st.Cached == 0 && st.Fragmentation != 0 {
		bad("Fragmentation %v with nothing cached", st.Fragmentation)
	}
	return errors.Join(errs...)
}

// finish frees everything, trims and closes, and checks that the allocator
// gave the device back all it took.
func (e *env) finish() {
	e.t.Helper()
	e.releaseHolds()
	if e.fault != nil {
		e.fault.ClearFaults()
	}
	e.freeAll()
	e.trimAndCheckEmpty()
	e.closeAndCheck()
}

// trimAndCheckEmpty trims an allocator with no live buffers and checks that
// it holds nothing and the device has its memory back.
func (e *env) trimAndCheckEmpty() {
	e.t.Helper()
	if err := e.a.Trim(); err != nil {
		e.t.Fatalf("Trim: %v", err)
	}
	e.verify("Trim")
	st := e.a.Stats()
	if st.Reserved != 0 || st.PlainBytes != 0 || st.MappedBytes != 0 || st.SpareBytes != 0 || st.PendingFrees != 0 {
		e.t.Fatalf("after freeing everything and Trim the allocator still holds memory: %+v", st)
	}
	free, _, err := e.dev.MemInfo()
	if err != nil {
		e.t.Fatalf("MemInfo: %v", err)
	}
	if !e.memoryBack(free) {
		e.t.Fatalf("after freeing everything and Trim the device has %d bytes free, %d before New", free, e.free0)
	}
}

// driverSlack is how much less free memory a real driver may report after a
// test than before it, for its own lazy allocations (stream and event
// structures, the spin kernel's module): 2 MiB per test was seen on an H100.
// Devices that report leaks exactly (LeakChecker, the simulated device) get
// no slack.
const driverSlack = 4 << 20

// memoryBack reports whether the device's free memory is back to what it
// was before New.
func (e *env) memoryBack(free uint64) bool {
	if _, exact := e.dev.(LeakChecker); exact {
		return free == e.free0
	}
	if free != e.free0 {
		e.t.Logf("device free memory %d bytes, %d before New (driver slack %d allowed)", free, e.free0, uint64(driverSlack))
	}
	return free+driverSlack >= e.free0
}

// closeAndCheck closes an allocator with no live buffers and checks that
// nothing is left on the device.
func (e *env) closeAndCheck() {
	e.t.Helper()
	e.releaseHolds()
	if err := e.a.Close(); err != nil {
		e.t.Fatalf("Close: %v", err)
	}
	e.done = true
	e.checkDeviceClean()
}

// checkDeviceClean checks that the device holds nothing of a closed
// allocator.
func (e *env) checkDeviceClean() {
	e.t.Helper()
	if lc, ok := e.dev.(LeakChecker); ok {
		if err := lc.Leaks(); err != nil {
			e.t.Fatalf("after Close the device still holds: %v", err)
		}
	}
	if ec, ok := e.dev.(EventCounter); ok {
		if n := ec.LiveEvents(); n != 0 {
			e.t.Fatalf("after Close %d events are still live on the device", n)
		}
	}
	free, _, err := e.dev.MemInfo()
	if err == nil && !e.memoryBack(free) {
		e.t.Fatalf("after Close the device has %d bytes free, %d before New", free, e.free0)
	}
}

// oomError unwraps err as an *OutOfMemoryError, failing the test if it is
// not one.
func oomError(t *testing.T, err error) *gpumem.OutOfMemoryError {
	t.Helper()
	if err == nil {
		t.Fatal("want an out-of-memory error, got nil")
	}
	if !errors.Is(err, gpumem.ErrOutOfMemory) {
		t.Fatalf("want an error matching gpumem.ErrOutOfMemory, got %v", err)
	}
	var oe *gpumem.OutOfMemoryError
	if !errors.As(err, &oe) {
		t.Fatalf("want an *OutOfMemoryError, got %T: %v", err, err)
	}
	return oe
}
