package gpumem_test

import (
	"errors"
	"fmt"
	"os"
	"runtime/debug"
	"testing"
	"time"

	"github.com/gpumem/gpumem"
	"github.com/gpumem/gpumem/device"
	"github.com/gpumem/gpumem/device/sim"
	"github.com/gpumem/gpumem/internal/conformance"
)

// FuzzOps decodes bytes into a sequence of allocator operations on a small
// simulated device (64 MiB) with three streams and runs them with
// CheckInvariants on. After every step Allocator.Check must pass, the
// Stats identities must hold and agree with the buffers the test holds,
// live buffers must never overlap, and a new buffer must be usable by its
// stream at once (sim.CheckHandoff: no unordered pending work of another
// stream on it). At the end everything is freed, trimmed and closed, and
// the device must hold nothing.
//
// The first byte picks the configuration (bit 64: Config.Compact, bit
// 128: Config.Defrag and Config.Gather, which Compact and ModePlain
// ignore); then
// each operation is an opcode byte followed by its argument bytes (see
// fuzzer.step). Missing bytes read as zero.
//
// Several injected faults may be armed at once (at most three), so that a
// failure while undoing a failure is explored too.
func FuzzOps(f *testing.F) {
	f.Add([]byte{0})
	// Allocs of every class on every stream, frees, a double free, Trim.
	f.Add([]byte{0, 0, 0, 0, 0, 1, 9, 1, 0, 2, 3, 0, 3, 2, 2, 0, 5, 0, 4, 0, 10})
	f.Add([]byte{1, 0, 0, 0, 0, 1, 9, 1, 0, 2, 3, 0, 3, 2, 2, 0, 5, 0, 4, 0, 10})
	// Hold stream 1, alloc there, free, alloc the same on stream 2 under
	// the 32 MiB limit (memory moves between streams), drain.
	f.Add([]byte{2, 7, 1, 0, 3, 12, 1, 3, 0, 0, 3, 12, 2, 8, 1, 10})
	f.Add([]byte{3, 7, 1, 0, 3, 12, 1, 3, 0, 0, 3, 12, 2, 8, 1, 10})
	// The same under Config.Compact (moves leave dormant mappings).
	f.Add([]byte{66, 7, 1, 0, 3, 12, 1, 3, 0, 0, 3, 12, 2, 8, 1, 10})
	f.Add([]byte{64, 0, 0, 0, 0, 1, 9, 1, 0, 2, 3, 0, 3, 2, 2, 0, 5, 0, 4, 0, 10})
	// The same under Config.Defrag (sparse spans split: a synchronize and
	// copies to new handles), with faults armed.
	f.Add([]byte{130, 7, 1, 0, 3, 12, 1, 3, 0, 0, 3, 12, 2, 8, 1, 10})
	f.Add([]byte{128, 13, 8, 0, 0, 3, 3, 0, 14, 0, 0, 0, 3, 6, 1, 15, 0, 0, 3, 2, 0, 10})
	// RecordStream on a held stream, free, reuse on the owner stream.
	f.Add([]byte{0, 0, 2, 40, 1, 7, 2, 6, 0, 2, 3, 0, 0, 2, 40, 1, 8, 2, 0, 2, 40, 1, 10})
	// Scopes with quotas, nested, closed with buffers inside.
	f.Add([]byte{16, 11, 0, 2, 1, 0, 9, 0, 11, 1, 3, 0, 1, 60, 1, 11, 0, 0, 1, 2, 5, 0, 12, 0, 10})
	// Faults: an injected Map failure, then a device OOM on Create.
	f.Add([]byte{0, 13, 8, 0, 0, 3, 3, 0, 14, 0, 0, 0, 3, 6, 1, 15, 0, 0, 3, 2, 0, 10})
	f.Add([]byte{1, 13, 0, 0, 0, 3, 3, 0, 14, 1, 0, 0, 3, 6, 1, 15, 0, 0, 3, 2, 0, 10})
	// Shrink the device, allocate until OOM, grow it back.
	f.Add([]byte{4, 16, 24, 0, 3, 7, 0, 0, 3, 7, 0, 0, 3, 7, 0, 16, 0, 0, 3, 7, 0, 10})
	f.Fuzz(func(t *testing.T, data []byte) {
		runOps(t, data)
	})
}

