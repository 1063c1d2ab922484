package sim

import (
	"fmt"

	"github.com/gpumem/gpumem/device"
)

// The operations a fault can be armed on (faults.DeviceOps), as passed to
// fault by each of them.
const (
	opAlloc             = "Alloc"
	opFree              = "Free"
	opMemInfo           = "MemInfo"
	opSynchronize       = "Synchronize"
	opReserve           = "Reserve"
	opReleaseAddress    = "ReleaseAddress"
	opCreate            = "Create"
	opRelease           = "Release"
	opMap               = "Map"
	opSetAccess         = "SetAccess"
	opUnmap             = "Unmap"
	opNewEvent          = "NewEvent"
	opDestroyEvent      = "DestroyEvent"
	opRecord            = "Record"
	opQuery             = "Query"
	opWait              = "Wait"
	opStreamWait        = "StreamWait"
	opNewStream         = "NewStream"
	opDestroyStream     = "DestroyStream"
	opSynchronizeStream = "SynchronizeStream"
	opCopy              = "Copy"
	opNewMarker         = "NewMarker"
	opDestroyMarker     = "DestroyMarker"
	opMark              = "Mark"
)

// FailNth makes the n-th future call (n >= 1; 1 is the next call) of the
// named operation fail with an *device.OpError wrapping device.ErrInjected.
// op is a device method name ("Alloc", "Free", "MemInfo", "Synchronize",
// "Reserve", "ReleaseAddress", "Create", "Release", "Map", "SetAccess",
// "Unmap", "NewEvent", "DestroyEvent", "Record", "Query", "Wait",
// "StreamWait", "NewStream", "DestroyStream", "SynchronizeStream", "Copy",
// "NewMarker", "DestroyMarker", "Mark") or ""
// for any of them. Calls count whether or not they would have succeeded; the
// injected failure happens before argument checking and changes no state.
// Several faults may be armed at once. FailNth panics on an unknown name or
// n < 1 (see internal/faults).
func (d *Device) FailNth(op string, n int) { d.faults.FailNth(op, n) }

// FailOOM is FailNth with an error that wraps device.ErrOutOfMemory (and
// device.ErrInjected, so a test can tell it from a real one).
func (d *Device) FailOOM(op string, n int) { d.faults.FailOOM(op, n) }

// ClearFaults disarms every pending FailNth and FailOOM and gives back all
// memory taken by Shrink.
func (d *Device) ClearFaults() {
	d.faults.Clear()
	d.mu.Lock()
	d.shrunk = 0
	d.mu.Unlock()
}

// Shrink takes bytes of free device memory away, as another process
// allocating it would. It fails with device.ErrOutOfMemory, taking nothing,
// if fewer bytes are free.
func (d *Device) Shrink(bytes uint64) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if bytes > d.avail() {
		return &device.OpError{Op: "sim.Shrink", Args: fmt.Sprintf("bytes=%d", bytes), Err: d.oom(bytes)}
	}
	d.shrunk += bytes
	return nil
}

// Grow gives back bytes taken by Shrink. It fails with device.ErrInvalid if
// fewer bytes were taken.
func (d *Device) Grow(bytes uint64) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if bytes > d.shrunk {
		return &device.OpError{Op: "sim.Grow", Args: fmt.Sprintf("bytes=%d", bytes),
			Err: errf(device.ErrInvalid, "only %d bytes were taken by Shrink", d.shrunk)}
	}
	d.shrunk -= bytes
	return nil
}

// fault counts a call of op against the armed faults and returns the
// injected error if one fires. It is the first thing every faultable
// operation does (with d.mu held).
func (d *Device) fault(op string) error {
	err := d.faults.Hit(op)
	if err != nil {
		d.st.Injected++
	}
	return err
}
