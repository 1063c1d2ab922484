package gpumem_test

import (
	"errors"
	"testing"

	"github.com/gpumem/gpumem"
	"github.com/gpumem/gpumem/device"
	"github.com/gpumem/gpumem/device/sim"
)

// testGate is a gpumem.Gate that counts its calls, can refuse, and, with
// gateCopies, sees every copy the allocator makes.
type testGate struct {
	closed                 bool
	closes, opens, refused int
	copies, unguarded      int
	refuse                 bool
}

func (g *testGate) Close() error {
	if g.closed {
		panic("gate closed twice")
	}
	if g.refuse {
		g.refused++
		return errors.New("refused")
	}
	g.closed = true
	g.closes++
	return nil
}

func (g *testGate) Open() {
	if !g.closed {
		panic("gate opened while open")
	}
	g.closed = false
	g.opens++
}

// gateCopies is the simulated device with its copies checked against the
// gate: a copy made while the gate is open is one another thread's launch
// could race with.
type gateCopies struct {
	*sim.Device
	g *testGate
}

func (d gateCopies) Copy(dst, src device.Ptr, n uint64) error {
	d.g.copies++
	if !d.g.closed {
		d.g.unguarded++
	}
	return d.Device.Copy(dst, src, n)
}

// TestGateGathers: with a gate (SetGate) the default gathers on the way
// to an out-of-memory without Config.Gather, and makes every copy of a
// move with the gate closed, closing it once per split and opening it
// after; the bytes moved read back. A gate that refuses to close makes no
// move: the out-of-memory stays, counted in Stats.GateRefusals, and its
// verdict says why nothing moved. Without a gate the default moves
// nothing, as before, and the verdict names gather=true.
func TestGateGathers(t *testing.T) {
	const mib = 1 << 20
	for _, c := range []struct {
		name           string
		gate, refusing bool
	}{{"gated", true, false}, {"refusing", true, true}, {"no gate", false, false}} {
		t.Run(c.name, func(t *testing.T) {
			dev := sim.MustNew(sim.Config{Capacity: 4 << 30})
			g := &testGate{refuse: c.refusing}
			a, err := gpumem.New(gateCopies{dev, g}, gpumem.Config{SpanSize: strandSpan, Limit: 128 * mib, CheckInvariants: true})
			if err != nil {
				t.Fatal(err)
			}
			defer a.Close()
			if c.gate {
				a.SetGate(g)
			}
			live := strand(t, dev, a, 8)
			b, err := a.Alloc(100*mib, 0)
			st := a.Stats()
			if c.gate && !c.refusing {
				if err != nil {
					t.Fatalf("gated: %v; want the request served by gathering", err)
				}
				live = append(live, mark(t, dev, b, 1000))
				if st.Splits == 0 || g.closes != int(st.Splits) || g.opens != g.closes {
					t.Errorf("%d splits, gate closed %d times and opened %d; want one close and one open per split", st.Splits, g.closes, g.opens)
				}
				if g.copies == 0 || g.unguarded != 0 {
					t.Errorf("%d copies, %d of them with the gate open; want some, none open", g.copies, g.unguarded)
				}
			} else {
				var oom *gpumem.OutOfMemoryError
				if !errors.As(err, &oom) || oom.Cause != gpumem.CauseFragmentation {
					t.Fatalf("%s: %v; want an out-of-memory caused by fragmentation", c.name, err)
				}
				if st.Splits != 0 || g.copies != 0 {
					t.Errorf("%d splits, %d copies; want none", st.Splits, g.copies)
				}
				if c.refusing && (g.refused == 0 || st.GateRefusals != uint64(g.refused)) {
					t.Errorf("the gate refused %d times, Stats.GateRefusals %d; want the same, at least one", g.refused, st.GateRefusals)
				}
				if c.refusing {
					wantIn(t, err.Error(), "no live chunk was moved out of them: refused")
				} else {
					wantIn(t, err.Error(), "GPUMEM_CONFIG=gather=true")
				}
			}
			if g.closed {
				t.Error("the gate was left closed")
			}
			readBack(t, dev, live, "after the large request")
		})
	}
}
