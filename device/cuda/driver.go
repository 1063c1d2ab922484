package cuda

import (
	"sync"
	"unsafe"

	"github.com/gpumem/gpumem/device"
	"github.com/gpumem/gpumem/internal/dl"
)

// libName is the driver library, as the CUDA runtime itself loads it.
const libName = "libcuda.so.1"

// driver holds the loaded library and the addresses of the entry points this
// package calls. It is immutable once loaded.
type driver struct {
	handle uintptr

	cuInit, cuDriverGetVersion, cuGetErrorName, cuGetErrorString uintptr

	cuDeviceGetCount, cuDeviceGet, cuDeviceGetName, cuDeviceTotalMem uintptr
	cuDeviceGetAttribute, cuDeviceGetUuid                            uintptr

	cuDevicePrimaryCtxRetain, cuDevicePrimaryCtxRelease uintptr
	cuCtxGetCurrent, cuCtxSetCurrent, cuCtxSynchronize  uintptr

	cuMemAlloc, cuMemFree, cuMemGetInfo uintptr

	cuMemGetAllocationGranularity, cuMemAddressReserve, cuMemAddressFree uintptr
	cuMemCreate, cuMemRelease, cuMemMap, cuMemSetAccess, cuMemUnmap      uintptr

	cuEventCreate, cuEventDestroy, cuEventRecord, cuEventQuery uintptr
	cuEventSynchronize, cuStreamWaitEvent                      uintptr

	cuStreamCreate, cuStreamDestroy, cuStreamSynchronize uintptr

	cuThreadExchangeStreamCaptureMode, cuStreamGetCaptureInfo uintptr

	// The capture's graph (CaptureGraph): cuStreamGetCaptureInfo_v2 and
	// cuGraphNodeGetDependencies by those exact names, whose arguments are
	// fixed (_v3 and _v2 of each add edge data); 0 if the driver has none.
	cuStreamGetCaptureInfo2, cuGraphNodeGetDependencies uintptr

	cuMemsetD8, cuMemsetD8Async, cuMemcpyHtoD, cuMemcpyDtoH uintptr
	cuMemcpyDtoD                                            uintptr

	// Sharing chunks with other processes (Exporter); 0 if the driver has
	// none.
	cuMemExportToShareableHandle uintptr

	cuModuleLoadDataEx, cuModuleGetFunction, cuModuleUnload, cuLaunchKernel uintptr

	// Markers (markers.go): pinned host memory the device writes in stream
	// order; 0 if the driver has none. cuStreamWriteValue64 is _v2 (CUDA
	// 12's memory operations), else the original, whose support a device
	// attribute of its own tells (markerBooks.init).
	cuMemHostAlloc, cuMemFreeHost, cuMemHostGetDevicePointer, cuStreamWriteValue64 uintptr
	cuStreamWriteValue64V1                                                         uintptr
}

