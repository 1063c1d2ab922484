package cuda

import (
	"fmt"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"unsafe"

	"github.com/gpumem/gpumem/device"
)

// Device is one CUDA device driven through its primary context. It
// implements device.Device, device.VirtualMemory, device.Events,
// device.Markers (markers.go) and device.Streams; every method is safe for
// concurrent use.
type Device struct {
	drv     *driver
	ordinal int
	dev     int32   // CUdevice
	ctx     uintptr // CUcontext: the retained primary context
	closed  atomic.Bool

	info device.Info
	uuid string
	gran uint64 // minimum VMM granularity
	vmm  bool   // CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED
	cc   [2]int // compute capability

	books vmBooks // reservations and mappings, see vmstate.go

	// plainOnly: a shareable cuMemCreate failed as not supported (a
	// driver or platform without POSIX file descriptor handles), so
	// chunks are made plain from then on and Export refuses.
	plainOnly atomic.Bool

	modMu      sync.Mutex
	module     uintptr // CUmodule of the kernels, 0 until first Spin or HoldUntil
	kernels    kernels // its CUfunctions
	spinTarget string  // the PTX target the kernel was built for

	marks markerBooks // markers.go
}

var (
	_ device.Device        = (*Device)(nil)
	_ device.VirtualMemory = (*Device)(nil)
	_ device.Events        = (*Device)(nil)
	_ device.Markers       = (*Device)(nil)
	_ device.Streams       = (*Device)(nil)
	_ device.Capture       = (*Device)(nil)
	_ device.Exporter      = (*Device)(nil)
)

// Open loads the driver (once per process), initializes it, and retains the
// primary context of the device with the given ordinal (as numbered by the
// driver, after CUDA_VISIBLE_DEVICES). Close releases the context.
//
// Without a driver the error matches device.ErrNoDriver and reads
// "libcuda.so.1 not found: no NVIDIA driver on this machine".
func Open(ordinal int) (*Device, error) {
	drv, err := getDriver()
	if err != nil {
		return nil, err
	}
	if ordinal < 0 {
		return nil, opError(drv, "cuDeviceGet", cudaErrInvalidValue, fmt.Sprintf("ordinal=%d", ordinal))
	}
	d := &Device{drv: drv, ordinal: ordinal}
	if r := ccall(drv.cuDeviceGet, uintptr(unsafe.Pointer(&d.dev)), uintptr(ordinal)); r != cudaSuccess {
		return nil, opError(drv, "cuDeviceGet", r, fmt.Sprintf("ordinal=%d", ordinal))
	}
	name := make([]byte, 256)
	if r := ccall(drv.cuDeviceGetName, uintptr(unsafe.Pointer(&name[0])), uintptr(len(name)), uintptr(d.dev)); r != cudaSuccess {
		return nil, opError(drv, "cuDeviceGetName", r, fmt.Sprintf("ordinal=%d", ordinal))
	}
	var total uint64
	if r := ccall(drv.cuDeviceTotalMem, uintptr(unsafe.Pointer(&total)), uintptr(d.dev)); r != cudaSuccess {
		return nil, opError(drv, "cuDeviceTotalMem", r, fmt.Sprintf("ordinal=%d", ordinal))
	}
	d.info = device.Info{Name: cString(name), Ordinal: ordinal, Total: total}
	var uuid [16]byte
	if r := ccall(drv.cuDeviceGetUuid, uintptr(unsafe.Pointer(&uuid[0])), uintptr(d.dev)); r != cudaSuccess {
		return nil, opError(drv, "cuDeviceGetUuid", r, fmt.Sprintf("ordinal=%d", ordinal))
	}
	d.uuid = formatUUID(uuid)
	d.vmm = d.attribute(cuDeviceAttrVirtualMemorySupported) == 1
	d.cc = [2]int{d.attribute(cuDeviceAttrComputeCapMajor), d.attribute(cuDeviceAttrComputeCapMinor)}
	d.marks.init(drv, d.attribute(cuDeviceAttrStreamMemOps64), d.attribute(cuDeviceAttrStreamMemOps64V1))

	if r := ccall(drv.cuDevicePrimaryCtxRetain, uintptr(unsafe.Pointer(&d.ctx)), uintptr(d.dev)); r != cudaSuccess {
		return nil, opError(drv, "cuDevicePrimaryCtxRetain", r, fmt.Sprintf("ordinal=%d", ordinal))
	}

	d.gran = 2 << 20
	if d.vmm {
		prop := devicePinnedProp(ordinal, false)
		var g uint64
		r := d.call(drv.cuMemGetAllocationGranularity, uintptr(unsafe.Pointer(&g)), uintptr(unsafe.Pointer(&prop)), cuMemAllocGranularityMinimum)
		runtime.KeepAlive(&prop)
		if r != cudaSuccess {
			err := opError(drv, "cuMemGetAllocationGranularity", r, "option=MINIMUM")
			d.Close()
			return nil, err
		}
		if g != 0 {
			d.gran = g
		}
	}
	return d, nil
}

