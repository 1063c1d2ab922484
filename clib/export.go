package main

// The Go side of gpumem.h: each gpumemGo_* function is called by its C
// function in capi.c (or torch_*.c), converts, calls the host and converts
// back. On a failure it records the thread's last error through
// gpumem_set_error (errors.c) and returns the status. It calls no C file
// above errors.c and callout.c (internal.h: the layers).

/*
#cgo CFLAGS: -O2 -fexceptions -Wall
#cgo LDFLAGS: -ldl
#include <stdlib.h>
#include "internal.h"
*/
import "C"

import (
	"encoding/json"
	"errors"
	"fmt"
	"runtime/debug"
	"sync"
	"unsafe"

	"github.com/gpumem/gpumem"
	gpudevice "github.com/gpumem/gpumem/device"
	"github.com/gpumem/gpumem/internal/announce"
	"github.com/gpumem/gpumem/internal/host"
)

// theHost is the process's host, made at the first call: GPUMEM_CONFIG is
// read then, from the process's environment as it is (getenv): os.Getenv
// reads the Go runtime's copy, which in a c-shared library is the
// environment the process started with, and missed what a Python program
// put in os.environ before its first gpumem call (measured: the config
// was ignored with no error).
var theHost = sync.OnceValue(func() *host.Host {
	h := host.New(getenv("GPUMEM_CONFIG"), nil)
	if g, ok := shimGate(); ok {
		h.SetGate(g)
	}
	return h
})

// The announcements' directory (GPUMEM_RUN_DIR, TMPDIR) is read from the
// environment as it is at the first call too.
func init() { announce.Getenv = getenv }

// getenv reads the process's environment as it is now (C's getenv).
func getenv(name string) string {
	cs := C.CString(name)
	defer C.free(unsafe.Pointer(cs))
	if v := C.getenv(cs); v != nil {
		return C.GoString(v)
	}
	return ""
}

// fail records err as the calling thread's last error and returns its
// status.
func fail(err error, device C.int) C.gpumem_status {
	st := host.Code(err)
	msg := err.Error()
	var oom *gpumem.OutOfMemoryError
	if errors.As(err, &oom) {
		v := C.gpumem_oom{
			cause:        C.int(oomCause(oom.Cause)),
			device:       device,
			requested:    C.uint64_t(oom.Requested),
			stream:       C.uint64_t(oom.Stream),
			limit:        C.uint64_t(oom.Limit),
			device_free:  C.uint64_t(oom.DeviceFree),
			reserved:     C.uint64_t(oom.Reserved),
			allocated:    C.uint64_t(oom.Allocated),
			cached:       C.uint64_t(oom.Cached),
			largest_free: C.uint64_t(oom.LargestFree),
			would_fit:    C.uint64_t(oom.WouldFit),

			total:            C.uint64_t(oom.Total),
			others:           C.uint64_t(oom.Others),
			active:           C.uint64_t(oom.Active),
			releasable:       C.uint64_t(oom.Releasable),
			pinned:           C.uint64_t(oom.Pinned),
			pinned_in_chunks: C.uint64_t(oom.PinnedInChunks),
			growth:           C.uint64_t(oom.Growth),
			free_total:       C.uint64_t(oom.FreeTotal),
			after_trim:       C.int(oom.AfterTrim), // GPUMEM_ANSWER_* are gpumem.Answer's values
			with_virtual:     C.int(oom.WithVirtual),
			mode:             C.int(oom.Mode), // GPUMEM_MODE_* are gpumem.Mode's values
		}
		C.gpumem_set_error(C.gpumem_status(st), (*C.char)(unsafe.Pointer(unsafe.StringData(msg))), C.size_t(len(msg)), &v)
	} else {
		C.gpumem_set_error(C.gpumem_status(st), (*C.char)(unsafe.Pointer(unsafe.StringData(msg))), C.size_t(len(msg)), nil)
	}
	return C.gpumem_status(st)
}