// fuzzTrace logs every step (GPUMEM_FUZZ_TRACE=1 go test -v -run FuzzOps/...),
// to read what a failing input does.
var fuzzTrace = os.Getenv("GPUMEM_FUZZ_TRACE") != ""

// fuzzOps are the operations a fault may be injected into.
var fuzzOps = []string{"Alloc", "Free", "MemInfo", "Synchronize", "Reserve", "Create", "Release",
	"Map", "SetAccess", "Unmap", "NewEvent", "Record", "Query", "Wait", "StreamWait", "NewMarker", "Mark"}

type fbuf struct {
	buf    gpumem.Buffer
	s      device.Stream
	scope  int // index in fuzzer.scopes, or -1
	lo, hi uint64
}

type fscope struct {
	sc     *gpumem.Scope
	parent int // index, or -1
	closed bool
}

type fuzzer struct {
	t        *testing.T
	data     []byte
	dev      *sim.Device
	a        *gpumem.Allocator
	streams  [3]device.Stream
	held     [3]bool
	live     []fbuf
	freed    []gpumem.Buffer // for double frees
	scopes   []fscope
	injected uint64 // dev.Stats().Injected as last seen
	armed    int    // faults armed and not yet fired
	shrunk   uint64
	step     int
}

func (z *fuzzer) next() byte {
	if len(z.data) == 0 {
		return 0
	}
	b := z.data[0]
	z.data = z.data[1:]
	return b
}

func runOps(t *testing.T, data []byte) {
	// A hang (a deadlock or a loop in the allocator) would stall the
	// fuzzer silently: crash instead, with every goroutine's stack.
	watchdog := time.AfterFunc(20*time.Second, func() {
		debug.SetTraceback("all")
		panic(fmt.Sprintf("FuzzOps: input %x has run for 20s: a hang", data))
	})
	defer watchdog.Stop()
	z := &fuzzer{t: t, data: data}
	c := z.next()
	cfg := gpumem.Config{CheckInvariants: true, Mode: gpumem.ModeVirtual}
	if c&1 != 0 {
		cfg.Mode = gpumem.ModePlain
	}
	if c&2 != 0 {
		cfg.Limit = 32 * miB
	}
	if c&4 != 0 {
		cfg.ReleaseThreshold = 4 * miB
	}
	if c&8 != 0 {
		cfg.Preallocate = 4 * miB
	}
	cfg.RecordSites = c&16 != 0
	if c&32 != 0 {
		cfg.SmallSize = 64 * kiB
	}
	cfg.Compact = c&64 != 0
	cfg.Defrag = c&128 != 0
	cfg.Gather = c&128 != 0 // splits at a shortage too: the 64 MiB device runs short
	if c&192 == 192 {
		// Both bits (Compact would ignore Defrag and Gather): a handle
		// per chunk instead, which excludes the three.
		cfg.Compact, cfg.Defrag, cfg.Gather, cfg.ChunkHandles = false, false, false, true
	}
	z.dev = sim.MustNew(sim.Config{Capacity: 64 * miB})
	a, err := gpumem.New(z.dev, cfg)
	if err != nil {
		t.Fatalf("New(%+v): %v", cfg, err)
	}
	z.a = a
	// No deferred Close: after a failed check (a panic with a pool locked) it would deadlock.
	z.streams[0] = 0
	for i := 1; i < 3; i++ {
		if z.streams[i], err = z.dev.NewStream(); err != nil {
			t.Fatal(err)
		}
	}
	for len(z.data) > 0 && z.step < 2000 {
		z.step++
		op := z.next()
		if fuzzTrace {
			t.Logf("step %d: op %d, next bytes %x, live %d", z.step, op%17, z.data[:min(len(z.data), 4)], len(z.live))
		}
		z.do(op)
		if z.verify(op) {
			return
		}
	}
	z.finish()
}

func (z *fuzzer) fatalf(format string, args ...any) {
	z.t.Helper()
	z.t.Fatalf("step %d: "+format, append([]any{z.step}, args...)...)
}

