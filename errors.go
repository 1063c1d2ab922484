package gpumem

// See doc.go for the overview.

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"strings"
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
	// ErrBroken: the allocator's books no longer match the device, so
	// nothing it says or gives back can be trusted: an invariant was
	// violated (Config.CheckInvariants), or a Defrag split failed and then
	// could not map the span's memory back (live buffers lost their
	// memory). Check and Close return it from then on; the process should
	// stop using the allocator.
	ErrBroken = errors.New("gpumem: allocator broken")
	// ErrOverLimit: SetLimit set a limit below what live buffers hold. The
	// limit is set all the same; nothing more is taken from the device
	// until enough is freed.
	ErrOverLimit = errors.New("gpumem: live buffers over the limit")
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

// Answer is the verdict on one "would it have fit?" question of an
// OutOfMemoryError. The zero value is AnswerUnknown: not decided (an error
// built by hand, or read from an older library).
type Answer int

const (
	AnswerUnknown Answer = iota
	AnswerNo
	AnswerYes
	// AnswerNotApplicable: the question does not apply (a scope's quota;
	// virtual-memory spans for an allocator that already uses them).
	AnswerNotApplicable
)

func (a Answer) String() string {
	switch a {
	case AnswerUnknown:
		return "unknown"
	case AnswerNo:
		return "no"
	case AnswerYes:
		return "yes"
	case AnswerNotApplicable:
		return "n/a"
	}
	return fmt.Sprintf("Answer(%d)", int(a))
}

// OutOfMemoryError is the verdict on a failed request: the cause, the
// numbers at the failure, and what would have fit. It matches
// ErrOutOfMemory with errors.Is. How each field is decided is written once,
// in oom.go. The numbers are read after the reclaim that precedes every
// failure (doc.go, the alloc path, step 6): what is still cached then is
// memory the allocator could not give back.
//
// Identities (exact when no other operation runs meanwhile):
//
//	Cached == Reserved - Active == Releasable + Pinned
//	PinnedInChunks <= Pinned
//	Others == Total - DeviceFree - Reserved - Family (0 if the device says less)
type OutOfMemoryError struct {
	Requested  uint64 // bytes asked for
	Stream     uint64
	Limit      uint64 // the allocator's limit (or the scope's quota for CauseQuota)
	DeviceFree uint64 // the device's free memory at the failure
	Total      uint64 // the device's capacity
	Others     uint64 // device memory held by others (other processes, other allocators): not gpumem's to give back
	Reserved   uint64 // bytes the allocator held from the device
	// Family is what the allocator's private pools (CUDA graphs'), or for
	// a private pool its root and the other pools, held: it counts against
	// the same limit (capture.go), and is not this allocator's to give back.
	Family      uint64
	Allocated   uint64 // bytes held by live buffers (of the scope, for CauseQuota)
	Active      uint64 // bytes of the blocks behind live buffers (requests rounded to 512 B)
	Cached      uint64 // Reserved - Active: held but unused
	LargestFree uint64 // largest request that would have fit without growing
	// Releasable is the part of Cached that Trim would still give back:
	// what the reclaim before the failure keeps (preallocated memory,
	// handles the driver refused to release).
	Releasable uint64
	// Pinned is the part of Cached that lies in segments (ModePlain) or
	// spans (ModeVirtual) that also hold live buffers: no trim gives it
	// back, and it is usable only by requests that fit in its pieces.
	Pinned uint64
	// PinnedInChunks (ModeVirtual) is the part of Pinned that is free
	// space inside chunks (the device's granule) that also hold live
	// buffers; the rest of Pinned is whole chunks idle in spans that hold
	// live buffers elsewhere.
	PinnedInChunks uint64
	// Growth is what the request would have taken from the device: the
	// smallest segment (ModePlain) or the chunks (ModeVirtual) for it.
	Growth uint64
	// FreeTotal is what the allocator could still use for new buffers, in
	// all its pieces: the cache plus the room to grow within the limit and
	// the device. FreeTotal/Requested is how many requests of the asked size
	// its bytes would hold if they were one piece.
	FreeTotal uint64
	// WouldFit is the largest request that would have succeeded at the
	// failure: a free block as large (LargestFree), or room to grow within
	// both the limit and the device's free memory.
	WouldFit uint64
	// AfterTrim: would the request have fit after Trim (gpumem_trim,
	// torch.cuda.empty_cache) gave Releasable back.
	AfterTrim Answer
	// WithVirtual: would ModeVirtual (virtual-memory spans, which map
	// physical memory wherever the address space has room and so do not
	// need one free piece) have placed the request: AnswerYes or AnswerNo
	// for an allocator in ModePlain; AnswerNotApplicable in ModeVirtual,
	// where Pinned and PinnedInChunks say what blocks it.
	WithVirtual Answer
	Mode        Mode   // the allocator's mode
	Scope       string // for CauseQuota: the scope whose quota was hit
	Cause       Cause
	Err         error // the device error, if any

	noVM     bool // the device has no virtual memory (WithVirtual is AnswerNo)
	suggestC bool // fragmentation in ModeVirtual without Config.Compact: say it exists
	suggestG bool // and idle memory in spans with live buffers, neither Config.Gather nor a gate: name them and the risk
	// gateRefused: why the gate (gate.go) refused to close, so that no
	// live chunk moved out of those spans; "" if it never did.
	gateRefused string
}