// gpumem.h numbers answers and modes as package gpumem does (fail copies
// them as they are): a difference fails the build here.
var (
	_ = [1]struct{}{}[gpumem.AnswerUnknown-C.GPUMEM_ANSWER_UNKNOWN]
	_ = [1]struct{}{}[gpumem.AnswerNo-C.GPUMEM_ANSWER_NO]
	_ = [1]struct{}{}[gpumem.AnswerYes-C.GPUMEM_ANSWER_YES]
	_ = [1]struct{}{}[gpumem.AnswerNotApplicable-C.GPUMEM_ANSWER_NOT_APPLICABLE]
	_ = [1]struct{}{}[gpumem.ModePlain-C.GPUMEM_MODE_PLAIN]
	_ = [1]struct{}{}[gpumem.ModeVirtual-C.GPUMEM_MODE_VIRTUAL]
)

// oomCause numbers a cause as gpumem.h does (GPUMEM_OOM_*).
func oomCause(c gpumem.Cause) int {
	switch c {
	case gpumem.CauseDevice:
		return 1
	case gpumem.CauseLimit, gpumem.CauseQuota:
		return 2
	case gpumem.CauseFragmentation:
		return 3
	}
	return 0
}

func status(err error, device C.int) C.gpumem_status {
	if err == nil {
		return 0
	}
	return fail(err, device)
}

//export gpumemGo_alloc
func gpumemGo_alloc(out *C.uintptr_t, size C.size_t, device C.int, stream C.uintptr_t, site C.uint32_t, thread C.uint64_t) C.gpumem_status {
	p, err := theHost().AllocThread(int(device), uint64(size), uint64(stream), uint32(site), uint64(thread))
	if err != nil {
		return fail(err, device)
	}
	*out = C.uintptr_t(p)
	return 0
}

//export gpumemGo_free
func gpumemGo_free(ptr C.uintptr_t, device C.int) C.gpumem_status {
	if err := theHost().Free(int(device), uint64(ptr)); err != nil {
		return fail(err, device)
	}
	return 0
}

//export gpumemGo_set_caching
func gpumemGo_set_caching(on C.int) C.gpumem_status {
	theHost().SetCaching(on != 0)
	return 0
}

//export gpumemGo_set_capture_reuse
func gpumemGo_set_capture_reuse(on C.int) C.gpumem_status {
	if !theHost().SetCaptureReuse(on != 0) && on != 0 {
		return fail(fmt.Errorf("%w: gpumem: reuse within a capture is on, but the driver cannot show a capture's graph (cuStreamGetCaptureInfo_v2, cuGraphNodeGetDependencies): buffers freed during a capture after other streams used them wait for its end", gpudevice.ErrUnsupported), -1)
	}
	return 0
}

//export gpumemGo_free_site
func gpumemGo_free_site(ptr C.uintptr_t, device C.int, site C.uint32_t) C.gpumem_status {
	if err := theHost().FreeSite(int(device), uint64(ptr), uint32(site)); err != nil {
		return fail(err, device)
	}
	return 0
}

// gpumemGo_totals gives device's allocated and reserved bytes, private
// pools included (PyTorch's profiler's totals; called only while it
// profiles memory).
//
//export gpumemGo_totals
func gpumemGo_totals(device C.int, allocated, reserved *C.uint64_t) {
	st, err := theHost().Stats(int(device))
	if err != nil {
		return
	}
	*allocated, *reserved = C.uint64_t(st.Allocated), C.uint64_t(st.Reserved)
}

//export gpumemGo_free_on
func gpumemGo_free_on(ptr C.uintptr_t, device C.int, stream C.uintptr_t) C.gpumem_status {
	if err := theHost().FreeOn(int(device), uint64(ptr), uint64(stream)); err != nil {
		return fail(err, device)
	}
	return 0
}

//export gpumemGo_record_stream
func gpumemGo_record_stream(ptr C.uintptr_t, device C.int, stream C.uintptr_t) C.gpumem_status {
	return status(theHost().RecordStream(int(device), uint64(ptr), uint64(stream)), device)
}

