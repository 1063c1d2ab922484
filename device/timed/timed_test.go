package timed_test

import (
	"errors"
	"slices"
	"testing"

	"github.com/gpumem/gpumem"
	"github.com/gpumem/gpumem/device"
	"github.com/gpumem/gpumem/device/sim"
	"github.com/gpumem/gpumem/device/timed"
	"github.com/gpumem/gpumem/internal/conformance"
	"github.com/gpumem/gpumem/internal/faults"
)

// hooked is the timed simulated device with the simulation's test hooks,
// for the conformance suite.
type hooked struct {
	*timed.Device
	conformance.SimHooks
}

func newTimed(t *testing.T) (*timed.Device, *sim.Device) {
	t.Helper()
	s := sim.MustNew(sim.Config{Capacity: 1 << 30})
	d, err := timed.New(s)
	if err != nil {
		t.Fatal(err)
	}
	return d, s
}

// TestConformanceTimed runs the conformance suite through the adaptor: the
// allocator must not be able to tell it from the device it wraps (errors,
// faults and capabilities pass through unchanged).
func TestConformanceTimed(t *testing.T) {
	if testing.Short() {
		t.Skip("the whole conformance suite; the root package runs it on the simulated device itself")
	}
	conformance.Run(t, func(t *testing.T) conformance.Device {
		d, s := newTimed(t)
		return hooked{d, conformance.SimHooks{S: s}}
	})
}

// TestTimesMatchStats: the calls the adaptor saw are the ones the
// allocator counts in its Stats, operation by operation, through growth,
// splits of sparse spans (Defrag) and a trim.
func TestTimesMatchStats(t *testing.T) {
	d, _ := newTimed(t)
	a, err := gpumem.New(d, gpumem.Config{Mode: gpumem.ModeVirtual, Defrag: true})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	// Eight 16 MiB spans, emptied, then filled with 2 MiB blocks of which
	// every eighth stays: sparse spans, which the large request's growth
	// splits (Defrag).
	var bufs []gpumem.Buffer
	for range 8 {
		b, err := a.Alloc(16<<20, 0)
		if err != nil {
			t.Fatal(err)
		}
		bufs = append(bufs, b)
	}
	for _, b := range bufs {
		if err := a.Free(b); err != nil {
			t.Fatal(err)
		}
	}
	bufs = bufs[:0]
	for range 64 {
		b, err := a.Alloc(2<<20, 0)
		if err != nil {
			t.Fatal(err)
		}
		bufs = append(bufs, b)
	}
	for i, b := range bufs {
		if i%8 != 0 {
			if err := a.Free(b); err != nil {
				t.Fatal(err)
			}
		}
	}
	big, err := a.Alloc(100<<20, 0)
	if err != nil {
		t.Fatal(err)
	}
	if err := a.Free(big); err != nil {
		t.Fatal(err)
	}
	if err := a.Trim(); err != nil {
		t.Fatal(err)
	}
	st, tm := a.Stats(), d.Times()
	for _, c := range []struct {
		op   string
		want uint64
	}{
		{"Create", st.Creates}, {"Release", st.Releases}, {"Map", st.Maps}, {"Unmap", st.Unmaps},
		{"SetAccess", st.SetAccess}, {"Reserve", st.Reserves}, {"Copy", st.Copies},
	} {
		if got := tm[c.op].Calls; got != c.want {
			t.Errorf("%s: the device saw %d calls, Stats counts %d", c.op, got, c.want)
		}
	}
	if st.Creates == 0 || st.Splits == 0 || st.Releases == 0 {
		t.Errorf("the workload made no growth, split or release: %+v", st)
	}
	tot := tm.Total()
	var sum uint64
	for _, name := range tm.Names() {
		o := tm[name]
		if o.Calls == 0 {
			t.Errorf("%s listed with no call", name)
		}
		sum += o.Calls
	}
	if sum != tot.Calls {
		t.Errorf("Total: %d calls, the operations add up to %d", tot.Calls, sum)
	}
}

// TestTimesSub: a difference of two snapshots holds only what happened in
// between.
func TestTimesSub(t *testing.T) {
	d, _ := newTimed(t)
	if _, err := d.Create(2 << 20); err != nil {
		t.Fatal(err)
	}
	before := d.Times()
	h, err := d.Create(2 << 20)
	if err != nil {
		t.Fatal(err)
	}
	if err := d.Release(h); err != nil {
		t.Fatal(err)
	}
	got := d.Times().Sub(before)
	if len(got) != 2 || got["Create"].Calls != 1 || got["Release"].Calls != 1 {
		t.Errorf("Sub = %+v, want one Create and one Release", got)
	}
	if names := got.Names(); len(names) != 2 {
		t.Errorf("Names = %q", names)
	}
	none := d.Times().Sub(d.Times())
	if len(none) != 2 || none.Total() != (timed.Op{}) {
		t.Errorf("Sub of equal snapshots = %+v, want both operations with no call", none)
	}
}

// TestFailedCallsCount: a call that fails is counted and timed (it cost
// the time it took), and its error passes through unchanged.
func TestFailedCallsCount(t *testing.T) {
	d, s := newTimed(t)
	s.FailOOM("Create", 1)
	_, err := d.Create(2 << 20)
	if !errors.Is(err, device.ErrOutOfMemory) || !errors.Is(err, device.ErrInjected) {
		t.Fatalf("Create: %v, want the injected OOM", err)
	}
	if c := d.Times()["Create"].Calls; c != 1 {
		t.Errorf("Create counted %d times, want 1", c)
	}
}

// TestNewNeedsEveryCapability: a device without one of the optional
// capabilities is refused with an error that names it.
func TestNewNeedsEveryCapability(t *testing.T) {
	_, err := timed.New(plainOnly{sim.MustNew(sim.Config{Capacity: 1 << 30})})
	if !errors.Is(err, timed.ErrCapability) {
		t.Fatalf("New(plain device) = %v, want ErrCapability", err)
	}
	t.Log(err)
}

type plainOnly struct{ d *sim.Device }

func (p plainOnly) Info() device.Info                  { return p.d.Info() }
func (p plainOnly) MemInfo() (uint64, uint64, error)   { return p.d.MemInfo() }
func (p plainOnly) Alloc(n uint64) (device.Ptr, error) { return p.d.Alloc(n) }
func (p plainOnly) Free(ptr device.Ptr) error          { return p.d.Free(ptr) }
func (p plainOnly) Synchronize() error                 { return p.d.Synchronize() }

// TestOpNames: the adaptor times every operation fault injection knows,
// by the same names (the device interfaces' method names).
func TestOpNames(t *testing.T) {
	got, want := slices.Clone(timed.OpNames[:]), slices.Clone(faults.DeviceOps)
	slices.Sort(got)
	slices.Sort(want)
	if !slices.Equal(got, want) {
		t.Errorf("timed ops %q, faults knows %q", got, want)
	}
}
