package gpumem

// See doc.go for the overview.

import (
	"fmt"

	"github.com/gpumem/gpumem/device"
)

// CUDA graphs. A stream capture records the work enqueued on its streams
// into a graph instead of running it; the graph then replays that work, at
// the same addresses, as often as the program asks. Two things follow for
// an allocator.
//
// While a capture is underway (BeginCapture to EndCapture), the driver
// refuses an event recorded on a capturing stream, an event or stream of
// the capture queried or waited for, and a synchronize of the device, and a
// refused call breaks the capture. So does PyTorch's allocator, which
// processes no event while any capture is underway. The allocator then:
//
//   - records, queries and waits for no event: memory freed by another
//     stream is not handed over (advanceEpoch, handOff), frees named on
//     other streams by RecordStream stay pending (deferFree,
//     processPending), and the device is never synchronized (syncDevice);
//   - fences no stream, so it unmaps and frees no memory emptied since the
//     last fence: an empty span that would need one stalls (vm.go) and new
//     memory is taken instead; Trim fails, saying so; idle release, the
//     release threshold and Defrag wait for the capture to end;
//   - makes its driver calls in relaxed capture mode (device/cuda), which
//     the driver allows during a capture.
//
// The memory a captured graph uses must stay its own while the graph lives:
// replays write it. NewPrivate makes a private pool for it (PyTorch's graph
// pools): an allocator in the same family, over the same device, whose
// memory serves only the allocations made through it, counted against the
// root's limit, and never unmapped, moved or given back before Close. It
// takes plain segments (ModePlain), which stay at their addresses; a
// virtual span could move once empty. Which allocation goes to which pool
// is the caller's to decide (internal/host routes PyTorch's by capture id
// or thread, as PyTorch's filters do).
//
// Invariant: a private pool never gives memory back before Close (keep;
// Trim, releaseTo and reclaim return early), and the bytes every member of
// a family holds add up to *family, at most the root's limit (or the
// overhang SetLimit left).

// errCapturing is what the operations a capture forbids return while one
// is underway.
var errCapturing = fmt.Errorf("a stream capture is underway on the device: %w", device.ErrCapturing)

// BeginCapture tells the allocator that a stream capture has begun on its
// device: until the matching EndCapture it does nothing the driver forbids
// during one (see above). Captures nest: each BeginCapture needs its
// EndCapture. A private pool shares its root's count.
func (a *Allocator) BeginCapture() { a.captures.Add(1) }

// EndCapture ends what BeginCapture began. It panics on an EndCapture with
// no capture underway (a caller's bug that would otherwise hide the next
// capture).
func (a *Allocator) EndCapture() {
	if a.captures.Add(-1) < 0 {
		a.captures.Add(1)
		panic("gpumem: EndCapture without BeginCapture")
	}
}

// Capturing reports whether a capture is underway (BeginCapture).
func (a *Allocator) Capturing() bool { return a.capturing() }

func (a *Allocator) capturing() bool { return a.captures.Load() > 0 }

// NewPrivate makes a private pool of a (see above): its buffers come from
// memory no other allocator of the family uses, counted against the
// root's limit, kept at their addresses until Close. Close it once nothing
// uses its memory any more (the graphs replaying into it are gone); Close
// reports the buffers still live as leaks and frees them.
func (a *Allocator) NewPrivate() (*Allocator, error) {
	if a.closed.Load() {
		return nil, fmt.Errorf("%w: NewPrivate on a closed allocator", ErrClosed)
	}
	root := a.root
	cfg := Config{Mode: ModePlain, SmallSize: root.cfg.SmallSize, RecordSites: root.cfg.RecordSites, CheckInvariants: root.cfg.CheckInvariants}
	p, err := New(root.dev, cfg)
	if err != nil {
		return nil, err
	}
	p.root, p.family, p.captures, p.keep = root, root.family, root.captures, true
	p.limit.Store(root.limit.Load())
	return p, nil
}

// Private reports whether a is a private pool (NewPrivate).
func (a *Allocator) Private() bool { return a.keep }
