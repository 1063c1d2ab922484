package nvml

import (
	"bytes"
	"encoding/binary"
	"errors"
	"strings"
	"testing"
	"unsafe"

	"github.com/gpumem/gpumem/device"
)

func TestStructLayouts(t *testing.T) {
	var pci pciInfo
	var mem memoryInfo
	var p processInfo
	for _, c := range []struct {
		name      string
		got, want uintptr
	}{
		{"sizeof(nvmlPciInfo_t)", unsafe.Sizeof(pci), 68},
		{"nvmlPciInfo_t.busIdLegacy", unsafe.Offsetof(pci.BusIDLegacy), 0},
		{"nvmlPciInfo_t.domain", unsafe.Offsetof(pci.Domain), 16},
		{"nvmlPciInfo_t.bus", unsafe.Offsetof(pci.Bus), 20},
		{"nvmlPciInfo_t.device", unsafe.Offsetof(pci.Device), 24},
		{"nvmlPciInfo_t.pciDeviceId", unsafe.Offsetof(pci.PCIDeviceID), 28},
		{"nvmlPciInfo_t.pciSubSystemId", unsafe.Offsetof(pci.PCISubSystemID), 32},
		{"nvmlPciInfo_t.busId", unsafe.Offsetof(pci.BusID), 36},

		{"sizeof(nvmlMemory_t)", unsafe.Sizeof(mem), 24},
		{"nvmlMemory_t.total", unsafe.Offsetof(mem.Total), 0},
		{"nvmlMemory_t.free", unsafe.Offsetof(mem.Free), 8},
		{"nvmlMemory_t.used", unsafe.Offsetof(mem.Used), 16},

		{"sizeof(nvmlProcessInfo_t)", unsafe.Sizeof(p), 24},
		{"nvmlProcessInfo_t.pid", unsafe.Offsetof(p.PID), 0},
		{"nvmlProcessInfo_t.usedGpuMemory", unsafe.Offsetof(p.UsedGPUMemory), 8},
		{"nvmlProcessInfo_t.gpuInstanceId", unsafe.Offsetof(p.GPUInstanceID), 16},
		{"nvmlProcessInfo_t.computeInstanceId", unsafe.Offsetof(p.ComputeInstanceID), 20},
	} {
		if c.got != c.want {
			t.Errorf("%s = %d, want %d", c.name, c.got, c.want)
		}
	}
}

// fakeProcesses lays out entries as a library with the given stride writes
// them into a buffer pre-filled with the sentinel.
func fakeProcesses(stride, capacity int, procs []processInfo) []byte {
	buf := bytes.Repeat([]byte{0xA5}, capacity*maxStride)
	for i, p := range procs {
		e := buf[i*stride:]
		binary.LittleEndian.PutUint32(e[0:], p.PID)
		binary.LittleEndian.PutUint32(e[4:], 0) // padding
		binary.LittleEndian.PutUint64(e[8:], p.UsedGPUMemory)
		if stride >= 24 {
			binary.LittleEndian.PutUint32(e[16:], p.GPUInstanceID)
			binary.LittleEndian.PutUint32(e[20:], p.ComputeInstanceID)
		}
		if stride == 32 {
			binary.LittleEndian.PutUint64(e[24:], 0) // usedGpuCcProtectedMemory
		}
	}
	return buf
}

func TestDecodeProcesses(t *testing.T) {
	procs := []processInfo{
		{PID: 1234, UsedGPUMemory: 1 << 30, GPUInstanceID: ^uint32(0), ComputeInstanceID: ^uint32(0)},
		{PID: 99, UsedGPUMemory: valueNotAvailable, GPUInstanceID: 0, ComputeInstanceID: 0},
		{PID: 7, UsedGPUMemory: 512 << 20, GPUInstanceID: 1, ComputeInstanceID: 2},
	}
	for _, stride := range []int{16, 24, 32} {
		for n := 0; n <= len(procs); n++ {
			got, gotStride := decodeProcesses(fakeProcesses(stride, 8, procs[:n]), n)
			if n > 0 && gotStride != stride {
				t.Errorf("%d entries of %d bytes: detected stride %d", n, stride, gotStride)
			}
			if len(got) != n {
				t.Fatalf("stride %d, %d entries: decoded %d", stride, n, len(got))
			}
			for i := range got {
				want := procs[i]
				if stride == 16 {
					want.GPUInstanceID, want.ComputeInstanceID = ^uint32(0), ^uint32(0)
				}
				if got[i] != want {
					t.Errorf("stride %d, entry %d of %d: %+v, want %+v", stride, i, n, got[i], want)
				}
			}
		}
	}
}