// attribute reads an integer device attribute, -1 when the driver refuses.
func (d *Device) attribute(attr int) int {
	var v int32
	if ccall(d.drv.cuDeviceGetAttribute, uintptr(unsafe.Pointer(&v)), uintptr(attr), uintptr(d.dev)) != cudaSuccess {
		return -1
	}
	return int(v)
}

// formatUUID spells a CUuuid as NVML and nvidia-smi do:
// GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx.
func formatUUID(u [16]byte) string {
	return fmt.Sprintf("GPU-%x-%x-%x-%x-%x", u[0:4], u[4:6], u[6:8], u[8:10], u[10:16])
}

// call makes the primary context current on this OS thread, calls fn, and
// puts back the context that was current before, with the goroutine locked
// to the thread in between so that fn runs where the context was made
// current. See the package documentation.
//
//go:uintptrescapes
func (d *Device) call(fn uintptr, args ...uintptr) result {
	if d.closed.Load() {
		return resultClosed
	}
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	// Relaxed capture mode for the call (see "Graph capture" in doc.go):
	// the mode the thread had is exchanged back afterwards.
	mode := uintptr(cuStreamCaptureModeRelaxed)
	if r := ccall(d.drv.cuThreadExchangeStreamCaptureMode, uintptr(unsafe.Pointer(&mode))); r != cudaSuccess {
		return r
	}
	defer ccall(d.drv.cuThreadExchangeStreamCaptureMode, uintptr(unsafe.Pointer(&mode)))
	var prev uintptr
	if r := ccall(d.drv.cuCtxGetCurrent, uintptr(unsafe.Pointer(&prev))); r != cudaSuccess {
		return r
	}
	if prev == d.ctx {
		return ccall(fn, args...)
	}
	if r := ccall(d.drv.cuCtxSetCurrent, d.ctx); r != cudaSuccess {
		return r
	}
	r := ccall(fn, args...)
	ccall(d.drv.cuCtxSetCurrent, prev) // prev was current a moment ago: cannot fail
	return r
}

// CUstreamCaptureMode and CUstreamCaptureStatus values (cuda.h).
const (
	cuStreamCaptureModeRelaxed  = 2
	cuStreamCaptureStatusActive = 1
)

// CaptureInfo reports whether stream s is being captured into a CUDA graph,
// and the id of the capture (cuStreamGetCaptureInfo). A capture that was
// invalidated counts as underway until it is ended: it is no more legal to
// record on its stream. device.Capture.
func (d *Device) CaptureInfo(s device.Stream) (bool, uint64, error) {
	var status int32
	var id uint64
	if r := d.call(d.drv.cuStreamGetCaptureInfo, uintptr(s), uintptr(unsafe.Pointer(&status)), uintptr(unsafe.Pointer(&id)), 0, 0, 0, 0); r != cudaSuccess {
		return false, 0, d.fail("cuStreamGetCaptureInfo", r, "stream=%#x", uint64(s))
	}
	return status != 0, id, nil
}

