package metrics

import (
	"fmt"
	"net/http"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/gpumem/gpumem/internal/announce"
	"github.com/gpumem/gpumem/nvml"
)

// GPUCollector exports what NVML says of a host's GPUs: each GPU's memory
// and each process's (contexts included), the figures nvidia-smi shows.
type GPUCollector struct {
	list func() ([]nvml.GPUReport, error)
}

// NewGPUCollector returns a collector over list (nvml.List on a real host).
func NewGPUCollector(list func() ([]nvml.GPUReport, error)) *GPUCollector {
	return &GPUCollector{list: list}
}

var (
	gpuLabels   = []string{"gpu", "uuid", "name"}
	gpuTotal    = prometheus.NewDesc("gpumem_gpu_memory_total_bytes", "A GPU's memory, as NVML reports it.", gpuLabels, nil)
	gpuUsed     = prometheus.NewDesc("gpumem_gpu_memory_used_bytes", "A GPU's memory in use by every process and the driver (NVML).", gpuLabels, nil)
	gpuProcUsed = prometheus.NewDesc("gpumem_gpu_process_memory_bytes", "The device memory a process holds on a GPU, its CUDA context included (NVML).", []string{"gpu", "uuid", "pid"}, nil)
	gpuUp       = prometheus.NewDesc("gpumem_gpu_up", "1 if NVML could be read, 0 if not (no driver, or an error).", nil, nil)
)

// Describe sends the descriptions.
func (c *GPUCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{gpuTotal, gpuUsed, gpuProcUsed, gpuUp} {
		ch <- d
	}
}

// Collect reads NVML once.
func (c *GPUCollector) Collect(ch chan<- prometheus.Metric) {
	reports, err := c.list()
	up := 1.0
	if err != nil {
		up = 0
	}
	ch <- prometheus.MustNewConstMetric(gpuUp, prometheus.GaugeValue, up)
	for _, r := range reports {
		g := r.GPU
		idx := strconv.Itoa(g.Index)
		ch <- prometheus.MustNewConstMetric(gpuTotal, prometheus.GaugeValue, float64(g.Memory.Total), idx, g.UUID, g.Name)
		ch <- prometheus.MustNewConstMetric(gpuUsed, prometheus.GaugeValue, float64(g.Memory.Used), idx, g.UUID, g.Name)
		for _, p := range r.Processes {
			if p.MemoryKnown {
				ch <- prometheus.MustNewConstMetric(gpuProcUsed, prometheus.GaugeValue, float64(p.UsedMemory), idx, g.UUID, strconv.Itoa(p.PID))
			}
		}
	}
}

// ProcessCollector exports the pools of the processes that serve gpumem's
// handler (package announce): it scrapes each one's /metrics at every
// collection and adds a pid label. A process that does not answer is
// counted in Errors (gpumem_process_scrape_errors_total, for the caller to
// register beside it) and skipped.
type ProcessCollector struct {
	list   func() ([]announce.Process, error)
	client *http.Client
	Errors prometheus.Counter
}

// NewProcessCollector returns a collector over the announced processes
// (list: announce.List on a real host).
func NewProcessCollector(list func() ([]announce.Process, error)) *ProcessCollector {
	return &ProcessCollector{list: list, client: &http.Client{Timeout: 2 * time.Second},
		Errors: prometheus.NewCounter(prometheus.CounterOpts{Name: "gpumem_process_scrape_errors_total",
			Help: "Scrapes of a gpumem process's metrics that failed."})}
}

// Describe sends nothing: the processes' metrics are not known in advance
// (an unchecked collector).
func (c *ProcessCollector) Describe(chan<- *prometheus.Desc) {}

// Collect scrapes every announced process.
func (c *ProcessCollector) Collect(ch chan<- prometheus.Metric) {
	procs, err := c.list()
	if err != nil {
		c.Errors.Inc()
		return
	}
	for _, p := range procs {
		if err := c.scrape(p, ch); err != nil {
			c.Errors.Inc()
		}
	}
}

func (c *ProcessCollector) scrape(p announce.Process, ch chan<- prometheus.Metric) error {
	resp, err := c.client.Get("http://" + p.Addr + "/metrics")
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%s: %s", p.Addr, resp.Status)
	}
	parser := expfmt.NewTextParser(model.UTF8Validation)
	families, err := parser.TextToMetricFamilies(resp.Body)
	if err != nil {
		return err
	}
	pid := strconv.Itoa(p.PID)
	for name, f := range families {
		var kind prometheus.ValueType
		switch f.GetType() {
		case dto.MetricType_COUNTER:
			kind = prometheus.CounterValue
		case dto.MetricType_GAUGE:
			kind = prometheus.GaugeValue
		default:
			continue // gpumem exports only counters and gauges
		}
		for _, m := range f.GetMetric() {
			names, values := []string{"pid"}, []string{pid}
			for _, l := range m.GetLabel() {
				names = append(names, l.GetName())
				values = append(values, l.GetValue())
			}
			v := m.GetGauge().GetValue()
			if kind == prometheus.CounterValue {
				v = m.GetCounter().GetValue()
			}
			desc := prometheus.NewDesc(name, f.GetHelp(), names, nil)
			metric, err := prometheus.NewConstMetric(desc, kind, v, values...)
			if err != nil {
				return err
			}
			ch <- metric
		}
	}
	return nil
}