// Error is one paragraph: the cause with its numbers, then what would have
// fit (after a trim, with virtual-memory spans, a smaller request).
func (e *OutOfMemoryError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "gpumem: out of memory (%s): requested %s", e.Cause, fmtBytes(e.Requested))
	if e.Cause == CauseQuota {
		fmt.Fprintf(&b, ": scope %s holds %s of its quota of %s; the largest request that would have fit: %s",
			e.Scope, size(e.Allocated), size(e.Limit), sizeDown(e.WouldFit))
		return b.String()
	}
	fmt.Fprintf(&b, " on stream %d: ", e.Stream)
	switch e.Cause {
	case CauseLimit:
		fmt.Fprintf(&b, "live buffers hold %s of %s", size(e.Allocated), limitPhrase(e))
		if e.Family > 0 {
			fmt.Fprintf(&b, " and private pools (CUDA graphs) %s", size(e.Family))
		}
		b.WriteString(", so no packing could fit it")
	case CauseDevice:
		fmt.Fprintf(&b, "the device has %s free of %s; gpumem holds %s of it (live buffers %s, cached %s) and other users %s",
			size(e.DeviceFree), size(e.Total), size(e.Reserved), size(e.Allocated), size(e.Cached), size(e.Others))
	case CauseFragmentation:
		fmt.Fprintf(&b, "%s is free in all (%s), %s the request, but the largest free piece is %s",
			size(e.FreeTotal), freeParts(e), times(e.FreeTotal, e.Requested), size(e.LargestFree))
		if e.Reserved+e.Family+e.Growth > e.Limit {
			fmt.Fprintf(&b, ", and growing by %s beyond the %s reserved would pass %s", size(e.Growth), size(e.Reserved), limitPhrase(e))
		} else {
			fmt.Fprintf(&b, ", and the device refused %s more (%s free, other users hold %s)", size(e.Growth), size(e.DeviceFree), size(e.Others))
		}
	default:
		fmt.Fprintf(&b, "limit %s, device free %s, reserved %s, allocated %s, cached %s",
			size(e.Limit), size(e.DeviceFree), size(e.Reserved), size(e.Allocated), size(e.Cached))
	}
	fmt.Fprintf(&b, ". Would fit after a trim (Trim, gpumem_trim, torch.cuda.empty_cache): %s", e.AfterTrim)
	switch {
	case e.AfterTrim == AnswerYes:
		fmt.Fprintf(&b, ", it gives back %s (preallocated or unreleased memory)", size(e.Releasable))
	case e.Releasable == 0 && e.Pinned > 0:
		fmt.Fprintf(&b, ", the %s cached lies in %s that hold live buffers", size(e.Pinned), pieceName(e.Mode))
	case e.Releasable > 0:
		fmt.Fprintf(&b, ", the %s it gives back is not enough", size(e.Releasable))
	}
	if e.Cause == CauseDevice && e.Others > 0 {
		fmt.Fprintf(&b, "; the %s other users hold is not gpumem's to give back", size(e.Others))
	}
	fmt.Fprintf(&b, ". With virtual-memory spans: ")
	switch e.WithVirtual {
	case AnswerNotApplicable:
		if e.Cause == CauseFragmentation {
			fmt.Fprintf(&b, "in use; blocked by %s idle in spans that also hold live buffers and %s free inside partly used chunks",
				size(e.Pinned-min(e.PinnedInChunks, e.Pinned)), size(e.PinnedInChunks))
			if e.suggestC {
				b.WriteString(" (Config.Compact, GPUMEM_CONFIG=compact=true, leaves less of both, at more driver calls: gpumem fit --policy gpumem-compact says whether a recorded trace would fit)")
			}
			if e.suggestG {
				// The risk in the same breath as the setting: a move while
				// another host thread launches loses that work's writes
				// with no error (config.go, Gather).
				b.WriteString("; Config.Gather, GPUMEM_CONFIG=gather=true, moves live chunks out of the idle spans before failing (gpumem fit --policy gpumem-gather), " +
					"but if another host thread launches work meanwhile, that work's writes to the moved memory are lost with no error (wrong results): " +
					"turn it on only where all GPU work, libraries' included, is launched from one thread at a time " +
					"(PyTorch's autograd engine, NCCL, DataLoader pin threads and serving frameworks launch from threads of their own)")
			}
			if e.gateRefused != "" {
				fmt.Fprintf(&b, "; no live chunk was moved out of them: %s", strings.TrimPrefix(e.gateRefused, "gpumem: "))
			}
		} else {
			fmt.Fprintf(&b, "in use; blocked by %s", map[Cause]string{CauseLimit: "the limit", CauseDevice: "the device's free memory"}[e.Cause])
		}
	case AnswerYes:
		fmt.Fprintf(&b, "yes, live buffers' %s and the request fit within the limit and the device (mode=virtual)", size(e.Active))
	case AnswerNo:
		if e.noVM {
			b.WriteString("no, the device has no virtual memory")
		} else {
			fmt.Fprintf(&b, "no, live buffers' %s and the request need more than the limit of %s or the %s the device could give (its free memory and gpumem's)",
				size(e.Active), size(e.Limit), size(e.DeviceFree+e.Reserved))
		}
	default:
		b.WriteString(e.WithVirtual.String())
	}
	fmt.Fprintf(&b, ". The largest request that would have fit: %s", sizeDown(e.WouldFit))
	if e.Scope != "" {
		b.WriteString(", scope " + e.Scope)
	}
	if e.Err != nil {
		b.WriteString(": " + e.Err.Error())
	}
	return b.String()
}