func TestErrorMapping(t *testing.T) {
	for _, c := range []struct {
		code nvmlReturn
		want error
	}{
		{9, ErrUnavailable},
		{12, ErrUnavailable},
		{18, ErrUnavailable},
		{3, device.ErrUnsupported},
		{2, device.ErrInvalid},
		{15, nil},
		{999, nil},
	} {
		err := (*library)(nil).opError("nvmlDeviceGetMemoryInfo", c.code, "index=0")
		var op *device.OpError
		if !errors.As(err, &op) || op.Op != "nvmlDeviceGetMemoryInfo" || op.Args != "index=0" {
			t.Fatalf("%v is not the OpError of nvmlDeviceGetMemoryInfo", err)
		}
		for _, s := range []error{ErrUnavailable, device.ErrUnsupported, device.ErrInvalid, device.ErrOutOfMemory} {
			if got := errors.Is(err, s); got != (s == c.want) {
				t.Errorf("%s: errors.Is(%v) = %v", returnName(c.code), s, got)
			}
		}
		if c.want == ErrUnavailable && !errors.Is(err, device.ErrNoDriver) {
			t.Errorf("%s does not match device.ErrNoDriver", returnName(c.code))
		}
		if !strings.Contains(err.Error(), returnName(c.code)) {
			t.Errorf("%q lacks the name", err)
		}
	}
	if !errors.Is(ErrUnavailable, device.ErrNoDriver) {
		t.Error("ErrUnavailable does not match device.ErrNoDriver")
	}
	if got := returnName(4242); got != "NVML_ERROR_4242" {
		t.Errorf("returnName(4242) = %s", got)
	}
}

func TestMissingLibrary(t *testing.T) {
	const name = "libgpumem-no-such-nvml.so.1"
	_, err := openLibrary(name)
	if err == nil {
		t.Fatal("loaded a missing library")
	}
	if !errors.Is(err, ErrUnavailable) || !errors.Is(err, device.ErrNoDriver) || !IsLibraryMissing(err) {
		t.Errorf("%v does not match ErrUnavailable / device.ErrNoDriver", err)
	}
	if got, want := err.Error(), name+" not found: no NVIDIA driver on this machine"; got != want {
		t.Errorf("error = %q, want %q", got, want)
	}
}

func TestOpenWithoutDriver(t *testing.T) {
	n, err := Open()
	if err == nil {
		n.Shutdown()
		t.Skip("NVML is present; covered by the GPU tests")
	}
	if !IsLibraryMissing(err) {
		t.Skipf("NVML loaded but failed: %v", err)
	}
	if !errors.Is(err, device.ErrNoDriver) || err.Error() != "libnvidia-ml.so.1 not found: no NVIDIA driver on this machine" {
		t.Errorf("Open: %q", err)
	}
	if _, err := List(); !errors.Is(err, ErrUnavailable) {
		t.Errorf("List: %v", err)
	}
}

func TestFormat(t *testing.T) {
	reports := []GPUReport{
		{
			GPU: GPU{Index: 0, Name: "NVIDIA H100 80GB HBM3", UUID: "GPU-6e0d1a2b-3c4d-5e6f-7081-92a3b4c5d6e7", BusID: "00000000:19:00.0",
				Memory: Memory{Total: 85520809984, Used: 1632632832, Free: 83888177152}},
			Processes: []Process{
				{PID: 12345, UsedMemory: 1 << 30, MemoryKnown: true, Compute: true},
				{PID: 678, Compute: true, Graphics: true},
			},
		},
		{GPU: GPU{Index: 1, Name: "NVIDIA H100 80GB HBM3", Memory: Memory{Total: 85520809984, Free: 85520809984}}},
		{GPU: GPU{Index: 2}, Err: errors.New("nvmlDeviceGetName(index=2): NVML_ERROR_GPU_IS_LOST (15)")},
	}
	var b strings.Builder
	if err := Format(&b, reports); err != nil {
		t.Fatal(err)
	}
	out := b.String()
	t.Logf("\n%s", out)
	for _, want := range []string{
		"GPU 0  NVIDIA H100 80GB HBM3  bus 00000000:19:00.0  GPU-6e0d1a2b-3c4d-5e6f-7081-92a3b4c5d6e7\n",
		"  memory: 1.52 GiB used of 79.65 GiB (1.9%), 78.13 GiB free\n",
		"  PID    TYPE  GPU MEMORY\n",
		"  12345  C       1.00 GiB\n",
		"  678    C+G          n/a\n",
		"GPU 1  NVIDIA H100 80GB HBM3\n  memory: 0 B used of 79.65 GiB (0.0%), 79.65 GiB free\n  (no processes)\n",
		"GPU 2\n  error: nvmlDeviceGetName(index=2): NVML_ERROR_GPU_IS_LOST (15)\n",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q", want)
		}
	}
	b.Reset()
	Format(&b, nil)
	if b.String() != "no NVIDIA GPUs\n" {
		t.Errorf("empty: %q", b.String())
	}
}

func TestFormatBytes(t *testing.T) {
	for b, want := range map[uint64]string{0: "0 B", 1023: "1023 B", 1536: "1.50 KiB", 2 << 20: "2.00 MiB", 85520809984: "79.65 GiB", 3 << 40: "3.00 TiB", 5000 << 40: "5000.00 TiB"} {
		if got := FormatBytes(b); got != want {
			t.Errorf("FormatBytes(%d) = %q, want %q", b, got, want)
		}
	}
}

func TestProcessType(t *testing.T) {
	for p, want := range map[Process]string{{Compute: true}: "C", {Graphics: true}: "G", {Compute: true, Graphics: true}: "C+G"} {
		if got := p.Type(); got != want {
			t.Errorf("%+v.Type() = %s", p, got)
		}
	}
}
