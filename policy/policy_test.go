package policy

import (
	"errors"
	"github.com/gpumem/gpumem"
	"strings"
	"testing"

	"github.com/gpumem/gpumem/trace"
)

// mustTrace builds a trace from its text.
func mustTrace(t *testing.T, text string) *trace.Trace {
	t.Helper()
	tr, err := trace.Read(strings.NewReader("# gpumem-trace v1\n"+text), "test.trace")
	if err != nil {
		t.Fatal(err)
	}
	return tr
}

func mustNew(t *testing.T, name string, capacity uint64) Allocator {
	t.Helper()
	a, err := New(name, capacity)
	if err != nil {
		t.Fatal(err)
	}
	return a
}

// mustAlloc allocates and checks the invariants.
func mustAlloc(t *testing.T, a Allocator, size, stream uint64) uint64 {
	t.Helper()
	addr, err := a.Alloc(size, stream)
	if err != nil {
		t.Fatalf("Alloc(%d, %d): %v", size, stream, err)
	}
	if err := checkAll(a); err != nil {
		t.Fatalf("after Alloc(%d, %d): %v", size, stream, err)
	}
	return addr
}

func mustFree(t *testing.T, a Allocator, addr uint64) {
	t.Helper()
	if err := a.Free(addr); err != nil {
		t.Fatalf("Free(%#x): %v", addr, err)
	}
	if err := checkAll(a); err != nil {
		t.Fatalf("after Free(%#x): %v", addr, err)
	}
}

// checkAll runs Check, and the emulation's own checker of its books.
func checkAll(a Allocator) error {
	if err := Check(a); err != nil {
		return err
	}
	if c, ok := a.(interface{ check() error }); ok {
		return c.check()
	}
	return nil
}

// segSizes lists the sizes of a's segments.
func segSizes(a Allocator) []uint64 {
	var out []uint64
	for _, s := range a.Segments() {
		out = append(out, s.Size)
	}
	return out
}

func TestNewUnknown(t *testing.T) {
	_, err := New("tcmalloc", 1<<30)
	if err == nil {
		t.Fatal("New accepted an unknown policy")
	}
	for _, n := range Names() {
		if !strings.Contains(err.Error(), n) {
			t.Errorf("the error %q does not list %s", err, n)
		}
	}
	if _, err := New("gpumem", 0); err == nil {
		t.Error("New accepted a device of capacity 0")
	}
}

func TestNamesAllWork(t *testing.T) {
	if Names()[0] != "gpumem" {
		t.Errorf("Names()[0] = %q, want gpumem first", Names()[0])
	}
	for _, n := range Names() {
		a := mustNew(t, n, 1<<30)
		x := mustAlloc(t, a, 1000, 0)
		y := mustAlloc(t, a, 3<<20, 7)
		mustFree(t, a, x)
		mustFree(t, a, y)
		if err := a.Free(y); err == nil {
			t.Errorf("%s: a second free of %#x succeeded", n, y)
		}
		if _, err := a.Alloc(2<<30, 0); !errors.Is(err, ErrOutOfMemory) {
			t.Errorf("%s: 2 GiB on a 1 GiB device: %v, want ErrOutOfMemory", n, err)
		}
		if err := Check(a); err != nil {
			t.Errorf("%s: %v", n, err)
		}
		closeAllocator(a)
	}
}

// badAllocator reports whatever segments it is given.
type badAllocator struct {
	reserved uint64
	segs     []Segment
}

func (b *badAllocator) Alloc(uint64, uint64) (uint64, error) { return 0, errors.New("no") }
func (b *badAllocator) Free(uint64) error                    { return errors.New("no") }
func (b *badAllocator) Reserved() uint64                     { return b.reserved }
func (b *badAllocator) Segments() []Segment                  { return b.segs }

func TestCheckFindsViolations(t *testing.T) {
	good := func() []Segment {
		return []Segment{
			{Addr: 100, Size: 50, Blocks: []Block{{Addr: 100, Size: 20, Requested: 10, Live: true}, {Addr: 120, Size: 30}}},
			{Addr: 200, Size: 10, Blocks: []Block{{Addr: 200, Size: 10}}},
		}
	}
	if err := Check(&badAllocator{60, good()}); err != nil {
		t.Fatalf("a valid map: %v", err)
	}
	for _, c := range []struct {
		want   string
		break_ func(s []Segment) uint64 // returns Reserved
	}{
		{"add up to", func(s []Segment) uint64 { return 61 }},
		{"overlaps", func(s []Segment) uint64 { s[1].Addr = 140; s[1].Blocks[0].Addr = 140; return 60 }},
		{"sorted and adjacent", func(s []Segment) uint64 { s[0].Blocks[1].Addr = 121; return 60 }},
		{"tile", func(s []Segment) uint64 { s[0].Blocks[1].Size = 29; return 60 }},
		{"runs past", func(s []Segment) uint64 { s[0].Blocks[1].Size = 31; return 60 }},
		{"serves", func(s []Segment) uint64 { s[0].Blocks[0].Requested = 21; return 60 }},
		{"free block", func(s []Segment) uint64 { s[0].Blocks[1].Requested = 1; return 60 }},
		{"no blocks", func(s []Segment) uint64 { s[1].Blocks = nil; return 60 }},
		{"empty", func(s []Segment) uint64 { s[1].Size = 0; s[1].Blocks = nil; return 50 }},
	} {
		s := good()
		err := Check(&badAllocator{c.break_(s), s})
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("want an error with %q, got %v", c.want, err)
		}
	}
}

