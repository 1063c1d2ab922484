package gpumem

// See doc.go for the overview.

import "github.com/gpumem/gpumem/device"

// oomError builds the error of a request that still had no memory after the
// reclaim and retry, and decides its cause from the numbers. Called with no
// pool locked.
func (a *Allocator) oomError(size uint64, s device.Stream, sh *shortage) *OutOfMemoryError {
	st := a.Stats()
	free, _, err := a.dev.MemInfo()
	if err != nil {
		free = 0
	}
	e := &OutOfMemoryError{Requested: size, Stream: uint64(s), Limit: a.limit.Load(), DeviceFree: free,
		Reserved: st.Reserved, Allocated: st.Allocated, Cached: st.Cached, LargestFree: st.LargestFree, Err: sh.err}
	e.WouldFit = st.LargestFree
	if e.Limit > st.Reserved {
		e.WouldFit = max(e.WouldFit, min(e.Limit-st.Reserved, free)&^(a.gran-1))
	}
	// Fragmentation means the allocator held enough but could not use it.
	// With the limit: perfect packing would have fitted (after the reclaim,
	// what is still cached is stuck in partly used memory). With the device:
	// the cache alone would have covered the request.
	switch {
	case sh.cause == CauseLimit && st.Allocated+size > e.Limit:
		e.Cause = CauseLimit
	case sh.cause == CauseLimit:
		e.Cause = CauseFragmentation
	case st.Cached >= size:
		e.Cause = CauseFragmentation
	default:
		e.Cause = CauseDevice
	}
	return e
}
