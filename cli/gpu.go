package cli

import (
	"github.com/gpumem/gpumem/device"
	"github.com/gpumem/gpumem/device/cuda"
)

// gpuDevice is what replay needs of a real GPU: the device capabilities,
// an asynchronous memset for --touch, and Close. *cuda.Device implements it.
type gpuDevice interface {
	device.Device
	// MemsetAsync enqueues on stream s the setting of n bytes at p.
	MemsetAsync(p device.Ptr, value byte, n uint64, s device.Stream) error
	Close() error
}

var _ gpuDevice = (*cuda.Device)(nil)

// openCUDA opens a CUDA device; without a driver the error matches
// device.ErrNoDriver.
func openCUDA(ordinal int) (gpuDevice, error) {
	d, err := cuda.Open(ordinal)
	if err != nil {
		return nil, err
	}
	return d, nil
}
