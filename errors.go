package gpumem

// See doc.go for the overview.

import (
	"errors"
	"fmt"
)

// Sentinel errors; match with errors.Is.
var (
	// ErrOutOfMemory: a request could not be satisfied. The error is an
	// *OutOfMemoryError with the numbers and the cause.
	ErrOutOfMemory = errors.New("gpumem: out of memory")
	// ErrDoubleFree: a buffer was freed twice (or used after its free).
	ErrDoubleFree = errors.New("gpumem: double free")
	// ErrForeign: a buffer that this allocator never gave out.
	ErrForeign = errors.New("gpumem: foreign buffer")
	// ErrInvalidSize: a size of 0 or an absurd size.
	ErrInvalidSize = errors.New("gpumem: invalid size")
	// ErrClosed: the allocator or scope is closed.
	ErrClosed = errors.New("gpumem: closed")
	// ErrLeak: Close found buffers still owned; the error is a *LeakError.
	ErrLeak = errors.New("gpumem: leaked buffers")
)

// Cause says why a request ran out of memory.
type Cause int

const (
	// CauseDevice: the device refused to give more memory, and what the
	// allocator caches would not have covered the request.
	CauseDevice Cause = iota + 1
	// CauseLimit: the allocator's Limit does not allow it even with perfect
	// packing: allocated + requested > limit.
	CauseLimit
	// CauseFragmentation: the allocator held enough free memory in total
	// (within its limit, or in its cache), but not in one usable piece.
	CauseFragmentation
	// CauseQuota: a scope's quota does not allow it.
	CauseQuota
)

func (c Cause) String() string {
	switch c {
	case CauseDevice:
		return "device exhausted"
	case CauseLimit:
		return "allocator limit"
	case CauseFragmentation:
		return "fragmentation"
	case CauseQuota:
		return "scope quota"
	}
	return fmt.Sprintf("Cause(%d)", int(c))
}

// OutOfMemoryError carries the numbers of a failed request. It matches
// ErrOutOfMemory with errors.Is.
type OutOfMemoryError struct {
	Requested   uint64 // bytes asked for
	Stream      uint64
	Limit       uint64 // the allocator's limit (or the scope's quota for CauseQuota)
	DeviceFree  uint64 // the device's free memory at the failure
	Reserved    uint64 // bytes the allocator held from the device
	Allocated   uint64 // bytes held by live buffers (of the scope, for CauseQuota)
	Cached      uint64 // Reserved - Active: held but unused
	LargestFree uint64 // largest request that would have fit without growing
	// WouldFit is the largest request that would have succeeded at the
	// failure: a free block as large (LargestFree), or room to grow within
	// both the limit and the device's free memory.
	WouldFit uint64
	Scope    string // for CauseQuota: the scope whose quota was hit
	Cause    Cause
	Err      error // the device error, if any
}

func (e *OutOfMemoryError) Error() string {
	if e.Cause == CauseQuota {
		return fmt.Sprintf("gpumem: out of memory (scope quota): scope %s holds %s of its quota of %s; requested %s",
			e.Scope, fmtBytes(e.Allocated), fmtBytes(e.Limit), fmtBytes(e.Requested))
	}
	s := fmt.Sprintf("gpumem: out of memory (%s): requested %s on stream %d; limit %s, device free %s, reserved %s, allocated %s, cached %s, largest free block %s; the largest request that would have fit: %s",
		e.Cause, fmtBytes(e.Requested), e.Stream, fmtBytes(e.Limit), fmtBytes(e.DeviceFree), fmtBytes(e.Reserved),
		fmtBytes(e.Allocated), fmtBytes(e.Cached), fmtBytes(e.LargestFree), fmtBytes(e.WouldFit))
	if e.Scope != "" {
		s += ", scope " + e.Scope
	}
	if e.Err != nil {
		s += ": " + e.Err.Error()
	}
	return s
}

func (e *OutOfMemoryError) Is(target error) bool { return target == ErrOutOfMemory }
func (e *OutOfMemoryError) Unwrap() error        { return e.Err }

// BufferError reports a misuse of a buffer: a double free, a foreign or
// stale buffer. It matches ErrDoubleFree or ErrForeign.
type BufferError struct {
	Op   string // "Free", "RecordStream"
	Ptr  uint64
	Size uint64
	Err  error // ErrDoubleFree or ErrForeign
	Why  string
}

func (e *BufferError) Error() string {
	return fmt.Sprintf("gpumem: %s of buffer 0x%x (%d bytes): %v: %s", e.Op, e.Ptr, e.Size, e.Err, e.Why)
}

func (e *BufferError) Unwrap() error { return e.Err }

// fmtBytes writes a byte count readably: "1.50 GiB (1610612736)".
func fmtBytes(n uint64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%d B", n)
	}
	f, u := float64(n), 0
	for f >= unit && u < 5 {
		f /= unit
		u++
	}
	return fmt.Sprintf("%.2f %ciB (%d)", f, "KMGTP"[u-1], n)
}
