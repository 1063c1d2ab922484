package gpumem_test

import (
	"testing"

	"github.com/gpumem/gpumem/device"
	"github.com/gpumem/gpumem/device/sim"
	"github.com/gpumem/gpumem/internal/conformance"
)

// simDevice is the simulated device with the counters the conformance
// suite's optional hooks want (it embeds *sim.Device, so every capability
// and test hook of the simulation is promoted).
type simDevice struct{ *sim.Device }

func (d simDevice) InjectedFaults() uint64 { return d.Stats().Injected }
func (d simDevice) LiveEvents() int        { return d.Stats().LiveEvents }

func newSim(capacity uint64) simDevice {
	return simDevice{sim.MustNew(sim.Config{Capacity: capacity})}
}

// TestConformanceSim runs the conformance suite on the simulated device, in
// both modes and every configuration.
func TestConformanceSim(t *testing.T) {
	conformance.Run(t, func(t *testing.T) conformance.Device { return newSim(1 << 30) })
}

// TestConformanceSimEvents: the suite again on a simulated device without
// markers (device.Markers), whose epochs are events, as on a GPU without
// 64-bit stream memory operations or with markers=false.
// Under the race detector it skips: it doubles TestConformanceSim's time
// there, and its locking is the markers' (the epochs differ in the device
// call, not in what holds the pool); `go test ./...` runs it (.ci/run).
func TestConformanceSimEvents(t *testing.T) {
	if raceDetector {
		t.Skip("under -race: the same locking as TestConformanceSim's; it runs without -race (go test ./..., .ci/run)")
	}
	conformance.Run(t, func(t *testing.T) conformance.Device {
		return simDevice{sim.MustNew(sim.Config{Capacity: 1 << 30, NoMarkers: true})}
	})
}

// plainDevice is the simulated device without virtual memory and without
// events: the least a backend may offer (plus streams and the test hooks).
// It runs the allocator's fallbacks: plain segments only, and a device
// Synchronize wherever events would have ordered streams.
type plainDevice struct {
	d *sim.Device
	conformance.SimHooks
}

func newPlain(d *sim.Device) plainDevice { return plainDevice{d, conformance.SimHooks{S: d}} }

func (p plainDevice) Info() device.Info                   { return p.d.Info() }
func (p plainDevice) MemInfo() (uint64, uint64, error)    { return p.d.MemInfo() }
func (p plainDevice) Alloc(n uint64) (device.Ptr, error)  { return p.d.Alloc(n) }
func (p plainDevice) Free(ptr device.Ptr) error           { return p.d.Free(ptr) }
func (p plainDevice) Synchronize() error                  { return p.d.Synchronize() }
func (p plainDevice) NewStream() (device.Stream, error)   { return p.d.NewStream() }
func (p plainDevice) DestroyStream(s device.Stream) error { return p.d.DestroyStream(s) }
func (p plainDevice) SynchronizeStream(s device.Stream) error {
	return p.d.SynchronizeStream(s)
}

// TestConformanceSimNoEvents runs the suite on a device with neither
// virtual memory nor events.
func TestConformanceSimNoEvents(t *testing.T) {
	conformance.Run(t, func(t *testing.T) conformance.Device {
		return newPlain(sim.MustNew(sim.Config{Capacity: 1 << 30}))
	})
}
