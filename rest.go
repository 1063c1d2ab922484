package gpumem

// See doc.go for the overview.

// Rest: a pool that holds no live block starts placement over (ModeVirtual,
// the default placement).
//
// The default places a block where the chunks under it are already mapped
// (placement, place.go), so the layout of a program's first run follows
// what it mapped as it grew. Once everything is freed and the program
// starts again (a sweep's next model, a notebook cell run again, each pass
// of `gpumem replay --passes`), the whole arena it mapped is free and
// ready, and the same requests spread over it another way: a span left
// partly used at the peak holds its free chunks, and the next run holds
// more than the first (the drift: spec_decode 1.018 times its peak live
// over one pass, 1.085 over ten; docs/EXPERIMENTS.md, "The default's drift
// over ten passes"). Giving everything back between runs (a Trim) removed
// the drift, at the price of every run making the first one's driver
// calls again.
//
// So when a pool's last live block is freed (nothing pending on other
// streams), rest marks every empty span rested: its mapping and access
// stay, but its chunks are shown to placement as not ready, as they were
// before the first run mapped them. The next run's requests are placed as
// the first run's were, and a block placed over a rested span wakes it
// (back, pressure.go): ready again with no driver call. Where the first
// run's spans have since moved (a span moved to serve a later request is
// not where the next run first wants it), back gives the chunks a span as
// the first run did: an empty span moved there, or new memory. Measured on
// the 47 real traces over ten passes (docs/EXPERIMENTS.md, "A pool that
// holds nothing starts over"): the ten-pass peak lower on 34, higher on 5
// (by 4-24 MiB), no first pass changed; three times the later passes'
// maps, a quarter of a first pass's driver calls.
//
// Nothing changes while a program holds memory: of the 47 real programs
// only two free everything in the middle of a run (a sweep of models, a
// layer-offloading server), and their first passes hold what they held.
// Not under Config.Compact or while the default is tight (pressure.go),
// whose placement ignores what is mapped, nor under Config.ChunkHandles.
// The churn guard's slack takes no new memory while rested spans are held
// (churn.go): they are the last run's memory, waiting where the next one
// will want it; beside them the slack's new memory made a program that
// frees at random hold 412 MiB more (bench/synth's randx1).
//
// Invariants (checked by checkPool, with vm.go's): span.rested ⇒
// span.occupied == 0 and span.access; a rested span's chunks are not
// ready; pool.rested == the number of rested spans.

// rest marks every empty span of the pool with access rested: called when
// the pool holds no live block (pool.afterFree).
func (p *pool) rest() {
	for i := p.empty.head; i >= 0; i = p.spans[i].next {
		s := &p.spans[i]
		if !s.access || s.rested {
			continue
		}
		s.rested = true
		p.rested++
		for j := s.c0; j < s.c0+s.n; j++ {
			s.seg.chunks[j].ready = false
		}
		s.seg.ready.set(int(s.c0), int(s.c0+s.n), false) // (which voids no ready cache: see block.nzFrom)
	}
	p.nRests++
}

// wake makes rested span i's chunks ready again: its mapping has access,
// so no driver call (back, for the block placed over it).
func (p *pool) wake(i int32) {
	p.unrest(i)
	p.nWoken++
	p.markReady(i)
}

// unrest clears span i's rested mark, if set: it is woken, moved or
// unmapped.
func (p *pool) unrest(i int32) {
	if s := &p.spans[i]; s.rested {
		s.rested = false
		p.rested--
	}
}

// mayRest reports whether the pool rests when its last live block is
// freed: the default placement, not tight.
func (a *Allocator) mayRest() bool {
	return a.mode == ModeVirtual && !a.compact && !a.chunkHandles && !a.tight()
}
