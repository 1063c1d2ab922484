package host

import (
	"cmp"
	"errors"
	"fmt"
	"slices"

	"github.com/gpumem/gpumem/device"
)

// Checkpoints of private pools: what torch.compile's CUDA graph trees
// (mode="reduce-overhead") need to go from replaying graphs to recording
// a new one. A replay runs only on the device: the allocator's books still
// say what they said when the last graph was recorded, or whatever the
// program freed since, not what the replayed graphs' outputs hold now. So
// right after each recording the trees take a checkpoint of the pool
// (PyTorch's getCheckpointState: its live buffers), and before recording
// a child of a replayed graph they put the pool back to it
// (setCheckpointPoolState): every live buffer of the pool is freed and the
// checkpoint's buffers are made again at their addresses
// (gpumem.Allocator.AllocAt). The Python package then gives the tensors
// still alive their deleters back (python/gpumem/_torch_graphs.py).
//
// Invariant: after RestorePool the pool's live buffers are exactly the
// checkpoint's, with the same addresses and sizes.

// PoolBuffer is a live buffer of a private pool as a checkpoint keeps it:
// its address, the size asked for and the stream it was allocated on.
type PoolBuffer struct{ Ptr, Size, Stream uint64 }

// CheckpointPool returns the live buffers of pool id on device ordinal, in
// address order: a checkpoint for RestorePool.
func (h *Host) CheckpointPool(ordinal int, id PoolID) ([]PoolBuffer, error) {
	d, p, err := h.poolOf(ordinal, id, "CheckpointPool")
	if err != nil {
		return nil, err
	}
	es := d.tab.entriesOf(p)
	out := make([]PoolBuffer, len(es))
	for i, e := range es {
		out[i] = PoolBuffer{Ptr: uint64(e.buf.Ptr()), Size: e.buf.Size(), Stream: e.stream}
	}
	return out, nil
}

// RestorePool puts pool id on device ordinal back to checkpoint cp
// (CheckpointPool): it frees every live buffer of the pool and makes each
// of cp's at its address. It returns the addresses it freed. Call it with
// no allocation into the pool underway and no capture on the device (it
// may wait for frees pending on other streams). A checkpoint that does
// not fit the pool (overlapping buffers, memory the pool does not hold)
// is refused before anything changes; a failure midway (the driver's)
// leaves the pool with the buffers made so far, and says so.
func (h *Host) RestorePool(ordinal int, id PoolID, cp []PoolBuffer) ([]uint64, error) {
	d, p, err := h.poolOf(ordinal, id, "RestorePool")
	if err != nil {
		return nil, err
	}
	if d.Alloc.Capturing() {
		return nil, fmt.Errorf("%w %v: RestorePool during a stream capture", ErrPool, id)
	}
	want := slices.Clone(cp)
	slices.SortFunc(want, func(x, y PoolBuffer) int { return cmp.Compare(x.Ptr, y.Ptr) })
	for i, b := range want {
		if b.Size == 0 || b.Ptr == 0 {
			return nil, fmt.Errorf("%w %v: RestorePool: checkpoint buffer %d is empty (%#x, %d bytes)", ErrPool, id, i, b.Ptr, b.Size)
		}
		if !p.alloc.Holds(device.Ptr(b.Ptr), b.Size) {
			return nil, fmt.Errorf("%w %v: RestorePool: checkpoint buffer %#x (%d bytes) is not in the pool's memory", ErrPool, id, b.Ptr, b.Size)
		}
		if i > 0 && want[i-1].Ptr+want[i-1].Size > b.Ptr {
			return nil, fmt.Errorf("%w %v: RestorePool: checkpoint buffers at %#x (%d bytes) and %#x overlap", ErrPool, id, want[i-1].Ptr, want[i-1].Size, b.Ptr)
		}
	}
	live := d.tab.entriesOf(p)
	freed := make([]uint64, 0, len(live))
	var errs []error
	for _, e := range live {
		ptr := uint64(e.buf.Ptr())
		if got, ok := d.tab.take(ptr); ok {
			errs = append(errs, d.free(got, 0))
			freed = append(freed, ptr)
		}
	}
	if err := errors.Join(errs...); err != nil {
		return freed, fmt.Errorf("gpumem: RestorePool%v: freeing the pool's buffers: %w", id, err)
	}
	for i, b := range want {
		p.live.Add(1)
		buf, err := p.alloc.AllocAt(device.Ptr(b.Ptr), b.Size)
		if err != nil {
			d.freed(p)
			return freed, fmt.Errorf("gpumem: RestorePool%v: buffer %d of %d: %w (the pool now holds the %d before it)", id, i+1, len(want), err, i)
		}
		if _, err := d.enter(entry{buf: buf, pool: p, stream: b.Stream}, uint64(buf.Ptr()), buf.Size()); err != nil {
			return freed, fmt.Errorf("gpumem: RestorePool%v: %w", id, err)
		}
	}
	return freed, nil
}

// poolOf finds pool id of device ordinal for op.
func (h *Host) poolOf(ordinal int, id PoolID, op string) (*Device, *privatePool, error) {
	d, err := h.Device(ordinal)
	if err != nil {
		return nil, nil, err
	}
	d.pools.mu.Lock()
	p := d.pools.byID[id]
	d.pools.mu.Unlock()
	if p == nil {
		return nil, nil, fmt.Errorf("%w %v: %s: no such pool on device %d", ErrPool, id, op, ordinal)
	}
	return d, p, nil
}