// CaptureTerminals appends to buf the nodes the next work captured on s
// will depend on (cuStreamGetCaptureInfo_v2's dependencies), the id of its
// capture, and whether s captures (an invalidated capture counts as not:
// nothing may be added to it). device.CaptureGraph.
func (d *Device) CaptureTerminals(s device.Stream, buf []device.Node) ([]device.Node, uint64, bool, error) {
	if d.drv.cuStreamGetCaptureInfo2 == 0 || d.drv.cuGraphNodeGetDependencies == 0 {
		return buf, 0, false, d.fail("cuStreamGetCaptureInfo_v2", cudaErrNotSupported, "stream=%#x: the driver lacks cuStreamGetCaptureInfo_v2 or cuGraphNodeGetDependencies", uint64(s))
	}
	var status int32
	var id uint64
	var graph uintptr
	var deps *uintptr
	var n uintptr
	if r := d.call(d.drv.cuStreamGetCaptureInfo2, uintptr(s), uintptr(unsafe.Pointer(&status)), uintptr(unsafe.Pointer(&id)),
		uintptr(unsafe.Pointer(&graph)), uintptr(unsafe.Pointer(&deps)), uintptr(unsafe.Pointer(&n))); r != cudaSuccess {
		return buf, 0, false, d.fail("cuStreamGetCaptureInfo_v2", r, "stream=%#x", uint64(s))
	}
	if status != cuStreamCaptureStatusActive {
		return buf, 0, false, nil
	}
	// deps points at n node handles the driver owns until the stream's
	// next captured work; copied out at once.
	if n > 0 && deps != nil {
		for _, node := range unsafe.Slice(deps, n) {
			buf = append(buf, device.Node(node))
		}
	}
	return buf, id, true, nil
}

// NodeParents appends to buf the nodes n depends on
// (cuGraphNodeGetDependencies). device.CaptureGraph.
func (d *Device) NodeParents(n device.Node, buf []device.Node) ([]device.Node, error) {
	if d.drv.cuGraphNodeGetDependencies == 0 {
		return buf, d.fail("cuGraphNodeGetDependencies", cudaErrNotSupported, "node=%#x: the driver lacks it", uint64(n))
	}
	var count uintptr
	if r := d.call(d.drv.cuGraphNodeGetDependencies, uintptr(n), 0, uintptr(unsafe.Pointer(&count))); r != cudaSuccess {
		return buf, d.fail("cuGraphNodeGetDependencies", r, "node=%#x", uint64(n))
	}
	if count == 0 {
		return buf, nil
	}
	at := len(buf)
	buf = slices.Grow(buf, int(count))[:at+int(count)]
	got := count
	if r := d.call(d.drv.cuGraphNodeGetDependencies, uintptr(n), uintptr(unsafe.Pointer(&buf[at])), uintptr(unsafe.Pointer(&got))); r != cudaSuccess {
		return buf[:at], d.fail("cuGraphNodeGetDependencies", r, "node=%#x", uint64(n))
	}
	return buf[:at+int(min(got, count))], nil
}

// fail builds the *device.OpError for a failed call; the arguments are only
// formatted on this path.
func (d *Device) fail(op string, r result, format string, a ...any) error {
	return opError(d.drv, op, r, fmt.Sprintf(format, a...))
}

// Close releases the primary context (cuDevicePrimaryCtxRelease) and the
// spin kernel's module. Memory, events and streams still alive stay valid as
// long as some other holder (the CUDA runtime, another Device) keeps the
// primary context. Close is idempotent; every other method fails with
// ErrClosed afterwards.
func (d *Device) Close() error {
	d.modMu.Lock()
	defer d.modMu.Unlock()
	if d.closed.Load() {
		return nil
	}
	err := d.freeMarkers()
	if d.module != 0 {
		if r := d.call(d.drv.cuModuleUnload, d.module); r != cudaSuccess && err == nil {
			err = d.fail("cuModuleUnload", r, "module=%#x", d.module)
		}
		d.module, d.kernels = 0, kernels{}
	}
	d.closed.Store(true)
	if r := ccall(d.drv.cuDevicePrimaryCtxRelease, uintptr(d.dev)); r != cudaSuccess && err == nil {
		err = d.fail("cuDevicePrimaryCtxRelease", r, "ordinal=%d", d.ordinal)
	}
	return err
}

