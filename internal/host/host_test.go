package host

import (
	"errors"
	"fmt"
	"github.com/gpumem/gpumem/device/sim"
	"io"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/gpumem/gpumem"
	"github.com/gpumem/gpumem/device"
	"github.com/gpumem/gpumem/trace"
)

const (
	miB = 1 << 20
	giB = 1 << 30
)

func newSimHost(t *testing.T, cfg string) *Host {
	t.Helper()
	h := New("device=sim,capacity=4GiB,check=true,"+cfg, nil)
	t.Cleanup(func() { h.Close() })
	return h
}

func TestParseConfig(t *testing.T) {
	c, err := ParseConfig(" limit=40GiB , release_after=30s,mode=virtual,span_size=32MiB,record_sites=true,release_threshold=1GiB,preallocate=2GiB,compact=true")
	if err != nil {
		t.Fatal(err)
	}
	a := c.Alloc
	if a.Limit != 40*giB || a.IdleRelease.Seconds() != 30 || a.Mode != gpumem.ModeVirtual || a.SpanSize != 32*miB ||
		!a.RecordSites || a.ReleaseThreshold != giB || a.Preallocate != 2*giB || !a.Compact || c.Sim {
		t.Errorf("parsed %+v", c)
	}
	for in, no := range map[string]bool{"stream_waits=false": true, "stream_waits=true": false} {
		if c, err := ParseConfig(in); err != nil || c.Alloc.NoStreamWaits != no {
			t.Errorf("%s: NoStreamWaits %v, %v; want %v", in, c.Alloc.NoStreamWaits, err, no)
		}
	}
	c, err = ParseConfig("device=sim,capacity=24GiB,limit=50%")
	if err != nil || !c.Sim || c.SimCapacity != 24*giB || c.limitFor(24*giB) != 12*giB {
		t.Errorf("device=sim,capacity=24GiB,limit=50%%: %+v, %v", c, err)
	}
	if c, err := ParseConfig(""); err != nil || c.Sim || c.Alloc != (gpumem.Config{}) {
		t.Errorf("empty config: %+v, %v", c, err)
	}
	for _, bad := range []struct{ in, says string }{
		{"limit", "want key=value"},
		{"limit=lots", "limit=lots"},
		{"limit=0%", "percentage"},
		{"limit=150%", "percentage"},
		{"limit=1GiB,limit=2GiB", "limit given twice"},
		{"colour=blue", "unknown key"},
		{"device=tpu", "want cuda or sim"},
		{"capacity=8GiB", "device=sim"},
		{"release_after=-1s", "negative"},
		{"release_after=soon", "release_after"},
		{"mode=magic", "unknown mode"},
		{"check=maybe", "check=maybe"},
		{"compact=lots", "compact=lots"},
		{"device=sim,capacity=0", "more than 0"},
		{"device=sim,capacity=5TiB", "at most 4.00 TiB, the most a simulated device models"},
	} {
		_, err := ParseConfig(bad.in)
		if !errors.Is(err, ErrConfig) || !strings.Contains(err.Error(), bad.says) {
			t.Errorf("ParseConfig(%q) = %v, want an ErrConfig saying %q", bad.in, err, bad.says)
		}
	}
}

