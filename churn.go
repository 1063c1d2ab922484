package gpumem

// See doc.go for the overview.

import "math/bits"

// Churn: a slack that bounds the driver work of programs that free at
// random (ModeVirtual, the default placement).
//
// When a request needs chunks that are not mapped and the pool holds an
// empty span, newSpan moves that span there (an unmap, a map and an
// access grant: tens of microseconds) or releases empty spans to make new
// memory: no memory beyond what the program uses is kept. In a program
// whose frees leave the free memory in holes smaller than its requests (a
// program that frees at random, bench/synth's `rand`), that happens every
// two or three requests: 14-19 us per event on an H100 against 0.5-1.1 us
// for PyTorch's allocator (docs/EXPERIMENTS.md, "Programs that free at
// random"). Holding free memory instead, mapped where it lies, makes later
// requests find mapped room; the price is memory, so it is paid only where
// the moves are frequent.
//
// The guard counts, per window of churnWindow allocations, the requests
// that reach newSpan while an empty span is held (each would move or
// release one). Above churnHigh per thousand allocations the slack rises
// one step (a sixteenth of the bytes in use) up to churnMaxLevel; below an
// eighth of churnHigh it falls one step. While the slack is above zero,
// what is reserved stays within it, and the limit leaves a quarter more
// room than is reserved, such a request takes new memory and leaves the
// empty spans where they are. If the limit or the device refuses that
// memory, the empty span moves as before. Near the limit the slack takes
// nothing, so a program that runs close to it meets the same OOMs as
// without the guard (a random-free program with 9 GiB live under a 9 GiB
// limit: more OOMs with the slack before that rule, the same after).
//
// At the slack's top level a large block also gets larger spans (churnSpan):
// an eighth of the block rather than Config.SpanSize, since a move costs
// the same whatever the span's size. On rand that cuts a first pass's
// driver calls by 30% and a later pass's maps by 45%, at the same ratio.
//
// The bounds, measured (docs/EXPERIMENTS.md, "Churn: a slack that sizes
// itself"): the most such requests in a window of any tune or shipped
// program is 54 per thousand allocations (gnn_random_graphs; most stay
// under 20), the random-free programs' 290-380. So the guard never acts
// on them (every eval replay but rand's decides as before, the holdout's
// too) and on rand it halves the driver calls, holding 1.18-1.19 times
// peak live, below every PyTorch allocator's 1.28-1.98 there.
// churnMaxLevel stops the slack there: at 6/16, rand0 held 1.31.
// The slack serves only requests small next to what is in use (a
// request's own size counts against it): on rand, up to 512 MiB beside
// 8 GiB.
//
// Guarded by the pool's mu. Not used under Config.Compact, whose user
// chose memory over driver calls, nor while the default is tight (past half
// its limit, pressure.go), which places and sizes spans as Compact does to
// hold less: the slack's new memory undid that, so that a limit with room
// held more than no limit at all (maskrcnn_train at 1.5 times its fit:
// 22,410 MiB against 21,294 unlimited, from 1,613 slack creates; bench/synth's
// rand programs at 1.3 times their peak: 11,264 against 9,936-10,052 MiB
// without the slack). The price is driver calls there: a random-free
// program under such a limit makes three to seven times the calls it made
// with the slack (docs/EXPERIMENTS.md, "The churn guard while tight").
// Under Config.Defrag, a raised slack stops the splits (defrag.go): the
// two would work against each other.
//
// Invariants (checked by checkPool): 0 <= level <= churnMaxLevel; the
// window starts at or before the pool's allocation count; under Compact
// the level stays 0 and the slack serves nothing.
type churnGuard struct {
	start   uint64 // pool.nallocs when the window began
	n       int    // requests of the window that met an empty span in newSpan
	level   int    // the slack, in sixteenths of the bytes in use: 0..churnMaxLevel
	taken   uint64 // requests the slack served with new memory
	refused uint64 // requests whose new memory the limit or the device refused (an empty span moved)
}

const (
	churnWindow   = 1024 // allocations per window
	churnHigh     = 100  // requests per thousand allocations that raise the slack
	churnMaxLevel = 4    // a quarter of the bytes in use

	churnBigBlock  = 32 << 20 // blocks whose spans grow with them while the slack is up
	churnSpanShare = 8        // ... to an eighth of the block (a power of two of chunks)
)

// churnSpan is the most chunks a span under the block being backed may
// have while the slack is at its top level (0 when it is not, or the block
// is small, or the limit is near, or the default is tight): an eighth of
// the block, rounded down to a power of two of chunks. A miss of a large
// request in such a program needs about 100 MiB of new backing
// (docs/EXPERIMENTS.md, "Programs that free at random"), which spans of
// Config.SpanSize bring in six or seven moves of some 75 us each on an
// H100, whatever their size; spans sized by the block bring the same bytes
// in fewer, larger moves. The rounding keeps the sizes few, so that an
// empty span is likely to match a later request exactly (findEmpty). The
// slack, not the span size, sets what such a program holds: on
// bench/synth's rand the ratio is unchanged (1.1848
// against 1.1849) and the maps and creates fall from 118 to 84 per 1000
// events in a first pass, from 85 to 50 in a later one. Larger spans hold
// more idle memory beside a block's edges: only a program that churns
// window after window gets them (the top level; knn_retrieval, a holdout
// program whose later passes raise the slack a step or two, held 1.0411
// over ten passes with them from any level, 1.0123 without: the gate was
// set after seeing that, so knn is no longer unseen here), and, as the
// slack, only where the limit leaves a quarter more room than would be
// reserved.
func (p *pool) churnSpan() int {
	b, a := p.backing, p.a
	if b == nil || p.churn.level < churnMaxLevel || b.size < churnBigBlock || a.tight() {
		return 0
	}
	if r := a.reserved.Load() + b.size; r+r/4 > a.limit.Load() {
		return 0
	}
	n := int(b.size/a.gran) / churnSpanShare
	return 1 << (bits.Len(uint(n)) - 1)
}

// slack counts a request of newSpan for size new bytes in the guard and
// reports whether it should take new memory rather than move or release
// the empty spans held.
func (p *pool) slack(size uint64) bool {
	a := p.a
	if a.compact || a.noChurn || p.empty.n == 0 || a.tight() {
		return false
	}
	g := &p.churn
	g.n++
	if n := p.nallocs - g.start; n >= churnWindow {
		switch rate := uint64(g.n) * 1000 / n; {
		case rate > churnHigh:
			g.level = min(g.level+1, churnMaxLevel)
		case rate < churnHigh/8:
			g.level = max(g.level-1, 0)
		}
		g.start, g.n = p.nallocs, 0
	}
	if g.level == 0 {
		return false
	}
	r := a.reserved.Load() + size
	inUse := uint64(max(a.active.Load(), 0))
	return r <= inUse+inUse*uint64(g.level)/16 && r+r/4 <= a.limit.Load()
}
