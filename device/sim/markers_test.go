package sim

import (
	"errors"
	"math/rand/v2"
	"testing"

	"github.com/gpumem/gpumem/device"
)

// TestMarkersAnswerAsEvents: a marker written beside an event, on the same
// stream at the same point, is seen to land exactly when the event is
// seen done, read for read, whatever happens in between: streams held and
// drained, the clock moving under RunAhead, QueryLag's first reads,
// synchronizes of the stream, of another and of the device. So an
// allocator that reads markers where it queried events decides the same.
func TestMarkersAnswerAsEvents(t *testing.T) {
	for seed := range uint64(20) {
		rng := rand.New(rand.NewPCG(seed, 1))
		d := MustNew(Config{QueryLag: int(seed % 3), RunAhead: 100 * (seed % 2)})
		var ss [3]device.Stream
		var es [3]device.Event
		var ms [3]device.Marker
		var vs [3]uint64
		held := [3]bool{}
		for k := range ss {
			var err error
			if ss[k], err = d.NewStream(); err != nil {
				t.Fatal(err)
			}
			if es[k], err = d.NewEvent(); err != nil {
				t.Fatal(err)
			}
			if ms[k], err = d.NewMarker(); err != nil {
				t.Fatal(err)
			}
		}
		now := uint64(0)
		for step := range 400 {
			k := rng.IntN(3)
			switch op := rng.IntN(8); op {
			case 0, 1, 2:
				vs[k]++
				if err := d.Record(es[k], ss[k]); err != nil {
					t.Fatal(err)
				}
				if err := d.Mark(ms[k], ss[k], vs[k]); err != nil {
					t.Fatal(err)
				}
			case 3:
				if !held[k] {
					d.Hold(ss[k])
					held[k] = true
				}
			case 4:
				d.Drain(ss[k])
				held[k] = false
			case 5:
				now += uint64(rng.IntN(80))
				d.SetTime(now)
			case 6:
				if err := d.SynchronizeStream(ss[k]); err != nil {
					t.Fatal(err)
				}
			case 7:
				if rng.IntN(4) == 0 {
					if err := d.Synchronize(); err != nil {
						t.Fatal(err)
					}
				}
			}
			for j := range ss {
				done, err := d.Query(es[j])
				if err != nil {
					t.Fatal(err)
				}
				if landed := d.Reached(ms[j]) >= vs[j]; landed != done {
					t.Fatalf("seed %d, step %d, stream %d: the event done %v, the marker written beside it landed %v (reads %d, last written %d)",
						seed, step, j, done, landed, d.Reached(ms[j]), vs[j])
				}
			}
		}
	}
}

// TestMarkerErrors: a device without markers says so; a marker never made
// or destroyed is refused by name; a write on a capturing stream is
// refused and breaks the capture, as a record is; faults can be injected.
func TestMarkerErrors(t *testing.T) {
	if _, err := MustNew(Config{NoMarkers: true}).NewMarker(); !errors.Is(err, device.ErrUnsupported) {
		t.Errorf("NewMarker with NoMarkers: %v, want ErrUnsupported", err)
	}
	d := MustNew(Config{})
	s, _ := d.NewStream()
	m, err := d.NewMarker()
	if err != nil {
		t.Fatal(err)
	}
	if err := d.Mark(m+1, s, 1); !errors.Is(err, device.ErrInvalid) {
		t.Errorf("Mark of a marker never made: %v", err)
	}
	d.BeginCapture(s)
	if err := d.Mark(m, s, 1); !errors.Is(err, device.ErrCapturing) {
		t.Errorf("Mark on a capturing stream: %v, want ErrCapturing", err)
	}
	if err := d.EndCapture(s); err == nil {
		t.Error("the capture survived a marker's write")
	}
	if got := d.Reached(m); got != 0 {
		t.Errorf("a refused write landed: %d", got)
	}
	d.FailNth("Mark", 1)
	if err := d.Mark(m, s, 1); !errors.Is(err, device.ErrInjected) {
		t.Errorf("Mark with a fault armed: %v", err)
	}
	if err := d.DestroyMarker(m); err != nil {
		t.Fatal(err)
	}
	if err := d.DestroyMarker(m); !errors.Is(err, device.ErrInvalid) {
		t.Errorf("DestroyMarker twice: %v", err)
	}
	if st := d.Stats(); st.LiveMarkers != 0 || st.Marks != 0 {
		t.Errorf("%d markers live, %d marks; want none", st.LiveMarkers, st.Marks)
	}
	defer func() {
		if recover() == nil {
			t.Error("Reached of a destroyed marker did not panic")
		}
	}()
	d.Reached(m)
}
