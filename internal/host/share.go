package host

import "github.com/gpumem/gpumem"

// Share exports the live buffer whose address is ptr (the address gpumem
// handed out, not one inside it) for another process: gpumem.Allocator's
// Share. ordinal -1 looks on every device. The caller owns the returned
// descriptors and must call Unshare once no other process maps the memory.
func (h *Host) Share(ordinal int, ptr uint64) (gpumem.Shared, error) {
	d, e, err := h.find("Share", ordinal, ptr)
	if err != nil {
		return gpumem.Shared{}, err
	}
	if e.direct != nil {
		return gpumem.Shared{}, &gpumem.BufferError{Op: "Share", Ptr: ptr, Err: gpumem.ErrNotShareable,
			Why: "it was allocated while gpumem's cache was off (a driver allocation of its own)"}
	}
	return d.allocatorOf(e).Share(e.buf)
}

// Unshare undoes one Share of the buffer at ptr.
func (h *Host) Unshare(ordinal int, ptr uint64) error {
	d, e, err := h.find("Unshare", ordinal, ptr)
	if err != nil {
		return err
	}
	if e.direct != nil {
		return &gpumem.BufferError{Op: "Unshare", Ptr: ptr, Err: gpumem.ErrNotShareable, Why: "buffer is not shared"}
	}
	return d.allocatorOf(e).Unshare(e.buf)
}
