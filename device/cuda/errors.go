package cuda

import (
	"fmt"

	"github.com/gpumem/gpumem/device"
	"github.com/gpumem/gpumem/internal/dl"
)

// result is a CUresult, the status every driver function returns.
type result int32

// The CUresult values this package tests for by number.
const (
	cudaSuccess           result = 0
	cudaErrInvalidValue   result = 1
	cudaErrOutOfMemory    result = 2
	cudaErrNotInitialized result = 3
	cudaErrNotReady       result = 600
	cudaErrNotPermitted   result = 800
	cudaErrNotSupported   result = 801
)

// resultClosed is not a CUresult: it stands for "the Device was closed" in
// the few places that carry results around before turning them into errors.
const resultClosed result = -1

// ErrClosed is returned (inside a *device.OpError) by every method of a
// closed Device. It matches device.ErrInvalid.
var ErrClosed = fmt.Errorf("cuda: device closed: %w", device.ErrInvalid)

// DriverError is a failed CUresult: its number, its name and its description
// as the driver gives them (cuGetErrorName, cuGetErrorString), or as cuda.h
// spells them when the driver does not know the code.
type DriverError struct {
	Code        int    // the CUresult value, e.g. 2
	Name        string // e.g. "CUDA_ERROR_OUT_OF_MEMORY"
	Description string // e.g. "out of memory"
}

func (e *DriverError) Error() string {
	if e.Description == "" {
		return fmt.Sprintf("%s (%d)", e.Name, e.Code)
	}
	return fmt.Sprintf("%s (%d): %s", e.Name, e.Code, e.Description)
}

// Is reports whether the code belongs to the class of a device sentinel
// (device.ErrOutOfMemory, device.ErrInvalid, device.ErrUnsupported,
// device.ErrNoDriver).
func (e *DriverError) Is(target error) bool {
	s := sentinel(result(e.Code))
	return s != nil && target == s
}

// sentinel gives the device sentinel a CUresult stands for, or nil.
func sentinel(r result) error {
	switch r {
	case cudaErrOutOfMemory:
		return device.ErrOutOfMemory
	case 1, // CUDA_ERROR_INVALID_VALUE
		101, // CUDA_ERROR_INVALID_DEVICE
		201, // CUDA_ERROR_INVALID_CONTEXT
		202, // CUDA_ERROR_CONTEXT_ALREADY_CURRENT
		207, // CUDA_ERROR_ARRAY_IS_MAPPED
		208, // CUDA_ERROR_ALREADY_MAPPED
		210, // CUDA_ERROR_ALREADY_ACQUIRED
		211, // CUDA_ERROR_NOT_MAPPED
		212, // CUDA_ERROR_NOT_MAPPED_AS_ARRAY
		213, // CUDA_ERROR_NOT_MAPPED_AS_POINTER
		400, // CUDA_ERROR_INVALID_HANDLE
		401, // CUDA_ERROR_ILLEGAL_STATE
		500, // CUDA_ERROR_NOT_FOUND
		709: // CUDA_ERROR_CONTEXT_IS_DESTROYED
		return device.ErrInvalid
	case cudaErrNotSupported:
		return device.ErrUnsupported
	case 900, 901, 902, 903, 904, 905, 906, 907, 908: // CUDA_ERROR_STREAM_CAPTURE_*, CUDA_ERROR_CAPTURED_EVENT
		return device.ErrCapturing
	case cudaErrNotInitialized,
		4,   // CUDA_ERROR_DEINITIALIZED
		34,  // CUDA_ERROR_STUB_LIBRARY
		100, // CUDA_ERROR_NO_DEVICE
		803, // CUDA_ERROR_SYSTEM_DRIVER_MISMATCH
		804: // CUDA_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE
		return device.ErrNoDriver
	}
	return nil
}

