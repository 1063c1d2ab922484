package gputest

import (
	"fmt"
	"sync"

	"github.com/gpumem/gpumem/device"
	"github.com/gpumem/gpumem/device/cuda"
	"github.com/gpumem/gpumem/internal/conformance"
	"github.com/gpumem/gpumem/internal/faults"
)

// suiteGPU is the CUDA device with the conformance suite's hooks, so that
// every test of the suite runs on the GPU:
//
//   - faults (conformance.Faulter, FaultCounter): a fault armed on an
//     operation makes its n-th future call fail before it reaches the
//     driver, with the simulated device's errors (internal/faults, which
//     both use).
//     Memory the allocator fails to give back after a fault shows in the
//     device's free memory, which the suite checks after every test.
//   - holds (conformance.Pender, pend_test.go): a held stream runs a kernel
//     that waits for a flag; Touch writes the buffer on its stream;
//     CheckHandoff asks the GPU whether a stream's work would run before
//     work still pending on another stream.
//   - memory taken away (conformance.Shrinker): real allocations of the
//     GPU's free memory, given back by Grow, ClearFaults or the test's end.
type suiteGPU struct {
	*cuda.Device
	faults *faults.Injector

	mu     sync.Mutex
	shrunk []shrunk // memory Shrink holds, last taken last

	pend pendState // guarded by its own mutex (pend_test.go)
}

var (
	_ conformance.Faulter      = (*suiteGPU)(nil)
	_ conformance.FaultCounter = (*suiteGPU)(nil)
	_ conformance.Pender       = (*suiteGPU)(nil)
	_ conformance.Shrinker     = (*suiteGPU)(nil)
	_ device.VirtualMemory     = (*suiteGPU)(nil)
	_ device.Events            = (*suiteGPU)(nil)
	_ device.Streams           = (*suiteGPU)(nil)
)

func (d *suiteGPU) FailNth(op string, n int) { d.faults.FailNth(op, n) }
func (d *suiteGPU) FailOOM(op string, n int) { d.faults.FailOOM(op, n) }
func (d *suiteGPU) InjectedFaults() uint64   { return d.faults.Fired() }

// ClearFaults disarms every fault and gives back what Shrink took.
func (d *suiteGPU) ClearFaults() {
	d.faults.Clear()
	d.growAll()
}

// fault counts a call of op against the armed faults and returns the
// injected error if one fires.
func (d *suiteGPU) fault(op string) error {
	if err := d.faults.Hit(op); err != nil {
		return &device.OpError{Op: "gputest." + op, Err: err}
	}
	return nil
}

func (d *suiteGPU) Alloc(size uint64) (device.Ptr, error) {
	if err := d.fault("Alloc"); err != nil {
		return 0, err
	}
	return d.Device.Alloc(size)
}

func (d *suiteGPU) Free(p device.Ptr) error {
	if err := d.fault("Free"); err != nil {
		return err
	}
	d.releaseAll() // cuMemFree waits for all work on the device
	return d.Device.Free(p)
}

func (d *suiteGPU) MemInfo() (free, total uint64, err error) {
	if err := d.fault("MemInfo"); err != nil {
		return 0, 0, err
	}
	return d.Device.MemInfo()
}

func (d *suiteGPU) Synchronize() error {
	if err := d.fault("Synchronize"); err != nil {
		return err
	}
	d.releaseAll()
	return d.Device.Synchronize()
}

func (d *suiteGPU) Reserve(size, align uint64) (device.Ptr, error) {
	if err := d.fault("Reserve"); err != nil {
		return 0, err
	}
	return d.Device.Reserve(size, align)
}

func (d *suiteGPU) ReleaseAddress(p device.Ptr, size uint64) error {
	if err := d.fault("ReleaseAddress"); err != nil {
		return err
	}
	return d.Device.ReleaseAddress(p, size)
}

func (d *suiteGPU) Create(size uint64) (device.Handle, error) {
	if err := d.fault("Create"); err != nil {
		return 0, err
	}
	return d.Device.Create(size)
}

func (d *suiteGPU) Release(h device.Handle) error {
	if err := d.fault("Release"); err != nil {
		return err
	}
	return d.Device.Release(h)
}

func (d *suiteGPU) Map(p device.Ptr, size uint64, h device.Handle) error {
	if err := d.fault("Map"); err != nil {
		return err
	}
	return d.Device.Map(p, size, h)
}

func (d *suiteGPU) SetAccess(p device.Ptr, size uint64) error {
	if err := d.fault("SetAccess"); err != nil {
		return err
	}
	return d.Device.SetAccess(p, size)
}

func (d *suiteGPU) Unmap(p device.Ptr, size uint64) error {
	if err := d.fault("Unmap"); err != nil {
		return err
	}
	return d.Device.Unmap(p, size)
}

