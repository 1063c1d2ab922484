package gpumem

import (
	"testing"

	"github.com/gpumem/gpumem/device/sim"
)

// TestCompactSpansGrow: under Config.Compact without a SpanSize, spans start
// at 4 MiB and grow with the allocator (spanMost): none is over twice (the
// frontier's doubled span) the largest power-of-two multiple of 4 MiB within
// 1/compactSpanShare of the most reserved, none over twice compactSpanMax,
// and past a few GiB some are larger than the frontier's doubled 4 MiB. The
// size never shrinks: after everything is freed and given back, a new block
// still gets the grown spans. An explicit SpanSize stays fixed.
func TestCompactSpansGrow(t *testing.T) {
	const block = 64 << 20
	longest := func(a *Allocator) uint64 {
		p := a.allPools()[0]
		var n int32
		for i := range p.spans {
			if s := &p.spans[i]; s.inUse {
				n = max(n, s.n)
			}
		}
		return uint64(n) * a.gran
	}
	grow := func(cfg Config, upTo uint64) (*Allocator, []Buffer, uint64) {
		cfg.CheckInvariants = true
		a, err := New(sim.MustNew(sim.Config{}), cfg)
		if err != nil {
			t.Fatal(err)
		}
		var bufs []Buffer
		var most uint64
		for live := uint64(0); live < upTo; live += block {
			b, err := a.Alloc(block, 0)
			if err != nil {
				t.Fatal(err)
			}
			bufs = append(bufs, b)
			most = max(most, a.Stats().Reserved)
		}
		return a, bufs, most
	}
	a, bufs, most := grow(Config{Compact: true}, 6<<30)
	defer a.Close()
	bound := uint64(compactSpanSize)
	for bound*2 <= most/compactSpanShare && bound*2 <= compactSpanMax {
		bound *= 2
	}
	n := longest(a)
	t.Logf("compact, %d MiB reserved: longest span %d MiB, the bound %d MiB (doubled at the frontier)", most>>20, n>>20, bound>>20)
	if n > 2*bound {
		t.Errorf("compact: a span of %d MiB; want at most twice %d MiB (1/%d of %d MiB held)", n>>20, bound>>20, compactSpanShare, most>>20)
	}
	if n <= 2*compactSpanSize {
		t.Errorf("compact at %d MiB held: longest span %d MiB; want spans grown past the frontier's doubled %d MiB", most>>20, n>>20, compactSpanSize>>20)
	}
	// Free everything and give it back; a new block keeps the grown size.
	for _, b := range bufs {
		if err := a.Free(b); err != nil {
			t.Fatal(err)
		}
	}
	if err := a.Trim(); err != nil {
		t.Fatal(err)
	}
	if r := a.Stats().Reserved; r != 0 {
		t.Fatalf("after Trim %d bytes reserved; want none", r)
	}
	if _, err := a.Alloc(block, 0); err != nil {
		t.Fatal(err)
	}
	if n := longest(a); n <= compactSpanSize {
		t.Errorf("after a Trim, a new %d MiB block has spans of at most %d MiB; want the grown size kept", block>>20, n>>20)
	}

	b, _, _ := grow(Config{Compact: true, SpanSize: compactSpanSize}, 6<<30)
	defer b.Close()
	if n := longest(b); n > 2*compactSpanSize {
		t.Errorf("compact with SpanSize %d MiB: a span of %d MiB; want at most twice SpanSize", compactSpanSize>>20, n>>20)
	}
}
