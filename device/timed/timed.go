// Package timed is a device adaptor that counts and times every call made
// to the device it wraps: where a replay's time goes on the real driver,
// operation by operation (`gpumem replay --driver-times`).
//
// A whole replay's time on the H100 varies by up to 2x between identical
// runs on a shared host, so comparing two builds by their ns per event
// cannot resolve a change of tens of percent. The driver's calls are most
// of the time of every replay that makes many of them, and their count and
// cost apart tell which part moved: more calls (a decision changed) or
// dearer ones (the host, or the call's arguments).
//
// The adaptor has every optional capability of package device, so it
// wraps only devices that have them all (the simulated device and the CUDA
// backend do): a wrapper that claimed a capability its device lacks would
// change what the allocator does. Markers are the exception, being
// optional on a GPU too: NewMarker says whether the device has them
// (device.ErrUnsupported if not), here as on the device. Methods that only
// read a property (Info, Granularity) and Reached (a load) are not timed.
// Timing a call costs two clock reads
// (tens of nanoseconds), nothing beside a driver call of microseconds;
// on the simulated device, whose calls cost about as much, the times say
// little and ns per event rises.
package timed

import (
	"cmp"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync/atomic"
	"time"

	"github.com/gpumem/gpumem/device"
)

// Op is the number of calls of one operation and their wall time.
type Op struct {
	Calls uint64 `json:"calls"`
	Ns    uint64 `json:"ns"`
}

// Times is what each operation called so far cost, by the name of the
// device method (Create, Map, SetAccess, ...: the names of the device
// interfaces). Operations never called are absent.
type Times map[string]Op

// Sub returns t - u, operation by operation: what happened between two
// snapshots, u taken first. Every operation of t is in it, with no call
// if none happened in between (so that "none" reads as none, not as
// "not measured").
func (t Times) Sub(u Times) Times {
	d := Times{}
	for name, o := range t {
		b := u[name]
		d[name] = Op{Calls: o.Calls - b.Calls, Ns: o.Ns - b.Ns}
	}
	return d
}

// Total is the sum over every operation.
func (t Times) Total() Op {
	var s Op
	for _, o := range t {
		s.Calls += o.Calls
		s.Ns += o.Ns
	}
	return s
}

// Names returns the operations of t, the dearest first (ties by name).
func (t Times) Names() []string {
	return slices.SortedFunc(maps.Keys(t), func(a, b string) int {
		return cmp.Or(cmp.Compare(t[b].Ns, t[a].Ns), cmp.Compare(a, b))
	})
}

// The timed operations, in the order of the device interfaces.
const (
	opMemInfo = iota
	opAlloc
	opFree
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
	opCopy
	opNewMarker
	opDestroyMarker
	opMark
	nOps
)

// OpNames are the names of the timed operations, as Times reports them.
var OpNames = [nOps]string{
	"MemInfo", "Alloc", "Free", "Synchronize",
	"Reserve", "ReleaseAddress", "Create", "Release", "Map", "SetAccess", "Unmap",
	"NewEvent", "DestroyEvent", "Record", "Query", "Wait", "StreamWait",
	"NewStream", "DestroyStream", "SynchronizeStream", "Copy",
	"NewMarker", "DestroyMarker", "Mark",
}

// Device wraps a device and times its calls. It is safe for concurrent use
// as the device is; the times of calls made at once add up (they may then
// exceed the wall time that passed).
type Device struct {
	d  device.Device
	vm device.VirtualMemory
	ev device.Events
	st device.Streams
	cp device.Copier
	mk device.Markers // nil where the device's type has none

	ops [nOps]struct{ calls, ns atomic.Uint64 }
}

var (
	_ device.Device        = (*Device)(nil)
	_ device.VirtualMemory = (*Device)(nil)
	_ device.Events        = (*Device)(nil)
	_ device.Streams       = (*Device)(nil)
	_ device.Copier        = (*Device)(nil)
	_ device.Markers       = (*Device)(nil)
)

// ErrCapability is returned by New for a device that lacks one of the
// optional capabilities.
var ErrCapability = errors.New("timed: the device lacks a capability")

// New wraps d, which must have every optional capability of package device
// (virtual memory, events, streams, copies); else the error matches
// ErrCapability and names what is missing.
func New(d device.Device) (*Device, error) {
	t := &Device{d: d}
	var ok [4]bool
	t.vm, ok[0] = device.AsVirtualMemory(d)
	t.ev, ok[1] = device.AsEvents(d)
	t.st, ok[2] = device.AsStreams(d)
	t.cp, ok[3] = device.AsCopier(d)
	t.mk, _ = device.AsMarkers(d) // optional even on a GPU: NewMarker says
	for i, name := range []string{"virtual memory", "events", "streams", "copies"} {
		if !ok[i] {
			return nil, fmt.Errorf("%w: %s has no %s (timing needs a device with every capability, as the simulated device and CUDA have)", ErrCapability, d.Info().Name, name)
		}
	}
	return t, nil
}

