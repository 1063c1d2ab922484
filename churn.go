package gpumem

// See doc.go for the overview.

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
// chose memory over driver calls. Under Config.Defrag, a raised slack
// stops the splits (defrag.go): the two would work against each other.
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
)

// slack counts a request of newSpan for size new bytes in the guard and
// reports whether it should take new memory rather than move or release
// the empty spans held.
func (p *pool) slack(size uint64) bool {
	a := p.a
	if a.compact || a.noChurn || p.empty.n == 0 {
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
