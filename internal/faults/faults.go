// Package faults makes chosen future calls of a device's operations fail:
// the fault hooks (FailNth, FailOOM) of the simulated device and of the GPU
// test device, so that both inject the same failures with the same errors.
package faults

import (
	"fmt"
	"slices"
	"sync"

	"github.com/gpumem/gpumem/device"
)

// DeviceOps are the names of the operations of device.Device and its
// optional capabilities (the method names) that a fault can be armed on.
var DeviceOps = []string{
	"Alloc", "Free", "MemInfo", "Synchronize",
	"Reserve", "ReleaseAddress", "Create", "Release", "Map", "SetAccess", "Unmap",
	"NewEvent", "DestroyEvent", "Record", "Query", "Wait", "StreamWait",
	"NewStream", "DestroyStream", "SynchronizeStream", "Copy",
	"NewMarker", "DestroyMarker", "Mark",
}

// Injector holds the armed faults of one device. Operations are named by
// the device's method names; "" stands for any of them. It is safe for
// concurrent use.
type Injector struct {
	names []string // the operation names it accepts, "" included

	mu    sync.Mutex
	armed []fault
	fired uint64
}

type fault struct {
	op   string
	left int // calls to go, this one included
	n    int // as armed, for the message
	oom  bool
}

// New returns an Injector for the operations named (plus "" for any).
func New(names ...string) *Injector {
	return &Injector{names: append([]string{""}, names...)}
}

// FailNth makes the n-th future call (n >= 1; 1 is the next call) of
// operation op fail with an error matching device.ErrInjected. Calls count
// whether or not they would have succeeded. Several faults may be armed at
// once. It panics on an unknown name or n < 1.
func (f *Injector) FailNth(op string, n int) { f.arm(op, n, false) }

// FailOOM is FailNth with an error that also matches device.ErrOutOfMemory
// (and still device.ErrInjected, so a test can tell it from a real one).
func (f *Injector) FailOOM(op string, n int) { f.arm(op, n, true) }

func (f *Injector) arm(op string, n int, oom bool) {
	if !slices.Contains(f.names, op) {
		panic(fmt.Sprintf("faults: unknown operation %q for fault injection (want one of %q, or \"\" for any)", op, f.names[1:]))
	}
	if n < 1 {
		panic(fmt.Sprintf("faults: fault injection at call %d; calls are counted from 1", n))
	}
	f.mu.Lock()
	f.armed = append(f.armed, fault{op: op, left: n, n: n, oom: oom})
	f.mu.Unlock()
}

// Clear disarms every fault not yet fired.
func (f *Injector) Clear() {
	f.mu.Lock()
	f.armed = nil
	f.mu.Unlock()
}

// Fired is how many faults have fired.
func (f *Injector) Fired() uint64 {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.fired
}

// Hit counts one call of op against the armed faults and returns the
// injected error if one fires, else nil. A device calls it first thing in
// every operation that can fail.
func (f *Injector) Hit(op string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.armed) == 0 {
		return nil
	}
	var hit *fault
	kept := f.armed[:0]
	for _, a := range f.armed {
		if a.op == "" || a.op == op {
			a.left--
			if a.left == 0 {
				if hit == nil {
					hit = &a
				}
				continue
			}
		}
		kept = append(kept, a)
	}
	f.armed = kept
	if hit == nil {
		return nil
	}
	f.fired++
	if hit.oom {
		return fmt.Errorf("%w (%w by FailOOM(%q, %d))", device.ErrOutOfMemory, device.ErrInjected, hit.op, hit.n)
	}
	return fmt.Errorf("%w (FailNth(%q, %d))", device.ErrInjected, hit.op, hit.n)
}
