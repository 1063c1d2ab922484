// Package conformance is gpumem's conformance suite: one set of tests of the
// allocator's contract (see the package comment of gpumem: the alloc and
// free paths, the stream contract, limits, scopes, statistics) that runs
// against every device backend and every configuration.
//
// A backend is tested by calling Run from a test of its own:
//
//	func TestConformanceSim(t *testing.T) {
//		conformance.Run(t, func(t *testing.T) conformance.Device {
//			return sim.MustNew(sim.Config{Capacity: 1 << 30})
//		})
//	}
//
// Only device.Device is required. The suite discovers what else the backend
// offers by type assertion, as package device does, and skips the tests that
// need a capability the backend lacks:
//
//	device.VirtualMemory  the ModeVirtual configurations
//	device.Streams        tests with several streams
//	Pender                tests of the stream contract (work left pending)
//	Faulter               device OOM and fault-injection tests
//	Shrinker              device exhaustion by another "process"
//	LeakChecker           "nothing left on the device after Close"
//	FaultCounter          exhaustive fault injection (every call of every op)
//	EventCounter          "no event left after Close"
//
// Every test runs under every configuration (see Configurations): ModeVirtual
// (where the device has virtual memory) and ModePlain, each plain, with a
// Limit, with Preallocate, with ReleaseThreshold and with CheckInvariants.
// After every operation the suite calls Allocator.Check and verifies the
// identities between the Stats fields and the buffers it knows to be live.
package conformance

import (
	"testing"

	"github.com/gpumem/gpumem"
	"github.com/gpumem/gpumem/device"
)

// Device is a backend under test: a device.Device, optionally with the
// capabilities of package device and the test hooks below.
type Device interface {
	device.Device
}

// Pender makes work pending on a stream, so that the suite can check that
// memory still used by pending work is never handed to another stream. The
// simulated device implements it directly (sim.Device); a real backend can
// implement it with a kernel that spins until released.
type Pender interface {
	// Hold stops stream s from completing work until Drain(s).
	Hold(s device.Stream)
	// Drain lifts the hold on s and completes its work.
	Drain(s device.Stream)
	// Touch enqueues on s work that reads and writes [p, p+size). It fails
	// if the range is not accessible.
	Touch(s device.Stream, p device.Ptr, size uint64) error
	// CheckHandoff fails if pending work on another stream uses
	// [p, p+size) and s's future work is not ordered after it.
	CheckHandoff(p device.Ptr, size uint64, s device.Stream) error
}

// Faulter injects failures into future device calls (see sim.Device.FailNth).
type Faulter interface {
	// FailNth makes the n-th future call of op fail with an error
	// matching device.ErrInjected.
	FailNth(op string, n int)
	// FailOOM is FailNth with an error that also matches
	// device.ErrOutOfMemory.
	FailOOM(op string, n int)
	// ClearFaults disarms all faults and undoes Shrink.
	ClearFaults()
}

// Shrinker takes device memory away, as another process would.
type Shrinker interface {
	Shrink(bytes uint64) error
	Grow(bytes uint64) error
}

// LeakChecker reports memory, mappings or address space still live on the
// device.
type LeakChecker interface {
	Leaks() error
}

// FaultCounter reports how many injected faults have fired, so that the
// suite can fail every call of an operation in turn until a workload no
// longer reaches the next one.
type FaultCounter interface {
	InjectedFaults() uint64
}

// EventCounter reports the events live on the device.
type EventCounter interface {
	LiveEvents() int
}

// Configuration is one allocator configuration the suite runs under.
type Configuration struct {
	Name   string
	Config gpumem.Config
}

// Sizes of the configurations (see Configurations). Tests that need their
// own numbers derive them from these.
const (
	confLimit     = 512 << 20
	confPrealloc  = 8 << 20
	confThreshold = 32 << 20
)

