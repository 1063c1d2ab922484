package nvml

import (
	"fmt"

	"github.com/gpumem/gpumem/device"
	"github.com/gpumem/gpumem/internal/dl"
)

// nvmlReturn is an nvmlReturn_t.
type nvmlReturn int32

const (
	nvmlSuccess          nvmlReturn = 0
	nvmlErrNotSupported  nvmlReturn = 3
	nvmlErrInsufficient  nvmlReturn = 7 // NVML_ERROR_INSUFFICIENT_SIZE
	nvmlErrUninitialized nvmlReturn = 1
)

// returnClosed is not an nvmlReturn_t: it stands for "Shutdown was called".
const returnClosed nvmlReturn = -1

// ErrUnavailable: NVML cannot be used on this machine (no libnvidia-ml.so.1,
// no driver loaded, library and kernel driver mismatched). It matches
// device.ErrNoDriver.
var ErrUnavailable = fmt.Errorf("NVML unavailable: %w", device.ErrNoDriver)

// ErrClosed is returned (inside a *device.OpError) by every method of an
// NVML after Shutdown. It matches device.ErrInvalid.
var ErrClosed = fmt.Errorf("nvml: shut down: %w", device.ErrInvalid)

// Error is a failed nvmlReturn_t: its number, its name as nvml.h spells it
// and the description nvmlErrorString gives.
type Error struct {
	Code        int    // e.g. 3
	Name        string // e.g. "NVML_ERROR_NOT_SUPPORTED"
	Description string // e.g. "Not Supported"
}

func (e *Error) Error() string {
	if e.Description == "" {
		return fmt.Sprintf("%s (%d)", e.Name, e.Code)
	}
	return fmt.Sprintf("%s (%d): %s", e.Name, e.Code, e.Description)
}

// Is matches ErrUnavailable and device.ErrNoDriver (DRIVER_NOT_LOADED,
// LIBRARY_NOT_FOUND, LIB_RM_VERSION_MISMATCH, UNINITIALIZED),
// device.ErrUnsupported (NOT_SUPPORTED, FUNCTION_NOT_FOUND) and
// device.ErrInvalid (INVALID_ARGUMENT, NOT_FOUND, GPU_NOT_FOUND).
func (e *Error) Is(target error) bool {
	switch e.Code {
	case 1, 9, 12, 18:
		return target == ErrUnavailable || target == device.ErrNoDriver
	case 3, 13:
		return target == device.ErrUnsupported
	case 2, 6, 28:
		return target == device.ErrInvalid
	}
	return false
}

// returnNames is enum nvmlReturn_t of nvml.h (CUDA 13).
var returnNames = map[nvmlReturn]string{
	0:   "NVML_SUCCESS",
	1:   "NVML_ERROR_UNINITIALIZED",
	2:   "NVML_ERROR_INVALID_ARGUMENT",
	3:   "NVML_ERROR_NOT_SUPPORTED",
	4:   "NVML_ERROR_NO_PERMISSION",
	5:   "NVML_ERROR_ALREADY_INITIALIZED",
	6:   "NVML_ERROR_NOT_FOUND",
	7:   "NVML_ERROR_INSUFFICIENT_SIZE",
	8:   "NVML_ERROR_INSUFFICIENT_POWER",
	9:   "NVML_ERROR_DRIVER_NOT_LOADED",
	10:  "NVML_ERROR_TIMEOUT",
	11:  "NVML_ERROR_IRQ_ISSUE",
	12:  "NVML_ERROR_LIBRARY_NOT_FOUND",
	13:  "NVML_ERROR_FUNCTION_NOT_FOUND",
	14:  "NVML_ERROR_CORRUPTED_INFOROM",
	15:  "NVML_ERROR_GPU_IS_LOST",
	16:  "NVML_ERROR_RESET_REQUIRED",
	17:  "NVML_ERROR_OPERATING_SYSTEM",
	18:  "NVML_ERROR_LIB_RM_VERSION_MISMATCH",
	19:  "NVML_ERROR_IN_USE",
	20:  "NVML_ERROR_MEMORY",
	21:  "NVML_ERROR_NO_DATA",
	22:  "NVML_ERROR_VGPU_ECC_NOT_SUPPORTED",
	23:  "NVML_ERROR_INSUFFICIENT_RESOURCES",
	24:  "NVML_ERROR_FREQ_NOT_SUPPORTED",
	25:  "NVML_ERROR_ARGUMENT_VERSION_MISMATCH",
	26:  "NVML_ERROR_DEPRECATED",
	27:  "NVML_ERROR_NOT_READY",
	28:  "NVML_ERROR_GPU_NOT_FOUND",
	29:  "NVML_ERROR_INVALID_STATE",
	999: "NVML_ERROR_UNKNOWN",
}

func returnName(r nvmlReturn) string {
	if n, ok := returnNames[r]; ok {
		return n
	}
	return fmt.Sprintf("NVML_ERROR_%d", int(r))
}

// opError wraps r as the *device.OpError of op.
func (l *library) opError(op string, r nvmlReturn, args string) error {
	var err error
	if r == returnClosed {
		err = ErrClosed
	} else {
		e := &Error{Code: int(r), Name: returnName(r)}
		if l != nil && l.errorString != nil {
			e.Description = l.errorString(int32(r))
		}
		err = e
	}
	return &device.OpError{Op: op, Args: args, Err: err}
}

// IsLibraryMissing reports whether err says libnvidia-ml.so.1 itself could
// not be loaded.
func IsLibraryMissing(err error) bool { return dl.IsLoadError(err) }
