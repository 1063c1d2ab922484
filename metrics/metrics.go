// Package metrics exports gpumem's statistics to Prometheus, with the
// official Go client: a Collector that reads the allocators it is given at
// every scrape. Names follow Prometheus's conventions: a gpumem_ prefix,
// bytes in bytes with a _bytes suffix, counters ending in _total, and the
// labels device (the CUDA ordinal, or the simulated device's) and pool (the
// allocator's name: "gpumem" for a process's allocator of that device).
//
//	reg := prometheus.NewRegistry()
//	reg.MustRegister(metrics.NewCollector(func() []metrics.Source {
//		return []metrics.Source{{Device: "0", Pool: "gpumem", Allocator: a}}
//	}))
package metrics

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/gpumem/gpumem"
)

// Source is one allocator to export, with its labels.
type Source struct {
	Device    string
	Pool      string
	Allocator *gpumem.Allocator
	// Private are the device's private pools (CUDA graphs, MemPools:
	// gpumem.Allocator.NewPrivate), whose memory is the device's too.
	// Stats and Snapshot, where set, answer for the allocator and its
	// private pools together; nil: the allocator's own.
	Private  []*gpumem.Allocator
	Stats    func() gpumem.Stats
	Snapshot func() gpumem.Snapshot
	// Outside is what the process held on the device outside gpumem (its
	// CUDA context, loaded modules, allocations made before gpumem) when
	// it was measured: NVML's figure for the process minus Reserved then.
	// OutsideKnown is false where it was not measured (no NVML, a
	// simulated device).
	Outside      uint64
	OutsideKnown bool
}

// AllStats is src's statistics: Stats where set, else the allocator's.
func (src Source) AllStats() gpumem.Stats {
	if src.Stats != nil {
		return src.Stats()
	}
	return src.Allocator.Stats()
}

// AllSnapshot is src's snapshot: Snapshot where set, else the allocator's.
func (src Source) AllSnapshot() gpumem.Snapshot {
	if src.Snapshot != nil {
		return src.Snapshot()
	}
	return src.Allocator.Snapshot()
}

// Collector is a prometheus.Collector over the allocators that its list
// function returns at each scrape (allocators may come and go).
type Collector struct {
	list func() []Source
}

// NewCollector returns a Collector over list's allocators.
func NewCollector(list func() []Source) *Collector { return &Collector{list: list} }

var labels = []string{"device", "pool"}

type metric struct {
	desc  *prometheus.Desc
	kind  prometheus.ValueType
	value func(s gpumem.Stats, a *gpumem.Allocator) float64
}

func stat(kind prometheus.ValueType, name, help string, f func(s gpumem.Stats) uint64) metric {
	return metric{prometheus.NewDesc("gpumem_"+name, help, labels, nil), kind,
		func(s gpumem.Stats, _ *gpumem.Allocator) float64 { return float64(f(s)) }}
}

func gauge(name, help string, f func(s gpumem.Stats) uint64) metric {
	return stat(prometheus.GaugeValue, name, help, f)
}

func counter(name, help string, f func(s gpumem.Stats) uint64) metric {
	return stat(prometheus.CounterValue, name, help, f)
}

// deviceCall is the counter of one kind of driver call, by label.
var deviceCalls = prometheus.NewDesc("gpumem_device_calls_total",
	"Memory-management calls made to the driver, by call.", append(labels, "call"), nil)

var driverCallSeconds = prometheus.NewDesc("gpumem_driver_call_seconds_total",
	"Host time spent in the driver's virtual-memory calls, by call (part of gpumem_driver_seconds_total).", append(labels, "call"), nil)