func (d *suiteGPU) NewEvent() (device.Event, error) {
	if err := d.fault("NewEvent"); err != nil {
		return 0, err
	}
	return d.Device.NewEvent()
}

func (d *suiteGPU) DestroyEvent(e device.Event) error {
	if err := d.fault("DestroyEvent"); err != nil {
		return err
	}
	return d.Device.DestroyEvent(e)
}

func (d *suiteGPU) Record(e device.Event, s device.Stream) error {
	if err := d.fault("Record"); err != nil {
		return err
	}
	if err := d.Device.Record(e, s); err != nil {
		return err
	}
	d.recorded(e, s)
	return nil
}

func (d *suiteGPU) NewMarker() (device.Marker, error) {
	if err := d.fault("NewMarker"); err != nil {
		return 0, err
	}
	return d.Device.NewMarker()
}

func (d *suiteGPU) DestroyMarker(m device.Marker) error {
	if err := d.fault("DestroyMarker"); err != nil {
		return err
	}
	return d.Device.DestroyMarker(m)
}

// Mark: a write on a held stream lands once the hold is drained (the
// kernel holding the stream comes before it), as on the simulated device.
func (d *suiteGPU) Mark(m device.Marker, s device.Stream, v uint64) error {
	if err := d.fault("Mark"); err != nil {
		return err
	}
	return d.Device.Mark(m, s, v)
}

func (d *suiteGPU) Query(e device.Event) (bool, error) {
	if err := d.fault("Query"); err != nil {
		return false, err
	}
	return d.Device.Query(e)
}

func (d *suiteGPU) Wait(e device.Event) error {
	if err := d.fault("Wait"); err != nil {
		return err
	}
	d.releaseFor(e)
	return d.Device.Wait(e)
}

func (d *suiteGPU) StreamWait(s device.Stream, e device.Event) error {
	if err := d.fault("StreamWait"); err != nil {
		return err
	}
	if err := d.Device.StreamWait(s, e); err != nil {
		return err
	}
	d.waited(s, e)
	return nil
}

func (d *suiteGPU) NewStream() (device.Stream, error) {
	if err := d.fault("NewStream"); err != nil {
		return 0, err
	}
	return d.Device.NewStream()
}

func (d *suiteGPU) DestroyStream(s device.Stream) error {
	if err := d.fault("DestroyStream"); err != nil {
		return err
	}
	return d.Device.DestroyStream(s)
}

func (d *suiteGPU) SynchronizeStream(s device.Stream) error {
	if err := d.fault("SynchronizeStream"); err != nil {
		return err
	}
	d.releaseStream(s)
	return d.Device.SynchronizeStream(s)
}

// Shrink takes bytes of the GPU's free memory away as another process
// would, with real allocations (cuMemAlloc, in pieces of at most
// shrinkPiece); if the driver refuses, it gives back what it took and fails
// with the driver's error (which matches device.ErrOutOfMemory).
func (d *suiteGPU) Shrink(bytes uint64) error {
	var took []shrunk
	for left := bytes; left > 0; {
		n := min(left, shrinkPiece)
		p, err := d.Device.Alloc(n)
		if err != nil {
			for _, s := range took {
				d.Device.Free(s.p)
			}
			return &device.OpError{Op: "gputest.Shrink", Args: fmt.Sprintf("bytes=%d", bytes), Err: err}
		}
		took = append(took, shrunk{p, n})
		left -= n
	}
	d.mu.Lock()
	d.shrunk = append(d.shrunk, took...)
	d.mu.Unlock()
	return nil
}

// Grow gives back bytes taken by Shrink, last taken first; bytes must end
// on a piece Shrink took.
func (d *suiteGPU) Grow(bytes uint64) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	for bytes > 0 {
		n := len(d.shrunk)
		if n == 0 || d.shrunk[n-1].size > bytes {
			return &device.OpError{Op: "gputest.Grow", Args: fmt.Sprintf("bytes=%d", bytes),
				Err: fmt.Errorf("not what Shrink took: %w", device.ErrInvalid)}
		}
		s := d.shrunk[n-1]
		if err := d.Device.Free(s.p); err != nil {
			return err
		}
		d.shrunk = d.shrunk[:n-1]
		bytes -= s.size
	}
	return nil
}

// growAll gives back everything Shrink took (ClearFaults, the end of a test).
func (d *suiteGPU) growAll() {
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, s := range d.shrunk {
		d.Device.Free(s.p)
	}
	d.shrunk = nil
}

// shrinkPiece is the most Shrink takes in one allocation.
const shrinkPiece = 4 << 30

type shrunk struct {
	p    device.Ptr
	size uint64
}
