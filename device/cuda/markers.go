package cuda

import (
	"fmt"
	"sync"
	"sync/atomic"
	"unsafe"

	"github.com/gpumem/gpumem/device"
)

// Markers (device.Markers): words of pinned host memory, mapped for the
// device (cuMemHostAlloc with CU_MEMHOSTALLOC_DEVICEMAP), that a stream
// writes with cuStreamWriteValue64 when its work before the write is done,
// and the host reads with a load. On an H200 the write costs the host
// 1.8-3.3 us (a record 0.15) and the stream 2.8 us of GPU time (a record
// none: the v2 write's system-wide fence), and the load nanoseconds (a
// query 1.3 us, plus this package's context switch around every call);
// over fifty rounds of a word written before and after an event, idle or
// beside another process's matmuls, the word never ran ahead of an event
// recorded before it nor behind one recorded after (docs/BENCHMARKS.md,
// "Stream markers on an H200").
//
// The words come in slabs of one page, never moved, so a marker is its
// index: slab m/slabWords, word m%slabWords (m = Marker-1). A destroyed
// marker's word is handed out again only once its last write has landed
// (the word reads what was last written), so that a late write cannot
// land in another marker's word; until then it waits in retired.
//
// Invariants: a word is in at most one of free and retired, and in
// neither while its marker lives; last[i] is the value last enqueued to
// word i; slabs only grows (Reached reads it without the lock).
type markerBooks struct {
	supported bool    // 64-bit stream memory operations and the entry points (init)
	write     uintptr // the cuStreamWriteValue64 that the device supports

	mu      sync.Mutex
	slabs   atomic.Pointer[[]*markerSlab] // copy on write, under mu
	free    []uint32                      // words to hand out
	retired []uint32                      // words destroyed with a write maybe pending
}

const slabWords = 512 // a 4 KiB page of 64-bit words

// init says whether the device supports markers, from its attributes
// CU_DEVICE_ATTRIBUTE_CAN_USE_64_BIT_STREAM_MEM_OPS (v2, CUDA 12's, 1 on
// an H200 with driver 580) and its _V1 (0 there: the original operations
// need the kernel module's NVreg_EnableStreamMemOPs), and picks the entry
// point of the one it has.
func (b *markerBooks) init(drv *driver, v2, v1 int) {
	switch {
	case drv.cuMemHostAlloc == 0 || drv.cuMemFreeHost == 0 || drv.cuMemHostGetDevicePointer == 0:
	case v2 == 1 && drv.cuStreamWriteValue64 != 0:
		b.write = drv.cuStreamWriteValue64
	case v1 == 1 && drv.cuStreamWriteValue64V1 != 0:
		b.write = drv.cuStreamWriteValue64V1
	}
	b.supported = b.write != 0
}

type markerSlab struct {
	host unsafe.Pointer // the page, from cuMemHostAlloc
	dev  uintptr        // its device address (cuMemHostGetDevicePointer)
	last [slabWords]atomic.Uint64
}

func (s *markerSlab) word(i uint32) *uint64 {
	return (*uint64)(unsafe.Add(s.host, 8*uintptr(i%slabWords)))
}

// landed reports whether word i of the books has its last write.
func (b *markerBooks) landed(i uint32) bool {
	s := (*b.slabs.Load())[i/slabWords]
	return atomic.LoadUint64(s.word(i)) == s.last[i%slabWords].Load()
}

