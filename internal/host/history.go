package host

import (
	"fmt"
	"sort"
	"sync"
	"time"

	"github.com/gpumem/gpumem"
)

// Memory history in PyTorch's snapshot format, for
// torch.cuda.memory._record_memory_history, _snapshot and _dump_snapshot
// under gpumem (python/gpumem/_torch_history.py), which PyTorch's own
// torch.cuda._memory_viz renders and `gpumem import` reads back.
//
// While a device's history is on (RecordHistory), every allocation and
// free is kept in a ring of the latest max entries, with its call site (the
// id the host program gave, 0 if none; the Python side turns ids into
// PyTorch's frames). TorchSnapshot returns the segments and blocks of the
// device's allocator and private pools in PyTorch's layout, and the ring
// as device_traces.
//
// The layout, as PyTorch's allocator writes it: a plain segment is one
// segment; a virtual arena is one segment per run of mapped spans (what
// physical memory backs: PyTorch's expandable segments also show their
// mapped size), with the blocks inside it, a free block cut to the run.
// Block states: active_allocated, active_pending_free (waiting for
// another stream's events), inactive. Trace actions: alloc,
// free_requested and free_completed (gpumem frees at once, so both come
// together; a pending free's completion is not traced), oom. Segment map
// and unmap events are not traced.

type history struct {
	mu   sync.Mutex
	ring []TorchTraceEntry // len(ring) <= max; next overwrites the oldest once full
	max  int
	next int
}

// TorchTraceEntry is one entry of a device trace, in PyTorch's keys (Site
// is gpumem's: the Python side replaces it with frames).
type TorchTraceEntry struct {
	Action string `json:"action"`
	Addr   uint64 `json:"addr"`
	Size   uint64 `json:"size"`
	Stream uint64 `json:"stream"`
	TimeUS int64  `json:"time_us"`
	Site   uint32 `json:"site"`
	// FreeSite is, for a free's entries, the call site of the free
	// itself when the caller gave one (Host.FreeSite), else 0.
	FreeSite uint32 `json:"free_site,omitempty"`
}

// TorchBlock is a block of a TorchSegment.
type TorchBlock struct {
	Address   uint64 `json:"address"`
	Size      uint64 `json:"size"`
	Requested uint64 `json:"requested_size"`
	State     string `json:"state"`
	Site      uint32 `json:"site"`
}

// TorchSegment is a segment in PyTorch's snapshot layout.
type TorchSegment struct {
	Device     int          `json:"device"`
	Address    uint64       `json:"address"`
	TotalSize  uint64       `json:"total_size"`
	Allocated  uint64       `json:"allocated_size"`
	Active     uint64       `json:"active_size"`
	Requested  uint64       `json:"requested_size"`
	Stream     uint64       `json:"stream"`
	Type       string       `json:"segment_type"`
	PoolID     [2]uint64    `json:"segment_pool_id"`
	Expandable bool         `json:"is_expandable"`
	Blocks     []TorchBlock `json:"blocks"`
}

// TorchSnapshot is what torch.cuda.memory._snapshot returns, for one device.
type TorchSnapshot struct {
	Segments     []TorchSegment      `json:"segments"`
	DeviceTraces [][]TorchTraceEntry `json:"device_traces"`
}

// RecordHistory turns device ordinal's history on, keeping the latest
// maxEntries allocations and frees (a new call starts it over), or off
// (on false), dropping what it kept.
func (h *Host) RecordHistory(ordinal int, on bool, maxEntries int) error {
	d, err := h.Device(ordinal)
	if err != nil {
		return err
	}
	if !on {
		d.hist.Store(nil)
		return nil
	}
	if maxEntries <= 0 {
		return fmt.Errorf("%w: history of %d entries: want at least 1", ErrConfig, maxEntries)
	}
	d.hist.Store(&history{max: maxEntries})
	return nil
}

func (hs *history) add(action string, addr, size, stream uint64, site uint32) {
	hs.addFree(action, addr, size, stream, site, 0)
}