// Unwrap returns the wrapped device.
func (t *Device) Unwrap() device.Device { return t.d }

// Times returns the calls and time of every operation called so far.
func (t *Device) Times() Times {
	out := Times{}
	for i := range t.ops {
		o := &t.ops[i]
		if n := o.calls.Load(); n > 0 {
			out[OpNames[i]] = Op{Calls: n, Ns: o.ns.Load()}
		}
	}
	return out
}

// done adds one call of op, begun at t0.
func (t *Device) done(op int, t0 time.Time) {
	o := &t.ops[op]
	o.ns.Add(uint64(time.Since(t0)))
	o.calls.Add(1)
}

func (t *Device) Info() device.Info { return t.d.Info() }

func (t *Device) MemInfo() (free, total uint64, err error) {
	defer t.done(opMemInfo, time.Now())
	return t.d.MemInfo()
}

func (t *Device) Alloc(size uint64) (device.Ptr, error) {
	defer t.done(opAlloc, time.Now())
	return t.d.Alloc(size)
}

func (t *Device) Free(p device.Ptr) error {
	defer t.done(opFree, time.Now())
	return t.d.Free(p)
}

func (t *Device) Synchronize() error {
	defer t.done(opSynchronize, time.Now())
	return t.d.Synchronize()
}

func (t *Device) Granularity() uint64 { return t.vm.Granularity() }

func (t *Device) Reserve(size, align uint64) (device.Ptr, error) {
	defer t.done(opReserve, time.Now())
	return t.vm.Reserve(size, align)
}

func (t *Device) ReleaseAddress(p device.Ptr, size uint64) error {
	defer t.done(opReleaseAddress, time.Now())
	return t.vm.ReleaseAddress(p, size)
}

func (t *Device) Create(size uint64) (device.Handle, error) {
	defer t.done(opCreate, time.Now())
	return t.vm.Create(size)
}

func (t *Device) Release(h device.Handle) error {
	defer t.done(opRelease, time.Now())
	return t.vm.Release(h)
}

func (t *Device) Map(p device.Ptr, size uint64, h device.Handle) error {
	defer t.done(opMap, time.Now())
	return t.vm.Map(p, size, h)
}

func (t *Device) SetAccess(p device.Ptr, size uint64) error {
	defer t.done(opSetAccess, time.Now())
	return t.vm.SetAccess(p, size)
}

func (t *Device) Unmap(p device.Ptr, size uint64) error {
	defer t.done(opUnmap, time.Now())
	return t.vm.Unmap(p, size)
}

func (t *Device) NewEvent() (device.Event, error) {
	defer t.done(opNewEvent, time.Now())
	return t.ev.NewEvent()
}

func (t *Device) DestroyEvent(e device.Event) error {
	defer t.done(opDestroyEvent, time.Now())
	return t.ev.DestroyEvent(e)
}

func (t *Device) Record(e device.Event, s device.Stream) error {
	defer t.done(opRecord, time.Now())
	return t.ev.Record(e, s)
}

func (t *Device) Query(e device.Event) (bool, error) {
	defer t.done(opQuery, time.Now())
	return t.ev.Query(e)
}

func (t *Device) Wait(e device.Event) error {
	defer t.done(opWait, time.Now())
	return t.ev.Wait(e)
}

func (t *Device) StreamWait(s device.Stream, e device.Event) error {
	defer t.done(opStreamWait, time.Now())
	return t.ev.StreamWait(s, e)
}

func (t *Device) NewStream() (device.Stream, error) {
	defer t.done(opNewStream, time.Now())
	return t.st.NewStream()
}

func (t *Device) DestroyStream(s device.Stream) error {
	defer t.done(opDestroyStream, time.Now())
	return t.st.DestroyStream(s)
}

func (t *Device) SynchronizeStream(s device.Stream) error {
	defer t.done(opSynchronizeStream, time.Now())
	return t.st.SynchronizeStream(s)
}

func (t *Device) Copy(dst, src device.Ptr, n uint64) error {
	defer t.done(opCopy, time.Now())
	return t.cp.Copy(dst, src, n)
}

// NewMarker is the device's, or fails with device.ErrUnsupported where its
// type has no markers: the wrapper claims none its device lacks.
func (t *Device) NewMarker() (device.Marker, error) {
	defer t.done(opNewMarker, time.Now())
	if t.mk == nil {
		return 0, &device.OpError{Op: "timed.NewMarker", Err: device.ErrUnsupported}
	}
	return t.mk.NewMarker()
}

func (t *Device) DestroyMarker(m device.Marker) error {
	defer t.done(opDestroyMarker, time.Now())
	return t.mk.DestroyMarker(m)
}

func (t *Device) Mark(m device.Marker, s device.Stream, v uint64) error {
	defer t.done(opMark, time.Now())
	return t.mk.Mark(m, s, v)
}

// Reached is not timed: on a GPU it is a load, no driver call.
func (t *Device) Reached(m device.Marker) uint64 { return t.mk.Reached(m) }