// gpumemGo_share exports the buffer at ptr (gpumem_share): descriptors
// and sizes go into C's arrays of capacity cap.
//
//export gpumemGo_share
func gpumemGo_share(ptr C.uintptr_t, device C.int, base *C.uint64_t, fds *C.int, sizes *C.uint64_t, capacity C.size_t, n *C.size_t) C.gpumem_status {
	sh, err := theHost().Share(int(device), uint64(ptr))
	if err != nil {
		return fail(err, device)
	}
	*n = C.size_t(len(sh.Spans))
	if len(sh.Spans) > int(capacity) {
		sh.Close()
		// Undone, so that the caller's second call counts once.
		if err := theHost().Unshare(int(device), uint64(ptr)); err != nil {
			return fail(err, device)
		}
		return fail(fmt.Errorf("%w: share: %d chunks, room for %d", host.ErrTooSmall, len(sh.Spans), capacity), device)
	}
	*base = C.uint64_t(sh.Base)
	if len(sh.Spans) > 0 {
		fs := unsafe.Slice((*C.int)(unsafe.Pointer(fds)), len(sh.Spans))
		ss := unsafe.Slice((*C.uint64_t)(unsafe.Pointer(sizes)), len(sh.Spans))
		for i, s := range sh.Spans {
			fs[i], ss[i] = C.int(s.FD), C.uint64_t(s.Size)
		}
	}
	return 0
}

//export gpumemGo_unshare
func gpumemGo_unshare(ptr C.uintptr_t, device C.int) C.gpumem_status {
	return status(theHost().Unshare(int(device), uint64(ptr)), device)
}

//export gpumemGo_pool_begin
func gpumemGo_pool_begin(device C.int, hi, lo C.uint64_t, stream C.uintptr_t, route C.int, thread C.uint64_t) C.gpumem_status {
	id := host.PoolID{Hi: uint64(hi), Lo: uint64(lo)}
	return status(theHost().BeginPool(int(device), id, host.Route(route), uint64(stream), uint64(thread)), device)
}

//export gpumemGo_pool_end
func gpumemGo_pool_end(device C.int, hi, lo C.uint64_t) C.gpumem_status {
	return status(theHost().EndPool(int(device), host.PoolID{Hi: uint64(hi), Lo: uint64(lo)}), device)
}

//export gpumemGo_pool_retain
func gpumemGo_pool_retain(device C.int, hi, lo C.uint64_t) C.gpumem_status {
	return status(theHost().RetainPool(int(device), host.PoolID{Hi: uint64(hi), Lo: uint64(lo)}), device)
}

//export gpumemGo_pool_create
func gpumemGo_pool_create(device C.int, hi, lo C.uint64_t, alloc, free C.uintptr_t, noSplit, useOnOOM C.int) C.gpumem_status {
	opts := host.PoolOptions{NoSplit: noSplit != 0, UseOnOOM: useOnOOM != 0}
	if alloc != 0 {
		opts.Segments = &poolSource{alloc: alloc, free: free, device: device}
	}
	return status(theHost().RetainPoolWith(int(device), host.PoolID{Hi: uint64(hi), Lo: uint64(lo)}, opts), device)
}

// poolSource is a pool's own allocator (gpumem_pool_options): a
// CUDAPluggableAllocator's alloc and free, called through callout.c.
type poolSource struct {
	alloc, free C.uintptr_t
	device      C.int
}

func (s *poolSource) Alloc(size uint64, stream gpudevice.Stream) (gpudevice.Ptr, error) {
	p := C.gpumem_call_alloc(s.alloc, C.size_t(size), s.device, C.uintptr_t(stream))
	if p == nil {
		return 0, fmt.Errorf("the pool's own allocator returned NULL for %d bytes: %w", size, gpudevice.ErrOutOfMemory)
	}
	return gpudevice.Ptr(uintptr(p)), nil
}

func (s *poolSource) Free(p gpudevice.Ptr, size uint64, stream gpudevice.Stream) error {
	C.gpumem_call_free(s.free, C.uintptr_t(p), C.size_t(size), s.device, C.uintptr_t(stream))
	return nil
}

//export gpumemGo_pool_uses
func gpumemGo_pool_uses(device C.int, hi, lo C.uint64_t, uses *C.uint64_t) C.gpumem_status {
	*uses = C.uint64_t(theHost().PoolUses(int(device), host.PoolID{Hi: uint64(hi), Lo: uint64(lo)}))
	return 0
}

//export gpumemGo_pool_release
func gpumemGo_pool_release(device C.int, hi, lo C.uint64_t) C.gpumem_status {
	return status(theHost().ReleasePool(int(device), host.PoolID{Hi: uint64(hi), Lo: uint64(lo)}), device)
}

//export gpumemGo_pool_drop
func gpumemGo_pool_drop(device C.int, hi, lo C.uint64_t) C.gpumem_status {
	return status(theHost().DropPool(int(device), host.PoolID{Hi: uint64(hi), Lo: uint64(lo)}), device)
}

