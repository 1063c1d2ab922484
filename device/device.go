// Package device is the boundary between gpumem and a GPU: the small set of
// driver operations the allocator needs, stated once with their
// preconditions, so that every backend (the simulated device in device/sim,
// the CUDA driver in device/cuda) implements exactly the same contract.
//
// The interfaces mirror the CUDA driver API directly:
//
//	Device.Alloc/Free            cuMemAlloc / cuMemFree
//	Device.MemInfo               cuMemGetInfo
//	VirtualMemory.Reserve/...    cuMemAddressReserve / cuMemAddressFree
//	VirtualMemory.Create/Release cuMemCreate / cuMemRelease
//	VirtualMemory.Map/Unmap      cuMemMap / cuMemUnmap
//	VirtualMemory.SetAccess      cuMemSetAccess (read-write, this device)
//	Events.*                     cuEventCreate / cuEventRecord / cuEventQuery /
//	                             cuEventSynchronize / cuStreamWaitEvent
//	Markers.Mark/Reached         cuStreamWriteValue64 into pinned host memory /
//	                             a load of that memory
//	Copier.Copy                  cuMemcpyDtoD (asynchronous to the host)
//
// Only Device is required. Optional capabilities are discovered by type
// assertion (see AsVirtualMemory, AsEvents, AsStreams); the allocator works
// without them, with fewer tricks:
//
//	without VirtualMemory: plain segments only (no chunk-granular growth);
//	without Events:        a block freed on one stream is never handed to
//	                       another stream without a full Synchronize;
//	without Copier:        live memory is never moved (Config.Defrag is off);
//	without Markers:       how far a stream has run is asked of the driver
//	                       (an event query) rather than read from memory.
//
// Preconditions common to every backend (a backend may check them and return
// ErrInvalid, but callers must not rely on it):
//
//   - sizes are > 0; VirtualMemory sizes and addresses are multiples of
//     Granularity();
//   - Free, Release, Unmap, ReleaseAddress and DestroyEvent receive only
//     values returned by the same device and not yet given back;
//   - Map maps a whole physical handle at offset 0 into reserved, unmapped
//     address space; Unmap unmaps exactly one earlier Map;
//   - every method is safe for concurrent use.
//
// Errors: a backend reports an exhausted device as an error matching
// ErrOutOfMemory with errors.Is, and any other failure with an error that
// names the operation (an *OpError).
package device

import (
	"errors"
	"fmt"
)

// Ptr is a device address. 0 is never a valid allocation.
type Ptr uint64

// Stream identifies a stream of device work. 0 is the default stream. Only
// identity matters to the allocator; a backend gives it meaning.
type Stream uint64

// Event is a marker recorded into a stream's work; it completes when all work
// enqueued on that stream before the record has finished.
type Event uint64

// Handle names a physical memory chunk created by VirtualMemory.Create.
type Handle uint64

// Info describes a device.
type Info struct {
	Name    string // e.g. "NVIDIA H100 80GB HBM3" or "sim"
	Ordinal int    // device index
	Total   uint64 // total device memory in bytes
}

// Device is the required capability: plain allocations and memory info.
type Device interface {
	// Info describes the device.
	Info() Info
	// MemInfo reports free and total device memory, as cuMemGetInfo does:
	// free counts memory any process could still allocate.
	MemInfo() (free, total uint64, err error)
	// Alloc allocates size bytes of device memory (cuMemAlloc). The
	// address is aligned to at least 512 bytes.
	Alloc(size uint64) (Ptr, error)
	// Free releases an allocation made by Alloc (cuMemFree). It may
	// synchronize with the device.
	Free(p Ptr) error
	// Synchronize waits until all work on all streams has completed.
	Synchronize() error
}

// VirtualMemory is the optional virtual-memory capability: address space
// reserved without backing, physical chunks created apart and mapped into it.
type VirtualMemory interface {
	// Granularity is the size and alignment of physical chunks and of
	// every address and size passed to the methods below (2 MiB on
	// current NVIDIA GPUs).
	Granularity() uint64
	// Reserve reserves size bytes of address space, aligned to align
	// (0 means Granularity()), with no physical memory behind it.
	Reserve(size, align uint64) (Ptr, error)
	// ReleaseAddress gives back a whole reservation; nothing may be
	// mapped in it.
	ReleaseAddress(p Ptr, size uint64) error
	// Create creates a physical chunk of size bytes (cuMemCreate). It
	// fails with ErrOutOfMemory when the device has no room.
	Create(size uint64) (Handle, error)
	// Release gives back a physical chunk. The device frees it once it is
	// no longer mapped anywhere.
	Release(h Handle) error
	// Map maps the whole chunk h at p, which must be reserved and unmapped.
	Map(p Ptr, size uint64, h Handle) error
	// SetAccess makes [p, p+size) readable and writable from this device.
	// The range may span several mappings; one call per range is the
	// cheap way.
	SetAccess(p Ptr, size uint64) error
	// Unmap unmaps [p, p+size), which must be exactly one earlier Map.
	// Work still using the range must have completed.
	Unmap(p Ptr, size uint64) error
}