// Info describes the device: its name (cuDeviceGetName), ordinal and total
// memory (cuDeviceTotalMem).
func (d *Device) Info() device.Info { return d.info }

// UUID is the device's UUID as NVML spells it ("GPU-8-4-4-4-12" hex), which
// identifies the same GPU in nvml whatever CUDA_VISIBLE_DEVICES says.
func (d *Device) UUID() string { return d.uuid }

// ComputeCapability reports the device's compute capability, e.g. 9, 0 for
// an H100.
func (d *Device) ComputeCapability() (major, minor int) { return d.cc[0], d.cc[1] }

// VirtualMemorySupported reports whether the device supports the
// virtual-memory calls (CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED).
// Without it they fail with errors matching device.ErrUnsupported.
func (d *Device) VirtualMemorySupported() bool { return d.vmm }

// MemInfo reports free and total device memory (cuMemGetInfo).
func (d *Device) MemInfo() (free, total uint64, err error) {
	if r := d.call(d.drv.cuMemGetInfo, uintptr(unsafe.Pointer(&free)), uintptr(unsafe.Pointer(&total))); r != cudaSuccess {
		return 0, 0, d.fail("cuMemGetInfo", r, "")
	}
	return free, total, nil
}

// Alloc allocates size bytes of device memory (cuMemAlloc).
func (d *Device) Alloc(size uint64) (device.Ptr, error) {
	var p uint64
	if r := d.call(d.drv.cuMemAlloc, uintptr(unsafe.Pointer(&p)), uintptr(size)); r != cudaSuccess {
		return 0, d.fail("cuMemAlloc", r, "size=%d", size)
	}
	return device.Ptr(p), nil
}

// Free releases an allocation made by Alloc (cuMemFree).
func (d *Device) Free(p device.Ptr) error {
	if r := d.call(d.drv.cuMemFree, uintptr(p)); r != cudaSuccess {
		return d.fail("cuMemFree", r, "ptr=%#x", uint64(p))
	}
	return nil
}

// Synchronize waits for all work in the primary context (cuCtxSynchronize).
func (d *Device) Synchronize() error {
	if r := d.call(d.drv.cuCtxSynchronize); r != cudaSuccess {
		return d.fail("cuCtxSynchronize", r, "")
	}
	return nil
}

// Granularity is the minimum granularity of physical chunks
// (cuMemGetAllocationGranularity with CU_MEM_ALLOC_GRANULARITY_MINIMUM),
// 2 MiB on current GPUs.
func (d *Device) Granularity() uint64 { return d.gran }

// Reserve reserves size bytes of address space (cuMemAddressReserve).
func (d *Device) Reserve(size, align uint64) (device.Ptr, error) {
	if align == 0 {
		align = d.gran
	}
	var p uint64
	if r := d.call(d.drv.cuMemAddressReserve, uintptr(unsafe.Pointer(&p)), uintptr(size), uintptr(align), 0, 0); r != cudaSuccess {
		return 0, d.fail("cuMemAddressReserve", r, "size=%d, align=%d", size, align)
	}
	d.books.addReservation(device.Ptr(p), size)
	return device.Ptr(p), nil
}

// ReleaseAddress gives back a reservation (cuMemAddressFree). It must be
// exactly one earlier Reserve with nothing mapped in it, else the error
// matches device.ErrInvalid (ErrNotReserved, ErrStillMapped).
func (d *Device) ReleaseAddress(p device.Ptr, size uint64) error {
	if err := d.books.takeReservation(p, size); err != nil {
		return &device.OpError{Op: "cuMemAddressFree", Args: fmt.Sprintf("ptr=%#x, size=%d", uint64(p), size), Err: err}
	}
	if r := d.call(d.drv.cuMemAddressFree, uintptr(p), uintptr(size)); r != cudaSuccess {
		d.books.putReservation(p, size)
		return d.fail("cuMemAddressFree", r, "ptr=%#x, size=%d", uint64(p), size)
	}
	return nil
}