// NewMarker hands out a word set to 0. Without 64-bit stream memory
// operations the error matches device.ErrUnsupported.
func (d *Device) NewMarker() (device.Marker, error) {
	b := &d.marks
	if !b.supported {
		return 0, &device.OpError{Op: "cuda.NewMarker", Err: fmt.Errorf("%w: %s has no 64-bit stream memory operations", device.ErrUnsupported, d.info.Name)}
	}
	if d.closed.Load() {
		return 0, d.fail("cuda.NewMarker", resultClosed, "")
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	kept := b.retired[:0]
	for _, i := range b.retired {
		if b.landed(i) {
			b.free = append(b.free, i)
		} else {
			kept = append(kept, i)
		}
	}
	b.retired = kept
	if len(b.free) == 0 {
		if err := d.newMarkerSlab(); err != nil {
			return 0, err
		}
	}
	i := b.free[len(b.free)-1]
	b.free = b.free[:len(b.free)-1]
	s := (*b.slabs.Load())[i/slabWords]
	atomic.StoreUint64(s.word(i), 0)
	s.last[i%slabWords].Store(0)
	return device.Marker(i + 1), nil
}

// newMarkerSlab adds a page of words to the free list (b.mu held).
func (d *Device) newMarkerSlab() error {
	b := &d.marks
	var old []*markerSlab
	if p := b.slabs.Load(); p != nil {
		old = *p
	}
	if len(old) >= 1<<20/slabWords {
		return d.fail("cuda.NewMarker", cudaErrInvalidValue, "a million markers live: more than any allocator makes")
	}
	s := &markerSlab{}
	if r := d.call(d.drv.cuMemHostAlloc, uintptr(unsafe.Pointer(&s.host)), slabWords*8, cuMemHostAllocPortable|cuMemHostAllocDeviceMap); r != cudaSuccess {
		return d.fail("cuMemHostAlloc", r, "size=%d, flags=PORTABLE|DEVICEMAP", slabWords*8)
	}
	if r := d.call(d.drv.cuMemHostGetDevicePointer, uintptr(unsafe.Pointer(&s.dev)), uintptr(s.host), 0); r != cudaSuccess {
		err := d.fail("cuMemHostGetDevicePointer", r, "host=%p", s.host)
		d.call(d.drv.cuMemFreeHost, uintptr(s.host))
		return err
	}
	slabs := append(append(make([]*markerSlab, 0, len(old)+1), old...), s)
	b.slabs.Store(&slabs)
	base := uint32(len(old) * slabWords)
	for k := slabWords - 1; k >= 0; k-- {
		b.free = append(b.free, base+uint32(k))
	}
	return nil
}

// index returns marker m's word, or false for a marker never handed out.
func (b *markerBooks) index(m device.Marker) (uint32, bool) {
	p := b.slabs.Load()
	if m == 0 || p == nil || uint64(m) > uint64(len(*p))*slabWords {
		return 0, false
	}
	return uint32(m - 1), true
}

// DestroyMarker gives m's word back: to be handed out again at once if its
// last write has landed, else once it has.
func (d *Device) DestroyMarker(m device.Marker) error {
	b := &d.marks
	i, ok := b.index(m)
	if !ok {
		return d.fail("cuda.DestroyMarker", cudaErrInvalidValue, "marker=%d: never made", uint64(m))
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.landed(i) {
		b.free = append(b.free, i)
	} else {
		b.retired = append(b.retired, i)
	}
	return nil
}

// Mark enqueues on s a write of v to m's word (cuStreamWriteValue64 with
// the default flags: the write is ordered after the stream's earlier work
// and preceded by a system-wide fence).
func (d *Device) Mark(m device.Marker, s device.Stream, v uint64) error {
	b := &d.marks
	i, ok := b.index(m)
	if !ok {
		return d.fail("cuStreamWriteValue64", cudaErrInvalidValue, "marker=%d: never made", uint64(m))
	}
	sl := (*b.slabs.Load())[i/slabWords]
	addr := sl.dev + 8*uintptr(i%slabWords)
	if r := d.call(b.write, uintptr(s), addr, uintptr(v), 0); r != cudaSuccess {
		return d.fail("cuStreamWriteValue64", r, "stream=%#x, marker=%d, value=%d", uint64(s), uint64(m), v)
	}
	// After the call: a write that was never enqueued must not keep the
	// word retired. Its marker's owner does not destroy it meanwhile.
	sl.last[i%slabWords].Store(v)
	return nil
}

// Reached loads m's word: the last value written to it that has landed.
// A marker never made, or any after Close, reads 0 (nothing reached).
func (d *Device) Reached(m device.Marker) uint64 {
	b := &d.marks
	i, ok := b.index(m)
	if !ok || d.closed.Load() {
		return 0
	}
	return atomic.LoadUint64((*b.slabs.Load())[i/slabWords].word(i))
}

// freeMarkers gives back the slabs all of whose writes have landed (Close;
// a slab with one still pending is left to the driver, which frees it with
// the context, rather than have the device write to freed memory).
func (d *Device) freeMarkers() error {
	b := &d.marks
	b.mu.Lock()
	defer b.mu.Unlock()
	p := b.slabs.Load()
	if p == nil {
		return nil
	}
	var err error
	for k, s := range *p {
		done := true
		for j := range uint32(slabWords) {
			if !b.landed(uint32(k)*slabWords + j) {
				done = false
				break
			}
		}
		if !done {
			continue
		}
		if r := d.call(d.drv.cuMemFreeHost, uintptr(s.host)); r != cudaSuccess && err == nil {
			err = d.fail("cuMemFreeHost", r, "host=%p", s.host)
		}
	}
	empty := []*markerSlab{}
	b.slabs.Store(&empty)
	b.free, b.retired = nil, nil
	return err
}
