package host

import (
	"errors"

	"github.com/gpumem/gpumem"
	"github.com/gpumem/gpumem/device"
	"github.com/gpumem/gpumem/torchsnapshot"
)

// Status is the result code of a C call, as gpumem.h numbers it. The
// numbers are part of the C ABI: never renumber, only add.
type Status int32

const (
	StatusSuccess        Status = 0  // GPUMEM_SUCCESS
	StatusOutOfMemory    Status = 1  // GPUMEM_ERROR_OUT_OF_MEMORY: limit, device or fragmentation; see gpumem_last_oom
	StatusInvalidValue   Status = 2  // GPUMEM_ERROR_INVALID_VALUE: an absurd size, a bad device ordinal, a bad fraction
	StatusInvalidPointer Status = 3  // GPUMEM_ERROR_INVALID_POINTER: not allocated by gpumem, or freed already
	StatusNoDriver       Status = 4  // GPUMEM_ERROR_NO_DRIVER: libcuda.so.1 missing or unusable
	StatusDevice         Status = 5  // GPUMEM_ERROR_DEVICE: the driver failed
	StatusConfig         Status = 6  // GPUMEM_ERROR_CONFIG: a bad configuration string, or a key that cannot change now
	StatusClosed         Status = 7  // GPUMEM_ERROR_CLOSED: gpumem was shut down
	StatusTooSmall       Status = 8  // GPUMEM_ERROR_BUFFER_TOO_SMALL: the caller's buffer cannot hold the answer
	StatusInternal       Status = 9  // GPUMEM_ERROR_INTERNAL: a bug in gpumem (its books disagree)
	StatusIO             Status = 10 // GPUMEM_ERROR_IO: a file could not be read or written
	StatusFormat         Status = 11 // GPUMEM_ERROR_FORMAT: a file is not what it should be (a corrupt or foreign snapshot)
	StatusNotShareable   Status = 12 // GPUMEM_ERROR_NOT_SHAREABLE: the buffer cannot be shared with another process
)

// Code classifies an error as the status a C caller receives.
func Code(err error) Status {
	switch {
	case err == nil:
		return StatusSuccess
	case errors.Is(err, gpumem.ErrOutOfMemory):
		return StatusOutOfMemory
	case errors.Is(err, gpumem.ErrInvalidSize), errors.Is(err, ErrInvalidDevice), errors.Is(err, ErrPool):
		return StatusInvalidValue
	case errors.Is(err, gpumem.ErrForeign), errors.Is(err, gpumem.ErrDoubleFree):
		return StatusInvalidPointer
	case errors.Is(err, device.ErrNoDriver):
		return StatusNoDriver
	case errors.Is(err, ErrConfig):
		return StatusConfig
	case errors.Is(err, gpumem.ErrClosed):
		return StatusClosed
	case errors.Is(err, torchsnapshot.ErrFormat), errors.Is(err, torchsnapshot.ErrNoHistory):
		return StatusFormat
	case errors.Is(err, ErrIO):
		return StatusIO
	case errors.Is(err, ErrTooSmall):
		return StatusTooSmall
	case errors.Is(err, gpumem.ErrNotShareable):
		return StatusNotShareable
	case errors.Is(err, device.ErrInvalid), errors.Is(err, device.ErrUnsupported), errors.Is(err, device.ErrOutOfMemory):
		return StatusDevice
	}
	var op *device.OpError
	if errors.As(err, &op) {
		return StatusDevice
	}
	return StatusInternal
}

// ErrTooSmall: the caller's buffer cannot hold the answer.
var ErrTooSmall = errors.New("gpumem: buffer too small")

// ErrIO is matched by errors reading or writing a file (a recording, an
// imported snapshot).
var ErrIO = errors.New("gpumem: i/o error")
