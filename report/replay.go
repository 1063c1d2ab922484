package report

// See doc.go for the overview.

import (
	"errors"
	"fmt"
	"io"
	"math"

	"github.com/gpumem/gpumem/policy"
	"github.com/gpumem/gpumem/trace"
)

// replayPolicy replays tr under p twice: once through the whole trace for
// the series, the peak and the free samples, then up to the peak for the
// map. Its fragmentation counts the bytes it served (the trace's live
// bytes less its OOMs).
func replayPolicy(tr *trace.Trace, c Clock, p Policy, opt Options) (PolicyData, error) {
	pd := PolicyData{Name: p.Name}
	a, err := p.New()
	if err != nil {
		return pd, err
	}
	defer closeAllocator(a)
	r := newReplayer(tr, a)
	// A policy that preallocates holds memory before the first event.
	res0 := a.Reserved()
	reserved := newSeriesBuilder(c, res0)
	frag := newRatioBuilder(c, fragmentation(0, res0))
	// Free samples are read at the end of every stride-th bucket.
	stride := (c.N + opt.Samples - 1) / opt.Samples
	cur := 0
	for i, e := range tr.Events {
		if b := c.bucket(e.TimeUS); b != cur {
			r.sample(&pd, c, cur, b, stride)
			cur = b
		}
		if err := r.step(i); err != nil {
			return pd, err
		}
		res := a.Reserved()
		reserved.set(e.TimeUS, res)
		frag.set(e.TimeUS, fragmentation(r.live, res))
		if res > pd.PeakReserved.Bytes || res == pd.PeakReserved.Bytes && r.live > pd.LiveAtPeak {
			pd.PeakReserved, pd.LiveAtPeak = Peak{Bytes: res, Event: i, TimeUS: e.TimeUS}, r.live
		}
	}
	r.sample(&pd, c, cur, c.N, stride)
	pd.Reserved, pd.Frag, pd.OOMs = reserved.done(), frag.done(), r.ooms

	// The second replay stops at the peak and reads the map.
	a, err = p.New()
	if err != nil {
		return pd, err
	}
	defer closeAllocator(a)
	r = newReplayer(tr, a)
	for i := 0; i <= pd.PeakReserved.Event; i++ {
		if err := r.step(i); err != nil {
			return pd, fmt.Errorf("second replay: %w", err)
		}
	}
	if got := a.Reserved(); got != pd.PeakReserved.Bytes || r.live != pd.LiveAtPeak {
		return pd, fmt.Errorf("%w: after event %d it reserved %d bytes and served %d in one replay, %d and %d in another",
			errNondeterministic, pd.PeakReserved.Event, pd.PeakReserved.Bytes, pd.LiveAtPeak, got, r.live)
	}
	pd.Map, err = newMap(a.Segments(), a.Reserved())
	if err != nil {
		return pd, fmt.Errorf("at its peak (event %d): %w", pd.PeakReserved.Event, err)
	}
	return pd, nil
}

// fragmentation is 1 - live/reserved, NaN when nothing is reserved.
func fragmentation(live, reserved uint64) float64 {
	if reserved == 0 {
		return math.NaN()
	}
	return 1 - float64(live)/float64(reserved)
}

// closeAllocator closes a if it holds something (policy "gpumem" holds a
// simulated device). Its error is dropped: the trace's requests still live
// at its end are live in the allocator, which some report as a leak, and
// the report is made by then.
func closeAllocator(a policy.Allocator) {
	if c, ok := a.(io.Closer); ok {
		_ = c.Close()
	}
}

// replayer drives one allocator through a trace.
type replayer struct {
	tr     *trace.Trace
	a      policy.Allocator
	addr   []uint64 // by request slot
	size   []uint64 // by request slot
	failed []bool   // by request slot: the allocation ran out of memory
	live   uint64   // bytes of the requests the allocator serves now
	ooms   int
	trims  int // tr.Trims done (the program's empty_cache calls)
}

func newReplayer(tr *trace.Trace, a policy.Allocator) *replayer {
	return &replayer{tr: tr, a: a, addr: make([]uint64, tr.Requests), size: make([]uint64, tr.Requests), failed: make([]bool, tr.Requests)}
}

// step replays event i.
func (r *replayer) step(i int) error {
	policy.EmptyCaches(r.tr, r.a, i, &r.trims)
	e, slot := r.tr.Events[i], r.tr.Slot[i]
	if e.Kind == trace.Alloc {
		addr, err := r.a.Alloc(e.Size, e.Stream)
		if errors.Is(err, policy.ErrOutOfMemory) {
			r.failed[slot] = true
			r.ooms++
			return nil
		}
		if err != nil {
			return fmt.Errorf("event %d (%v): %w", i, e, err)
		}
		r.addr[slot], r.size[slot] = addr, e.Size
		r.live += e.Size
		return nil
	}
	if r.failed[slot] {
		return nil
	}
	if err := r.a.Free(r.addr[slot]); err != nil {
		return fmt.Errorf("event %d (%v): %w", i, e, err)
	}
	r.live -= r.size[slot]
	return nil
}

// sample reads the free blocks at the end of bucket from, if a sample is
// due there or at a bucket before to (where nothing changed since).
func (r *replayer) sample(pd *PolicyData, c Clock, from, to, stride int) {
	var fs *FreeSample
	for b := from; b < to; b++ {
		if b%stride != stride-1 && b != c.N-1 {
			continue
		}
		if fs == nil {
			bytes, largest := freeBlocks(r.a.Segments())
			fs = &FreeSample{Bytes: bytes, Largest: largest}
		}
		s := *fs
		s.TimeUS = uint64(math.Round(c.start(b + 1)))
		pd.Free = append(pd.Free, s)
	}
}

// freeBlocks returns the bytes of the free blocks in segs and the size of
// the largest.
func freeBlocks(segs []policy.Segment) (bytes, largest uint64) {
	for _, s := range segs {
		for _, b := range s.Blocks {
			if !b.Live {
				bytes += b.Size
				largest = max(largest, b.Size)
			}
		}
	}
	return bytes, largest
}
