package sim

import (
	"fmt"

	"github.com/gpumem/gpumem/device"
)

type opcode uint8

const (
	opAny opcode = iota
	opAlloc
	opFree
	opMemInfo
	opSynchronize
	opReserve
	opReleaseAddress
	opCreate
	opRelease
	opMap
	opSetAccess
	opUnmap
	opNewEvent
	opDestroyEvent
	opRecord
	opQuery
	opWait
	opStreamWait
	opNewStream
	opDestroyStream
	opSynchronizeStream
	numOps
)

// opNames are the operation names FailNth and FailOOM accept: the names of
// the device methods. "" matches any of them.
var opNames = [numOps]string{
	opAny:               "",
	opAlloc:             "Alloc",
	opFree:              "Free",
	opMemInfo:           "MemInfo",
	opSynchronize:       "Synchronize",
	opReserve:           "Reserve",
	opReleaseAddress:    "ReleaseAddress",
	opCreate:            "Create",
	opRelease:           "Release",
	opMap:               "Map",
	opSetAccess:         "SetAccess",
	opUnmap:             "Unmap",
	opNewEvent:          "NewEvent",
	opDestroyEvent:      "DestroyEvent",
	opRecord:            "Record",
	opQuery:             "Query",
	opWait:              "Wait",
	opStreamWait:        "StreamWait",
	opNewStream:         "NewStream",
	opDestroyStream:     "DestroyStream",
	opSynchronizeStream: "SynchronizeStream",
}

type fault struct {
	op   opcode
	left int // calls to go, this one included
	oom  bool
	n    int // as armed, for the message
}

func parseOp(name string) opcode {
	for i, s := range opNames {
		if s == name {
			return opcode(i)
		}
	}
	panic(fmt.Sprintf("sim: unknown operation %q for fault injection (want one of the device method names, or \"\" for any)", name))
}

// FailNth makes the n-th future call (n >= 1; 1 is the next call) of the
// named operation fail with an *device.OpError wrapping device.ErrInjected.
// op is a device method name ("Alloc", "Free", "MemInfo", "Synchronize",
// "Reserve", "ReleaseAddress", "Create", "Release", "Map", "SetAccess",
// "Unmap", "NewEvent", "DestroyEvent", "Record", "Query", "Wait",
// "StreamWait", "NewStream", "DestroyStream", "SynchronizeStream") or ""
// for any of them. Calls count whether or not they would have succeeded; the
// injected failure happens before argument checking and changes no state.
// Several faults may be armed at once. FailNth panics on an unknown name or
// n < 1.
func (d *Device) FailNth(op string, n int) { d.arm(op, n, false) }

// FailOOM is FailNth with an error that wraps device.ErrOutOfMemory (and
// device.ErrInjected, so a test can tell it from a real one).
func (d *Device) FailOOM(op string, n int) { d.arm(op, n, true) }

func (d *Device) arm(op string, n int, oom bool) {
	code := parseOp(op)
	if n < 1 {
		panic(fmt.Sprintf("sim: fault injection at call %d; calls are counted from 1", n))
	}
	d.mu.Lock()
	d.faults = append(d.faults, fault{op: code, left: n, oom: oom, n: n})
	d.mu.Unlock()
}

// ClearFaults disarms every pending FailNth and FailOOM and gives back all
// memory taken by Shrink.
func (d *Device) ClearFaults() {
	d.mu.Lock()
	d.faults = d.faults[:0]
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
// operation does.
func (d *Device) fault(op opcode) error {
	if len(d.faults) == 0 {
		return nil
	}
	var hit fault
	fired := false
	kept := d.faults[:0]
	for i := range d.faults {
		f := d.faults[i]
		if f.op == opAny || f.op == op {
			f.left--
			if f.left == 0 {
				if !fired {
					hit, fired = f, true
				}
				continue
			}
		}
		kept = append(kept, f)
	}
	d.faults = kept
	if !fired {
		return nil
	}
	d.st.Injected++
	if hit.oom {
		return fmt.Errorf("%w (%w by FailOOM(%q, %d))", device.ErrOutOfMemory, device.ErrInjected, opNames[hit.op], hit.n)
	}
	return fmt.Errorf("%w (FailNth(%q, %d))", device.ErrInjected, opNames[hit.op], hit.n)
}
