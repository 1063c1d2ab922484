package gpumem

// See doc.go for the overview.

import (
	"errors"
	"fmt"
	"syscall"

	"github.com/gpumem/gpumem/device"
)

// Sharing a live buffer with another process.
//
// A buffer lies in spans, each one physical handle mapped whole (vm.go).
// Another process maps the same memory by importing those handles and
// mapping them, in address order, over a range of its own: the buffer is
// then at the same offset from that range's start as from the first span's
// start here. Share hands out one file descriptor per span
// (device.Exporter) and the layout; the importing process maps whole spans,
// so it can read the buffer's neighbours in them too, as with CUDA's own
// IPC handles, which cover a whole allocation.
//
// While a buffer is shared its spans are never split (Config.Defrag,
// Config.Gather): a split maps new handles at the same addresses here, and
// the other process, which holds the old ones, would stop seeing this
// process's writes without an error. The spans count their shares
// (span.shares); Unshare, which the sharer calls once every importer has
// let go, gives them back to the splits. The buffer itself must stay live
// until then: that is the sharer's to keep (the Python package keeps the
// tensor's storage until the receiving processes have released theirs, as
// PyTorch's allocator does), and gpumem cannot check it, since an
// importer's handle keeps the memory allocated after this process frees it.

// SharedSpan is one span under a shared buffer: a file descriptor for its
// physical handle and the span's size in bytes.
type SharedSpan struct {
	FD   int
	Size uint64
}

// Shared is what another process needs to map a buffer: the spans under it
// in address order, mapped back to back from Base, and the buffer's
// address. The buffer starts Ptr-Base bytes into that range.
type Shared struct {
	Ptr   device.Ptr
	Base  device.Ptr
	Spans []SharedSpan
}

// Close closes the file descriptors of s (once they have been sent).
func (s *Shared) Close() {
	for i := range s.Spans {
		if s.Spans[i].FD >= 0 {
			syscall.Close(s.Spans[i].FD)
			s.Spans[i].FD = -1
		}
	}
}

// ErrNotShareable: the buffer's memory cannot be handed to another process.
var ErrNotShareable = errors.New("gpumem: buffer cannot be shared with another process")

// Share exports the spans under buf for another process (see above; under
// Config.ChunkHandles each chunk's handle is a piece of its own) and
// keeps them from being split until Unshare. The caller owns the returned
// descriptors (Shared.Close). It fails, matching ErrNotShareable and
// saying why, where the device cannot export (the simulated device, a
// driver without shareable handles) or the buffer lies in a plain segment
// (ModePlain, Config.Preallocate's plain segments).
func (a *Allocator) Share(buf Buffer) (Shared, error) {
	notShareable := func(why string) error {
		return &BufferError{Op: "Share", Ptr: uint64(buf.ptr), Size: buf.size, Err: ErrNotShareable, Why: why}
	}
	p, err := a.lockLive("Share", buf, "buffer was freed")
	if err != nil {
		return Shared{}, err
	}
	defer p.mu.Unlock()
	ex, ok := device.AsExporter(a.dev)
	if !ok {
		return Shared{}, notShareable(fmt.Sprintf("device %q cannot share memory between processes", a.dev.Info().Name))
	}
	b := buf.b
	seg := b.seg
	if !seg.virtual {
		return Shared{}, notShareable("it lies in a plain segment (a cuMemAlloc of its own), not in mapped spans")
	}
	idx, err := p.spansUnder(b)
	if err != nil {
		return Shared{}, notShareable(err.Error())
	}
	sh := Shared{Ptr: buf.ptr, Base: device.Ptr(seg.chunkAddr(int(p.spans[idx[0]].c0), a.gran))}
	for _, i := range idx {
		s := &p.spans[i]
		// One handle per span, or under Config.ChunkHandles one per chunk
		// (chunks.go), each exported as a piece of its own.
		hs, size := []device.Handle{s.h}, uint64(s.n)*a.gran
		if a.chunkHandles {
			hs, size = p.spanHandles(i, nil), a.gran
		}
		for _, h := range hs {
			fd, err := ex.Export(h)
			if err != nil {
				sh.Close()
				return Shared{}, notShareable("the driver would not export its memory: " + err.Error())
			}
			sh.Spans = append(sh.Spans, SharedSpan{FD: fd, Size: size})
		}
	}
	for _, i := range idx {
		p.spans[i].shares++
	}
	return sh, nil
}

// Unshare gives buf's spans back to the splits once no other process maps
// them (one call per Share).
func (a *Allocator) Unshare(buf Buffer) error {
	p, err := a.lockLive("Unshare", buf, "buffer was freed while shared")
	if err != nil {
		return err
	}
	defer p.mu.Unlock()
	b := buf.b
	idx, err := p.spansUnder(b)
	if err != nil {
		return &BufferError{Op: "Unshare", Ptr: uint64(buf.ptr), Size: buf.size, Err: ErrNotShareable, Why: err.Error()}
	}
	for _, i := range idx {
		if p.spans[i].shares == 0 {
			return &BufferError{Op: "Unshare", Ptr: uint64(buf.ptr), Size: buf.size, Err: ErrNotShareable, Why: "buffer is not shared"}
		}
	}
	for _, i := range idx {
		p.spans[i].shares--
	}
	return nil
}

// spansUnder returns the spans under live block b in address order; they
// are contiguous, each following the last one's end. Called with p.mu held.
func (p *pool) spansUnder(b *block) ([]int32, error) {
	seg := b.seg
	c0, c1 := seg.chunkSpan(b.addr, b.size, p.a.gran)
	var idx []int32
	for c := c0; c <= c1; {
		si := seg.chunks[c].span
		if si < 0 {
			return nil, fmt.Errorf("internal error: chunk %d under a live buffer is unmapped", c)
		}
		s := &p.spans[si]
		if int(s.c0) != c && len(idx) > 0 {
			return nil, fmt.Errorf("internal error: span %d does not start where span %d ends", si, idx[len(idx)-1])
		}
		idx = append(idx, si)
		c = int(s.c0 + s.n)
	}
	return idx, nil
}
