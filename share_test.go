package gpumem_test

import (
	"errors"
	"os"
	"strings"
	"syscall"
	"testing"

	"github.com/gpumem/gpumem"
	"github.com/gpumem/gpumem/device"
	"github.com/gpumem/gpumem/device/sim"
)

// exportingSim is the simulated device with device.Exporter: each export
// is a descriptor of /dev/null, enough to see that one is handed out per
// span and closed by its owner.
type exportingSim struct {
	*sim.Device
	exported []device.Handle
}

func (d *exportingSim) Export(h device.Handle) (int, error) {
	f, err := os.Open(os.DevNull)
	if err != nil {
		return -1, err
	}
	fd, err := syscall.Dup(int(f.Fd()))
	f.Close()
	d.exported = append(d.exported, h)
	return fd, err
}

// TestShareLayout: a buffer over several spans is shared as those spans,
// back to back from Base, one open descriptor each; Close closes them.
func TestShareLayout(t *testing.T) {
	const mib = 1 << 20
	dev := &exportingSim{Device: sim.MustNew(sim.Config{Capacity: 4 << 30})}
	a, err := gpumem.New(dev, gpumem.Config{CheckInvariants: true})
	if err != nil {
		t.Fatal(err)
	}
	small, err := a.Alloc(3*mib, 0) // the next buffer starts inside a chunk
	if err != nil {
		t.Fatal(err)
	}
	b, err := a.Alloc(40*mib, 0)
	if err != nil {
		t.Fatal(err)
	}
	sh, err := a.Share(b)
	if err != nil {
		t.Fatal(err)
	}
	if len(sh.Spans) < 2 || len(sh.Spans) != len(dev.exported) {
		t.Fatalf("a 40 MiB buffer shared as %d spans (%d exports); want at least 2, one export each", len(sh.Spans), len(dev.exported))
	}
	var total uint64
	for i, s := range sh.Spans {
		var st syscall.Stat_t
		if err := syscall.Fstat(s.FD, &st); err != nil {
			t.Fatalf("span %d: descriptor %d is not open: %v", i, s.FD, err)
		}
		if s.Size == 0 || s.Size%dev.Granularity() != 0 {
			t.Errorf("span %d: %d bytes, not whole chunks", i, s.Size)
		}
		total += s.Size
	}
	off := uint64(sh.Ptr - sh.Base)
	if sh.Ptr != b.Ptr() || sh.Base > b.Ptr() || off >= sh.Spans[0].Size || off+b.Size() > total {
		t.Fatalf("buffer [%#x, +%d) not inside the shared range [%#x, +%d) starting in its first span (%d bytes)",
			b.Ptr(), b.Size(), sh.Base, total, sh.Spans[0].Size)
	}
	fds := make([]int, len(sh.Spans))
	for i, s := range sh.Spans {
		fds[i] = s.FD
	}
	sh.Close()
	for _, fd := range fds {
		var st syscall.Stat_t
		if syscall.Fstat(fd, &st) == nil {
			t.Errorf("descriptor %d still open after Close", fd)
		}
	}
	if err := a.Unshare(b); err != nil {
		t.Fatal(err)
	}
	if err := a.Unshare(b); !errors.Is(err, gpumem.ErrNotShareable) {
		t.Errorf("second Unshare: %v; want ErrNotShareable (not shared)", err)
	}
	for _, x := range []gpumem.Buffer{small, b} {
		if err := a.Free(x); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := a.Share(b); !errors.Is(err, gpumem.ErrDoubleFree) {
		t.Errorf("Share of a freed buffer: %v; want ErrDoubleFree", err)
	}
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
}

// TestShareRefusedWithoutExport: a device that cannot export (the
// simulated device as it is) refuses at once, saying so.
func TestShareRefusedWithoutExport(t *testing.T) {
	dev := sim.MustNew(sim.Config{Capacity: 1 << 30})
	a, err := gpumem.New(dev, gpumem.Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	b, err := a.Alloc(1<<20, 0)
	if err != nil {
		t.Fatal(err)
	}
	_, err = a.Share(b)
	if !errors.Is(err, gpumem.ErrNotShareable) || !strings.Contains(err.Error(), "cannot share memory between processes") {
		t.Fatalf("Share on the simulated device: %v; want ErrNotShareable saying the device cannot share", err)
	}
	if err := a.Free(b); err != nil {
		t.Fatal(err)
	}
}

// TestSharedSpansNotSplit: Gather does not split a span under a shared
// buffer (the other process would keep the old memory and lose this
// process's writes); once unshared, it does, and every byte reads back.
func TestSharedSpansNotSplit(t *testing.T) {
	const mib = 1 << 20
	dev := &exportingSim{Device: sim.MustNew(sim.Config{Capacity: 4 << 30})}
	a, err := gpumem.New(dev, gpumem.Config{SpanSize: strandSpan, Gather: true, Limit: 140 * mib, CheckInvariants: true})
	if err != nil {
		t.Fatal(err)
	}
	live := strand(t, dev.Device, a, 8)
	for _, m := range live {
		sh, err := a.Share(m.b)
		if err != nil {
			t.Fatal(err)
		}
		sh.Close()
	}
	_, err = a.Alloc(100*mib, 0)
	var oom *gpumem.OutOfMemoryError
	if !errors.As(err, &oom) {
		t.Fatalf("with every stranded span shared: %v; want an out-of-memory", err)
	}
	if st := a.Stats(); st.Splits != 0 {
		t.Fatalf("%d splits of shared spans", st.Splits)
	}
	readBack(t, dev.Device, live, "after the refused request")
	for _, m := range live {
		if err := a.Unshare(m.b); err != nil {
			t.Fatal(err)
		}
	}
	b, err := a.Alloc(100*mib, 0)
	if err != nil {
		t.Fatalf("unshared: %v", err)
	}
	if st := a.Stats(); st.Splits == 0 {
		t.Fatalf("unshared, the request was served with no split")
	}
	live = append(live, mark(t, dev.Device, b, 1000))
	readBack(t, dev.Device, live, "after the gather")
	freeAndClose(t, dev.Device, a, live)
}