// Create creates a physical chunk of size bytes on this device (cuMemCreate,
// pinned device memory), shareable with other processes through a POSIX
// file descriptor (Export). Where the driver refuses shareable chunks as
// unsupported, it makes plain ones from then on, and Export says why.
func (d *Device) Create(size uint64) (device.Handle, error) {
	if !d.plainOnly.Load() {
		h, r := d.create(size, true)
		switch r {
		case cudaSuccess:
			return h, nil
		case cudaErrNotSupported, cudaErrNotPermitted:
			// Not the memory: the handle type. Plain from now on.
			d.plainOnly.Store(true)
		default:
			return 0, d.fail("cuMemCreate", r, "size=%d", size)
		}
	}
	h, r := d.create(size, false)
	if r != cudaSuccess {
		return 0, d.fail("cuMemCreate", r, "size=%d", size)
	}
	return h, nil
}

func (d *Device) create(size uint64, shareable bool) (device.Handle, result) {
	prop := devicePinnedProp(d.ordinal, shareable)
	var h uint64
	r := d.call(d.drv.cuMemCreate, uintptr(unsafe.Pointer(&h)), uintptr(size), uintptr(unsafe.Pointer(&prop)), 0)
	runtime.KeepAlive(&prop)
	return device.Handle(h), r
}

// Export returns a POSIX file descriptor for chunk h
// (cuMemExportToShareableHandle), which another process imports with
// cuMemImportFromShareableHandle. The caller owns the descriptor.
func (d *Device) Export(h device.Handle) (int, error) {
	if d.drv.cuMemExportToShareableHandle == 0 {
		return -1, &device.OpError{Op: "cuMemExportToShareableHandle", Args: fmt.Sprintf("handle=%#x", uint64(h)),
			Err: fmt.Errorf("%w: the driver has no cuMemExportToShareableHandle", device.ErrUnsupported)}
	}
	if d.plainOnly.Load() {
		return -1, &device.OpError{Op: "cuMemExportToShareableHandle", Args: fmt.Sprintf("handle=%#x", uint64(h)),
			Err: fmt.Errorf("%w: the driver refused shareable (POSIX file descriptor) chunks on this device, so gpumem makes plain ones", device.ErrUnsupported)}
	}
	var fd int32 = -1
	if r := d.call(d.drv.cuMemExportToShareableHandle, uintptr(unsafe.Pointer(&fd)), uintptr(h), cuMemHandleTypePosixFD, 0); r != cudaSuccess {
		return -1, d.fail("cuMemExportToShareableHandle", r, "handle=%#x", uint64(h))
	}
	return int(fd), nil
}

// Release gives back a physical chunk (cuMemRelease).
func (d *Device) Release(h device.Handle) error {
	if r := d.call(d.drv.cuMemRelease, uintptr(h)); r != cudaSuccess {
		return d.fail("cuMemRelease", r, "handle=%#x", uint64(h))
	}
	return nil
}

// Map maps the whole chunk h at p (cuMemMap, offset 0).
func (d *Device) Map(p device.Ptr, size uint64, h device.Handle) error {
	if err := d.books.checkUnmapped(p); err != nil {
		return &device.OpError{Op: "cuMemMap", Args: fmt.Sprintf("ptr=%#x, size=%d, handle=%#x", uint64(p), size, uint64(h)), Err: err}
	}
	if r := d.call(d.drv.cuMemMap, uintptr(p), uintptr(size), 0, uintptr(h), 0); r != cudaSuccess {
		return d.fail("cuMemMap", r, "ptr=%#x, size=%d, handle=%#x", uint64(p), size, uint64(h))
	}
	d.books.addMapping(p, size)
	return nil
}