// addFree is add with the call site of a free (TorchTraceEntry.FreeSite).
func (hs *history) addFree(action string, addr, size, stream uint64, site, freeSite uint32) {
	hs.mu.Lock()
	defer hs.mu.Unlock()
	e := TorchTraceEntry{Action: action, Addr: addr, Size: size, Stream: stream, Site: site, FreeSite: freeSite,
		TimeUS: time.Now().UnixMicro()} // PyTorch's time_us: microseconds since the epoch
	if len(hs.ring) < hs.max {
		hs.ring = append(hs.ring, e)
		return
	}
	hs.ring[hs.next] = e
	hs.next = (hs.next + 1) % hs.max
}

// entries returns the ring oldest first.
func (hs *history) entries() []TorchTraceEntry {
	hs.mu.Lock()
	defer hs.mu.Unlock()
	out := make([]TorchTraceEntry, 0, len(hs.ring))
	out = append(out, hs.ring[hs.next:]...)
	return append(out, hs.ring[:hs.next]...)
}

// TorchSnapshot returns device ordinal's memory in PyTorch's snapshot
// layout (empty for a device not in use): the device's allocator and its
// private pools, and the history if it is on.
func (h *Host) TorchSnapshot(ordinal int) TorchSnapshot {
	out := TorchSnapshot{Segments: []TorchSegment{}, DeviceTraces: [][]TorchTraceEntry{{}}}
	d := h.existing(ordinal)
	if d == nil {
		return out
	}
	sites := d.tab.sites()
	out.Segments = torchSegments(d.Alloc.Snapshot(), ordinal, [2]uint64{}, sites)
	d.pools.mu.Lock()
	for id, p := range d.pools.byID {
		out.Segments = append(out.Segments, torchSegments(p.alloc.Snapshot(), ordinal, [2]uint64{id.Hi, id.Lo}, sites)...)
	}
	d.pools.mu.Unlock()
	if out.Segments == nil {
		out.Segments = []TorchSegment{} // JSON [] rather than null
	}
	sort.Slice(out.Segments, func(i, j int) bool { return out.Segments[i].Address < out.Segments[j].Address })
	if hs := d.hist.Load(); hs != nil {
		out.DeviceTraces[0] = hs.entries()
	}
	return out
}

// torchSegments lays out one allocator's snapshot as PyTorch's segments.
func torchSegments(s gpumem.Snapshot, ordinal int, pool [2]uint64, sites map[uint64]uint32) []TorchSegment {
	var out []TorchSegment
	for _, seg := range s.Segments {
		typ := seg.Pool
		if seg.Kind == "plain" {
			out = append(out, torchSegment(seg, seg.Address, seg.Size, typ, ordinal, pool, false, sites))
			continue
		}
		// A run of adjacent spans is one segment.
		for i := 0; i < len(seg.Spans); {
			start, end := seg.Spans[i].Address, seg.Spans[i].Address+seg.Spans[i].Size
			for i++; i < len(seg.Spans) && seg.Spans[i].Address == end; i++ {
				end += seg.Spans[i].Size
			}
			out = append(out, torchSegment(seg, start, end-start, typ, ordinal, pool, true, sites))
		}
	}
	return out
}

func torchSegment(seg gpumem.SegmentSnapshot, start, size uint64, typ string, ordinal int, pool [2]uint64, expandable bool, sites map[uint64]uint32) TorchSegment {
	ts := TorchSegment{Device: ordinal, Address: start, TotalSize: size, Stream: seg.Stream, Type: typ,
		PoolID: pool, Expandable: expandable, Blocks: []TorchBlock{}}
	end := start + size
	// The blocks tile the segment in address order: those over [start,
	// end) are a run, found by a search (a segment may have thousands of
	// blocks and hundreds of runs of spans).
	bs := seg.Blocks
	first := sort.Search(len(bs), func(i int) bool { return bs[i].Address+bs[i].Size > start })
	for _, b := range bs[first:] {
		if b.Address >= end {
			break
		}
		lo, hi := max(b.Address, start), min(b.Address+b.Size, end)
		tb := TorchBlock{Address: lo, Size: hi - lo, State: "inactive"}
		switch b.State {
		case "allocated":
			tb.State, tb.Requested, tb.Site = "active_allocated", b.Requested, sites[b.Address]
			ts.Allocated += tb.Size
			ts.Active += tb.Size
			ts.Requested += b.Requested
		case "pending":
			tb.State = "active_pending_free"
			ts.Active += tb.Size
		}
		ts.Blocks = append(ts.Blocks, tb)
	}
	return ts
}