// Configurations lists the configurations the suite runs under for dev:
// virtual (if dev has virtual memory) and plain, each default, with a Limit,
// with Preallocate, with ReleaseThreshold and with CheckInvariants, and
// virtual with Compact and with Defrag under the limit (invariants checked).
func Configurations(dev device.Device) []Configuration {
	modes := []gpumem.Mode{gpumem.ModePlain}
	if _, ok := device.AsVirtualMemory(dev); ok {
		modes = []gpumem.Mode{gpumem.ModeVirtual, gpumem.ModePlain}
	}
	limit := uint64(confLimit)
	if total := dev.Info().Total; total > 0 && limit > total/2 {
		limit = total / 2
	}
	var out []Configuration
	for _, m := range modes {
		out = append(out,
			Configuration{m.String() + "/default", gpumem.Config{Mode: m}},
			Configuration{m.String() + "/limit", gpumem.Config{Mode: m, Limit: limit}},
			Configuration{m.String() + "/preallocate", gpumem.Config{Mode: m, Preallocate: confPrealloc}},
			Configuration{m.String() + "/release-threshold", gpumem.Config{Mode: m, ReleaseThreshold: confThreshold}},
			Configuration{m.String() + "/check-invariants", gpumem.Config{Mode: m, CheckInvariants: true}},
		)
		if m == gpumem.ModeVirtual {
			out = append(out, Configuration{m.String() + "/compact", gpumem.Config{Mode: m, Compact: true, CheckInvariants: true}},
				Configuration{m.String() + "/defrag", gpumem.Config{Mode: m, Defrag: true, Limit: limit, CheckInvariants: true}},
				Configuration{m.String() + "/chunk-handles", gpumem.Config{Mode: m, ChunkHandles: true, Limit: limit, CheckInvariants: true}})
		}
	}
	return out
}

// suite is one configuration of one backend.
type suite struct {
	newDevice func(t *testing.T) Device
	conf      Configuration
}

var tests = []struct {
	name string
	fn   func(t *testing.T, s *suite)
}{
	{"Basics", testBasics},
	{"ReuseSameStream", testReuseSameStream},
	{"ReuseWhilePending", testReuseWhilePending},
	{"StreamOrderHandoff", testStreamOrderHandoff},
	{"StreamOrderManyStreams", testStreamOrderManyStreams},
	{"FailedBackMovedSpan", testFailedBackMovedSpan},
	{"RecordStream", testRecordStream},
	{"RecordStreamErrors", testRecordStreamErrors},
	{"Trim", testTrim},
	{"Limit", testLimit},
	{"DeviceOOM", testDeviceOOM},
	{"DeviceOOMInjected", testDeviceOOMInjected},
	{"Faults", testFaults},
	{"FaultsDuringClose", testFaultsDuringClose},
	{"DoubleFree", testDoubleFree},
	{"Foreign", testForeign},
	{"InvalidSize", testInvalidSize},
	{"Close", testClose},
	{"ScopeClose", testScopeClose},
	{"ScopeQuota", testScopeQuota},
	{"ScopeNested", testScopeNested},
	{"ScopeParentClosesChildren", testScopeParentClosesChildren},
	{"ScopeFreeThroughAllocator", testScopeFreeThroughAllocator},
	{"ScopeInvalidSize", testScopeInvalidSize},
	{"StatsIdentities", testStatsIdentities},
	{"StatsKnownFields", testStatsKnownFields},
	{"Snapshot", testSnapshot},
	{"IdleRelease", testIdleRelease},
	{"ReleaseThreshold", testReleaseThreshold},
}

// Run runs the whole suite on devices made by newDevice, under every
// configuration. newDevice is called once per test (and once to learn the
// device's capabilities); it may register cleanups with t.
func Run(t *testing.T, newDevice func(t *testing.T) Device) {
	probe := newDevice(t)
	for _, conf := range Configurations(probe) {
		t.Run(conf.Name, func(t *testing.T) {
			s := &suite{newDevice: newDevice, conf: conf}
			for _, tc := range tests {
				t.Run(tc.name, func(t *testing.T) { tc.fn(t, s) })
			}
		})
	}
}