// gpumemGo_pool_live copies the pool's live addresses into C's buffer of
// capacity cap (ptrs is C memory; nothing of Go's crosses).
//
//export gpumemGo_pool_live
func gpumemGo_pool_live(device C.int, hi, lo C.uint64_t, ptrs *C.uint64_t, capacity C.size_t, n *C.size_t) C.gpumem_status {
	live := theHost().PoolLive(int(device), host.PoolID{Hi: uint64(hi), Lo: uint64(lo)})
	*n = C.size_t(len(live))
	if len(live) > int(capacity) {
		return fail(fmt.Errorf("%w: pool live: %d addresses, room for %d", host.ErrTooSmall, len(live), capacity), device)
	}
	if len(live) > 0 {
		dst := unsafe.Slice((*uint64)(unsafe.Pointer(ptrs)), len(live))
		copy(dst, live)
	}
	return 0
}

// gpumemGo_pool_checkpoint copies the pool's live buffers into C's array
// of capacity cap, three words each (gpumem_pool_buffer).
//
//export gpumemGo_pool_checkpoint
func gpumemGo_pool_checkpoint(device C.int, hi, lo C.uint64_t, bufs *C.uint64_t, capacity C.size_t, n *C.size_t) C.gpumem_status {
	cp, err := theHost().CheckpointPool(int(device), host.PoolID{Hi: uint64(hi), Lo: uint64(lo)})
	if err != nil {
		return fail(err, device)
	}
	*n = C.size_t(len(cp))
	if len(cp) > int(capacity) {
		return fail(fmt.Errorf("%w: pool checkpoint: %d buffers, room for %d", host.ErrTooSmall, len(cp), capacity), device)
	}
	if len(cp) > 0 {
		dst := unsafe.Slice((*uint64)(unsafe.Pointer(bufs)), 3*len(cp))
		for i, b := range cp {
			dst[3*i], dst[3*i+1], dst[3*i+2] = b.Ptr, b.Size, b.Stream
		}
	}
	return 0
}

//export gpumemGo_pool_restore
func gpumemGo_pool_restore(device C.int, hi, lo C.uint64_t, bufs *C.uint64_t, n C.size_t) C.gpumem_status {
	if n > 1<<30 {
		return fail(fmt.Errorf("%w: pool restore: %d buffers", host.ErrPool, n), device)
	}
	cp := make([]host.PoolBuffer, int(n))
	if n > 0 {
		src := unsafe.Slice((*uint64)(unsafe.Pointer(bufs)), 3*int(n))
		for i := range cp {
			cp[i] = host.PoolBuffer{Ptr: src[3*i], Size: src[3*i+1], Stream: src[3*i+2]}
		}
	}
	_, err := theHost().RestorePool(int(device), host.PoolID{Hi: uint64(hi), Lo: uint64(lo)}, cp)
	return status(err, device)
}

//export gpumemGo_capture_hold
func gpumemGo_capture_hold(device C.int) C.gpumem_status {
	return status(theHost().HoldCapture(int(device)), device)
}

//export gpumemGo_capture_release
func gpumemGo_capture_release(device C.int) C.gpumem_status {
	return status(theHost().ReleaseCapture(int(device)), device)
}

//export gpumemGo_history
func gpumemGo_history(device C.int, enabled C.int, maxEntries C.size_t) C.gpumem_status {
	if maxEntries > 1<<31 {
		maxEntries = 1 << 31
	}
	return status(theHost().RecordHistory(int(device), enabled != 0, int(maxEntries)), device)
}

//export gpumemGo_configure
func gpumemGo_configure(cfg *C.char) C.gpumem_status {
	if cfg == nil {
		return fail(host.ErrConfig, -1)
	}
	return status(theHost().Configure(C.GoString(cfg)), -1)
}

//export gpumemGo_set_limit
func gpumemGo_set_limit(device C.int, n C.uint64_t) C.gpumem_status {
	return status(theHost().SetLimit(int(device), uint64(n)), device)
}

//export gpumemGo_set_memory_fraction
func gpumemGo_set_memory_fraction(device C.int, f C.double) C.gpumem_status {
	return status(theHost().SetLimitFraction(int(device), float64(f)), device)
}