var metricsList = []metric{
	gauge("allocated_bytes", "Bytes requested by live buffers.", func(s gpumem.Stats) uint64 { return s.Allocated }),
	gauge("allocated_peak_bytes", "Peak of allocated_bytes since the start or the last peak reset.", func(s gpumem.Stats) uint64 { return s.PeakAllocated }),
	gauge("active_bytes", "Bytes of the blocks behind live buffers (requests rounded to 512 bytes).", func(s gpumem.Stats) uint64 { return s.Active }),
	gauge("reserved_bytes", "Bytes held from the driver.", func(s gpumem.Stats) uint64 { return s.Reserved }),
	gauge("reserved_peak_bytes", "Peak of reserved_bytes.", func(s gpumem.Stats) uint64 { return s.PeakReserved }),
	gauge("cached_bytes", "Bytes held but not in use (reserved - active).", func(s gpumem.Stats) uint64 { return s.Cached }),
	gauge("releasable_bytes", "Part of cached_bytes a trim would give back now.", func(s gpumem.Stats) uint64 { return s.Releasable }),
	gauge("largest_free_bytes", "Largest request served now without a driver call.", func(s gpumem.Stats) uint64 { return s.LargestFree }),
	gauge("address_space_bytes", "Virtual address space reserved.", func(s gpumem.Stats) uint64 { return s.AddressSpace }),
	gauge("live_buffers", "Buffers allocated and not freed.", func(s gpumem.Stats) uint64 { return s.LiveBuffers }),
	gauge("pending_frees", "Freed buffers waiting for other streams' work.", func(s gpumem.Stats) uint64 { return uint64(s.PendingFrees) }),
	gauge("streams", "Streams with a pool.", func(s gpumem.Stats) uint64 { return uint64(s.Streams) }),
	counter("allocations_total", "Successful allocations.", func(s gpumem.Stats) uint64 { return s.Allocs }),
	counter("frees_total", "Successful frees.", func(s gpumem.Stats) uint64 { return s.Frees }),
	counter("out_of_memory_total", "Allocations that failed for want of memory.", func(s gpumem.Stats) uint64 { return s.OOMs }),
	counter("retries_total", "Allocations retried after giving the cache back.", func(s gpumem.Stats) uint64 { return s.Retries }),
	counter("trims_total", "Trims (every unused byte given back on request).", func(s gpumem.Stats) uint64 { return s.Trims }),
	counter("fences_total", "Host waits for a stream before memory was unmapped or freed.", func(s gpumem.Stats) uint64 { return s.Fences }),
	counter("splits_total", "Sparse spans whose live chunks moved to handles of their own (Config.Defrag).", func(s gpumem.Stats) uint64 { return s.Splits }),
	counter("copied_bytes_total", "Bytes copied to move live chunks (Config.Defrag).", func(s gpumem.Stats) uint64 { return s.CopiedBytes }),
	{prometheus.NewDesc("gpumem_driver_seconds_total", "Host time spent in the driver's memory calls (gpumem_device_calls_total).", labels, nil),
		prometheus.CounterValue, func(s gpumem.Stats, _ *gpumem.Allocator) float64 { return float64(s.DriverNanos) / 1e9 }},
	{prometheus.NewDesc("gpumem_wait_seconds_total", "Host time spent waiting for the GPU before memory was unmapped or freed (fences_total).", labels, nil),
		prometheus.CounterValue, func(s gpumem.Stats, _ *gpumem.Allocator) float64 { return float64(s.WaitNanos) / 1e9 }},
	counter("misses_total", "Allocations the cache could not serve at once (the slow path).", func(s gpumem.Stats) uint64 { return s.Misses }),
	{prometheus.NewDesc("gpumem_miss_seconds_total", "Host time spent in allocations the cache could not serve at once (misses_total), driver calls and waits included.", labels, nil),
		prometheus.CounterValue, func(s gpumem.Stats, _ *gpumem.Allocator) float64 { return float64(s.MissNanos) / 1e9 }},
	counter("event_calls_total", "Calls to the device's events and markers that keep the streams' order (queries, records or markers' writes, stream waits).", func(s gpumem.Stats) uint64 { return s.EventCalls }),
	{prometheus.NewDesc("gpumem_event_seconds_total", "Host time spent in those event calls (event_calls_total).", labels, nil),
		prometheus.CounterValue, func(s gpumem.Stats, _ *gpumem.Allocator) float64 { return float64(s.EventNanos) / 1e9 }},
	{prometheus.NewDesc("gpumem_fragmentation_ratio", "1 - largest_free_bytes / cached_bytes: 0 when the cache is one piece.", labels, nil),
		prometheus.GaugeValue, func(s gpumem.Stats, _ *gpumem.Allocator) float64 { return s.Fragmentation }},
	{prometheus.NewDesc("gpumem_limit_bytes", "The cap on reserved_bytes.", labels, nil),
		prometheus.GaugeValue, func(_ gpumem.Stats, a *gpumem.Allocator) float64 { return float64(a.Limit()) }},
}

// Describe sends every metric's description.
func (c *Collector) Describe(ch chan<- *prometheus.Desc) {
	for _, m := range metricsList {
		ch <- m.desc
	}
	ch <- deviceCalls
	ch <- driverCallSeconds
	ch <- outsideDesc
}

var outsideDesc = prometheus.NewDesc("gpumem_process_outside_bytes",
	"Device memory the process held outside gpumem when measured (CUDA context, modules, earlier allocations): NVML's figure minus reserved_bytes then.", labels, nil)

// Collect reads every allocator's statistics once and sends them.
func (c *Collector) Collect(ch chan<- prometheus.Metric) {
	for _, src := range c.list() {
		s := src.AllStats()
		for _, m := range metricsList {
			ch <- prometheus.MustNewConstMetric(m.desc, m.kind, m.value(s, src.Allocator), src.Device, src.Pool)
		}
		for _, call := range []struct {
			name string
			n    uint64
		}{{"alloc", s.DeviceAllocs}, {"free", s.DeviceFrees}, {"create", s.Creates}, {"release", s.Releases},
			{"map", s.Maps}, {"unmap", s.Unmaps}, {"set_access", s.SetAccess}, {"reserve", s.Reserves}} {
			ch <- prometheus.MustNewConstMetric(deviceCalls, prometheus.CounterValue, float64(call.n), src.Device, src.Pool, call.name)
		}
		for _, call := range []struct {
			name string
			ns   uint64
		}{{"create", s.CreateNanos}, {"release", s.ReleaseNanos}, {"map", s.MapNanos}, {"unmap", s.UnmapNanos}, {"set_access", s.SetAccessNanos}} {
			ch <- prometheus.MustNewConstMetric(driverCallSeconds, prometheus.CounterValue, float64(call.ns)/1e9, src.Device, src.Pool, call.name)
		}
		if src.OutsideKnown {
			ch <- prometheus.MustNewConstMetric(outsideDesc, prometheus.GaugeValue, float64(src.Outside), src.Device, src.Pool)
		}
	}
}