func (d *driver) symbols() []dl.Symbol {
	return []dl.Symbol{
		{Addr: &d.cuInit, Names: []string{"cuInit"}},
		{Addr: &d.cuDriverGetVersion, Names: []string{"cuDriverGetVersion"}},
		{Addr: &d.cuGetErrorName, Names: []string{"cuGetErrorName"}},
		{Addr: &d.cuGetErrorString, Names: []string{"cuGetErrorString"}},
		{Addr: &d.cuDeviceGetCount, Names: []string{"cuDeviceGetCount"}},
		{Addr: &d.cuDeviceGet, Names: []string{"cuDeviceGet"}},
		{Addr: &d.cuDeviceGetName, Names: []string{"cuDeviceGetName"}},
		{Addr: &d.cuDeviceTotalMem, Names: []string{"cuDeviceTotalMem_v2"}},
		{Addr: &d.cuDeviceGetAttribute, Names: []string{"cuDeviceGetAttribute"}},
		{Addr: &d.cuDeviceGetUuid, Names: []string{"cuDeviceGetUuid_v2", "cuDeviceGetUuid"}},
		{Addr: &d.cuDevicePrimaryCtxRetain, Names: []string{"cuDevicePrimaryCtxRetain"}},
		{Addr: &d.cuDevicePrimaryCtxRelease, Names: []string{"cuDevicePrimaryCtxRelease_v2", "cuDevicePrimaryCtxRelease"}},
		{Addr: &d.cuCtxGetCurrent, Names: []string{"cuCtxGetCurrent"}},
		{Addr: &d.cuCtxSetCurrent, Names: []string{"cuCtxSetCurrent"}},
		{Addr: &d.cuCtxSynchronize, Names: []string{"cuCtxSynchronize"}},
		{Addr: &d.cuMemAlloc, Names: []string{"cuMemAlloc_v2"}},
		{Addr: &d.cuMemFree, Names: []string{"cuMemFree_v2"}},
		{Addr: &d.cuMemGetInfo, Names: []string{"cuMemGetInfo_v2"}},
		{Addr: &d.cuMemGetAllocationGranularity, Names: []string{"cuMemGetAllocationGranularity"}},
		{Addr: &d.cuMemAddressReserve, Names: []string{"cuMemAddressReserve"}},
		{Addr: &d.cuMemAddressFree, Names: []string{"cuMemAddressFree"}},
		{Addr: &d.cuMemCreate, Names: []string{"cuMemCreate"}},
		{Addr: &d.cuMemRelease, Names: []string{"cuMemRelease"}},
		{Addr: &d.cuMemMap, Names: []string{"cuMemMap"}},
		{Addr: &d.cuMemSetAccess, Names: []string{"cuMemSetAccess"}},
		{Addr: &d.cuMemUnmap, Names: []string{"cuMemUnmap"}},
		{Addr: &d.cuEventCreate, Names: []string{"cuEventCreate"}},
		{Addr: &d.cuEventDestroy, Names: []string{"cuEventDestroy_v2"}},
		{Addr: &d.cuEventRecord, Names: []string{"cuEventRecord"}},
		{Addr: &d.cuEventQuery, Names: []string{"cuEventQuery"}},
		{Addr: &d.cuEventSynchronize, Names: []string{"cuEventSynchronize"}},
		{Addr: &d.cuStreamWaitEvent, Names: []string{"cuStreamWaitEvent"}},
		{Addr: &d.cuStreamCreate, Names: []string{"cuStreamCreate"}},
		{Addr: &d.cuStreamDestroy, Names: []string{"cuStreamDestroy_v2"}},
		{Addr: &d.cuStreamSynchronize, Names: []string{"cuStreamSynchronize"}},
		{Addr: &d.cuThreadExchangeStreamCaptureMode, Names: []string{"cuThreadExchangeStreamCaptureMode"}},
		// _v2 and _v3 add out-parameters after these three, which may be
		// NULL; the call passes NULL for them (ignored by the original).
		{Addr: &d.cuStreamGetCaptureInfo, Names: []string{"cuStreamGetCaptureInfo_v2", "cuStreamGetCaptureInfo_v3", "cuStreamGetCaptureInfo"}},
		{Addr: &d.cuStreamGetCaptureInfo2, Names: []string{"cuStreamGetCaptureInfo_v2"}, Optional: true},
		{Addr: &d.cuGraphNodeGetDependencies, Names: []string{"cuGraphNodeGetDependencies"}, Optional: true},
		{Addr: &d.cuMemExportToShareableHandle, Names: []string{"cuMemExportToShareableHandle"}, Optional: true},
		{Addr: &d.cuMemsetD8, Names: []string{"cuMemsetD8_v2"}},
		{Addr: &d.cuMemsetD8Async, Names: []string{"cuMemsetD8Async"}},
		{Addr: &d.cuMemcpyHtoD, Names: []string{"cuMemcpyHtoD_v2"}},
		{Addr: &d.cuMemcpyDtoH, Names: []string{"cuMemcpyDtoH_v2"}},
		{Addr: &d.cuMemcpyDtoD, Names: []string{"cuMemcpyDtoD_v2"}},
		{Addr: &d.cuModuleLoadDataEx, Names: []string{"cuModuleLoadDataEx"}},
		{Addr: &d.cuModuleGetFunction, Names: []string{"cuModuleGetFunction"}},
		{Addr: &d.cuModuleUnload, Names: []string{"cuModuleUnload"}},
		{Addr: &d.cuLaunchKernel, Names: []string{"cuLaunchKernel"}},
		{Addr: &d.cuMemHostAlloc, Names: []string{"cuMemHostAlloc"}, Optional: true},
		{Addr: &d.cuMemFreeHost, Names: []string{"cuMemFreeHost"}, Optional: true},
		{Addr: &d.cuMemHostGetDevicePointer, Names: []string{"cuMemHostGetDevicePointer_v2"}, Optional: true},
		{Addr: &d.cuStreamWriteValue64, Names: []string{"cuStreamWriteValue64_v2"}, Optional: true},
		{Addr: &d.cuStreamWriteValue64V1, Names: []string{"cuStreamWriteValue64"}, Optional: true},
	}
}