// Events is the optional stream-ordering capability.
type Events interface {
	// NewEvent creates an event (timing disabled).
	NewEvent() (Event, error)
	// DestroyEvent destroys an event.
	DestroyEvent(e Event) error
	// Record records e at the current end of stream s.
	Record(e Event, s Stream) error
	// Query reports whether the work before e's last record has completed.
	// An event never recorded is complete.
	Query(e Event) (bool, error)
	// Wait blocks the host until e has completed (cuEventSynchronize).
	Wait(e Event) error
	// StreamWait makes all future work on s wait for e (cuStreamWaitEvent);
	// it does not block the host.
	StreamWait(s Stream, e Event) error
}

// Marker is a word of host memory that the device writes in stream order
// (Markers).
type Marker uint64

// Markers is the optional capability of host-visible stream markers: a
// word of pinned host memory that a stream writes when its work before the
// write is done (cuStreamWriteValue64 to memory from cuMemHostAlloc, mapped
// for the device). The host then learns how far the stream has run by
// reading the word, with no driver call: what an event query says, for
// the cost of a load (1.3 us against a few nanoseconds on an H200). The
// write costs more than a record, to the host (2-3 us against 0.15) and to
// the stream (2.8 us of GPU time against none), so markers pay where a
// point is queried more often than it is written (docs/BENCHMARKS.md,
// "Stream markers on an H200").
//
// Support depends on the device (CU_DEVICE_ATTRIBUTE_CAN_USE_64_BIT_STREAM_MEM_OPS):
// where it has none NewMarker fails with an error matching ErrUnsupported,
// so a caller tries once and keeps to its events. A marker, like an event,
// must not be written on a stream that is being captured (Capture): the
// write would become a node of the graph.
type Markers interface {
	// NewMarker creates a marker whose value is 0.
	NewMarker() (Marker, error)
	// DestroyMarker gives a marker back. A write to it still pending may
	// land later: a backend gives its memory to no other marker before
	// that.
	DestroyMarker(m Marker) error
	// Mark enqueues on s a write of v to m: it lands once all work
	// enqueued on s before it has completed. One stream writes a marker,
	// each write a larger value than the last.
	Mark(m Marker, s Stream, v uint64) error
	// Reached returns the value of the last write to m that has landed
	// (0 before any). Writes land in the order they were enqueued on
	// their stream, so with one stream writing increasing values,
	// Reached(m) >= v means the work before the write of v is done. It
	// makes no driver call.
	Reached(m Marker) uint64
}

// AsMarkers returns d's marker capability, if its type has one (whether
// the device supports it is known only when NewMarker succeeds).
func AsMarkers(d Device) (Markers, bool) {
	m, ok := d.(Markers)
	return m, ok
}

// Streams is the optional capability of creating streams (for tests, replay
// and programs that let gpumem own their streams).
type Streams interface {
	NewStream() (Stream, error)
	DestroyStream(s Stream) error
	// SynchronizeStream waits until all work on s has completed.
	SynchronizeStream(s Stream) error
}

// Copier is the optional capability of copying device memory, with which the
// allocator moves live chunks to new physical memory (Config.Defrag).
type Copier interface {
	// Copy enqueues a copy of n bytes from src to dst, in order with the
	// other copies; it is complete once Device.Synchronize returns (a
	// backend may finish it sooner). Both ranges must be mapped with
	// access, each inside one mapping, and must not overlap, until then;
	// work using either must have completed before the call.
	Copy(dst, src Ptr, n uint64) error
}

// Exporter is the optional capability of sharing physical chunks with
// other processes (cuMemExportToShareableHandle, POSIX file descriptors):
// another process imports the descriptor (cuMemImportFromShareableHandle)
// and maps the chunk in its own address space. The chunk's memory then
// lives until every process that holds it has released its handle, so a
// chunk given back here stays allocated while an importer still maps it.
type Exporter interface {
	// Export returns a new file descriptor for chunk h, owned by the
	// caller (close it once it is sent). It fails, matching
	// ErrUnsupported, where the chunk was not created shareable.
	Export(h Handle) (fd int, err error)
}

