// Package cuda implements the gpumem device interfaces (device.Device,
// device.VirtualMemory, device.Events, device.Streams) on an NVIDIA GPU
// through the CUDA driver API.
//
// # What is loaded
//
// The driver library libcuda.so.1 is loaded at run time with dlopen through
// github.com/ebitengine/purego: there is no cgo, and neither the CUDA headers
// nor the toolkit are needed to build (CGO_ENABLED=0 builds work). A program
// that imports this package runs on machines without a GPU; Open then fails
// with an error matching device.ErrNoDriver:
//
//	libcuda.so.1 not found: no NVIDIA driver on this machine
//
// The versioned entry points are looked up by their exported names
// (cuMemAlloc_v2, cuMemFree_v2, cuMemGetInfo_v2, cuDeviceTotalMem_v2,
// cuEventDestroy_v2, cuStreamDestroy_v2, cuMemsetD8_v2, cuMemcpyHtoD_v2,
// cuMemcpyDtoH_v2, cuDevicePrimaryCtxRelease_v2), exactly as cuda.h maps the
// unversioned names. The C structures passed to the driver
// (CUmemAllocationProp, CUmemLocation, CUmemAccessDesc) are mirrored by hand;
// their sizes and offsets are checked by the tests against cuda.h of CUDA 12
// and 13.
//
// Only linux/amd64 and linux/arm64 load the driver; elsewhere Open reports
// device.ErrNoDriver.
//
// # Contexts
//
// Open retains the device's PRIMARY context (cuDevicePrimaryCtxRetain), the
// one the CUDA runtime uses, so device pointers, streams and events are
// shared with PyTorch, CuPy and any other runtime-API code in the process.
// Close releases it (cuDevicePrimaryCtxRelease).
//
// Goroutines migrate between OS threads while the driver keeps the current
// context per thread, so every driver call that needs a context is made with
// the goroutine locked to its thread (runtime.LockOSThread) after
// cuCtxSetCurrent(primary) on that thread, and the context that was current
// before is made current again after the call (cuCtxGetCurrent first; when
// the primary context is already current, as it is on a thread of PyTorch
// working on this device, nothing is set at all). The restore matters where
// gpumem runs on its host's threads, as the C library does: a free of
// device 1's memory called from a thread working on device 0 must leave
// that thread on device 0, or the host's next runtime call would go to the
// wrong GPU. cuCtxSetCurrent was chosen over cuCtxPushCurrent/cuCtxPopCurrent:
// each is one cheap call, and the pair is skipped in the common case.
//
// # Graph capture
//
// While any stream of the process captures into a CUDA graph in the
// default (global) mode, the driver refuses calls it deems unsafe, such as
// cuMemAlloc, on every thread, and a refused call invalidates the capture.
// So every call is made in relaxed capture mode: cuThreadExchangeStreamCaptureMode
// sets it on the thread before the call and puts the thread's mode back
// after (PyTorch's allocator does the same around its driver calls). What
// relaxed mode does not permit (an event recorded on, or queried for, a
// capturing stream; a synchronize of it or of the device) the allocator
// does not do while a capture is underway (gpumem's BeginCapture);
// CaptureInfo tells whether a stream captures (cuStreamGetCaptureInfo).
//
// # Errors
//
// Every CUresult other than CUDA_SUCCESS becomes a *device.OpError whose Op
// is the driver function without its version suffix ("cuMemCreate",
// "cuMemAlloc"), whose Args lists the arguments ("size=2097152"), and whose
// Err is a *DriverError carrying the numeric code, its name
// (cuGetErrorName) and its description (cuGetErrorString). A DriverError
// matches the device sentinels with errors.Is:
//
//	CUDA_ERROR_OUT_OF_MEMORY                         device.ErrOutOfMemory
//	CUDA_ERROR_INVALID_VALUE, _INVALID_HANDLE,
//	_INVALID_DEVICE, _INVALID_CONTEXT,
//	_CONTEXT_IS_DESTROYED, _ALREADY_MAPPED,
//	_NOT_MAPPED, _ILLEGAL_STATE, _NOT_FOUND, ...      device.ErrInvalid
//	CUDA_ERROR_NOT_SUPPORTED                         device.ErrUnsupported
//	CUDA_ERROR_NO_DEVICE, _STUB_LIBRARY,
//	_NOT_INITIALIZED, _DEINITIALIZED,
//	_SYSTEM_DRIVER_MISMATCH, ...                     device.ErrNoDriver
//
// The driver does not check every precondition of device.VirtualMemory
// (cuMemUnmap of reserved but unmapped space returns CUDA_SUCCESS), so a
// Device keeps the books of its own reservations and mappings: Unmap of a
// range that is not exactly one earlier Map fails with ErrNotMapped,
// ReleaseAddress of anything but a whole, empty reservation with
// ErrNotReserved or ErrStillMapped, Map over its own mapping with
// ErrAlreadyMapped; all match device.ErrInvalid. A method called after Close
// fails with ErrClosed, which matches device.ErrInvalid too.
//
// # Memory rules
//
// Go memory handed to the driver (out-parameters, the structures above, host
// buffers of CopyToHost/CopyFromHost, kernel parameters) is referenced only
// for the duration of the call: the calls are synchronous or copy their
// arguments (cuMemcpyHtoD returns once the source is staged, cuLaunchKernel
// copies its parameters). Kernel parameter blocks, which hold Go pointers,
// are pinned with runtime.Pinner for the call.
package cuda