// allowed reports whether err is an acceptable failure of an operation:
// out of memory, or a fault the test injected.
func allowed(err error) bool {
	return errors.Is(err, gpumem.ErrOutOfMemory) || errors.Is(err, device.ErrInjected)
}

func (z *fuzzer) size() uint64 {
	c, x := z.next(), uint64(z.next())
	switch c % 4 {
	case 0:
		return 1 + x*16 // up to 4 KiB
	case 1:
		return (x + 1) * 4 * kiB // up to 1 MiB
	case 2:
		return (x%16 + 1) * 512 * kiB // up to 8 MiB
	default:
		return (x%8+1)*2*miB + uint64(c/4)*512 // up to 16 MiB and a bit
	}
}

func (z *fuzzer) stream() (int, device.Stream) {
	i := int(z.next() % 3)
	return i, z.streams[i]
}

func (z *fuzzer) pick() int {
	if len(z.live) == 0 {
		z.next()
		return -1
	}
	return int(z.next()) % len(z.live)
}

// scopeClosed reports whether scope i or an ancestor is closed.
func (z *fuzzer) scopeClosed(i int) bool {
	for ; i >= 0; i = z.scopes[i].parent {
		if z.scopes[i].closed {
			return true
		}
	}
	return false
}

func (z *fuzzer) do(op byte) {
	switch op % 17 {
	case 0, 1, 2: // Alloc
		n := z.size()
		_, s := z.stream()
		b, err := z.a.Alloc(n, s)
		if err != nil {
			if !allowed(err) {
				z.fatalf("Alloc(%d, %d): %v", n, s, err)
			}
			return
		}
		z.admit(b, n, s, -1)
	case 3, 4: // Free
		i := z.pick()
		if i < 0 {
			return
		}
		l := z.live[i]
		var err error
		if l.scope >= 0 && op%2 == 0 {
			err = z.scopes[l.scope].sc.Free(l.buf)
		} else {
			err = z.a.Free(l.buf)
		}
		if err != nil {
			z.fatalf("Free(0x%x): %v", l.lo, err)
		}
		z.drop(i)
	case 5: // double free
		if len(z.freed) == 0 {
			z.next()
			return
		}
		b := z.freed[int(z.next())%len(z.freed)]
		before := z.a.Stats()
		if err := z.a.Free(b); !errors.Is(err, gpumem.ErrDoubleFree) {
			z.fatalf("Free of a freed buffer: %v, want ErrDoubleFree", err)
		}
		if err := z.a.RecordStream(b, 0); !errors.Is(err, gpumem.ErrDoubleFree) {
			z.fatalf("RecordStream of a freed buffer: %v, want ErrDoubleFree", err)
		}
		if after := z.a.Stats(); after != before {
			z.fatalf("a refused double free changed the stats:\n%+v\n%+v", before, after)
		}
	case 6: // RecordStream, and work on the other stream
		i := z.pick()
		_, s := z.stream()
		if i < 0 {
			return
		}
		l := z.live[i]
		if err := z.a.RecordStream(l.buf, s); err != nil {
			z.fatalf("RecordStream: %v", err)
		}
		if err := z.dev.Touch(s, l.buf.Ptr(), l.buf.Size()); err != nil {
			z.fatalf("Touch of a live buffer on stream %d: %v", s, err)
		}
	case 7: // Hold
		i, s := z.stream()
		if !z.held[i] {
			z.dev.Hold(s)
			z.held[i] = true
		}
	case 8: // Drain
		i, s := z.stream()
		z.dev.Drain(s)
		z.held[i] = false
	case 9: // work on a buffer's own stream
		i := z.pick()
		if i < 0 {
			return
		}
		l := z.live[i]
		if err := z.dev.Touch(l.s, l.buf.Ptr(), l.buf.Size()); err != nil {
			z.fatalf("Touch of a live buffer on its stream: %v", err)
		}
	case 10: // Trim
		if err := z.a.Trim(); err != nil && !allowed(err) {
			z.fatalf("Trim: %v", err)
		}
	case 11: // Alloc in a scope (made on first use, maybe nested)
		k := int(z.next() % 4)
		quota := uint64(z.next()%4) * 4 * miB
		n := z.size()
		_, s := z.stream()
		for len(z.scopes) <= k {
			parent := len(z.scopes) - 1
			name := fmt.Sprintf("s%d", len(z.scopes))
			if parent >= 0 && quota != 0 && !z.scopeClosed(parent) {
				sc, err := z.scopes[parent].sc.NewScope(name, quota)
				if err != nil {
					z.fatalf("NewScope: %v", err)
				}
				z.scopes = append(z.scopes, fscope{sc: sc, parent: parent})
			} else {
				z.scopes = append(z.scopes, fscope{sc: z.a.NewScope(name, quota), parent: -1})
			}
		}
		b, err := z.scopes[k].sc.Alloc(n, s)
		if z.scopeClosed(k) {
			if !errors.Is(err, gpumem.ErrClosed) {
				z.fatalf("Alloc in a closed scope: %v, want ErrClosed", err)
			}
			return
		}
		if err != nil {
			if !allowed(err) {
				z.fatalf("scope Alloc(%d): %v", n, err)
			}
			return
		}
		z.admit(b, n, s, k)
	case 12: // close a scope
		if len(z.scopes) == 0 {
			z.next()
			return
		}
		k := int(z.next()) % len(z.scopes)
		z.closeScope(k)
	case 13: // inject a fault
		name := fuzzOps[int(z.next())%len(fuzzOps)]
		n := 1 + int(z.next()%4)
		if z.faultFree() {
			z.dev.FailNth(name, n)
			z.armed++
		}
	case 14: // inject a device OOM
		name := []string{"Create", "Alloc"}[z.next()%2]
		n := 1 + int(z.next()%3)
		if z.faultFree() {
			z.dev.FailOOM(name, n)
			z.armed++
		}
	case 15: // clear faults (and give back shrunk memory)
		z.next()
		z.dev.ClearFaults()
		z.armed, z.shrunk, z.injected = 0, 0, z.dev.Stats().Injected
	case 16: // another process takes or gives back memory
		x := uint64(z.next())
		if z.shrunk > 0 {
			if err := z.dev.Grow(z.shrunk); err != nil {
				z.fatalf("Grow: %v", err)
			}
			z.shrunk = 0
			return
		}
		n := (x%32 + 1) * miB
		if z.dev.Shrink(n) == nil {
			z.shrunk = n
		}
	}
}

