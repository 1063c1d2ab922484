package nvml

import (
	"errors"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/gpumem/gpumem/device"
	"github.com/gpumem/gpumem/device/cuda"
)

// The tests below need an NVIDIA GPU. Without a driver they skip; set
// GPUMEM_REQUIRE_GPU=1 to make them fail instead (on GPU machines).

const GiB = 1 << 30

func openNVML(t *testing.T) *NVML {
	t.Helper()
	n, err := Open()
	if err != nil {
		if os.Getenv("GPUMEM_REQUIRE_GPU") != "" {
			t.Fatalf("Open: %v", err)
		}
		if IsLibraryMissing(err) {
			t.Skip("no NVIDIA driver: libnvidia-ml.so.1 not found")
		}
		t.Skipf("NVML unusable: %v", err)
	}
	t.Cleanup(func() {
		if err := n.Shutdown(); err != nil {
			t.Errorf("Shutdown: %v", err)
		}
	})
	return n
}

func openCUDA(t *testing.T) *cuda.Device {
	t.Helper()
	d, err := cuda.Open(0)
	if err != nil {
		if os.Getenv("GPUMEM_REQUIRE_GPU") != "" {
			t.Fatalf("cuda.Open(0): %v", err)
		}
		if cuda.IsDriverMissing(err) {
			t.Skip("no NVIDIA driver: libcuda.so.1 not found")
		}
		t.Skipf("no usable NVIDIA GPU: %v", err)
	}
	t.Cleanup(func() { d.Close() })
	return d
}

func TestGPUDevices(t *testing.T) {
	n := openNVML(t)
	v, err := n.DriverVersion()
	if err != nil || v == "" {
		t.Errorf("DriverVersion = %q, %v", v, err)
	}
	c, err := n.DeviceCount()
	if err != nil || c < 1 {
		t.Fatalf("DeviceCount = %d, %v", c, err)
	}
	for i := range c {
		g, err := n.Device(i)
		if err != nil {
			t.Fatalf("Device(%d): %v", i, err)
		}
		if g.Index != i || g.Name == "" || !strings.HasPrefix(g.UUID, "GPU-") || g.BusID == "" || g.Memory.Total == 0 || g.Memory.Free > g.Memory.Total {
			t.Errorf("Device(%d) = %+v", i, g)
		}
		if j, err := n.IndexByUUID(g.UUID); j != i || err != nil {
			t.Errorf("IndexByUUID(%s) = %d, %v", g.UUID, j, err)
		}
		procs, err := n.Processes(i)
		if err != nil {
			t.Errorf("Processes(%d): %v", i, err)
		}
		t.Logf("driver %s, GPU %d: %+v, %d processes %+v", v, i, g, len(procs), procs)
	}
	_, err = n.Device(c + 100)
	if !errors.Is(err, device.ErrInvalid) {
		t.Errorf("Device(%d): %v, want device.ErrInvalid", c+100, err)
	}
	if _, err := n.IndexByUUID("GPU-00000000-0000-0000-0000-000000000000"); err == nil {
		t.Error("IndexByUUID of an unknown UUID succeeded")
	}

	reports, err := List()
	if err != nil || len(reports) != c {
		t.Fatalf("List = %d reports, %v", len(reports), err)
	}
	var b strings.Builder
	if err := Format(&b, reports); err != nil {
		t.Fatal(err)
	}
	t.Logf("gpumem devices:\n%s", b.String())
}

// TestGPUProcessMemoryTracksAlloc: NVML's figure for this process rises by
// 1 GiB with a 1 GiB cuMemAlloc and falls back after cuMemFree.
func TestGPUProcessMemoryTracksAlloc(t *testing.T) {
	d := openCUDA(t)
	n := openNVML(t)
	i, err := n.IndexByUUID(d.UUID())
	if err != nil {
		t.Fatalf("IndexByUUID(%s): %v", d.UUID(), err)
	}
	pid := os.Getpid()

	// self reads this process's figure, or (when NVML cannot see this pid:
	// another PID namespace) the GPU's used memory.
	usePID := true
	self := func() uint64 {
		t.Helper()
		if usePID {
			used, ok, err := n.ProcessMemory(i, pid)
			if err != nil {
				t.Fatalf("ProcessMemory: %v", err)
			}
			if ok {
				return used
			}
			procs, _ := n.Processes(i)
			t.Logf("pid %d not listed by NVML (processes %+v): another PID namespace? Using the GPU's used memory", pid, procs)
			usePID = false
		}
		g, err := n.Device(i)
		if err != nil {
			t.Fatalf("Device: %v", err)
		}
		return g.Memory.Used
	}
	// poll waits up to 5 s for cond on the figure.
	poll := func(cond func(uint64) bool) uint64 {
		t.Helper()
		var v uint64
		for start := time.Now(); time.Since(start) < 5*time.Second; time.Sleep(50 * time.Millisecond) {
			if v = self(); cond(v) {
				break
			}
		}
		return v
	}

	// The context exists (cuDevicePrimaryCtxRetain); make sure it is
	// initialized before the baseline.
	if err := d.Synchronize(); err != nil {
		t.Fatal(err)
	}
	before := self()
	p, err := d.Alloc(GiB)
	if err != nil {
		t.Fatalf("Alloc(1 GiB): %v", err)
	}
	if err := d.Memset8(p, 1, GiB); err != nil {
		t.Fatal(err)
	}
	if err := d.Synchronize(); err != nil {
		t.Fatal(err)
	}
	const slack = 16 << 20
	with := poll(func(v uint64) bool { return v >= before+GiB-slack })
	if err := d.Free(p); err != nil {
		t.Fatalf("Free: %v", err)
	}
	after := poll(func(v uint64) bool { return v+GiB-slack <= with })
	t.Logf("NVML (pid figure %v) stride %d: before %s, with 1 GiB %s, after free %s",
		usePID, lastStride.Load(), FormatBytes(before), FormatBytes(with), FormatBytes(after))
	if with < before+GiB-slack {
		t.Errorf("figure rose from %d to %d, want at least +1 GiB", before, with)
	}
	if after+GiB-slack > with {
		t.Errorf("figure fell from %d to %d after the free, want at least -1 GiB", with, after)
	}
}
