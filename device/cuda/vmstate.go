package cuda

import (
	"fmt"
	"sync"

	"github.com/gpumem/gpumem/device"
)

// The driver does not enforce every precondition of device.VirtualMemory:
// on an H100 with driver 580 (CUDA 13.0), cuMemUnmap of reserved but
// unmapped space, or of a mapping plus unmapped space after it, returns
// CUDA_SUCCESS. Device therefore keeps the books of its reservations and
// mappings and refuses, with errors matching device.ErrInvalid, what the
// contract forbids.
var (
	// ErrNotMapped: Unmap of a range that is not exactly one Map of this
	// Device.
	ErrNotMapped = fmt.Errorf("cuda: range is not exactly one mapping made by this device: %w", device.ErrInvalid)
	// ErrNotReserved: ReleaseAddress of a range that is not exactly one
	// Reserve of this Device.
	ErrNotReserved = fmt.Errorf("cuda: range is not a whole reservation made by this device: %w", device.ErrInvalid)
	// ErrStillMapped: ReleaseAddress of a reservation with mappings left.
	ErrStillMapped = fmt.Errorf("cuda: reservation still has mappings: %w", device.ErrInvalid)
	// ErrAlreadyMapped: Map at an address where this Device already mapped.
	ErrAlreadyMapped = fmt.Errorf("cuda: address already mapped by this device: %w", device.ErrInvalid)
)

// vmBooks records the reservations and mappings of one Device.
type vmBooks struct {
	mu       sync.Mutex
	reserved map[device.Ptr]uint64 // start -> size
	mapped   map[device.Ptr]uint64 // start -> size
}

func (b *vmBooks) addReservation(p device.Ptr, size uint64) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.reserved == nil {
		b.reserved = map[device.Ptr]uint64{}
	}
	b.reserved[p] = size
}

// takeReservation removes the reservation [p, p+size) if it exists whole
// and has nothing mapped in it; putReservation undoes it when the driver
// then fails.
func (b *vmBooks) takeReservation(p device.Ptr, size uint64) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if s, ok := b.reserved[p]; !ok || s != size {
		return ErrNotReserved
	}
	end := uint64(p) + size
	for m := range b.mapped {
		if uint64(m) >= uint64(p) && uint64(m) < end {
			return ErrStillMapped
		}
	}
	delete(b.reserved, p)
	return nil
}

func (b *vmBooks) putReservation(p device.Ptr, size uint64) { b.addReservation(p, size) }

// checkUnmapped refuses a Map at an address this Device has mapped.
func (b *vmBooks) checkUnmapped(p device.Ptr) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if _, ok := b.mapped[p]; ok {
		return ErrAlreadyMapped
	}
	return nil
}

func (b *vmBooks) addMapping(p device.Ptr, size uint64) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.mapped == nil {
		b.mapped = map[device.Ptr]uint64{}
	}
	b.mapped[p] = size
}

// takeMapping removes the mapping [p, p+size) if it is exactly one earlier
// Map; putMapping undoes it when the driver then fails.
func (b *vmBooks) takeMapping(p device.Ptr, size uint64) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if s, ok := b.mapped[p]; !ok || s != size {
		return ErrNotMapped
	}
	delete(b.mapped, p)
	return nil
}

func (b *vmBooks) putMapping(p device.Ptr, size uint64) { b.addMapping(p, size) }