// SetAccess makes [p, p+size) readable and writable from this device, in
// one cuMemSetAccess call over the whole range.
func (d *Device) SetAccess(p device.Ptr, size uint64) error {
	desc := deviceReadWrite(d.ordinal)
	r := d.call(d.drv.cuMemSetAccess, uintptr(p), uintptr(size), uintptr(unsafe.Pointer(&desc)), 1)
	runtime.KeepAlive(&desc)
	if r != cudaSuccess {
		return d.fail("cuMemSetAccess", r, "ptr=%#x, size=%d", uint64(p), size)
	}
	return nil
}

// Unmap unmaps [p, p+size) (cuMemUnmap). The range must be exactly one
// earlier Map of this Device, else the error matches device.ErrInvalid
// (ErrNotMapped): the driver itself accepts some such ranges silently.
func (d *Device) Unmap(p device.Ptr, size uint64) error {
	if err := d.books.takeMapping(p, size); err != nil {
		return &device.OpError{Op: "cuMemUnmap", Args: fmt.Sprintf("ptr=%#x, size=%d", uint64(p), size), Err: err}
	}
	if r := d.call(d.drv.cuMemUnmap, uintptr(p), uintptr(size)); r != cudaSuccess {
		d.books.putMapping(p, size)
		return d.fail("cuMemUnmap", r, "ptr=%#x, size=%d", uint64(p), size)
	}
	return nil
}

// NewEvent creates an event with timing disabled (cuEventCreate with
// CU_EVENT_DISABLE_TIMING).
func (d *Device) NewEvent() (device.Event, error) {
	var e uintptr
	if r := d.call(d.drv.cuEventCreate, uintptr(unsafe.Pointer(&e)), cuEventDisableTiming); r != cudaSuccess {
		return 0, d.fail("cuEventCreate", r, "flags=CU_EVENT_DISABLE_TIMING")
	}
	return device.Event(e), nil
}

// DestroyEvent destroys an event (cuEventDestroy).
func (d *Device) DestroyEvent(e device.Event) error {
	if r := d.call(d.drv.cuEventDestroy, uintptr(e)); r != cudaSuccess {
		return d.fail("cuEventDestroy", r, "event=%#x", uint64(e))
	}
	return nil
}

// Record records e at the current end of stream s (cuEventRecord).
func (d *Device) Record(e device.Event, s device.Stream) error {
	if r := d.call(d.drv.cuEventRecord, uintptr(e), uintptr(s)); r != cudaSuccess {
		return d.fail("cuEventRecord", r, "event=%#x, stream=%#x", uint64(e), uint64(s))
	}
	return nil
}

// Query reports whether e has completed (cuEventQuery: CUDA_SUCCESS is true,
// CUDA_ERROR_NOT_READY false, anything else an error).
func (d *Device) Query(e device.Event) (bool, error) {
	switch r := d.call(d.drv.cuEventQuery, uintptr(e)); r {
	case cudaSuccess:
		return true, nil
	case cudaErrNotReady:
		return false, nil
	default:
		return false, d.fail("cuEventQuery", r, "event=%#x", uint64(e))
	}
}

// Wait blocks until e has completed (cuEventSynchronize).
func (d *Device) Wait(e device.Event) error {
	if r := d.call(d.drv.cuEventSynchronize, uintptr(e)); r != cudaSuccess {
		return d.fail("cuEventSynchronize", r, "event=%#x", uint64(e))
	}
	return nil
}

// StreamWait makes future work on s wait for e (cuStreamWaitEvent).
func (d *Device) StreamWait(s device.Stream, e device.Event) error {
	if r := d.call(d.drv.cuStreamWaitEvent, uintptr(s), uintptr(e), 0); r != cudaSuccess {
		return d.fail("cuStreamWaitEvent", r, "stream=%#x, event=%#x", uint64(s), uint64(e))
	}
	return nil
}