func TestReplayCountsOOMsAndSkipsTheirFrees(t *testing.T) {
	// 1.25 GiB device (tf-bfc-prealloc's limit: 960 MiB); the 900 MiB
	// request fits, the second does not, and its free is ignored.
	tr := mustTrace(t, "a 0 943718400 0 1\na 1 943718400 0 2\nf 1 3\nf 0 4\na 2 943718400 0 5\n")
	for _, n := range Names() {
		var seen []int
		r, err := Run(tr, n, 1280<<20, true, Options{Observe: func(i int, a Allocator) { seen = append(seen, i) }})
		if err != nil {
			t.Fatalf("%s: %v", n, err)
		}
		if r.OOMs != 1 {
			t.Errorf("%s: %d OOMs, want 1", n, r.OOMs)
		}
		if len(seen) != 5 || seen[4] != 4 {
			t.Errorf("%s: observed events %v, want 0..4", n, seen)
		}
		if r.PeakReservedBytes < 943718400 || r.PeakEvent > 0 {
			t.Errorf("%s: peak %d at event %d, want at least the request at event 0", n, r.PeakReservedBytes, r.PeakEvent)
		}
	}
}

func TestAtPeak(t *testing.T) {
	// Peak at event 2 (3 MiB and 30 MiB live under torch-native: a 20 MiB
	// and a 30 MiB segment); later events hold less.
	tr := mustTrace(t, "a 0 3145728 0 1\nf 0 2\na 1 31457280 0 3\na 2 3145728 0 4\nf 1 5\nf 2 6\n")
	for _, n := range Names() {
		r, segs, err := AtPeak(tr, n, 1<<30)
		if err != nil {
			t.Fatalf("%s: %v", n, err)
		}
		var sum, live uint64
		for _, s := range segs {
			sum += s.Size
			for _, b := range s.Blocks {
				if b.Live {
					live += b.Requested
				}
			}
		}
		if sum != r.PeakReservedBytes {
			t.Errorf("%s: the map at peak holds %d bytes, the peak was %d", n, sum, r.PeakReservedBytes)
		}
		if n == "torch-native" && (r.PeakEvent != 2 || live != 31457280) {
			t.Errorf("%s: peak at event %d with %d live, want event 2 with 31457280", n, r.PeakEvent, live)
		}
	}
}

// TestGpumemReserved checks that the gpumem policy's Reserved (read from the
// simulated device) is the allocator's Stats.Reserved after every event of
// a real trace.
func TestGpumemReserved(t *testing.T) {
	var tr *trace.Trace
	for _, x := range shipped(t) {
		if x.Name == "resnet50_train" {
			tr = x
		}
	}
	g, err := newGpumem(80<<30, gpumem.Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	bad := 0
	_, err = Replay(tr, g, Options{Observe: func(i int, a Allocator) {
		if got, want := g.Reserved(), g.a.Stats().Reserved; got != want && bad < 5 {
			bad++
			t.Errorf("event %d: Reserved %d, Stats.Reserved %d", i, got, want)
		}
	}})
	if err != nil {
		t.Fatal(err)
	}
	if err := Check(g); err != nil {
		t.Fatal(err)
	}
}

// TestReplayTrims: a trace's trims empty the cache of the policies that
// give memory back (gpumem, PyTorch's two), and of no other: after the
// final trim they hold only the live 2 MiB's segment; XLA's BFC keeps what
// it took.
func TestReplayTrims(t *testing.T) {
	tr := mustTrace(t, "a 0 2097152 0 1\na 1 62914560 0 2\nf 1 3\nt 4\n")
	for _, n := range Names() {
		r, err := Run(tr, n, 1<<30, true, Options{})
		if err != nil {
			t.Fatalf("%s: %v", n, err)
		}
		_, emptier := func() (Allocator, bool) {
			a, err := New(n, 1<<30)
			if err != nil {
				t.Fatal(err)
			}
			defer closeAllocator(a)
			_, ok := a.(CacheEmptier)
			return a, ok
		}()
		if emptier && r.EndReservedBytes > 20<<20 {
			t.Errorf("%s: %d bytes held after the trim, want at most a segment for the live 2 MiB", n, r.EndReservedBytes)
		}
		if !emptier && r.EndReservedBytes < 62914560 {
			t.Errorf("%s: %d bytes held after the trim by a policy that models none", n, r.EndReservedBytes)
		}
	}
}
