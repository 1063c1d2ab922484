// Package front models the C library's front cache (clib/front.c, whose
// overview has the rules) in Go, for replays (gpumem replay --front) and
// for fitting (gpumem fit --policy gpumem-front): what a PyTorch program
// under gpumem.torch.use() gets, where every request passes it. Its rules
// and bounds are the library's; python/tests/test_front.py's
// test_replay_front_models_the_library checks that a replay with it and
// the library itself hold the same on single-stream traces.
//
// What the library does at its other entry points, the caller does where
// the program did them: Drain before the figures are read, Trim for a
// trim (empty_cache).
package front

import (
	"errors"

	"github.com/gpumem/gpumem"
	"github.com/gpumem/gpumem/device"
)

// Cache is the front of one allocator (one device). Not safe for
// concurrent use.
type Cache struct {
	a      *gpumem.Allocator
	slots  []frontBuf // parked, oldest first
	bytes  uint64     // their blocks
	parked gpumem.Parked
	live   map[device.Ptr]frontBuf // buffers the front may park when freed
	g      gpumem.Gauges           // Go's gauges at the last miss, less the front's frees since
	known  bool                    // g holds, and the allocator has one pool (the library's lone)

	reused, reusedBytes, reusedReq uint64 // since the last drain
	reusedOn                       device.Stream
}

type frontBuf struct {
	buf        gpumem.Buffer
	req, block uint64
	s          device.Stream
}

// The library's bounds (front.c: FRONT_SLOTS, FRONT_BYTES,
// FRONT_MAX_REQUEST).
const (
	frontSlots      = 64
	frontBytes      = 4 << 20
	frontMaxRequest = 1 << 20
)

// New returns an empty front over a.
func New(a *gpumem.Allocator) *Cache {
	return &Cache{a: a, live: map[device.Ptr]frontBuf{}}
}

// Alloc serves a request, from what is parked or from the allocator.
func (f *Cache) Alloc(size uint64, s device.Stream) (gpumem.Buffer, error) {
	if size <= frontMaxRequest && f.known {
		for i := len(f.slots) - 1; i >= 0; i-- {
			e := f.slots[i]
			if e.req != size || e.s != s {
				continue
			}
			if !f.underPeaks(e) {
				break // a request for Go
			}
			f.unpark(i)
			f.live[e.buf.Ptr()] = e
			f.reused++
			f.reusedBytes += e.block
			f.reusedReq += e.req
			f.reusedOn = s
			return e.buf, nil
		}
	}
	b, g, err := f.a.AllocParked(size, s, f.parked)
	if errors.Is(err, gpumem.ErrParked) {
		if err := f.Drain(); err != nil {
			return gpumem.Buffer{}, err
		}
		b, g, err = f.a.AllocParked(size, s, gpumem.Parked{})
	}
	if err != nil {
		return gpumem.Buffer{}, err
	}
	f.g, f.known = g, f.a.Lone() && !f.a.Limited() // the host's parkable
	if f.known && size <= frontMaxRequest {
		f.live[b.Ptr()] = frontBuf{buf: b, req: size, block: b.Block(), s: s}
	}
	return b, nil
}

// underPeaks is front.c's under_peaks: handing out e keeps the program
// within Go's peaks.
func (f *Cache) underPeaks(e frontBuf) bool {
	return f.g.Active-(f.parked.Active-e.block) <= f.g.PeakActive &&
		f.g.Allocated-(f.parked.Allocated-e.req) <= f.g.PeakAllocated
}

// Free takes back a buffer Alloc handed out: parked, or freed in the
// allocator.
func (f *Cache) Free(b gpumem.Buffer) error {
	e, ok := f.live[b.Ptr()]
	if !ok || !f.known {
		delete(f.live, b.Ptr())
		return f.freeInGo(b)
	}
	delete(f.live, b.Ptr())
	for len(f.slots) == frontSlots || (len(f.slots) > 0 && f.bytes+e.block > frontBytes) {
		old := f.unpark(0)
		f.gone(old)
		if err := f.a.Free(old.buf); err != nil {
			return err
		}
	}
	f.slots = append(f.slots, e)
	f.bytes += e.block
	f.parked.Active += e.block
	f.parked.Allocated += e.req
	return nil
}

func (f *Cache) freeInGo(b gpumem.Buffer) error {
	block, req := b.Block(), b.Size()
	if err := f.a.Free(b); err != nil {
		return err
	}
	if f.known {
		f.g.Active -= block
		f.g.Allocated -= req
	}
	return nil
}

func (f *Cache) unpark(i int) frontBuf {
	e := f.slots[i]
	f.slots = append(f.slots[:i], f.slots[i+1:]...)
	f.bytes -= e.block
	f.parked.Active -= e.block
	f.parked.Allocated -= e.req
	return e
}

func (f *Cache) gone(e frontBuf) {
	f.g.Active -= e.block
	f.g.Allocated -= e.req
}

// Drain frees what is parked, oldest first, and counts the reuses, as
// gpumemGo_front_drain.
func (f *Cache) Drain() error {
	for len(f.slots) > 0 {
		e := f.unpark(0)
		f.gone(e)
		if err := f.a.Free(e.buf); err != nil {
			return err
		}
	}
	f.a.Reused(f.reusedOn, f.reused, f.reusedBytes, f.reusedReq)
	f.reused, f.reusedBytes, f.reusedReq = 0, 0, 0
	return nil
}

// Trim is an empty_cache: the library drains first (a trim changes none
// of the gauges the front follows).
func (f *Cache) Trim() error {
	if err := f.Drain(); err != nil {
		return err
	}
	return f.a.Trim()
}
