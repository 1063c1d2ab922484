package cli

import (
	"io"
	"net/http/httptest"
	"os"
	"strconv"
	"strings"
	"testing"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/gpumem/gpumem"
	"github.com/gpumem/gpumem/device/sim"
	"github.com/gpumem/gpumem/httpdebug"
	"github.com/gpumem/gpumem/internal/announce"
	"github.com/gpumem/gpumem/metrics"
	"github.com/gpumem/gpumem/nvml"
)

// TestServe: gpumem serve exports NVML's GPUs and processes and the pools
// of the announced gpumem processes with their pid, in a scrape that
// Prometheus's parser reads.
func TestServe(t *testing.T) {
	t.Setenv("GPUMEM_RUN_DIR", t.TempDir())
	a, err := gpumem.New(sim.MustNew(sim.Config{Capacity: 1 << 30}), gpumem.Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	b, _ := a.Alloc(7<<20, 0)
	defer a.Free(b)
	proc := httptest.NewServer(httpdebug.Handler(func() []metrics.Source { return []metrics.Source{{Device: "0", Pool: "gpumem", Allocator: a}} }))
	defer proc.Close()
	if err := announce.Announce(strings.TrimPrefix(proc.URL, "http://")); err != nil {
		t.Fatal(err)
	}
	e := fakeEnv()
	pid := os.Getpid()
	e.listGPUs = func() ([]nvml.GPUReport, error) {
		return []nvml.GPUReport{{GPU: nvml.GPU{Index: 0, Name: "NVIDIA H100 80GB HBM3", UUID: "GPU-1",
			Memory: nvml.Memory{Total: 80 << 30, Used: 3 << 30}},
			Processes: []nvml.Process{{PID: pid, UsedMemory: 700 << 20, MemoryKnown: true, Compute: true}}}}, nil
	}
	srv := httptest.NewServer(e.serveHandler())
	defer srv.Close()
	resp, err := srv.Client().Get(srv.URL + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	parser := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := parser.TextToMetricFamilies(strings.NewReader(string(body)))
	if err != nil {
		t.Fatalf("the scrape does not parse: %v\n%s", err, body)
	}
	for _, want := range []string{
		`gpumem_allocated_bytes{device="0",pid="` + strconv.Itoa(pid) + `",pool="gpumem"} 7.340032e+06`,
		`gpumem_gpu_memory_total_bytes{gpu="0",name="NVIDIA H100 80GB HBM3",uuid="GPU-1"} 8.589934592e+10`,
		`gpumem_gpu_process_memory_bytes{gpu="0",pid="` + strconv.Itoa(pid) + `",uuid="GPU-1"} 7.340032e+08`,
		`gpumem_gpu_up 1`,
		`gpumem_process_scrape_errors_total 0`,
	} {
		if !strings.Contains(string(body), want) {
			t.Errorf("the scrape lacks %s\n%s", want, body)
		}
	}
	if fams["gpumem_allocations_total"].GetType().String() != "COUNTER" {
		t.Error("a process's counter was not exported as a counter")
	}
	resp, err = srv.Client().Get(srv.URL + "/debug/gpumem/processes")
	if err != nil {
		t.Fatal(err)
	}
	body, _ = io.ReadAll(resp.Body)
	resp.Body.Close()
	if !strings.Contains(string(body), `"pid":`+strconv.Itoa(pid)) {
		t.Errorf("processes: %s", body)
	}
}
