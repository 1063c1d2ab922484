package gpumem

// See doc.go for the overview.

import (
	"fmt"
	"sync"
	"time"

	"github.com/gpumem/gpumem/device"
	"github.com/gpumem/gpumem/trace"
)

// Resource is what hands out buffers: an *Allocator, a *Scope, or an
// adaptor wrapping one of them.
type Resource interface {
	Alloc(size uint64, s device.Stream) (Buffer, error)
	Free(b Buffer) error
}

var (
	_ Resource = (*Allocator)(nil)
	_ Resource = (*Scope)(nil)
	_ Resource = (*Recorder)(nil)
)

// Recorder is a Resource adaptor that writes every successful Alloc and
// Free of the resource it wraps as a gpumem-trace v1 event, so a program's
// own requests can be replayed, explained and planned for later. Request IDs
// count up from 0; times are microseconds since NewRecorder. A failed Alloc
// is not recorded (the program did not get memory); a failed Free neither.
//
// The first write error stops recording and is returned by Err and Close;
// it never fails an allocation.
type Recorder struct {
	r     Resource
	w     *trace.Writer
	start time.Time

	mu   sync.Mutex // guards the fields below and w
	next uint64
	ids  map[device.Ptr]uint64 // live buffers' request IDs
	err  error
}

// NewRecorder wraps r, writing to w.
func NewRecorder(r Resource, w *trace.Writer) *Recorder {
	return &Recorder{r: r, w: w, start: time.Now(), ids: make(map[device.Ptr]uint64)}
}

func (rc *Recorder) now() uint64 { return uint64(time.Since(rc.start).Microseconds()) }

// Alloc allocates through the wrapped resource and records the request.
func (rc *Recorder) Alloc(size uint64, s device.Stream) (Buffer, error) {
	b, err := rc.r.Alloc(size, s)
	if err != nil {
		return b, err
	}
	rc.mu.Lock()
	id := rc.next
	rc.next++
	rc.ids[b.Ptr()] = id
	if rc.err == nil {
		rc.err = rc.w.Alloc(id, size, uint64(s), rc.now())
	}
	rc.mu.Unlock()
	return b, nil
}

// Free frees through the wrapped resource and records the free.
func (rc *Recorder) Free(b Buffer) error {
	// Look the ID up before the free: once freed, the address may be
	// handed to another goroutine's Alloc.
	rc.mu.Lock()
	id, ok := rc.ids[b.Ptr()]
	rc.mu.Unlock()
	if err := rc.r.Free(b); err != nil {
		return err
	}
	if !ok {
		return nil // allocated before recording began
	}
	rc.mu.Lock()
	if cur, still := rc.ids[b.Ptr()]; still && cur == id {
		delete(rc.ids, b.Ptr())
	}
	if rc.err == nil {
		rc.err = rc.w.Free(id, rc.now())
	}
	rc.mu.Unlock()
	return nil
}

// Err returns the first error writing the trace, if any.
func (rc *Recorder) Err() error {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	return rc.err
}

// Flush flushes the trace writer and returns the first error.
func (rc *Recorder) Flush() error {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	if rc.err == nil {
		rc.err = rc.w.Flush()
	}
	if rc.err != nil {
		return fmt.Errorf("gpumem: recording trace: %w", rc.err)
	}
	return nil
}