//export gpumemGo_trim
func gpumemGo_trim(device C.int) C.gpumem_status {
	return status(theHost().Trim(int(device)), device)
}

//export gpumemGo_reset_peaks
func gpumemGo_reset_peaks(device C.int) C.gpumem_status {
	theHost().ResetPeaks(int(device))
	return 0
}

//export gpumemGo_get_stats
func gpumemGo_get_stats(device C.int, out *C.gpumem_stats) C.gpumem_status {
	h := theHost()
	s, err := h.Stats(int(device))
	if err != nil {
		return fail(err, device)
	}
	var limit uint64
	if d, err := h.Device(int(device)); err == nil && s.Allocs > 0 {
		limit = d.Alloc.Limit()
	}
	*out = C.gpumem_stats{
		allocated: C.uint64_t(s.Allocated), peak_allocated: C.uint64_t(s.PeakAllocated),
		active: C.uint64_t(s.Active), peak_active: C.uint64_t(s.PeakActive),
		reserved: C.uint64_t(s.Reserved), peak_reserved: C.uint64_t(s.PeakReserved),
		cached: C.uint64_t(s.Cached), releasable: C.uint64_t(s.Releasable),
		largest_free: C.uint64_t(s.LargestFree), fragmentation: C.double(s.Fragmentation),
		live_buffers: C.uint64_t(s.LiveBuffers), allocs: C.uint64_t(s.Allocs), frees: C.uint64_t(s.Frees),
		device_calls: C.uint64_t(s.DeviceCalls()), ooms: C.uint64_t(s.OOMs), trims: C.uint64_t(s.Trims),
		limit:  C.uint64_t(limit),
		splits: C.uint64_t(s.Splits), copies: C.uint64_t(s.Copies),
		copied_bytes: C.uint64_t(s.CopiedBytes), split_ns: C.uint64_t(s.SplitNanos),
		alloc_bytes: C.uint64_t(s.AllocBytes), free_bytes: C.uint64_t(s.FreeBytes),
		alloc_requested: C.uint64_t(s.AllocRequested), free_requested: C.uint64_t(s.FreeRequested),
		segments: C.uint64_t(s.Segments), retries: C.uint64_t(s.Retries),
		device_allocs: C.uint64_t(s.DeviceAllocs), device_frees: C.uint64_t(s.DeviceFrees),
		pool_reserved:     C.uint64_t(h.PoolReserved(int(device))),
		peak_live_buffers: C.uint64_t(s.PeakLiveBuffers), peak_segments: C.uint64_t(s.PeakSegments),
		fences: C.uint64_t(s.Fences), gate_refusals: C.uint64_t(s.GateRefusals),
		driver_ns: C.uint64_t(s.DriverNanos), wait_ns: C.uint64_t(s.WaitNanos),
		misses: C.uint64_t(s.Misses), miss_ns: C.uint64_t(s.MissNanos),
		create_ns: C.uint64_t(s.CreateNanos), map_ns: C.uint64_t(s.MapNanos),
		set_access_ns: C.uint64_t(s.SetAccessNanos), unmap_ns: C.uint64_t(s.UnmapNanos),
		release_ns:  C.uint64_t(s.ReleaseNanos),
		event_calls: C.uint64_t(s.EventCalls), event_ns: C.uint64_t(s.EventNanos),
		mark_calls: C.uint64_t(s.MarkCalls), mark_ns: C.uint64_t(s.MarkNanos),
	}
	return 0
}

//export gpumemGo_get_usage
func gpumemGo_get_usage(device C.int, out *C.gpumem_usage) C.gpumem_status {
	u, err := theHost().Usage(int(device))
	if err != nil {
		return fail(err, device)
	}
	*out = C.gpumem_usage{
		allocated: C.uint64_t(u.Allocated), peak_allocated: C.uint64_t(u.PeakAllocated),
		active: C.uint64_t(u.Active), peak_active: C.uint64_t(u.PeakActive),
		reserved: C.uint64_t(u.Reserved), peak_reserved: C.uint64_t(u.PeakReserved),
	}
	return 0
}

//export gpumemGo_mem_info
func gpumemGo_mem_info(device C.int, free, total *C.uint64_t) C.gpumem_status {
	f, t, err := theHost().MemInfo(int(device))
	if err != nil {
		return fail(err, device)
	}
	*free, *total = C.uint64_t(f), C.uint64_t(t)
	return 0
}

