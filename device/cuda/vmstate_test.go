package cuda

import (
	"errors"
	"testing"

	"github.com/gpumem/gpumem/device"
)

func TestVMBooks(t *testing.T) {
	const g = 2 << 20
	var b vmBooks
	base := device.Ptr(0x7f0000000000)
	b.addReservation(base, 4*g)

	if err := b.takeMapping(base, g); !errors.Is(err, ErrNotMapped) || !errors.Is(err, device.ErrInvalid) {
		t.Errorf("takeMapping of nothing: %v", err)
	}
	if err := b.checkUnmapped(base); err != nil {
		t.Errorf("checkUnmapped: %v", err)
	}
	b.addMapping(base, g)
	b.addMapping(base+g, g)
	if err := b.checkUnmapped(base); !errors.Is(err, ErrAlreadyMapped) {
		t.Errorf("checkUnmapped of a mapping: %v", err)
	}
	for _, c := range []struct {
		p    device.Ptr
		size uint64
	}{{base, 2 * g}, {base, g / 2}, {base + 1, g}, {base + 2*g, g}} {
		if err := b.takeMapping(c.p, c.size); !errors.Is(err, ErrNotMapped) {
			t.Errorf("takeMapping(%#x, %d): %v", uint64(c.p), c.size, err)
		}
	}
	if err := b.takeReservation(base, 4*g); !errors.Is(err, ErrStillMapped) || !errors.Is(err, device.ErrInvalid) {
		t.Errorf("takeReservation with mappings: %v", err)
	}
	if err := b.takeReservation(base, 2*g); !errors.Is(err, ErrNotReserved) {
		t.Errorf("takeReservation of part: %v", err)
	}
	if err := b.takeMapping(base, g); err != nil {
		t.Errorf("takeMapping: %v", err)
	}
	if err := b.takeMapping(base, g); !errors.Is(err, ErrNotMapped) {
		t.Errorf("second takeMapping: %v", err)
	}
	b.putMapping(base, g) // the driver failed: the mapping is back
	if err := b.takeMapping(base, g); err != nil {
		t.Errorf("takeMapping after putMapping: %v", err)
	}
	if err := b.takeMapping(base+g, g); err != nil {
		t.Errorf("takeMapping: %v", err)
	}
	// A mapping just past the reservation does not block it.
	b.addMapping(base+4*g, g)
	if err := b.takeReservation(base, 4*g); err != nil {
		t.Errorf("takeReservation: %v", err)
	}
	if err := b.takeReservation(base, 4*g); !errors.Is(err, ErrNotReserved) {
		t.Errorf("second takeReservation: %v", err)
	}
	b.putReservation(base, 4*g)
	if err := b.takeReservation(base, 4*g); err != nil {
		t.Errorf("takeReservation after putReservation: %v", err)
	}
}