var (
	loadOnce sync.Once
	loaded   *driver
	loadErr  error
)

// getDriver loads libcuda.so.1 and runs cuInit(0), once per process.
func getDriver() (*driver, error) {
	loadOnce.Do(func() {
		d, err := openDriver(libName)
		if err != nil {
			loadErr = err
			return
		}
		if r := ccall(d.cuInit, 0); r != cudaSuccess {
			loadErr = opError(d, "cuInit", r, "flags=0")
			return
		}
		loaded = d
	})
	return loaded, loadErr
}

// openDriver loads the library called name and resolves every entry point.
// Its errors are one line and match device.ErrNoDriver.
func openDriver(name string) (*driver, error) {
	d := &driver{}
	h, err := dl.Open(name, d.symbols(), device.ErrNoDriver, "the NVIDIA driver is too old (CUDA 11.0 or newer is needed)")
	if err != nil {
		return nil, err
	}
	d.handle = h
	return d, nil
}

// errorName asks the driver for the name of r (cuGetErrorName).
func (d *driver) errorName(r result) (string, bool) {
	var s *byte
	if ccall(d.cuGetErrorName, uintptr(r), uintptr(unsafe.Pointer(&s))) != cudaSuccess || s == nil {
		return "", false
	}
	return goString(s), true
}

// errorString asks the driver for the description of r (cuGetErrorString).
func (d *driver) errorString(r result) (string, bool) {
	var s *byte
	if ccall(d.cuGetErrorString, uintptr(r), uintptr(unsafe.Pointer(&s))) != cudaSuccess || s == nil {
		return "", false
	}
	return goString(s), true
}

// goString copies the NUL-terminated C string at p (driver memory).
func goString(p *byte) string {
	if p == nil {
		return ""
	}
	n := 0
	for *(*byte)(unsafe.Add(unsafe.Pointer(p), n)) != 0 {
		n++
	}
	return string(unsafe.Slice(p, n))
}

// cString gives the Go string in b up to its first NUL.
func cString(b []byte) string {
	for i, c := range b {
		if c == 0 {
			return string(b[:i])
		}
	}
	return string(b)
}

// DeviceCount reports how many CUDA devices the driver exposes (after
// CUDA_VISIBLE_DEVICES).
func DeviceCount() (int, error) {
	drv, err := getDriver()
	if err != nil {
		return 0, err
	}
	var n int32
	if r := ccall(drv.cuDeviceGetCount, uintptr(unsafe.Pointer(&n))); r != cudaSuccess {
		return 0, opError(drv, "cuDeviceGetCount", r, "")
	}
	return int(n), nil
}

// DriverVersion reports the CUDA version the driver implements, as
// 1000*major + 10*minor (12040 for CUDA 12.4).
func DriverVersion() (int, error) {
	drv, err := getDriver()
	if err != nil {
		return 0, err
	}
	var v int32
	if r := ccall(drv.cuDriverGetVersion, uintptr(unsafe.Pointer(&v))); r != cudaSuccess {
		return 0, opError(drv, "cuDriverGetVersion", r, "")
	}
	return int(v), nil
}
