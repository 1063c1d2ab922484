package gpumem_test

import (
	"testing"

	"github.com/gpumem/gpumem"
)

// TestStreamsShareFreeMemory: memory one stream freed serves another
// stream's request without a driver call once the first stream's work is
// done, and not before (borrow); the second stream's free waits for its
// own work before the first stream reuses the memory, and the second
// stream may reuse it at once (relend). The simulated device checks every
// hand-over against the work still pending on other streams.
func TestStreamsShareFreeMemory(t *testing.T) {
	dev := newSim(8 << 30)
	a := newAlloc(t, dev, gpumem.Config{Mode: gpumem.ModeVirtual})
	sa, _ := dev.NewStream()
	sb, _ := dev.NewStream()
	const n = 96 * miB
	keep, err := a.Alloc(64*miB, sa) // a live neighbour
	if err != nil {
		t.Fatal(err)
	}
	x, err := a.Alloc(n, sa)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := a.Alloc(miB, sb); err != nil { // stream b has a pool of its own
		t.Fatal(err)
	}
	dev.Hold(sa)
	if err := dev.Touch(sa, x.Ptr(), n); err != nil { // a's work on x still pending
		t.Fatal(err)
	}
	if err := a.Free(x); err != nil {
		t.Fatal(err)
	}

	// Once a's work is done, b's next request is served from a's free
	// memory, without a driver call.
	dev.Drain(sa)
	before := a.Stats()
	y, err := a.Alloc(n, sb)
	if err != nil {
		t.Fatal(err)
	}
	after := a.Stats()
	if y.Ptr() != x.Ptr() {
		t.Errorf("stream b got 0x%x, want the 0x%x stream a freed", y.Ptr(), x.Ptr())
	}
	if d := after.DeviceCalls() - before.DeviceCalls(); d != 0 {
		t.Errorf("lending a's free memory to b made %d device calls, want 0", d)
	}
	if after.Handoffs != before.Handoffs+1 {
		t.Errorf("handoffs %d -> %d, want one more", before.Handoffs, after.Handoffs)
	}
	if err := dev.CheckHandoff(y.Ptr(), n, sb); err != nil {
		t.Fatalf("b may use the memory before a's work on it is done: %v", err)
	}
	snap := a.Snapshot()
	found := false
	for _, seg := range snap.Segments {
		for _, b := range seg.Blocks {
			if b.Address == uint64(y.Ptr()) && b.State == "allocated" {
				found = true
				if b.Stream != uint64(sb) {
					t.Errorf("the lent block shows stream %d in a snapshot, want b's %d", b.Stream, sb)
				}
			}
		}
	}
	if !found {
		t.Errorf("the lent block 0x%x is not in the snapshot", y.Ptr())
	}
	if err := a.ReleaseStream(sb); err == nil {
		t.Fatal("ReleaseStream(b) succeeded while b's buffer lives in a's memory")
	}
	mustCheck(t, a, "a lend")

	// b uses y and frees it while its work is pending: a must not reuse it.
	dev.Hold(sb)
	if err := dev.Touch(sb, y.Ptr(), n); err != nil {
		t.Fatal(err)
	}
	if err := a.Free(y); err != nil {
		t.Fatal(err)
	}
	z, err := a.Alloc(n, sa)
	if err != nil {
		t.Fatal(err)
	}
	if err := dev.CheckHandoff(z.Ptr(), n, sa); err != nil {
		t.Fatalf("a reuses memory b freed before b's work is done: %v", err)
	}
	// b itself may take it back at once, with no driver call.
	before = a.Stats()
	w, err := a.Alloc(n, sb)
	if err != nil {
		t.Fatal(err)
	}
	after = a.Stats()
	if w.Ptr() != y.Ptr() {
		t.Errorf("b's next request got 0x%x, want the 0x%x it freed itself", w.Ptr(), y.Ptr())
	}
	if d := after.DeviceCalls() - before.DeviceCalls(); d != 0 {
		t.Errorf("b's reuse of its own free made %d device calls, want 0", d)
	}
	mustCheck(t, a, "a relend")
	dev.Drain(sb)

	// While a's work is pending, a lends nothing: b's work would have to
	// wait for all of a's.
	dev.Hold(sa)
	if err := dev.Touch(sa, z.Ptr(), n); err != nil {
		t.Fatal(err)
	}
	if err := a.Free(z); err != nil {
		t.Fatal(err)
	}
	before = a.Stats()
	v, err := a.Alloc(n, sb)
	if err != nil {
		t.Fatal(err)
	}
	if err := dev.CheckHandoff(v.Ptr(), n, sb); err != nil {
		t.Fatalf("b may use memory before a's work on it is done: %v", err)
	}
	if a.Stats().Handoffs != before.Handoffs {
		t.Errorf("a lent memory to b while a's work was pending")
	}
	dev.Drain(sa)

	// Memory a freed before an event a recorded after it completed stays
	// lendable while a is busy with other work: no wait is needed.
	var us [3]gpumem.Buffer
	for i := range us {
		if us[i], err = a.Alloc(n, sa); err != nil {
			t.Fatal(err)
		}
	}
	for _, i := range []int{0, 2} { // a is idle; us[1] keeps the two apart
		if err := a.Free(us[i]); err != nil {
			t.Fatal(err)
		}
	}
	first, err := a.Alloc(n, sb) // lent at once: a is idle
	if err != nil {
		t.Fatal(err)
	}
	if first.Ptr() != us[0].Ptr() && first.Ptr() != us[2].Ptr() {
		t.Errorf("b got 0x%x while idle a held 0x%x and 0x%x free", first.Ptr(), us[0].Ptr(), us[2].Ptr())
	}
	dev.Hold(sa)
	if err := dev.Touch(sa, keep.Ptr(), keep.Size()); err != nil { // a busy elsewhere
		t.Fatal(err)
	}
	before = a.Stats()
	r, err := a.Alloc(n, sb)
	if err != nil {
		t.Fatal(err)
	}
	if err := dev.CheckHandoff(r.Ptr(), n, sb); err != nil {
		t.Fatal(err)
	}
	if r.Ptr() != us[0].Ptr() && r.Ptr() != us[2].Ptr() || a.Stats().DeviceCalls() != before.DeviceCalls() {
		t.Errorf("a busy with other work did not lend memory whose use was done (got 0x%x, a freed 0x%x and 0x%x)", r.Ptr(), us[0].Ptr(), us[2].Ptr())
	}
	dev.Drain(sa)
	for _, buf := range []gpumem.Buffer{w, v, keep, first, us[1], r} {
		if err := a.Free(buf); err != nil {
			t.Fatal(err)
		}
	}
	mustCheck(t, a, "the frees")
}
