package metrics

import (
	"io"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/gpumem/gpumem"
	"github.com/gpumem/gpumem/device/sim"
)

func newAllocator(t *testing.T) *gpumem.Allocator {
	t.Helper()
	a, err := gpumem.New(sim.MustNew(sim.Config{Capacity: 1 << 30}), gpumem.Config{Limit: 512 << 20})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.Close() })
	return a
}

// TestScrape: an HTTP scrape of the collector parses with Prometheus's own
// text parser and reports the allocator's numbers under both labels.
func TestScrape(t *testing.T) {
	a, b := newAllocator(t), newAllocator(t)
	keep, err := a.Alloc(3<<20, 0)
	if err != nil {
		t.Fatal(err)
	}
	x, _ := b.Alloc(1<<20, 0)
	_ = b.Free(x)
	if err := b.Trim(); err != nil { // a fence: an event recorded and waited for
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(NewCollector(func() []Source {
		return []Source{{Device: "0", Pool: "gpumem", Allocator: a}, {Device: "1", Pool: "gpumem", Allocator: b, Outside: 560 << 20, OutsideKnown: true}}
	}))
	srv := httptest.NewServer(promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	defer srv.Close()
	resp, err := srv.Client().Get(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	parser := expfmt.NewTextParser(model.UTF8Validation)
	families, err := parser.TextToMetricFamilies(strings.NewReader(string(body)))
	if err != nil {
		t.Fatalf("the scrape does not parse: %v\n%s", err, body)
	}
	value := func(name, dev string, extra ...string) float64 {
		t.Helper()
		f := families[name]
		if f == nil {
			t.Fatalf("no %s in the scrape", name)
		}
	next:
		for _, m := range f.GetMetric() {
			got := map[string]string{}
			for _, l := range m.GetLabel() {
				got[l.GetName()] = l.GetValue()
			}
			if got["device"] != dev || got["pool"] != "gpumem" {
				continue
			}
			for i := 0; i+1 < len(extra); i += 2 {
				if got[extra[i]] != extra[i+1] {
					continue next
				}
			}
			if m.Gauge != nil {
				return m.Gauge.GetValue()
			}
			return m.Counter.GetValue()
		}
		t.Fatalf("no %s for device %s %v", name, dev, extra)
		return 0
	}
	sa, sb := a.Stats(), b.Stats()
	if got := value("gpumem_allocated_bytes", "0"); got != float64(sa.Allocated) || got != 3<<20 {
		t.Errorf("allocated_bytes{device=0} = %v, want %d", got, sa.Allocated)
	}
	if got := value("gpumem_reserved_bytes", "1"); got != float64(sb.Reserved) {
		t.Errorf("reserved_bytes{device=1} = %v, want %d", got, sb.Reserved)
	}
	if got := value("gpumem_frees_total", "1"); got != 1 {
		t.Errorf("frees_total{device=1} = %v, want 1", got)
	}
	if got := value("gpumem_limit_bytes", "0"); got != 512<<20 {
		t.Errorf("limit_bytes = %v", got)
	}
	if got := value("gpumem_device_calls_total", "0", "call", "create"); got != float64(sa.Creates) || got == 0 {
		t.Errorf("device_calls_total{call=create} = %v, want %d", got, sa.Creates)
	}
	if got := value("gpumem_splits_total", "0"); got != float64(sa.Splits) {
		t.Errorf("splits_total{device=0} = %v, want %d", got, sa.Splits)
	}
	if got := value("gpumem_copied_bytes_total", "1"); got != float64(sb.CopiedBytes) {
		t.Errorf("copied_bytes_total{device=1} = %v, want %d", got, sb.CopiedBytes)
	}
	if got := value("gpumem_driver_seconds_total", "0"); got != float64(sa.DriverNanos)/1e9 || got <= 0 {
		t.Errorf("driver_seconds_total{device=0} = %v, want %d ns, above 0 after its creates", got, sa.DriverNanos)
	}
	if got := value("gpumem_driver_call_seconds_total", "0", "call", "create"); got != float64(sa.CreateNanos)/1e9 || got <= 0 {
		t.Errorf("driver_call_seconds_total{call=create} = %v, want %d ns, above 0 after its creates", got, sa.CreateNanos)
	}
	if got := value("gpumem_driver_call_seconds_total", "0", "call", "set_access"); got != float64(sa.SetAccessNanos)/1e9 {
		t.Errorf("driver_call_seconds_total{call=set_access} = %v, want %d ns", got, sa.SetAccessNanos)
	}
	if got := value("gpumem_misses_total", "0"); got != float64(sa.Misses) || got == 0 {
		t.Errorf("misses_total{device=0} = %v, want %d, above 0 after its growth", got, sa.Misses)
	}
	if got := value("gpumem_miss_seconds_total", "0"); got != float64(sa.MissNanos)/1e9 {
		t.Errorf("miss_seconds_total{device=0} = %v, want %d ns", got, sa.MissNanos)
	}
	if got := value("gpumem_event_calls_total", "1"); got != float64(sb.EventCalls) || got == 0 {
		t.Errorf("event_calls_total{device=1} = %v, want %d, above 0 after its fence's record", got, sb.EventCalls)
	}
	if got := value("gpumem_event_seconds_total", "1"); got != float64(sb.EventNanos)/1e9 {
		t.Errorf("event_seconds_total{device=1} = %v, want %d ns", got, sb.EventNanos)
	}
	if got := value("gpumem_wait_seconds_total", "1"); got != float64(sb.WaitNanos)/1e9 {
		t.Errorf("wait_seconds_total{device=1} = %v, want %d ns", got, sb.WaitNanos)
	}
	if got := value("gpumem_process_outside_bytes", "1"); got != 560<<20 {
		t.Errorf("process_outside_bytes{device=1} = %v, want %d", got, 560<<20)
	}
	for _, m := range families["gpumem_process_outside_bytes"].GetMetric() {
		for _, l := range m.GetLabel() {
			if l.GetName() == "device" && l.GetValue() == "0" {
				t.Error("process_outside_bytes exported for device 0, where it was not measured")
			}
		}
	}
	if families["gpumem_allocations_total"].GetType().String() != "COUNTER" || families["gpumem_reserved_bytes"].GetType().String() != "GAUGE" {
		t.Error("counters and gauges are typed wrong")
	}
	_ = a.Free(keep)
}

// TestLint: the metrics follow Prometheus's naming conventions, as its own
// linter checks them.
func TestLint(t *testing.T) {
	a := newAllocator(t)
	problems, err := testutil.CollectAndLint(NewCollector(func() []Source {
		return []Source{{Device: "0", Pool: "gpumem", Allocator: a, Outside: 1, OutsideKnown: true}}
	}))
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		t.Errorf("%s: %s", p.Metric, p.Text)
	}
}

// TestScrapeUsesSourceStats: a Source's Stats, where set (a host's
// allocator with its private pools), is what the metrics report, not the
// allocator's own figure.
func TestScrapeUsesSourceStats(t *testing.T) {
	a := newAllocator(t)
	p, err := a.NewPrivate()
	if err != nil {
		t.Fatal(err)
	}
	buf, err := p.Alloc(8<<20, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = p.Free(buf); _ = p.Close() }()
	both := func() gpumem.Stats {
		st := a.Stats()
		st.Reserved += p.Stats().Reserved
		return st
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(NewCollector(func() []Source {
		return []Source{{Device: "0", Pool: "gpumem", Allocator: a, Private: []*gpumem.Allocator{p}, Stats: both}}
	}))
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		if f.GetName() == "gpumem_reserved_bytes" {
			if got, want := f.GetMetric()[0].GetGauge().GetValue(), float64(both().Reserved); got != want || got < 8<<20 {
				t.Errorf("reserved_bytes = %v, want the allocator's and its pool's %v", got, want)
			}
			return
		}
	}
	t.Fatal("no gpumem_reserved_bytes")
}
