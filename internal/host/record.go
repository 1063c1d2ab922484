package host

import (
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gpumem/gpumem/torchsnapshot"
	"github.com/gpumem/gpumem/trace"
)

// A recorder writes one device's requests as a gpumem trace while a
// recording runs (StartRecording to StopRecording): every successful
// allocation and its free, with the stream, each Trim (torch.cuda.empty_cache)
// and, when the host program supplies them (DefineSite), call sites. Request IDs count up from 0;
// times are microseconds since the start. The first write error stops the
// recording and is reported by StopRecording; it never fails an
// allocation.
type recorder struct {
	gen   uint32 // tells this recording's IDs from an earlier one's
	path  string
	start time.Time

	mu      sync.Mutex // guards the fields below and w
	w       traceFile
	next    uint64
	allocs  uint64
	frees   uint64
	err     error
	lastT   uint64
	stopped bool
}

// traceFile is what a recorder writes to: a *trace.FileWriter.
type traceFile interface {
	AllocSite(id, size, stream, tUS uint64, site uint32) error
	Free(id, tUS uint64) error
	Trim(tUS uint64) error
	Site(id uint32, text string) error
	Close() error
}

var createTrace = func(path string) (traceFile, error) { return trace.Create(path) }

var recordGen atomic.Uint32

// RecordSummary says what a recording wrote.
type RecordSummary struct {
	Path   string
	Allocs uint64 // alloc events written
	Frees  uint64 // free events written
}

// StartRecording starts writing device ordinal's requests to a trace file at
// path (gzip-compressed when it ends in .gz). Buffers allocated before it
// are not in the trace, nor are their frees. One recording per device at a
// time.
func (h *Host) StartRecording(ordinal int, path string) error {
	d, err := h.Device(ordinal)
	if err != nil {
		return err
	}
	w, err := createTrace(path)
	if err != nil {
		return fmt.Errorf("%w: recording device %d: %v", ErrIO, ordinal, err)
	}
	r := &recorder{gen: recordGen.Add(1), path: path, start: time.Now(), w: w}
	if !d.rec.CompareAndSwap(nil, r) {
		w.Close()
		return fmt.Errorf("%w: device %d is being recorded already (to %s)", ErrConfig, ordinal, d.rec.Load().path)
	}
	return nil
}

// StopRecording ends device ordinal's recording and completes its file.
func (h *Host) StopRecording(ordinal int) (RecordSummary, error) {
	d := h.existing(ordinal)
	var r *recorder
	if d != nil {
		r = d.rec.Swap(nil)
	}
	if r == nil {
		return RecordSummary{}, fmt.Errorf("%w: device %d is not being recorded", ErrConfig, ordinal)
	}
	err := r.close()
	return RecordSummary{Path: r.path, Allocs: r.allocs, Frees: r.frees}, err
}

// DefineSite names call site id (>= 1) in device ordinal's recording, before
// the first allocation that carries it.
func (h *Host) DefineSite(ordinal int, id uint32, text string) error {
	d := h.existing(ordinal)
	if d == nil || d.rec.Load() == nil {
		return fmt.Errorf("%w: device %d is not being recorded", ErrConfig, ordinal)
	}
	return d.rec.Load().site(id, text)
}

// Recording reports whether device ordinal is being recorded.
func (h *Host) Recording(ordinal int) bool {
	d := h.existing(ordinal)
	return d != nil && d.rec.Load() != nil
}

// now is the time since the start in microseconds, never before the last
// event's (the clock is monotonic, but take no chances). Called with mu.
func (r *recorder) now() uint64 {
	t := max(uint64(time.Since(r.start).Microseconds()), r.lastT)
	r.lastT = t
	return t
}

// alloc records an allocation and returns its ID plus one (0: not recorded).
func (r *recorder) alloc(size, stream uint64, site uint32) uint64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.err != nil || r.stopped {
		return 0
	}
	id := r.next
	if r.err = r.w.AllocSite(id, size, stream, r.now(), site); r.err != nil {
		return 0
	}
	r.next++
	r.allocs++
	return id + 1
}

func (r *recorder) free(id uint64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.err != nil || r.stopped {
		return
	}
	if r.err = r.w.Free(id, r.now()); r.err == nil {
		r.frees++
	}
}

// trim records that the program emptied the cache (Host.Trim): a replay
// trims there too.
func (r *recorder) trim() {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.err != nil || r.stopped {
		return
	}
	r.err = r.w.Trim(r.now())
}

func (r *recorder) site(id uint32, text string) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.stopped {
		return errors.New("gpumem: the recording has stopped")
	}
	return r.w.Site(id, text)
}

func (r *recorder) close() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.stopped = true
	err := r.w.Close()
	if r.err != nil {
		return fmt.Errorf("%w: recording to %s stopped at its first write error: %v", ErrIO, r.path, r.err)
	}
	if err != nil {
		return fmt.Errorf("%w: completing %s: %v", ErrIO, r.path, err)
	}
	return nil
}

// ImportSnapshot converts the PyTorch memory snapshot at in (the pickle of
// torch.cuda.memory._dump_snapshot) into traces at out, as `gpumem import`
// does (torchsnapshot.Import): gpumem.torch.record uses it under PyTorch's
// own allocator. It needs no device.
func ImportSnapshot(in, out string) ([]torchsnapshot.Written, error) {
	w, err := torchsnapshot.Import(in, out)
	if err != nil && !errors.Is(err, torchsnapshot.ErrFormat) && !errors.Is(err, torchsnapshot.ErrNoHistory) {
		err = fmt.Errorf("%w: %w", ErrIO, err)
	}
	return w, err
}
