package policy

import (
	"errors"
	"fmt"
	"io"

	"github.com/gpumem/gpumem/trace"
)

// Result is one trace replayed under one policy. JSON keys are part of the
// CLI's contract (gpumem replay --policy --json).
type Result struct {
	Policy   string `json:"policy"`
	Trace    string `json:"trace"`
	Capacity uint64 `json:"capacity"`
	Events   int    `json:"events"`
	// PeakLiveBytes is the trace's: the largest sum of requested bytes
	// alive at once, the floor for any allocator.
	PeakLiveBytes     uint64  `json:"peak_live_bytes"`
	PeakReservedBytes uint64  `json:"peak_reserved_bytes"`
	Ratio             float64 `json:"ratio"` // PeakReservedBytes / PeakLiveBytes
	// OOMs counts the requests the allocator refused; each is skipped and
	// its free ignored.
	OOMs             int    `json:"ooms"`
	EndReservedBytes uint64 `json:"end_reserved_bytes"`
	// PeakEvent is the index in the trace of the first event after which
	// the allocator held PeakReservedBytes; -1 if it held that before the
	// first event (a preallocating policy, or an empty trace).
	PeakEvent int `json:"peak_event"`
	// Passes is the address repetition over several passes (Repeat), when
	// they were asked for (gpumem replay --policy NAME --passes N).
	Passes *Repetition `json:"passes,omitempty"`
}

// Options tune a replay.
type Options struct {
	// Observe, if set, is called after every event with its index in the
	// trace and the allocator, which it may read (Reserved, Segments) but
	// not change: a timeline is made of these.
	Observe func(i int, a Allocator)
}

// Replay replays tr on a, in the trace's order and on its streams, and
// reports what a held. A request a refuses with ErrOutOfMemory is counted
// and skipped, and its free ignored, as package replay does; any other
// error stops the replay. Requests the trace never frees stay allocated
// in a. The peak of Reserved is read after every allocation: no policy
// takes memory from the device on a free.
func Replay(tr *trace.Trace, a Allocator, opt Options) (Result, error) {
	return replayTo(tr, a, len(tr.Events)-1, opt)
}

// replayTo replays the events of tr up to and including index last.
func replayTo(tr *trace.Trace, a Allocator, last int, opt Options) (Result, error) {
	r := Result{Trace: tr.Name, Events: len(tr.Events), PeakLiveBytes: tr.PeakLiveBytes, PeakEvent: -1}
	r.PeakReservedBytes = a.Reserved()   // what a preallocating policy took at start
	addrs := make([]uint64, tr.Requests) // 0: not allocated (refused, or freed)
	trims := 0
	for i := 0; i <= last; i++ {
		EmptyCaches(tr, a, i, &trims)
		ev := &tr.Events[i]
		slot := tr.Slot[i]
		if ev.Kind == trace.Alloc {
			addr, err := a.Alloc(ev.Size, ev.Stream)
			switch {
			case errors.Is(err, ErrOutOfMemory):
				r.OOMs++
			case err != nil:
				return r, fmt.Errorf("replay %s: event %d (a %d %d): %w", tr.Name, i, ev.ID, ev.Size, err)
			case addr == 0:
				return r, fmt.Errorf("replay %s: event %d (a %d %d): the allocator returned address 0", tr.Name, i, ev.ID, ev.Size)
			default:
				addrs[slot] = addr
				if res := a.Reserved(); res > r.PeakReservedBytes {
					r.PeakReservedBytes, r.PeakEvent = res, i
				}
			}
		} else if addr := addrs[slot]; addr != 0 {
			if err := a.Free(addr); err != nil {
				return r, fmt.Errorf("replay %s: event %d (f %d): %w", tr.Name, i, ev.ID, err)
			}
			addrs[slot] = 0
		}
		if opt.Observe != nil {
			opt.Observe(i, a)
		}
	}
	if last == len(tr.Events)-1 {
		EmptyCaches(tr, a, len(tr.Events), &trims)
	}
	r.EndReservedBytes = a.Reserved()
	if r.PeakLiveBytes > 0 {
		r.Ratio = float64(r.PeakReservedBytes) / float64(r.PeakLiveBytes)
	}
	return r, nil
}

// Run replays tr under the named policy on a new device of capacity bytes
// and reports what it held; with check set, Check runs on the allocator
// at the end and a violation is an error.
func Run(tr *trace.Trace, name string, capacity uint64, check bool, opt Options) (Result, error) {
	a, err := New(name, capacity)
	if err != nil {
		return Result{}, err
	}
	defer closeAllocator(a)
	r, err := Replay(tr, a, opt)
	r.Policy, r.Capacity = name, capacity
	if err == nil && check {
		if cerr := Check(a); cerr != nil {
			err = fmt.Errorf("replay %s under %s: %w", tr.Name, name, cerr)
		}
	}
	return r, err
}

// AtPeak replays tr under the named policy and returns the segment map at
// the moment of peak reserved: the replay runs twice, the second time on a
// new allocator stopping after Result.PeakEvent, which is exact since every
// policy decides deterministically. Keeping a copy of the map at every new
// peak instead would cost a copy per growth, thousands on a long trace.
func AtPeak(tr *trace.Trace, name string, capacity uint64) (Result, []Segment, error) {
	r, err := Run(tr, name, capacity, false, Options{})
	if err != nil {
		return r, nil, err
	}
	a, err := New(name, capacity)
	if err != nil {
		return r, nil, err
	}
	defer closeAllocator(a)
	again, err := replayTo(tr, a, r.PeakEvent, Options{}) // none when PeakEvent is -1
	if err != nil {
		return r, nil, err
	}
	if got := a.Reserved(); got != r.PeakReservedBytes || again.OOMs > r.OOMs {
		return r, nil, fmt.Errorf("replay %s under %s: the second pass holds %d bytes at event %d, the first held %d: the policy is not deterministic",
			tr.Name, name, got, r.PeakEvent, r.PeakReservedBytes)
	}
	return r, a.Segments(), nil
}

func closeAllocator(a Allocator) {
	if c, ok := a.(io.Closer); ok {
		_ = c.Close()
	}
}