// limitPhrase names the limit, and says when it is the device's whole
// memory (the limit when none is set).
func limitPhrase(e *OutOfMemoryError) string {
	if e.Limit == e.Total && e.Total != 0 {
		return "the limit of " + size(e.Limit) + " (the device's whole memory)"
	}
	return "the limit of " + size(e.Limit)
}

// freeParts names the parts of FreeTotal: the cache and the room to grow.
func freeParts(e *OutOfMemoryError) string {
	return fmt.Sprintf("%s cached, %s room to grow", size(e.Cached), size(e.FreeTotal-min(e.Cached, e.FreeTotal)))
}

// times says how many times n holds m: "2.5 times".
func times(n, m uint64) string {
	if m == 0 {
		return "?"
	}
	return fmt.Sprintf("%.1f times", float64(n)/float64(m))
}

func pieceName(m Mode) string {
	if m == ModeVirtual {
		return "spans"
	}
	return "segments"
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

// size writes a byte count readably, without the exact count: "1.50 GiB".
func size(n uint64) string {
	s := fmtBytes(n)
	if i := strings.IndexByte(s, '('); i > 0 {
		return s[:i-1]
	}
	return s
}

// sizeDown is size rounded down to its last digit: a figure that may be
// typed back as a request and must not be above n ("the largest request
// that would have fit").
func sizeDown(n uint64) string {
	if n < 1024 {
		return fmt.Sprintf("%d B", n)
	}
	f, u := scaled(n)
	return fmt.Sprintf("%.2f %ciB", math.Floor(f*100)/100, u)
}

// fmtBytes writes a byte count readably: "1.50 GiB (1610612736)".
func fmtBytes(n uint64) string {
	if n < 1024 {
		return fmt.Sprintf("%d B", n)
	}
	f, u := scaled(n)
	return fmt.Sprintf("%.2f %ciB (%d)", f, u, n)
}

// scaled is n (at least 1024) in its largest binary unit, and the unit's
// letter: 1.5, 'G' for 1.5 GiB.
func scaled(n uint64) (float64, byte) {
	f, u := float64(n), 0
	for f >= 1024 && u < 5 {
		f /= 1024
		u++
	}
	return f, "KMGTP"[u-1]
}

// MarshalJSON writes the verdict as one object with snake_case keys (the
// names of gpumem.h's gpumem_oom), the cause as "limit", "device",
// "fragmentation" or "quota", the answers as "yes", "no", "n/a" or
// "unknown", and the message.
func (e *OutOfMemoryError) MarshalJSON() ([]byte, error) {
	v := struct {
		Cause          string `json:"cause"`
		Requested      uint64 `json:"requested"`
		Stream         uint64 `json:"stream"`
		Limit          uint64 `json:"limit"`
		DeviceFree     uint64 `json:"device_free"`
		Total          uint64 `json:"total"`
		Others         uint64 `json:"others"`
		Reserved       uint64 `json:"reserved"`
		Allocated      uint64 `json:"allocated"`
		Active         uint64 `json:"active"`
		Cached         uint64 `json:"cached"`
		Releasable     uint64 `json:"releasable"`
		Pinned         uint64 `json:"pinned"`
		PinnedInChunks uint64 `json:"pinned_in_chunks"`
		LargestFree    uint64 `json:"largest_free"`
		FreeTotal      uint64 `json:"free_total"`
		Growth         uint64 `json:"growth"`
		WouldFit       uint64 `json:"would_fit"`
		AfterTrim      string `json:"after_trim"`
		WithVirtual    string `json:"with_virtual"`
		Mode           string `json:"mode"`
		Scope          string `json:"scope,omitempty"`
		Message        string `json:"message"`
	}{e.Cause.key(), e.Requested, e.Stream, e.Limit, e.DeviceFree, e.Total, e.Others, e.Reserved, e.Allocated, e.Active,
		e.Cached, e.Releasable, e.Pinned, e.PinnedInChunks, e.LargestFree, e.FreeTotal, e.Growth, e.WouldFit,
		e.AfterTrim.String(), e.WithVirtual.String(), e.Mode.String(), e.Scope, e.Error()}
	return json.Marshal(v)
}

// key is the cause's one-word name in JSON and in the Python package.
func (c Cause) key() string {
	switch c {
	case CauseDevice:
		return "device"
	case CauseLimit:
		return "limit"
	case CauseFragmentation:
		return "fragmentation"
	case CauseQuota:
		return "quota"
	}
	return "unknown"
}