// faultFree reports whether another fault may be armed: at most three are
// outstanding (armed and not yet fired, as far as the test can tell).
func (z *fuzzer) faultFree() bool {
	inj := z.dev.Stats().Injected
	if fired := int(inj - z.injected); fired > 0 {
		z.armed = max(0, z.armed-fired)
		z.injected = inj
	}
	return z.armed < 3
}

func (z *fuzzer) admit(b gpumem.Buffer, n uint64, s device.Stream, scope int) {
	z.t.Helper()
	p := uint64(b.Ptr())
	if b.IsZero() || p == 0 || p%512 != 0 || b.Size() != n {
		z.fatalf("Alloc(%d) = %#x (size %d, zero %v)", n, p, b.Size(), b.IsZero())
	}
	lo, hi := p, p+(n+511)&^511
	for _, l := range z.live {
		if lo < l.hi && l.lo < hi {
			z.fatalf("Alloc(%d, stream %d) = [%#x, %#x) overlaps live [%#x, %#x) of stream %d", n, s, lo, hi, l.lo, l.hi, l.s)
		}
	}
	if err := z.dev.CheckHandoff(b.Ptr(), n, s); err != nil {
		z.fatalf("Alloc(%d, stream %d) = %#x, still in use by another stream: %v", n, s, p, err)
	}
	if err := z.dev.Touch(s, b.Ptr(), n); err != nil {
		z.fatalf("Alloc(%d, stream %d) = %#x is not usable: %v", n, s, p, err)
	}
	z.live = append(z.live, fbuf{buf: b, s: s, scope: scope, lo: lo, hi: hi})
}