// NewStream creates a stream that does not synchronize with the default
// stream (cuStreamCreate with CU_STREAM_NON_BLOCKING).
func (d *Device) NewStream() (device.Stream, error) {
	var s uintptr
	if r := d.call(d.drv.cuStreamCreate, uintptr(unsafe.Pointer(&s)), cuStreamNonBlocking); r != cudaSuccess {
		return 0, d.fail("cuStreamCreate", r, "flags=CU_STREAM_NON_BLOCKING")
	}
	return device.Stream(s), nil
}

// DestroyStream destroys a stream (cuStreamDestroy); work already on it
// still completes.
func (d *Device) DestroyStream(s device.Stream) error {
	if r := d.call(d.drv.cuStreamDestroy, uintptr(s)); r != cudaSuccess {
		return d.fail("cuStreamDestroy", r, "stream=%#x", uint64(s))
	}
	return nil
}

// SynchronizeStream waits for all work on s (cuStreamSynchronize).
func (d *Device) SynchronizeStream(s device.Stream) error {
	if r := d.call(d.drv.cuStreamSynchronize, uintptr(s)); r != cudaSuccess {
		return d.fail("cuStreamSynchronize", r, "stream=%#x", uint64(s))
	}
	return nil
}

// Memset8 sets n bytes at p to value (cuMemsetD8), ordered on the default
// stream.
func (d *Device) Memset8(p device.Ptr, value byte, n uint64) error {
	if r := d.call(d.drv.cuMemsetD8, uintptr(p), uintptr(value), uintptr(n)); r != cudaSuccess {
		return d.fail("cuMemsetD8", r, "ptr=%#x, value=%d, n=%d", uint64(p), value, n)
	}
	return nil
}

// MemsetAsync enqueues on stream s the setting of n bytes at p to value
// (cuMemsetD8Async).
func (d *Device) MemsetAsync(p device.Ptr, value byte, n uint64, s device.Stream) error {
	if r := d.call(d.drv.cuMemsetD8Async, uintptr(p), uintptr(value), uintptr(n), uintptr(s)); r != cudaSuccess {
		return d.fail("cuMemsetD8Async", r, "ptr=%#x, value=%d, n=%d, stream=%#x", uint64(p), value, n, uint64(s))
	}
	return nil
}

// Copy enqueues a copy of n bytes from src to dst (cuMemcpyDtoD, on the
// legacy default stream: copies run in order, and a copy between device
// addresses does not block the host); Synchronize waits for it.
func (d *Device) Copy(dst, src device.Ptr, n uint64) error {
	if r := d.call(d.drv.cuMemcpyDtoD, uintptr(dst), uintptr(src), uintptr(n)); r != cudaSuccess {
		return d.fail("cuMemcpyDtoD", r, "dst=%#x, src=%#x, n=%d", uint64(dst), uint64(src), n)
	}
	return nil
}

// CopyToHost copies len(dst) bytes from device address src into dst
// (cuMemcpyDtoH). It returns when the copy is complete.
func (d *Device) CopyToHost(dst []byte, src device.Ptr) error {
	if len(dst) == 0 {
		return nil
	}
	r := d.call(d.drv.cuMemcpyDtoH, uintptr(unsafe.Pointer(&dst[0])), uintptr(src), uintptr(len(dst)))
	runtime.KeepAlive(dst)
	if r != cudaSuccess {
		return d.fail("cuMemcpyDtoH", r, "src=%#x, n=%d", uint64(src), len(dst))
	}
	return nil
}

// CopyFromHost copies src to device address dst (cuMemcpyHtoD). It returns
// once src has been read; src may be reused at once.
func (d *Device) CopyFromHost(dst device.Ptr, src []byte) error {
	if len(src) == 0 {
		return nil
	}
	r := d.call(d.drv.cuMemcpyHtoD, uintptr(dst), uintptr(unsafe.Pointer(&src[0])), uintptr(len(src)))
	runtime.KeepAlive(src)
	if r != cudaSuccess {
		return d.fail("cuMemcpyHtoD", r, "dst=%#x, n=%d", uint64(dst), len(src))
	}
	return nil
}