// AsExporter returns d's export capability, if it has one.
func AsExporter(d Device) (Exporter, bool) {
	e, ok := d.(Exporter)
	return e, ok
}

// Capture is the optional capability of telling which streams are being
// captured into a CUDA graph (cuStreamGetCaptureInfo). Work enqueued on a
// capturing stream is recorded into the graph, not run: recording an event
// on such a stream, querying or waiting for one recorded there, or
// synchronizing it or the whole device breaks the capture (the driver
// invalidates it, and the program's graph is lost). An allocator must do
// none of these while a capture is underway (see gpumem's BeginCapture).
type Capture interface {
	// CaptureInfo reports whether work on s is being captured, and the id
	// of that capture: shared by every stream that joined it, unique in
	// the process.
	CaptureInfo(s Stream) (capturing bool, id uint64, err error)
}

// Node is a node of the graph a capture builds (CUgraphNode).
type Node uintptr

// CaptureGraph is the optional capability of reading the graph a capture
// is building (cuStreamGetCaptureInfo's dependencies,
// cuGraphNodeGetDependencies), which the driver allows during a capture.
// With it an allocator can tell, with no event, when the work of every
// stream that used a buffer comes before the work a stream captures next:
// the buffer may then be reused on that stream within the capture (see
// gpumem's SetCaptureReuse).
type CaptureGraph interface {
	// CaptureTerminals appends to buf the nodes the next work captured on
	// s will depend on (none before the capture's first work), and
	// reports whether s captures, and the capture's id (as CaptureInfo).
	CaptureTerminals(s Stream, buf []Node) (nodes []Node, id uint64, capturing bool, err error)
	// NodeParents appends to buf the nodes that n depends on.
	NodeParents(n Node, buf []Node) ([]Node, error)
}

// AsCaptureGraph returns d's capture-graph capability, if it has one.
func AsCaptureGraph(d Device) (CaptureGraph, bool) {
	c, ok := d.(CaptureGraph)
	return c, ok
}

// AsCapture returns d's capture capability, if it has one.
func AsCapture(d Device) (Capture, bool) {
	c, ok := d.(Capture)
	return c, ok
}

// AsCopier returns d's copy capability, if it has one.
func AsCopier(d Device) (Copier, bool) {
	c, ok := d.(Copier)
	return c, ok
}

// AsVirtualMemory returns d's virtual-memory capability, if it has one.
func AsVirtualMemory(d Device) (VirtualMemory, bool) {
	vm, ok := d.(VirtualMemory)
	return vm, ok
}

// AsEvents returns d's event capability, if it has one.
func AsEvents(d Device) (Events, bool) {
	ev, ok := d.(Events)
	return ev, ok
}

// AsStreams returns d's stream capability, if it has one.
func AsStreams(d Device) (Streams, bool) {
	st, ok := d.(Streams)
	return st, ok
}

// Sentinel errors. Match them with errors.Is.
var (
	// ErrOutOfMemory: the device has no room for the request.
	ErrOutOfMemory = errors.New("device out of memory")
	// ErrInvalid: a precondition was violated (a bad size, an address or
	// handle the device never gave out, a double release).
	ErrInvalid = errors.New("invalid argument")
	// ErrUnsupported: the device lacks the capability.
	ErrUnsupported = errors.New("not supported by this device")
	// ErrNoDriver: the driver library could not be loaded.
	ErrNoDriver = errors.New("GPU driver not available")
	// ErrInjected: a fault injected by a test hook.
	ErrInjected = errors.New("injected fault")
	// ErrCapturing: the operation is not permitted while a stream is being
	// captured into a CUDA graph (see Capture).
	ErrCapturing = errors.New("operation not permitted when stream is capturing")
)

// OpError reports a failed device operation: which operation, with which
// arguments, and the underlying error (a sentinel above or a driver code).
type OpError struct {
	Op   string // e.g. "cuMemCreate" or "sim.Map"
	Args string // e.g. "size=2097152"
	Err  error
}

func (e *OpError) Error() string {
	if e.Args == "" {
		return fmt.Sprintf("%s: %v", e.Op, e.Err)
	}
	return fmt.Sprintf("%s(%s): %v", e.Op, e.Args, e.Err)
}

func (e *OpError) Unwrap() error { return e.Err }