func (z *fuzzer) drop(i int) {
	if len(z.freed) < 16 {
		z.freed = append(z.freed, z.live[i].buf)
	} else {
		z.freed[z.step%16] = z.live[i].buf
	}
	z.live[i] = z.live[len(z.live)-1]
	z.live = z.live[:len(z.live)-1]
}

func (z *fuzzer) closeScope(k int) {
	err := z.scopes[k].sc.Close()
	var le *gpumem.LeakError
	if err != nil && !errors.As(err, &le) {
		z.fatalf("Scope.Close: %v", err)
	}
	already := z.scopeClosed(k)
	z.scopes[k].closed = true
	leaked := map[uint64]bool{}
	if le != nil {
		for _, l := range le.Buffers {
			leaked[l.Ptr] = true
		}
	}
	// Every buffer of the scope and its descendants was freed, and those
	// are exactly the ones reported.
	for i := 0; i < len(z.live); {
		l := z.live[i]
		if l.scope >= 0 && z.scopeClosed(l.scope) && !already {
			if !leaked[l.lo] {
				z.fatalf("Scope.Close freed 0x%x without reporting it", l.lo)
			}
			delete(leaked, l.lo)
			z.drop(i)
			continue
		}
		i++
	}
	if len(leaked) > 0 {
		z.fatalf("Scope.Close reported %d buffers the scope did not own", len(leaked))
	}
}

// verify checks the allocator after an operation. It reports true when the
// allocator says it is broken (gpumem.ErrBroken), which only a second
// injected fault may cause (a split that fails, then cannot map its span's
// memory back): Close must then refuse, and the run ends there.
func (z *fuzzer) verify(op byte) bool {
	z.t.Helper()
	if err := z.a.Check(); err != nil {
		if !errors.Is(err, gpumem.ErrBroken) {
			z.fatalf("after op %d: Check: %v", op%17, err)
		}
		if n := z.dev.Stats().Injected; n < 2 {
			z.fatalf("after op %d: broken after %d injected faults: %v", op%17, n, err)
		}
		if cerr := z.a.Close(); !errors.Is(cerr, gpumem.ErrBroken) {
			z.fatalf("after op %d: Close of a broken allocator returned %v", op%17, cerr)
		}
		return true
	}
	st := z.a.Stats()
	if err := conformance.StatsIdentities(st); err != nil {
		z.fatalf("after op %d: %v", op%17, err)
	}
	var allocated uint64
	for _, l := range z.live {
		allocated += l.buf.Size()
	}
	if st.LiveBuffers != uint64(len(z.live)) || st.Allocated != allocated {
		z.fatalf("after op %d: stats say %d buffers of %d bytes, the test holds %d of %d", op%17, st.LiveBuffers, st.Allocated, len(z.live), allocated)
	}
	return false
}

func (z *fuzzer) finish() {
	z.t.Helper()
	z.dev.ClearFaults()
	z.shrunk = 0
	for i := range z.held {
		z.dev.Drain(z.streams[i])
	}
	for len(z.live) > 0 {
		if err := z.a.Free(z.live[0].buf); err != nil {
			z.fatalf("final Free: %v", err)
		}
		z.drop(0)
	}
	for _, s := range z.scopes {
		if err := s.sc.Close(); err != nil {
			z.fatalf("closing an empty scope: %v", err)
		}
	}
	if err := z.a.Trim(); err != nil {
		z.fatalf("final Trim: %v", err)
	}
	if z.verify(10) {
		z.fatalf("broken after the faults were cleared")
	}
	if st := z.a.Stats(); st.Reserved != 0 {
		z.fatalf("after freeing everything and Trim: %+v", st)
	}
	if free, total, _ := z.dev.MemInfo(); free != total {
		z.fatalf("after Trim the device has %d of %d bytes free", free, total)
	}
	if err := z.a.Close(); err != nil {
		z.fatalf("Close: %v", err)
	}
	if err := z.dev.Leaks(); err != nil {
		z.fatalf("after Close: %v", err)
	}
	if n := z.dev.Stats().LiveEvents; n != 0 {
		z.fatalf("after Close %d events are live on the device", n)
	}
}