// resultNames is enum cudaError_enum of cuda.h (CUDA 13.1), used when the
// driver cannot name a code itself (cuGetErrorName fails or is missing).
var resultNames = map[result]string{
	0:   "CUDA_SUCCESS",
	1:   "CUDA_ERROR_INVALID_VALUE",
	2:   "CUDA_ERROR_OUT_OF_MEMORY",
	3:   "CUDA_ERROR_NOT_INITIALIZED",
	4:   "CUDA_ERROR_DEINITIALIZED",
	5:   "CUDA_ERROR_PROFILER_DISABLED",
	6:   "CUDA_ERROR_PROFILER_NOT_INITIALIZED",
	7:   "CUDA_ERROR_PROFILER_ALREADY_STARTED",
	8:   "CUDA_ERROR_PROFILER_ALREADY_STOPPED",
	34:  "CUDA_ERROR_STUB_LIBRARY",
	46:  "CUDA_ERROR_DEVICE_UNAVAILABLE",
	100: "CUDA_ERROR_NO_DEVICE",
	101: "CUDA_ERROR_INVALID_DEVICE",
	102: "CUDA_ERROR_DEVICE_NOT_LICENSED",
	200: "CUDA_ERROR_INVALID_IMAGE",
	201: "CUDA_ERROR_INVALID_CONTEXT",
	202: "CUDA_ERROR_CONTEXT_ALREADY_CURRENT",
	205: "CUDA_ERROR_MAP_FAILED",
	206: "CUDA_ERROR_UNMAP_FAILED",
	207: "CUDA_ERROR_ARRAY_IS_MAPPED",
	208: "CUDA_ERROR_ALREADY_MAPPED",
	209: "CUDA_ERROR_NO_BINARY_FOR_GPU",
	210: "CUDA_ERROR_ALREADY_ACQUIRED",
	211: "CUDA_ERROR_NOT_MAPPED",
	212: "CUDA_ERROR_NOT_MAPPED_AS_ARRAY",
	213: "CUDA_ERROR_NOT_MAPPED_AS_POINTER",
	214: "CUDA_ERROR_ECC_UNCORRECTABLE",
	215: "CUDA_ERROR_UNSUPPORTED_LIMIT",
	216: "CUDA_ERROR_CONTEXT_ALREADY_IN_USE",
	217: "CUDA_ERROR_PEER_ACCESS_UNSUPPORTED",
	218: "CUDA_ERROR_INVALID_PTX",
	219: "CUDA_ERROR_INVALID_GRAPHICS_CONTEXT",
	220: "CUDA_ERROR_NVLINK_UNCORRECTABLE",
	221: "CUDA_ERROR_JIT_COMPILER_NOT_FOUND",
	222: "CUDA_ERROR_UNSUPPORTED_PTX_VERSION",
	223: "CUDA_ERROR_JIT_COMPILATION_DISABLED",
	224: "CUDA_ERROR_UNSUPPORTED_EXEC_AFFINITY",
	225: "CUDA_ERROR_UNSUPPORTED_DEVSIDE_SYNC",
	226: "CUDA_ERROR_CONTAINED",
	300: "CUDA_ERROR_INVALID_SOURCE",
	301: "CUDA_ERROR_FILE_NOT_FOUND",
	302: "CUDA_ERROR_SHARED_OBJECT_SYMBOL_NOT_FOUND",
	303: "CUDA_ERROR_SHARED_OBJECT_INIT_FAILED",
	304: "CUDA_ERROR_OPERATING_SYSTEM",
	400: "CUDA_ERROR_INVALID_HANDLE",
	401: "CUDA_ERROR_ILLEGAL_STATE",
	402: "CUDA_ERROR_LOSSY_QUERY",
	500: "CUDA_ERROR_NOT_FOUND",
	600: "CUDA_ERROR_NOT_READY",
	700: "CUDA_ERROR_ILLEGAL_ADDRESS",
	701: "CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES",
	702: "CUDA_ERROR_LAUNCH_TIMEOUT",
	703: "CUDA_ERROR_LAUNCH_INCOMPATIBLE_TEXTURING",
	704: "CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED",
	705: "CUDA_ERROR_PEER_ACCESS_NOT_ENABLED",
	708: "CUDA_ERROR_PRIMARY_CONTEXT_ACTIVE",
	709: "CUDA_ERROR_CONTEXT_IS_DESTROYED",
	710: "CUDA_ERROR_ASSERT",
	711: "CUDA_ERROR_TOO_MANY_PEERS",
	712: "CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED",
	713: "CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED",
	714: "CUDA_ERROR_HARDWARE_STACK_ERROR",
	715: "CUDA_ERROR_ILLEGAL_INSTRUCTION",
	716: "CUDA_ERROR_MISALIGNED_ADDRESS",
	717: "CUDA_ERROR_INVALID_ADDRESS_SPACE",
	718: "CUDA_ERROR_INVALID_PC",
	719: "CUDA_ERROR_LAUNCH_FAILED",
	720: "CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE",
	721: "CUDA_ERROR_TENSOR_MEMORY_LEAK",
	800: "CUDA_ERROR_NOT_PERMITTED",
	801: "CUDA_ERROR_NOT_SUPPORTED",
	802: "CUDA_ERROR_SYSTEM_NOT_READY",
	803: "CUDA_ERROR_SYSTEM_DRIVER_MISMATCH",
	804: "CUDA_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE",
	805: "CUDA_ERROR_MPS_CONNECTION_FAILED",
	806: "CUDA_ERROR_MPS_RPC_FAILURE",
	807: "CUDA_ERROR_MPS_SERVER_NOT_READY",
	808: "CUDA_ERROR_MPS_MAX_CLIENTS_REACHED",
	809: "CUDA_ERROR_MPS_MAX_CONNECTIONS_REACHED",
	810: "CUDA_ERROR_MPS_CLIENT_TERMINATED",
	811: "CUDA_ERROR_CDP_NOT_SUPPORTED",
	812: "CUDA_ERROR_CDP_VERSION_MISMATCH",
	900: "CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED",
	901: "CUDA_ERROR_STREAM_CAPTURE_INVALIDATED",
	902: "CUDA_ERROR_STREAM_CAPTURE_MERGE",
	903: "CUDA_ERROR_STREAM_CAPTURE_UNMATCHED",
	904: "CUDA_ERROR_STREAM_CAPTURE_UNJOINED",
	905: "CUDA_ERROR_STREAM_CAPTURE_ISOLATION",
	906: "CUDA_ERROR_STREAM_CAPTURE_IMPLICIT",
	907: "CUDA_ERROR_CAPTURED_EVENT",
	908: "CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD",
	909: "CUDA_ERROR_TIMEOUT",
	910: "CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE",
	911: "CUDA_ERROR_EXTERNAL_DEVICE",
	912: "CUDA_ERROR_INVALID_CLUSTER_SIZE",
	913: "CUDA_ERROR_FUNCTION_NOT_LOADED",
	914: "CUDA_ERROR_INVALID_RESOURCE_TYPE",
	915: "CUDA_ERROR_INVALID_RESOURCE_CONFIGURATION",
	916: "CUDA_ERROR_KEY_ROTATION",
	917: "CUDA_ERROR_STREAM_DETACHED",
	999: "CUDA_ERROR_UNKNOWN",
}

// resultName names r from the table above, or "CUDA_ERROR_<n>".
func resultName(r result) string {
	if n, ok := resultNames[r]; ok {
		return n
	}
	return fmt.Sprintf("CUDA_ERROR_%d", int(r))
}

// newDriverError builds the DriverError for r, asking drv (which may be nil)
// for the name and description.
func newDriverError(drv *driver, r result) *DriverError {
	e := &DriverError{Code: int(r), Name: resultName(r)}
	if drv != nil {
		if n, ok := drv.errorName(r); ok {
			e.Name = n
		}
		if s, ok := drv.errorString(r); ok {
			e.Description = s
		}
	}
	return e
}

// opError wraps r as the *device.OpError of op with the given arguments.
func opError(drv *driver, op string, r result, args string) error {
	var err error
	if r == resultClosed {
		err = ErrClosed
	} else {
		err = newDriverError(drv, r)
	}
	return &device.OpError{Op: op, Args: args, Err: err}
}

// IsDriverMissing reports whether err says the driver library itself could
// not be loaded (as opposed to a driver that loaded and then failed).
func IsDriverMissing(err error) bool { return dl.IsLoadError(err) }
