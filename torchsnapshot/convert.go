package torchsnapshot

import (
	"fmt"
	"math"

	"github.com/gpumem/gpumem/trace"
)

// Summary says what WriteTrace wrote.
type Summary struct {
	Events        int    // alloc and free lines
	Requests      int    // alloc lines
	Sites         int    // sites defined
	PeakLiveBytes uint64 // the largest sum of the sizes of the requests live at once, as trace.Trace counts it

	// What the trace has that the history did not record (steps 3 to 6
	// of the package documentation), so that a caller can say so.
	AllocatedBefore int // requests freed in the history but allocated before it: allocated at time 0
	LiveThroughout  int // blocks allocated at the snapshot but never in the history: allocated at time 0, never freed
	ImpliedFrees    int // allocs at the address of a live request: that request freed at the same time
	ClampedTimes    int // entries recorded earlier than the entry before them: written at that entry's time
}

// WriteTrace writes the history of device dev to w as a trace, and says
// what it wrote; the caller flushes w. dev must be one of Devices. The
// package documentation says how entries become events.
func (s *Snapshot) WriteTrace(dev int, w *trace.Writer) (Summary, error) {
	if dev < 0 || dev >= len(s.devices) || len(s.devices[dev].entries) == 0 {
		return Summary{}, fmt.Errorf("torchsnapshot: device %d has no allocation history", dev)
	}
	h := &s.devices[dev]
	c := converter{w: w, ids: make(map[uint64]uint64)}

	// First pass: the frees whose request the history does not allocate,
	// and the addresses it does.
	live := make(map[uint64]bool)
	allocated := make(map[uint64]bool)
	var before []entry
	for _, e := range h.entries {
		switch {
		case !e.free:
			live[e.addr] = true
			allocated[e.addr] = true
		case live[e.addr]:
			live[e.addr] = false
		default:
			before = append(before, e)
		}
	}

	// The requests live from the start: those freed above, then the
	// blocks allocated at the snapshot that the history never allocated.
	var beforeIDs []uint64
	for _, e := range before {
		id, err := c.alloc(e.size, e.stream, 0, "")
		if err != nil {
			return c.sum, err
		}
		beforeIDs = append(beforeIDs, id)
		c.sum.AllocatedBefore++
	}
	for _, b := range h.blocks {
		if allocated[b.addr] {
			continue
		}
		allocated[b.addr] = true // a block listed twice counts once
		if _, err := c.alloc(b.size, b.stream, 0, b.site); err != nil {
			return c.sum, err
		}
		c.sum.LiveThroughout++
	}

	// Second pass: the history, making the same choices as the first.
	t0 := h.entries[0].timeUS
	for _, e := range h.entries {
		t := c.lastT
		if e.timeUS >= t0 && uint64(e.timeUS)-uint64(t0) >= t {
			t = uint64(e.timeUS) - uint64(t0)
		} else {
			c.sum.ClampedTimes++
		}
		id, ok := c.ids[e.addr]
		if e.free {
			if ok {
				delete(c.ids, e.addr)
			} else {
				id, beforeIDs = beforeIDs[0], beforeIDs[1:]
			}
			if err := c.free(id, t); err != nil {
				return c.sum, err
			}
			continue
		}
		if ok {
			if err := c.free(id, t); err != nil {
				return c.sum, err
			}
			c.sum.ImpliedFrees++
		}
		id, err := c.alloc(e.size, e.stream, t, e.site)
		if err != nil {
			return c.sum, err
		}
		c.ids[e.addr] = id
	}
	return c.sum, nil
}

// converter writes the events of one trace and counts them.
type converter struct {
	w     *trace.Writer
	sum   Summary
	ids   map[uint64]uint64 // address -> ID of the request live there
	sizes []uint64          // by ID
	sites map[string]uint32 // site text -> number
	live  uint64            // bytes
	lastT uint64
}

// alloc writes the next request, defining its site first if new, and
// returns its ID. The caller records where it lives.
func (c *converter) alloc(size, stream, t uint64, site string) (uint64, error) {
	if c.live > math.MaxUint64-size {
		return 0, fmt.Errorf("torchsnapshot: the live requests add up to more than 2^64 bytes")
	}
	var n uint32
	if site != "" {
		n = c.sites[site]
		if n == 0 {
			if c.sites == nil {
				c.sites = make(map[string]uint32)
			}
			n = uint32(len(c.sites) + 1)
			if err := c.w.Site(n, site); err != nil {
				return 0, err
			}
			c.sites[site] = n
			c.sum.Sites++
		}
	}
	id := uint64(len(c.sizes))
	if err := c.w.AllocSite(id, size, stream, t, n); err != nil {
		return 0, err
	}
	c.sizes = append(c.sizes, size)
	c.live += size
	c.sum.PeakLiveBytes = max(c.sum.PeakLiveBytes, c.live)
	c.sum.Requests++
	c.sum.Events++
	c.lastT = t
	return id, nil
}

// free writes the free of request id.
func (c *converter) free(id, t uint64) error {
	if err := c.w.Free(id, t); err != nil {
		return err
	}
	c.live -= c.sizes[id]
	c.sum.Events++
	c.lastT = t
	return nil
}
