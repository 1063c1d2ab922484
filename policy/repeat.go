package policy

import (
	"errors"
	"fmt"

	"github.com/gpumem/gpumem/trace"
)

// Address repetition: how often a program that repeats itself gets the
// same addresses again. XLA records its command buffers (CUDA graphs) with
// the addresses of their buffers and traces a command again (a stream
// capture) when a step's addresses are not among the few it traced it with
// (docs/EXPERIMENTS.md, "JAX step time under gpumem run"); an allocator
// that hands a repeated step its earlier addresses spares those captures.
// Fit says nothing about this: two allocators of the same peak may differ
// completely in it.
//
// The measure: replay the trace several times on one allocator (what the
// trace never frees stays live from the pass that allocated it and is not
// allocated again, as in replay --passes) and, for every request of pass
// k+1, compare its address with the one the same request got in pass k.

// Repetition is the address repetition of a trace replayed in several
// passes on one allocator. JSON keys are part of the CLI's contract
// (gpumem replay --policy NAME --passes N --json).
type Repetition struct {
	Passes int `json:"n"`
	// Compared counts the requests of passes 2..n that were served in
	// their pass and in the one before; Same those of them that got the
	// address they had in the pass before.
	Compared uint64 `json:"compared"`
	Same     uint64 `json:"same"`
	// SameFraction is Same / Compared (0 when nothing was compared): 1.0
	// is a program whose every pass after the first reuses the addresses
	// of the pass before.
	SameFraction float64 `json:"same_address"`
	// PeakReservedBytes is the peak over every pass, and Ratio it over the
	// peak live bytes over every pass (trace.Trace's PeakLivePasses).
	PeakReservedBytes uint64  `json:"peak_reserved_bytes"`
	Ratio             float64 `json:"ratio"`
	// OOMsLater counts the requests of passes 2..n the allocator refused
	// (as package replay's passes.ooms_later): a layout that drifts can
	// refuse in a later pass what the first pass served.
	OOMsLater int `json:"ooms_later"`
	// oomsFirst counts the refused requests of pass 1 (Fits needs every
	// pass; the first pass's figures are Result's).
	oomsFirst int
}

// Repeat replays tr passes times (at least 2) under the named policy on a
// new device of capacity bytes, and reports its address repetition.
// Requests the allocator refuses are skipped (and not compared), as in
// Replay.
func Repeat(tr *trace.Trace, name string, capacity uint64, passes int) (Repetition, error) {
	if passes < 2 {
		return Repetition{}, fmt.Errorf("policy: address repetition needs at least 2 passes, not %d", passes)
	}
	a, err := New(name, capacity)
	if err != nil {
		return Repetition{}, err
	}
	defer closeAllocator(a)
	r, err := repeatOn(tr, a, passes)
	if err != nil {
		return r, fmt.Errorf("replay %s under %s: %w", tr.Name, name, err)
	}
	return r, nil
}

// repeatOn is Repeat on allocator a.
func repeatOn(tr *trace.Trace, a Allocator, passes int) (Repetition, error) {
	r := Repetition{Passes: passes, PeakReservedBytes: a.Reserved()}
	// prev and cur hold each request's address in the last pass and this
	// one (0: refused); live the addresses allocated and not yet freed.
	prev := make([]uint64, tr.Requests)
	cur := make([]uint64, tr.Requests)
	live := make([]uint64, tr.Requests)
	for n := 1; n <= passes; n++ {
		if n > 1 {
			synchronize(a)
		}
		trims := 0
		for i := range tr.Events {
			EmptyCaches(tr, a, i, &trims)
			ev := &tr.Events[i]
			slot := tr.Slot[i]
			if ev.Kind != trace.Alloc {
				if addr := live[slot]; addr != 0 {
					if err := a.Free(addr); err != nil {
						return r, fmt.Errorf("pass %d, event %d (f %d): %w", n, i, ev.ID, err)
					}
					live[slot] = 0
				}
				continue
			}
			if live[slot] != 0 {
				continue // never freed: live since an earlier pass (as replay --passes)
			}
			addr, err := a.Alloc(ev.Size, ev.Stream)
			switch {
			case errors.Is(err, ErrOutOfMemory):
				addr = 0
				if n > 1 {
					r.OOMsLater++
				} else {
					r.oomsFirst++
				}
			case err != nil:
				return r, fmt.Errorf("pass %d, event %d (a %d %d): %w", n, i, ev.ID, ev.Size, err)
			case addr == 0:
				return r, fmt.Errorf("pass %d, event %d (a %d %d): the allocator returned address 0", n, i, ev.ID, ev.Size)
			}
			live[slot], cur[slot] = addr, addr
			if addr != 0 {
				r.PeakReservedBytes = max(r.PeakReservedBytes, a.Reserved())
			}
			if n > 1 && addr != 0 && prev[slot] != 0 {
				r.Compared++
				if addr == prev[slot] {
					r.Same++
				}
			}
		}
		EmptyCaches(tr, a, len(tr.Events), &trims)
		prev, cur = cur, prev
	}
	if r.Compared > 0 {
		r.SameFraction = float64(r.Same) / float64(r.Compared)
	}
	if live := tr.PeakLivePasses(passes); live > 0 {
		r.Ratio = float64(r.PeakReservedBytes) / float64(live)
	}
	return r, nil
}