func TestAllocFree(t *testing.T) {
	h := newSimHost(t, "")
	p, err := h.Alloc(0, 3*miB, 7, 0)
	if err != nil || p == 0 {
		t.Fatalf("Alloc: %#x, %v", p, err)
	}
	if n := h.Live(0); n != 1 {
		t.Errorf("%d live buffers, want 1", n)
	}
	st, _ := h.Stats(0)
	if st.Allocated != 3*miB || st.Streams != 1 {
		t.Errorf("stats after Alloc: %d allocated on %d streams", st.Allocated, st.Streams)
	}
	if err := h.RecordStream(0, p, 9); err != nil {
		t.Errorf("RecordStream: %v", err)
	}
	if err := h.Free(0, p); err != nil {
		t.Fatalf("Free: %v", err)
	}
	// A double free and a foreign pointer change nothing and say so.
	for _, ptr := range []uint64{p, 0xdead000} {
		err := h.Free(0, ptr)
		if !errors.Is(err, gpumem.ErrForeign) || Code(err) != StatusInvalidPointer || !strings.Contains(err.Error(), fmt.Sprintf("%#x", ptr)) {
			t.Errorf("Free(%#x) again: %v (status %d), want an invalid pointer naming it", ptr, err, Code(err))
		}
	}
	if err := h.Free(-1, 0xdead000); !strings.Contains(fmt.Sprint(err), "on any device") {
		t.Errorf("Free(-1, foreign) = %v", err)
	}
	if err := h.RecordStream(0, p, 9); Code(err) != StatusInvalidPointer {
		t.Errorf("RecordStream of a freed pointer: %v", err)
	}
	// Size 0 and pointer 0 are no-ops, as in PyTorch's allocator.
	if p, err := h.Alloc(0, 0, 0, 0); p != 0 || err != nil {
		t.Errorf("Alloc(0) = %#x, %v", p, err)
	}
	if err := h.Free(0, 0); err != nil {
		t.Errorf("Free(0) = %v", err)
	}
	// Device ordinals out of range.
	for _, d := range []int{-1, MaxDevices} {
		if _, err := h.Alloc(d, miB, 0, 0); Code(err) != StatusInvalidValue {
			t.Errorf("Alloc on device %d: %v", d, err)
		}
	}
	// An absurd size is invalid, not an out-of-memory.
	if _, err := h.Alloc(0, 1<<62, 0, 0); Code(err) != StatusInvalidValue {
		t.Errorf("Alloc(2^62): %v (status %d)", err, Code(err))
	}
	// Free on whichever device holds the buffer.
	q, err := h.Alloc(1, miB, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	if err := h.Free(0, q); Code(err) != StatusInvalidPointer {
		t.Errorf("Free of device 1's buffer on device 0: %v", err)
	}
	if err := h.Free(-1, q); err != nil {
		t.Errorf("Free(-1) of device 1's buffer: %v", err)
	}
	if len(h.Devices()) != 2 {
		t.Errorf("%d devices, want 2", len(h.Devices()))
	}
}

func TestOutOfMemoryStatus(t *testing.T) {
	h := newSimHost(t, "limit=256MiB")
	p, err := h.Alloc(0, 200*miB, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	_, err = h.Alloc(0, 100*miB, 0, 0)
	var oom *gpumem.OutOfMemoryError
	if Code(err) != StatusOutOfMemory || !errors.As(err, &oom) || oom.Cause != gpumem.CauseLimit {
		t.Fatalf("Alloc over the limit: %v", err)
	}
	_ = h.Free(0, p)
}

func TestConfigure(t *testing.T) {
	h := newSimHost(t, "")
	if err := h.Configure("limit=1GiB,release_threshold=64MiB"); err != nil {
		t.Fatal(err)
	}
	if c := h.Config(); c.Alloc.Limit != giB || c.Alloc.ReleaseThreshold != 64*miB || !c.Sim {
		t.Errorf("after Configure: %+v", c)
	}
	p, err := h.Alloc(0, miB, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	d, _ := h.Device(0)
	if d.Alloc.Limit() != giB {
		t.Errorf("limit %d, want the configured 1 GiB", d.Alloc.Limit())
	}
	// Once a device is in use only the limit changes, on every device.
	if err := h.Configure("mode=plain"); Code(err) != StatusConfig || !strings.Contains(err.Error(), "mode cannot change") {
		t.Errorf("Configure(mode) after use: %v", err)
	}
	if err := h.Configure("limit=50%"); err != nil {
		t.Fatal(err)
	}
	if d.Alloc.Limit() != 2*giB {
		t.Errorf("limit %d after limit=50%% of 4 GiB", d.Alloc.Limit())
	}
	if err := h.Configure("limit=fast"); Code(err) != StatusConfig {
		t.Errorf("Configure(limit=fast): %v", err)
	}
	_ = h.Free(0, p)
}

func TestBadEnvironment(t *testing.T) {
	h := New("limit=lots", nil)
	_, err := h.Alloc(0, miB, 0, 0)
	if Code(err) != StatusConfig || !strings.Contains(err.Error(), "GPUMEM_CONFIG") {
		t.Errorf("Alloc with a bad GPUMEM_CONFIG: %v", err)
	}
	if err := h.Configure("limit=1GiB"); Code(err) != StatusConfig {
		t.Errorf("Configure after a bad environment: %v", err)
	}
}

func TestNoDriver(t *testing.T) {
	h := New("", func(int, Config) (device.Device, func() error, error) {
		return nil, nil, fmt.Errorf("libcuda.so.1 not found: %w", device.ErrNoDriver)
	})
	_, err := h.Alloc(0, miB, 0, 0)
	if Code(err) != StatusNoDriver {
		t.Errorf("Alloc without a driver: %v (status %d)", err, Code(err))
	}
}

func TestLimitAndTrim(t *testing.T) {
	h := newSimHost(t, "")
	p, err := h.Alloc(0, 512*miB, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	_ = h.Free(0, p)
	if st, _ := h.Stats(0); st.Reserved < 512*miB {
		t.Fatalf("reserved %d after a free, want the cache kept", st.Reserved)
	}
	free, total, err := h.MemInfo(0)
	if err != nil || total != 4*giB || free != 4*giB {
		t.Errorf("MemInfo with everything cached: free %d, total %d, %v; want 4 GiB of 4", free, total, err)
	}
	if err := h.Trim(-1); err != nil {
		t.Fatal(err)
	}
	if st, _ := h.Stats(0); st.Reserved != 0 {
		t.Errorf("reserved %d after Trim", st.Reserved)
	}
	if err := h.SetLimitFraction(0, 0.25); err != nil {
		t.Fatal(err)
	}
	if _, total, _ := h.MemInfo(0); total != giB {
		t.Errorf("MemInfo total %d after a fraction of 0.25 of 4 GiB", total)
	}
	if err := h.SetLimitFraction(0, 1.5); Code(err) != StatusConfig {
		t.Errorf("SetLimitFraction(1.5): %v", err)
	}
	if err := h.SetLimitFraction(0, -0.1); Code(err) != StatusConfig {
		t.Errorf("SetLimitFraction(-0.1): %v", err)
	}
	// A fraction of 0, as PyTorch's: nothing more can be allocated, and a
	// fraction below what is live is no error (SetLimit says it is over).
	live, err := h.Alloc(0, 64*miB, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	if err := h.SetLimit(0, miB); !errors.Is(err, gpumem.ErrOverLimit) {
		t.Errorf("SetLimit below the live 64 MiB: %v, want ErrOverLimit", err)
	}
	if err := h.SetLimitFraction(0, 0); err != nil {
		t.Fatalf("SetLimitFraction(0) with 64 MiB live: %v, want no error (PyTorch's)", err)
	}
	if _, err := h.Alloc(0, 512, 0, 0); !errors.Is(err, gpumem.ErrOutOfMemory) {
		t.Errorf("an allocation under a fraction of 0: %v, want an out-of-memory", err)
	}
	if err := h.Free(0, live); err != nil {
		t.Fatal(err)
	}
	if err := h.Trim(0); err != nil {
		t.Fatal(err)
	}
	if err := h.SetLimit(0, 0); err != nil {
		t.Fatal(err)
	}
	h.ResetPeaks(-1)
	if st, _ := h.Stats(0); st.PeakReserved != 0 {
		t.Errorf("peak reserved %d after ResetPeaks with nothing held", st.PeakReserved)
	}
	if st, err := h.Stats(5); err != nil || st.Allocs != 0 {
		t.Errorf("Stats of an unused device: %+v, %v", st, err)
	}
}

// TestConcurrent: many threads on several streams and two devices, each
// freeing what it allocated, some freeing by pointer alone; run with -race.
func TestConcurrent(t *testing.T) {
	h := newSimHost(t, "")
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			dev, stream := g%2, uint64(g%3)
			var live []uint64
			for i := range 3000 {
				if len(live) < 32 && (i%3 != 2 || len(live) == 0) {
					p, err := h.Alloc(dev, uint64(i%17+1)*64*1024, stream, 0)
					if err != nil {
						t.Error(err)
						return
					}
					live = append(live, p)
					continue
				}
				ordinal := dev
				if i%5 == 0 {
					ordinal = -1
				}
				if err := h.Free(ordinal, live[0]); err != nil {
					t.Error(err)
					return
				}
				live = live[1:]
			}
			for _, p := range live {
				if err := h.Free(dev, p); err != nil {
					t.Error(err)
				}
			}
		}()
	}
	wg.Wait()
	for d := range 2 {
		if n := h.Live(d); n != 0 {
			t.Errorf("device %d: %d buffers left", d, n)
		}
		st, _ := h.Stats(d)
		if st.Allocated != 0 || st.Allocs != st.Frees {
			t.Errorf("device %d: %d bytes allocated, %d allocs, %d frees", d, st.Allocated, st.Allocs, st.Frees)
		}
	}
}

// BenchmarkHostAllocFree is the Go side of a C alloc+free pair: the table
// and the allocator's cache hit, without the C-to-Go crossing.
func BenchmarkHostAllocFree(b *testing.B) {
	h := New("device=sim", nil)
	defer h.Close()
	if _, err := h.Device(0); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		p, err := h.Alloc(0, 4096, 0, 0)
		if err != nil {
			b.Fatal(err)
		}
		if err := h.Free(0, p); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkHostFreeAnyDevice is the Go side of the shim's pair: a free
// on a stream with the device unknown (-1), as cuMemFreeAsync makes it.
func BenchmarkHostFreeAnyDevice(b *testing.B) {
	h := New("device=sim", nil)
	defer h.Close()
	if _, err := h.Device(0); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		p, err := h.Alloc(0, 4096, 5, 0)
		if err != nil {
			b.Fatal(err)
		}
		if err := h.FreeOn(-1, p, 5); err != nil {
			b.Fatal(err)
		}
	}
}

// TestRecording: a recording holds the allocations and frees made while it
// runs (not those of buffers from before), with streams and sites, and
// loads as a trace; a second recording's IDs do not mix with the first's.
func TestRecording(t *testing.T) {
	h := newSimHost(t, "")
	dir := t.TempDir()
	old, err := h.Alloc(0, miB, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	path := dir + "/one.trace.gz"
	if err := h.StartRecording(0, path); err != nil {
		t.Fatal(err)
	}
	if err := h.StartRecording(0, dir+"/two.trace"); Code(err) != StatusConfig {
		t.Errorf("a second recording of the same device: %v", err)
	}
	if err := h.DefineSite(0, 1, "step train.py:10 < main train.py:20"); err != nil {
		t.Fatal(err)
	}
	a, _ := h.Alloc(0, 3*miB, 5, 1)
	b, _ := h.Alloc(0, 4096, 0, 0)
	if err := h.Free(0, a); err != nil {
		t.Fatal(err)
	}
	if err := h.Free(0, old); err != nil { // allocated before: not recorded
		t.Fatal(err)
	}
	if err := h.Trim(-1); err != nil { // torch.cuda.empty_cache: a "t" line
		t.Fatal(err)
	}
	sum, err := h.StopRecording(0)
	if err != nil || sum.Allocs != 2 || sum.Frees != 1 {
		t.Fatalf("StopRecording: %+v, %v", sum, err)
	}
	// b was allocated during the first recording: its free must not reach
	// the second one, which never allocated it.
	if err := h.StartRecording(0, dir+"/two.trace"); err != nil {
		t.Fatal(err)
	}
	if err := h.Free(0, b); err != nil {
		t.Fatal(err)
	}
	c, _ := h.Alloc(0, 8192, 0, 0)
	_ = h.Free(0, c)
	sum2, err := h.StopRecording(0)
	if err != nil || sum2.Allocs != 1 || sum2.Frees != 1 {
		t.Fatalf("second recording: %+v, %v", sum2, err)
	}
	if _, err := h.StopRecording(0); Code(err) != StatusConfig {
		t.Errorf("StopRecording twice: %v", err)
	}
	tr, err := trace.Load(path)
	if err != nil {
		t.Fatal(err)
	}
	if tr.Requests != 2 || len(tr.Events) != 3 || tr.Events[0].Stream != 5 || tr.Events[0].Site != 1 ||
		tr.Sites[1] != "step train.py:10 < main train.py:20" || tr.PeakLiveBytes != 3*miB+4096 {
		t.Errorf("recorded trace: %d requests, events %v, sites %v, peak %d", tr.Requests, tr.Events, tr.Sites, tr.PeakLiveBytes)
	}
	if !slices.Equal(tr.Trims, []int32{3}) {
		t.Errorf("recorded trims %v, want [3]: the Trim after the three events", tr.Trims)
	}
	if _, err := trace.Load(dir + "/two.trace"); err != nil {
		t.Errorf("the second recording does not load: %v", err)
	}
	if err := h.StartRecording(0, dir+"/no/such/dir/x.trace"); Code(err) != StatusIO {
		t.Errorf("recording to a missing directory: %v", err)
	}
}

// TestFreeOn: freed on another stream, a buffer's memory waits for that
// stream's work; freed on its own, it is reusable at once; a foreign
// pointer changes nothing.
func TestFreeOn(t *testing.T) {
	h := newSimHost(t, "")
	d, _ := h.Device(0)
	p, _ := h.Alloc(0, miB, 1, 0)
	if err := h.FreeOn(0, p, 2); err != nil {
		t.Fatal(err)
	}
	if st := d.Alloc.Stats(); st.PendingFrees != 1 {
		t.Errorf("freed on another stream: %d pending frees, want 1", st.PendingFrees)
	}
	q, _ := h.Alloc(0, miB, 1, 0)
	if err := h.FreeOn(0, q, 1); err != nil {
		t.Fatal(err)
	}
	if st := d.Alloc.Stats(); st.PendingFrees != 1 || st.Allocated != 0 {
		t.Errorf("freed on its own stream: %d pending, %d allocated", st.PendingFrees, st.Allocated)
	}
	if err := h.FreeOn(0, 0xbad000, 1); Code(err) != StatusInvalidPointer {
		t.Errorf("FreeOn of a foreign pointer: %v", err)
	}
}

// TestServe: serve= starts an HTTP server at the first use, which serves
// the host's allocators; Serve returns the address.
func TestServe(t *testing.T) {
	t.Setenv("GPUMEM_RUN_DIR", t.TempDir())
	h := newSimHost(t, "serve=127.0.0.1:0")
	p, err := h.Alloc(0, 3*miB, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	addr, err := h.Serve("ignored:0")
	if err != nil || addr == "" {
		t.Fatalf("Serve: %q, %v", addr, err)
	}
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if !strings.Contains(string(body), `gpumem_allocated_bytes{device="0",pool="gpumem"} 3.145728e+06`) {
		t.Errorf("metrics of a served host:\n%s", body)
	}
	_ = h.Free(0, p)
	if _, err := ParseConfig("serve=nowhere"); Code(err) != StatusConfig {
		t.Errorf("serve=nowhere: %v", err)
	}
}

// TestOutside: a served host measures what its process holds outside gpumem
// on each device, once: NVML's figure minus what gpumem reserved then (at
// the device's start when serving is configured, at Serve for devices that
// started before), and serves it beside the stats.
func TestOutside(t *testing.T) {
	t.Setenv("GPUMEM_RUN_DIR", t.TempDir())
	calls := 0
	processMemory = func(dev device.Device) (uint64, bool) {
		calls++
		return 600*miB + 64*miB, true // a context of 600 MiB, and gpumem's 64 MiB once it holds it
	}
	t.Cleanup(func() { processMemory = measureWithNVML })

	// Serving configured: measured at the device's start, nothing reserved.
	h := newSimHost(t, "serve=127.0.0.1:0")
	if _, err := h.Device(0); err != nil {
		t.Fatal(err)
	}
	d := h.existing(0)
	if got, ok := d.Outside(); !ok || got != 664*miB {
		t.Errorf("outside at the start = %d, %v; want %d (nothing reserved yet)", got, ok, 664*miB)
	}

	// Served later: what gpumem reserved by then is not outside.
	h2 := newSimHost(t, "")
	p, err := h2.Alloc(0, 64*miB, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := h2.existing(0).Outside(); ok {
		t.Error("measured before serving")
	}
	res := h2.existing(0).Alloc.Stats().Reserved
	addr, err := h2.Serve("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	if got, ok := h2.existing(0).Outside(); !ok || got != 664*miB-res {
		t.Errorf("outside after Serve = %d, %v; want %d", got, ok, 664*miB-res)
	}
	resp, err := http.Get("http://" + addr + "/debug/gpumem/stats")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if want := fmt.Sprintf(`"outside": %d`, 664*miB-res); !strings.Contains(string(body), want) {
		t.Errorf("stats lack %s:\n%s", want, body)
	}
	_ = h2.Free(0, p)
	if calls != 2 {
		t.Errorf("NVML read %d times for two devices, want once each", calls)
	}
}

// BenchmarkTorchSnapshot is one memory_snapshot under gpumem.torch (the
// layout, before JSON) of a virtual arena holding 4,000 live buffers in
// runs of spans that unmapped gaps separate: what PyTorch's CUDA graph tree
// tests ask for after every test.
func BenchmarkTorchSnapshot(b *testing.B) {
	h := New("device=sim,capacity=64GiB,mode=virtual", nil)
	defer h.Close()
	var gone []uint64
	for i := range 6000 {
		n := uint64(1+i%5) * 256 << 10
		if i%3 == 1 {
			n = 20 << 20 // freed below: whole spans, unmapped by Trim
		}
		p, err := h.Alloc(0, n, 0, 0)
		if err != nil {
			b.Fatal(err)
		}
		if i%3 == 1 {
			gone = append(gone, p)
		}
	}
	for _, p := range gone {
		if err := h.Free(0, p); err != nil {
			b.Fatal(err)
		}
	}
	if err := h.Trim(0); err != nil {
		b.Fatal(err)
	}
	segs := len(h.TorchSnapshot(0).Segments)
	for b.Loop() {
		h.TorchSnapshot(0)
	}
	b.ReportMetric(float64(segs), "segments")
}

// TestFreeSite: a free given its own call site (FreeSite, PyTorch's
// context "all") puts it in both of its history entries beside the
// allocation's; a plain Free puts none; the allocation's site stays.
func TestFreeSite(t *testing.T) {
	h := newSimHost(t, "")
	if err := h.RecordHistory(0, true, 16); err != nil {
		t.Fatal(err)
	}
	a, err := h.Alloc(0, miB, 0, 7)
	if err != nil {
		t.Fatal(err)
	}
	b, err := h.Alloc(0, miB, 0, 7)
	if err != nil {
		t.Fatal(err)
	}
	if err := h.FreeSite(0, a, 9); err != nil {
		t.Fatal(err)
	}
	if err := h.Free(0, b); err != nil {
		t.Fatal(err)
	}
	if err := h.FreeSite(0, a, 9); !errors.Is(err, gpumem.ErrForeign) {
		t.Errorf("FreeSite of a freed buffer: %v, want ErrForeign", err)
	}
	var got []string
	for _, e := range h.TorchSnapshot(0).DeviceTraces[0] {
		got = append(got, fmt.Sprintf("%s %d %d", e.Action, e.Site, e.FreeSite))
	}
	want := []string{"alloc 7 0", "alloc 7 0", "free_requested 7 9", "free_completed 7 9", "free_requested 7 0", "free_completed 7 0"}
	if !slices.Equal(got, want) {
		t.Errorf("history:\n%v\nwant\n%v", got, want)
	}
}

// TestUncached: with the cache off (SetCaching(false)) an allocation is
// the driver's own (the simulated device's allocation count moves), counts
// in none of the allocator's statistics, ignores the limit, and its free
// goes straight back to the driver, even once the cache is on again; a
// buffer made while the cache was on goes back to the cache; a private
// pool's route still wins.
func TestUncached(t *testing.T) {
	h := newSimHost(t, "limit=8MiB")
	d, err := h.Device(0)
	if err != nil {
		t.Fatal(err)
	}
	sd := d.dev.(*sim.Device)
	cached := mustAlloc(t, h, miB, 0, 0)
	h.SetCaching(false)
	if h.Caching() {
		t.Fatal("Caching after SetCaching(false)")
	}
	before := sd.Stats()
	direct := mustAlloc(t, h, 16*miB, 0, 0) // twice the limit: the driver's, not gpumem's
	if got := sd.Stats().Allocs - before.Allocs; got != 1 {
		t.Errorf("an uncached allocation made %d driver allocations, want 1", got)
	}
	st, _ := h.Stats(0)
	if st.Allocated != miB || st.LiveBuffers != 1 {
		t.Errorf("stats with an uncached buffer live: allocated %d, buffers %d; want the cached 1 MiB and 1", st.Allocated, st.LiveBuffers)
	}
	mustFree(t, h, cached) // made cached: back to the cache
	if st, _ := h.Stats(0); st.Cached == 0 {
		t.Errorf("a buffer made with the cache on, freed with it off, did not go back to the cache")
	}
	h.SetCaching(true)
	mustFree(t, h, direct)
	if got := sd.Stats().Frees - before.Frees; got != 1 {
		t.Errorf("the uncached buffer's free made %d driver frees, want 1", got)
	}
	if err := h.Free(0, direct); !errors.Is(err, gpumem.ErrForeign) {
		t.Errorf("a second free of the uncached buffer: %v, want ErrForeign", err)
	}
	h.SetCaching(false)
	id := PoolID{0, 3}
	if err := h.BeginPool(0, id, RouteAll, 0, 0); err != nil {
		t.Fatal(err)
	}
	pooled := mustAlloc(t, h, miB, 0, 0)
	if live := h.PoolLive(0, id); !slices.Equal(live, []uint64{pooled}) {
		t.Errorf("with the cache off, a pool's route still takes its allocations: pool holds %#x, want [%#x]", live, pooled)
	}
	mustFree(t, h, pooled)
	if err := h.EndPool(0, id); err != nil {
		t.Fatal(err)
	}
	h.SetCaching(true)
}

// BenchmarkMemInfo is gpumem_mem_info's Go side, which PyTorch's cacheInfo
// asks at every cuDNN attention call: on a pool shaped by a generation
// program (gpt2_generate's trace, its live requests left allocated at its
// peak's size classes).
func BenchmarkMemInfo(b *testing.B) {
	h := New("device=sim,capacity=80GiB", nil)
	defer h.Close()
	tr, err := trace.Load("../../testdata/traces/gpt2_generate.trace.gz")
	if err != nil {
		b.Skip(err)
	}
	live := map[uint64]uint64{}
	for i, ev := range tr.Events {
		if i > len(tr.Events)/2 {
			break
		}
		if ev.Kind == trace.Alloc {
			p, err := h.Alloc(0, ev.Size, 0, 0)
			if err != nil {
				b.Fatal(err)
			}
			live[ev.ID] = p
		} else if p, ok := live[ev.ID]; ok {
			if err := h.Free(0, p); err != nil {
				b.Fatal(err)
			}
			delete(live, ev.ID)
		}
	}
	b.ReportAllocs()
	for b.Loop() {
		if _, _, err := h.MemInfo(0); err != nil {
			b.Fatal(err)
		}
	}
}
