package replay_test

import (
	"path/filepath"
	"reflect"
	"testing"

	"github.com/gpumem/gpumem"
	"github.com/gpumem/gpumem/device/sim"
	"github.com/gpumem/gpumem/replay"
	"github.com/gpumem/gpumem/trace"
)

// TestMarkersDecideAsEvents: learning how far the other streams have run
// from markers (device.Markers: a word the stream writes, read by the
// host) rather than from event queries changes no decision: two programs
// that hand memory between streams, two passes with the host 5 ms ahead
// of the GPU and events seen done only at their third query, hold the
// same memory and make the same driver calls, stream waits and handoffs
// both ways; with markers the device answers no event query, and the
// marks are the records.
func TestMarkersDecideAsEvents(t *testing.T) {
	for _, name := range []string{"layer_offload", "prefetch_two_stream"} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			tr, err := trace.Load(filepath.Join(corpusTraces, name+".trace.gz"))
			if err != nil {
				t.Fatal(err)
			}
			var res [2]replay.Result
			var st [2]sim.Stats
			for k, markers := range []bool{false, true} {
				dev := sim.MustNew(sim.Config{RunAhead: 5000, QueryLag: 2, NoMarkers: !markers})
				res[k], err = replay.Run(tr, dev, gpumem.Config{}, replay.Options{Check: true, Passes: 2, AtTime: dev.SetTime})
				if err != nil {
					t.Fatal(err)
				}
				st[k] = dev.Stats()
			}
			ev, mk := res[0], res[1]
			if ev.Handoffs == 0 || ev.Orders == 0 {
				t.Fatalf("%d handoffs, %d stream waits: the trace hands no memory between streams", ev.Handoffs, ev.Orders)
			}
			if ev.PeakReservedBytes != mk.PeakReservedBytes || ev.Creates != mk.Creates || ev.Maps != mk.Maps || ev.Unmaps != mk.Unmaps ||
				ev.Releases != mk.Releases || ev.Fences != mk.Fences || ev.Handoffs != mk.Handoffs || ev.Orders != mk.Orders ||
				!reflect.DeepEqual(ev.Passes.PeakReservedBytes, mk.Passes.PeakReservedBytes) || ev.Passes.MapsLater != mk.Passes.MapsLater {
				t.Errorf("events: peak %d, creates %d, maps %d, unmaps %d, releases %d, fences %d, handoffs %d, waits %d, peaks by pass %v, later maps %d\n"+
					"markers: peak %d, creates %d, maps %d, unmaps %d, releases %d, fences %d, handoffs %d, waits %d, peaks by pass %v, later maps %d",
					ev.PeakReservedBytes, ev.Creates, ev.Maps, ev.Unmaps, ev.Releases, ev.Fences, ev.Handoffs, ev.Orders, ev.Passes.PeakReservedBytes, ev.Passes.MapsLater,
					mk.PeakReservedBytes, mk.Creates, mk.Maps, mk.Unmaps, mk.Releases, mk.Fences, mk.Handoffs, mk.Orders, mk.Passes.PeakReservedBytes, mk.Passes.MapsLater)
			}
			e, m := st[0], st[1]
			if e.Marks != 0 || e.Queries == 0 || m.Marks == 0 || m.MarkerReads == 0 || m.Queries >= e.Queries/2 || m.Marks > e.Records {
				t.Errorf("events: %d records, %d queries, %d marks; markers: %d records, %d queries, %d marks, %d reads; want no marks with events, and with markers no more marks than records and under half the queries",
					e.Records, e.Queries, e.Marks, m.Records, m.Queries, m.Marks, m.MarkerReads)
			}
			t.Logf("events: %d records, %d queries; markers: %d records, %d queries, %d marks, %d reads", e.Records, e.Queries, m.Records, m.Queries, m.Marks, m.MarkerReads)
		})
	}
}
