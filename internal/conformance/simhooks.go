package conformance

import (
	"github.com/gpumem/gpumem/device"
	"github.com/gpumem/gpumem/device/sim"
)

// SimHooks gives a wrapper of the simulated device every optional hook of
// the suite (Pender, Faulter, Shrinker, LeakChecker, FaultCounter,
// EventCounter), forwarded to S, without promoting S's device methods:
// embed it in a device that offers fewer capabilities than the simulation,
// or in an adaptor over it.
type SimHooks struct{ S *sim.Device }

func (h SimHooks) Hold(s device.Stream)  { h.S.Hold(s) }
func (h SimHooks) Drain(s device.Stream) { h.S.Drain(s) }
func (h SimHooks) Touch(s device.Stream, p device.Ptr, n uint64) error {
	return h.S.Touch(s, p, n)
}
func (h SimHooks) CheckHandoff(p device.Ptr, n uint64, s device.Stream) error {
	return h.S.CheckHandoff(p, n, s)
}
func (h SimHooks) FailNth(op string, n int) { h.S.FailNth(op, n) }
func (h SimHooks) FailOOM(op string, n int) { h.S.FailOOM(op, n) }
func (h SimHooks) ClearFaults()             { h.S.ClearFaults() }
func (h SimHooks) Shrink(n uint64) error    { return h.S.Shrink(n) }
func (h SimHooks) Grow(n uint64) error      { return h.S.Grow(n) }
func (h SimHooks) Leaks() error             { return h.S.Leaks() }
func (h SimHooks) InjectedFaults() uint64   { return h.S.Stats().Injected }
func (h SimHooks) LiveEvents() int          { return h.S.Stats().LiveEvents }
