package cuda

import (
	"strings"
	"sync"
	"unsafe"
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
	cuCtxSetCurrent, cuCtxSynchronize                   uintptr

	cuMemAlloc, cuMemFree, cuMemGetInfo uintptr

	cuMemGetAllocationGranularity, cuMemAddressReserve, cuMemAddressFree uintptr
	cuMemCreate, cuMemRelease, cuMemMap, cuMemSetAccess, cuMemUnmap      uintptr

	cuEventCreate, cuEventDestroy, cuEventRecord, cuEventQuery uintptr
	cuEventSynchronize, cuStreamWaitEvent                      uintptr

	cuStreamCreate, cuStreamDestroy, cuStreamSynchronize uintptr

	cuMemsetD8, cuMemsetD8Async, cuMemcpyHtoD, cuMemcpyDtoH uintptr

	cuModuleLoadDataEx, cuModuleGetFunction, cuModuleUnload, cuLaunchKernel uintptr
}

// symbol is an entry point and the exported names it may have, best first.
type symbol struct {
	addr  *uintptr
	names []string
}

func (d *driver) symbols() []symbol {
	return []symbol{
		{&d.cuInit, []string{"cuInit"}},
		{&d.cuDriverGetVersion, []string{"cuDriverGetVersion"}},
		{&d.cuGetErrorName, []string{"cuGetErrorName"}},
		{&d.cuGetErrorString, []string{"cuGetErrorString"}},
		{&d.cuDeviceGetCount, []string{"cuDeviceGetCount"}},
		{&d.cuDeviceGet, []string{"cuDeviceGet"}},
		{&d.cuDeviceGetName, []string{"cuDeviceGetName"}},
		{&d.cuDeviceTotalMem, []string{"cuDeviceTotalMem_v2"}},
		{&d.cuDeviceGetAttribute, []string{"cuDeviceGetAttribute"}},
		{&d.cuDeviceGetUuid, []string{"cuDeviceGetUuid_v2", "cuDeviceGetUuid"}},
		{&d.cuDevicePrimaryCtxRetain, []string{"cuDevicePrimaryCtxRetain"}},
		{&d.cuDevicePrimaryCtxRelease, []string{"cuDevicePrimaryCtxRelease_v2", "cuDevicePrimaryCtxRelease"}},
		{&d.cuCtxSetCurrent, []string{"cuCtxSetCurrent"}},
		{&d.cuCtxSynchronize, []string{"cuCtxSynchronize"}},
		{&d.cuMemAlloc, []string{"cuMemAlloc_v2"}},
		{&d.cuMemFree, []string{"cuMemFree_v2"}},
		{&d.cuMemGetInfo, []string{"cuMemGetInfo_v2"}},
		{&d.cuMemGetAllocationGranularity, []string{"cuMemGetAllocationGranularity"}},
		{&d.cuMemAddressReserve, []string{"cuMemAddressReserve"}},
		{&d.cuMemAddressFree, []string{"cuMemAddressFree"}},
		{&d.cuMemCreate, []string{"cuMemCreate"}},
		{&d.cuMemRelease, []string{"cuMemRelease"}},
		{&d.cuMemMap, []string{"cuMemMap"}},
		{&d.cuMemSetAccess, []string{"cuMemSetAccess"}},
		{&d.cuMemUnmap, []string{"cuMemUnmap"}},
		{&d.cuEventCreate, []string{"cuEventCreate"}},
		{&d.cuEventDestroy, []string{"cuEventDestroy_v2"}},
		{&d.cuEventRecord, []string{"cuEventRecord"}},
		{&d.cuEventQuery, []string{"cuEventQuery"}},
		{&d.cuEventSynchronize, []string{"cuEventSynchronize"}},
		{&d.cuStreamWaitEvent, []string{"cuStreamWaitEvent"}},
		{&d.cuStreamCreate, []string{"cuStreamCreate"}},
		{&d.cuStreamDestroy, []string{"cuStreamDestroy_v2"}},
		{&d.cuStreamSynchronize, []string{"cuStreamSynchronize"}},
		{&d.cuMemsetD8, []string{"cuMemsetD8_v2"}},
		{&d.cuMemsetD8Async, []string{"cuMemsetD8Async"}},
		{&d.cuMemcpyHtoD, []string{"cuMemcpyHtoD_v2"}},
		{&d.cuMemcpyDtoH, []string{"cuMemcpyDtoH_v2"}},
		{&d.cuModuleLoadDataEx, []string{"cuModuleLoadDataEx"}},
		{&d.cuModuleGetFunction, []string{"cuModuleGetFunction"}},
		{&d.cuModuleUnload, []string{"cuModuleUnload"}},
		{&d.cuLaunchKernel, []string{"cuLaunchKernel"}},
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
	h, err := dlopen(name)
	if err != nil {
		return nil, &loadError{msg: dlopenMessage(name, err)}
	}
	d := &driver{handle: h}
	for _, s := range d.symbols() {
		for _, n := range s.names {
			if addr, err := dlsym(h, n); err == nil && addr != 0 {
				*s.addr = addr
				break
			}
		}
		if *s.addr == 0 {
			dlclose(h)
			return nil, &loadError{msg: name + " has no " + s.names[0] + ": the NVIDIA driver is too old (CUDA 11.0 or newer is needed)"}
		}
	}
	return d, nil
}

// dlopenMessage turns a dlopen failure into one clear line.
func dlopenMessage(name string, err error) string {
	msg := strings.Join(strings.Fields(err.Error()), " ")
	if strings.Contains(msg, "No such file") || strings.Contains(msg, "cannot open shared object file") || msg == "" {
		return name + " not found: no NVIDIA driver on this machine"
	}
	if !strings.Contains(msg, name) {
		msg = name + ": " + msg
	}
	return "cannot load " + msg
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