// gpumemGo_json returns device's snapshot (what 0), stats (what 1) or
// snapshot in PyTorch's layout (what 2) as a JSON string in C memory, which
// the caller frees; NULL on failure.
//
//export gpumemGo_json
func gpumemGo_json(device C.int, what C.int) *C.char {
	h := theHost()
	var v any
	var err error
	switch what {
	case 0:
		v, err = h.Snapshot(int(device))
	case 2:
		v = h.TorchSnapshot(int(device))
	default:
		var s gpumem.Stats
		s, err = h.Stats(int(device))
		v = s
	}
	if err != nil {
		fail(err, device)
		return nil
	}
	b, err := json.Marshal(v)
	if err != nil {
		fail(err, device)
		return nil
	}
	return C.CString(string(b))
}

// gpumemGo_serve serves the allocators over HTTP on addr and returns the
// address bound, in C memory the caller frees; NULL on failure.
//
//export gpumemGo_serve
func gpumemGo_serve(addr *C.char) *C.char {
	if addr == nil {
		fail(errors.New("gpumem: serve: no address"), -1)
		return nil
	}
	a, err := theHost().Serve(C.GoString(addr))
	if err != nil {
		fail(err, -1)
		return nil
	}
	return C.CString(a)
}

//export gpumemGo_record_start
func gpumemGo_record_start(device C.int, path *C.char) C.gpumem_status {
	if path == nil {
		return fail(errors.New("gpumem: record: no path"), device)
	}
	return status(theHost().StartRecording(int(device), C.GoString(path)), device)
}

//export gpumemGo_record_stop
func gpumemGo_record_stop(device C.int) C.gpumem_status {
	_, err := theHost().StopRecording(int(device))
	return status(err, device)
}

//export gpumemGo_record_site
func gpumemGo_record_site(device C.int, id C.uint32_t, text *C.char) C.gpumem_status {
	if text == nil {
		return fail(errors.New("gpumem: record site: no text"), device)
	}
	return status(theHost().DefineSite(int(device), uint32(id), C.GoString(text)), device)
}

var version = sync.OnceValue(func() *C.char {
	v := "gpumem (devel)"
	if bi, ok := debug.ReadBuildInfo(); ok {
		rev := ""
		for _, s := range bi.Settings {
			if s.Key == "vcs.revision" && len(s.Value) >= 12 {
				rev = s.Value[:12]
			}
		}
		switch {
		case bi.Main.Version != "" && bi.Main.Version != "(devel)":
			v = "gpumem " + bi.Main.Version
		case rev != "":
			v = "gpumem (devel " + rev + ")"
		}
	}
	return C.CString(v) // kept for the life of the process
})

//export gpumemGo_version
func gpumemGo_version() *C.char { return version() }

//export gpumemGo_import_snapshot
func gpumemGo_import_snapshot(in, out *C.char) C.gpumem_status {
	if in == nil || out == nil {
		return fail(errors.New("gpumem: import: no path"), -1)
	}
	_, err := host.ImportSnapshot(C.GoString(in), C.GoString(out))
	return status(err, -1)
}

// cGate is the preload shim's launch gate (shim/c/gate.c) as a
// gpumem.Gate: `gpumem run` preloads the shim, which sees every driver
// call that submits work.
type cGate struct{ close, open C.uintptr_t }

func (g cGate) Close() error {
	if C.gpumem_call_gate_close(g.close) != 0 {
		return errGateRefused
	}
	return nil
}

func (g cGate) Open() { C.gpumem_call_gate_open(g.open) }

var errGateRefused = errors.New("gpumem: the launch gate refused to close (moves are off in this process, or a driver call did not return)")

// shimGate finds the shim's gate in the process, if it is there.
func shimGate() (gpumem.Gate, bool) {
	c, o := C.gpumem_shim_gate(0), C.gpumem_shim_gate(1)
	if c == 0 || o == 0 {
		return nil, false
	}
	return cGate{close: c, open: o}, true
}

//export gpumemGo_owns
func gpumemGo_owns(ptr C.uintptr_t) C.int {
	if theHost().Owns(uint64(ptr)) {
		return 1
	}
	return 0
}
