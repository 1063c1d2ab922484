package cuda

import (
	"bytes"
	"encoding/binary"
	"errors"
	"os"
	"runtime"
	"sync"
	"testing"
	"time"
	"unsafe"

	"github.com/gpumem/gpumem/device"
)

// The tests below need an NVIDIA GPU. Without a driver they skip; set
// GPUMEM_REQUIRE_GPU=1 to make them fail instead (on GPU machines).

const (
	MiB = 1 << 20
	GiB = 1 << 30
)

// spinCycles is about half a second of SM clock on an H100 (~1.7 GHz):
// far longer than launching work and querying it.
const spinCycles = 1_000_000_000

func openGPU(t *testing.T) *Device {
	t.Helper()
	d, err := Open(0)
	if err != nil {
		if os.Getenv("GPUMEM_REQUIRE_GPU") != "" {
			t.Fatalf("Open(0): %v", err)
		}
		if IsDriverMissing(err) {
			t.Skip("no NVIDIA driver: libcuda.so.1 not found")
		}
		t.Skipf("no usable NVIDIA GPU: %v", err)
	}
	t.Cleanup(func() {
		if err := d.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	return d
}

func mustInvalid(t *testing.T, what string, err error) {
	t.Helper()
	if err == nil {
		t.Errorf("%s: no error, want one matching device.ErrInvalid", what)
		return
	}
	var op *device.OpError
	if !errors.As(err, &op) {
		t.Errorf("%s: %v is not a *device.OpError", what, err)
	}
	if !errors.Is(err, device.ErrInvalid) {
		t.Errorf("%s: %v does not match device.ErrInvalid", what, err)
		return
	}
	t.Logf("%s: %v", what, err)
}

func readU32(t *testing.T, d *Device, p device.Ptr) uint32 {
	t.Helper()
	var b [4]byte
	if err := d.CopyToHost(b[:], p); err != nil {
		t.Fatalf("CopyToHost: %v", err)
	}
	return binary.LittleEndian.Uint32(b[:])
}

func TestGPUInfo(t *testing.T) {
	d := openGPU(t)
	n, err := DeviceCount()
	if err != nil || n < 1 {
		t.Fatalf("DeviceCount = %d, %v", n, err)
	}
	v, err := DriverVersion()
	if err != nil || v < 11000 {
		t.Errorf("DriverVersion = %d, %v", v, err)
	}
	info := d.Info()
	if info.Name == "" || info.Ordinal != 0 || info.Total == 0 {
		t.Errorf("Info = %+v", info)
	}
	free, total, err := d.MemInfo()
	if err != nil || total == 0 || free > total {
		t.Errorf("MemInfo = %d, %d, %v", free, total, err)
	}
	major, minor := d.ComputeCapability()
	g := d.Granularity()
	if g < 64<<10 || g&(g-1) != 0 {
		t.Errorf("Granularity = %d", g)
	}
	if len(d.UUID()) != len("GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx") {
		t.Errorf("UUID = %q", d.UUID())
	}
	t.Logf("%d device(s), driver CUDA %d.%d; device 0: %q sm_%d%d %s total %d (cuMemGetInfo total %d, free %d), granularity %d, VMM %v",
		n, v/1000, v%1000/10, info.Name, major, minor, d.UUID(), info.Total, total, free, g, d.VirtualMemorySupported())
	for _, x := range []device.Device{d} {
		if _, ok := device.AsVirtualMemory(x); !ok {
			t.Error("not a device.VirtualMemory")
		}
		if _, ok := device.AsEvents(x); !ok {
			t.Error("not a device.Events")
		}
		if _, ok := device.AsStreams(x); !ok {
			t.Error("not a device.Streams")
		}
	}
}

// TestGPUErrorNames checks the package's CUresult table against the
// driver's own cuGetErrorName.
func TestGPUErrorNames(t *testing.T) {
	d := openGPU(t)
	unknown := 0
	for r, want := range resultNames {
		got, ok := d.drv.errorName(r)
		if !ok {
			unknown++ // newer than this driver
			continue
		}
		if got != want {
			t.Errorf("cuGetErrorName(%d) = %s, table says %s", r, got, want)
		}
	}
	e := newDriverError(d.drv, cudaErrOutOfMemory)
	if e.Name != "CUDA_ERROR_OUT_OF_MEMORY" || e.Description == "" {
		t.Errorf("newDriverError(2) = %+v", e)
	}
	t.Logf("%d codes checked, %d unknown to this driver; e.g. %v", len(resultNames)-unknown, unknown, e)
}

func TestGPUAllocCopyFree(t *testing.T) {
	d := openGPU(t)
	const n = 1*MiB + 123
	p, err := d.Alloc(n)
	if err != nil {
		t.Fatalf("Alloc: %v", err)
	}
	if p == 0 || p%512 != 0 {
		t.Errorf("Alloc = %#x, want 512-aligned", uint64(p))
	}
	if err := d.Memset8(p, 0xab, n); err != nil {
		t.Fatalf("Memset8: %v", err)
	}
	got := make([]byte, n)
	if err := d.CopyToHost(got, p); err != nil {
		t.Fatalf("CopyToHost: %v", err)
	}
	if !bytes.Equal(got, bytes.Repeat([]byte{0xab}, n)) {
		t.Error("Memset8 then CopyToHost: wrong bytes")
	}
	want := make([]byte, n)
	for i := range want {
		want[i] = byte(i*31 + i>>11)
	}
	if err := d.CopyFromHost(p, want); err != nil {
		t.Fatalf("CopyFromHost: %v", err)
	}
	clear(got)
	if err := d.CopyToHost(got, p); err != nil {
		t.Fatalf("CopyToHost: %v", err)
	}
	if !bytes.Equal(got, want) {
		t.Error("CopyFromHost then CopyToHost: wrong bytes")
	}
	if err := d.Free(p); err != nil {
		t.Fatalf("Free: %v", err)
	}

	// Memory really is taken from the device.
	free0, _, err := d.MemInfo()
	if err != nil {
		t.Fatal(err)
	}
	big, err := d.Alloc(256 * MiB)
	if err != nil {
		t.Fatalf("Alloc(256 MiB): %v", err)
	}
	free1, _, _ := d.MemInfo()
	if err := d.Free(big); err != nil {
		t.Fatalf("Free: %v", err)
	}
	free2, _, _ := d.MemInfo()
	if free0-free1 < 256*MiB || free2 < free1+256*MiB {
		t.Errorf("MemInfo free: %d before, %d with 256 MiB allocated, %d after", free0, free1, free2)
	}
	if err := d.Synchronize(); err != nil {
		t.Errorf("Synchronize: %v", err)
	}
}

func TestGPUOutOfMemory(t *testing.T) {
	d := openGPU(t)
	p, err := d.Alloc(1 << 40)
	if err == nil {
		d.Free(p)
		t.Fatal("Alloc(1 TiB) succeeded")
	}
	var op *device.OpError
	if !errors.Is(err, device.ErrOutOfMemory) || !errors.As(err, &op) || op.Op != "cuMemAlloc" {
		t.Errorf("Alloc(1 TiB): %v, want an OpError cuMemAlloc matching device.ErrOutOfMemory", err)
	}
	t.Logf("Alloc(1 TiB): %v", err)
	if d.VirtualMemorySupported() {
		h, err := d.Create(1 << 40)
		if err == nil {
			d.Release(h)
			t.Fatal("Create(1 TiB) succeeded")
		}
		if !errors.Is(err, device.ErrOutOfMemory) {
			t.Errorf("Create(1 TiB): %v, want device.ErrOutOfMemory", err)
		}
		t.Logf("Create(1 TiB): %v", err)
	}
	// The device is still usable after the failures.
	p, err = d.Alloc(MiB)
	if err != nil {
		t.Fatalf("Alloc after OOM: %v", err)
	}
	d.Free(p)
}

func TestGPUVirtualMemoryRoundTrip(t *testing.T) {
	d := openGPU(t)
	if !d.VirtualMemorySupported() {
		t.Skip("device lacks virtual memory management")
	}
	g := d.Granularity()
	const reserve = 64 * GiB
	base, err := d.Reserve(reserve, 0)
	if err != nil {
		t.Fatalf("Reserve(64 GiB): %v", err)
	}
	if uint64(base)%g != 0 {
		t.Errorf("Reserve = %#x, not aligned to %d", uint64(base), g)
	}
	const chunks = 8
	var hs []device.Handle
	for i := range chunks {
		h, err := d.Create(g)
		if err != nil {
			t.Fatalf("Create(%d): %v", g, err)
		}
		hs = append(hs, h)
		if err := d.Map(base+device.Ptr(uint64(i)*g), g, h); err != nil {
			t.Fatalf("Map chunk %d: %v", i, err)
		}
	}
	size := uint64(chunks) * g
	if err := d.SetAccess(base, size); err != nil {
		t.Fatalf("SetAccess over %d chunks: %v", chunks, err)
	}
	want := make([]byte, size)
	for i := range want {
		want[i] = byte(i*131 + i>>16)
	}
	if err := d.CopyFromHost(base, want); err != nil {
		t.Fatalf("CopyFromHost: %v", err)
	}
	got := make([]byte, size)
	if err := d.CopyToHost(got, base); err != nil {
		t.Fatalf("CopyToHost: %v", err)
	}
	if !bytes.Equal(got, want) {
		t.Fatal("VM round trip: bytes read back differ")
	}
	// A read across a chunk boundary.
	edge := make([]byte, 4096)
	if err := d.CopyToHost(edge, base+device.Ptr(3*g-2048)); err != nil {
		t.Fatalf("CopyToHost across chunks: %v", err)
	}
	if !bytes.Equal(edge, want[3*g-2048:3*g+2048]) {
		t.Error("read across a chunk boundary differs")
	}
	// A chunk far into the reservation, set accessible on its own.
	far := base + device.Ptr(reserve-g)
	hf, err := d.Create(g)
	if err != nil {
		t.Fatalf("Create: %v", err)
	}
	if err := d.Map(far, g, hf); err != nil {
		t.Fatalf("Map at the end of the reservation: %v", err)
	}
	if err := d.SetAccess(far, g); err != nil {
		t.Fatalf("SetAccess: %v", err)
	}
	// Released while mapped: the memory stays until Unmap.
	if err := d.Release(hf); err != nil {
		t.Fatalf("Release of a mapped chunk: %v", err)
	}
	if err := d.Memset8(far, 0x5a, g); err != nil {
		t.Fatalf("Memset8 on a released, still mapped chunk: %v", err)
	}
	if v := readU32(t, d, far+device.Ptr(g-4)); v != 0x5a5a5a5a {
		t.Errorf("released, mapped chunk reads %#x", v)
	}
	if err := d.Unmap(far, g); err != nil {
		t.Fatalf("Unmap: %v", err)
	}
	for i, h := range hs {
		if err := d.Unmap(base+device.Ptr(uint64(i)*g), g); err != nil {
			t.Fatalf("Unmap chunk %d: %v", i, err)
		}
		if err := d.Release(h); err != nil {
			t.Fatalf("Release chunk %d: %v", i, err)
		}
	}
	if err := d.ReleaseAddress(base, reserve); err != nil {
		t.Fatalf("ReleaseAddress: %v", err)
	}
}

// TestGPUMapOneHandleTwice: one handle mapped at two addresses is one
// memory, written through either and read through the other, and either
// mapping outlives the unmap of the other. gpumem's Config.Compact leaves a
// moved span's old mapping in place (dormant.go) and relies on this.
func TestGPUMapOneHandleTwice(t *testing.T) {
	d := openGPU(t)
	if !d.VirtualMemorySupported() {
		t.Skip("device lacks virtual memory management")
	}
	g := d.Granularity()
	size := 4 * g
	base, err := d.Reserve(4*size, 0)
	if err != nil {
		t.Fatalf("Reserve: %v", err)
	}
	h, err := d.Create(size)
	if err != nil {
		t.Fatalf("Create: %v", err)
	}
	a, b := base, base+device.Ptr(2*size)
	for _, p := range []device.Ptr{a, b} {
		if err := d.Map(p, size, h); err != nil {
			t.Fatalf("Map of the handle at %#x: %v", uint64(p), err)
		}
		if err := d.SetAccess(p, size); err != nil {
			t.Fatalf("SetAccess at %#x: %v", uint64(p), err)
		}
	}
	want := make([]byte, size)
	for i := range want {
		want[i] = byte(i*7 + i>>12)
	}
	if err := d.CopyFromHost(a, want); err != nil {
		t.Fatalf("CopyFromHost through the first mapping: %v", err)
	}
	got := make([]byte, size)
	if err := d.CopyToHost(got, b); err != nil {
		t.Fatalf("CopyToHost through the second mapping: %v", err)
	}
	if !bytes.Equal(got, want) {
		t.Fatal("the second mapping does not show what the first wrote")
	}
	if err := d.Unmap(a, size); err != nil {
		t.Fatalf("Unmap of the first mapping: %v", err)
	}
	if err := d.Memset8(b+device.Ptr(g), 0x3c, g); err != nil {
		t.Fatalf("Memset8 through the second mapping after the first is gone: %v", err)
	}
	if v := readU32(t, d, b+device.Ptr(2*g-4)); v != 0x3c3c3c3c {
		t.Errorf("the second mapping reads %#x after the first was unmapped", v)
	}
	// Mapped again where it was: the same memory.
	if err := d.Map(a, size, h); err != nil {
		t.Fatalf("Map again at the first address: %v", err)
	}
	if err := d.SetAccess(a, size); err != nil {
		t.Fatalf("SetAccess: %v", err)
	}
	if v := readU32(t, d, a+device.Ptr(g)); v != 0x3c3c3c3c {
		t.Errorf("mapped again, the first address reads %#x, want what the second wrote", v)
	}
	for _, p := range []device.Ptr{a, b} {
		if err := d.Unmap(p, size); err != nil {
			t.Fatalf("Unmap at %#x: %v", uint64(p), err)
		}
	}
	if err := d.Release(h); err != nil {
		t.Fatalf("Release: %v", err)
	}
	if err := d.ReleaseAddress(base, 4*size); err != nil {
		t.Fatalf("ReleaseAddress: %v", err)
	}
}

func TestGPUVirtualMemoryErrors(t *testing.T) {
	d := openGPU(t)
	if !d.VirtualMemorySupported() {
		t.Skip("device lacks virtual memory management")
	}
	g := d.Granularity()
	base, err := d.Reserve(4*g, 0)
	if err != nil {
		t.Fatalf("Reserve: %v", err)
	}
	// What the driver itself says (documents why Device keeps books).
	r := d.call(d.drv.cuMemUnmap, uintptr(base), uintptr(g))
	t.Logf("driver: cuMemUnmap of reserved, unmapped space returns %s", resultName(r))

	mustInvalid(t, "Unmap of an unmapped range", d.Unmap(base, g))
	if err := d.Unmap(base, g); !errors.Is(err, ErrNotMapped) {
		t.Errorf("Unmap of an unmapped range: %v, want ErrNotMapped", err)
	}
	mustInvalid(t, "SetAccess of an unmapped range", d.SetAccess(base, g))
	_, err = d.Create(g + 1)
	mustInvalid(t, "Create of a size not a multiple of the granularity", err)
	h, err := d.Create(g)
	if err != nil {
		t.Fatalf("Create: %v", err)
	}
	if err := d.Map(base, g, h); err != nil {
		t.Fatalf("Map: %v", err)
	}
	mustInvalid(t, "Map over a mapped range", d.Map(base, g, h))
	mustInvalid(t, "Map overlapping a mapped range", d.Map(base+device.Ptr(g/2), g, h))
	mustInvalid(t, "Unmap of a mapping plus unmapped space", d.Unmap(base, 2*g))
	mustInvalid(t, "Unmap of part of a mapping", d.Unmap(base, g/2))
	mustInvalid(t, "ReleaseAddress of a reservation with a mapping", d.ReleaseAddress(base, 4*g))
	mustInvalid(t, "ReleaseAddress of part of a reservation", d.ReleaseAddress(base, 2*g))
	if err := d.SetAccess(base, g); err != nil {
		t.Fatalf("SetAccess: %v", err)
	}
	if err := d.Memset8(base, 7, g); err != nil {
		t.Fatalf("Memset8 after the refused calls: %v", err)
	}
	if err := d.Unmap(base, g); err != nil {
		t.Fatalf("Unmap: %v", err)
	}
	mustInvalid(t, "second Unmap", d.Unmap(base, g))
	if err := d.Release(h); err != nil {
		t.Fatalf("Release: %v", err)
	}
	if err := d.ReleaseAddress(base, 4*g); err != nil {
		t.Fatalf("ReleaseAddress: %v", err)
	}
	mustInvalid(t, "second ReleaseAddress", d.ReleaseAddress(base, 4*g))
	_, err = d.Alloc(0)
	mustInvalid(t, "Alloc(0)", err)
	mustInvalid(t, "Free of an address never allocated", d.Free(device.Ptr(0x10000)))
}

func TestGPUEventsAndSpin(t *testing.T) {
	d := openGPU(t)
	a, err := d.NewStream()
	if err != nil {
		t.Fatalf("NewStream: %v", err)
	}
	defer d.DestroyStream(a)
	flag, err := d.Alloc(4)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Free(flag)
	if err := d.Memset8(flag, 0, 4); err != nil {
		t.Fatal(err)
	}
	if err := d.Synchronize(); err != nil {
		t.Fatal(err)
	}
	e, err := d.NewEvent()
	if err != nil {
		t.Fatalf("NewEvent: %v", err)
	}
	defer func() {
		if err := d.DestroyEvent(e); err != nil {
			t.Errorf("DestroyEvent: %v", err)
		}
	}()
	if done, err := d.Query(e); !done || err != nil {
		t.Errorf("Query of a never recorded event = %v, %v; want true", done, err)
	}
	start := time.Now()
	if err := d.Spin(a, spinCycles, flag); err != nil {
		t.Fatalf("Spin: %v", err)
	}
	t.Logf("spin kernel built for %s", d.spinTarget)
	if err := d.Record(e, a); err != nil {
		t.Fatalf("Record: %v", err)
	}
	if done, err := d.Query(e); done || err != nil {
		t.Errorf("Query right after a long Spin = %v, %v; want false", done, err)
	}
	if v := readU32(t, d, flag); v != 0 {
		t.Errorf("flag = %d before the spin ended", v)
	}
	if err := d.Wait(e); err != nil {
		t.Fatalf("Wait: %v", err)
	}
	el := time.Since(start)
	if done, err := d.Query(e); !done || err != nil {
		t.Errorf("Query after Wait = %v, %v; want true", done, err)
	}
	if v := readU32(t, d, flag); v != SpinValue {
		t.Errorf("flag = %d after the spin, want %d", v, SpinValue)
	}
	t.Logf("%d cycles took %v (%.2f GHz)", spinCycles, el, float64(spinCycles)/el.Seconds()/1e9)

	// Spin on the default stream, then Synchronize.
	if err := d.Memset8(flag, 0, 4); err != nil {
		t.Fatal(err)
	}
	if err := d.Spin(0, spinCycles/10, flag); err != nil {
		t.Fatalf("Spin on the default stream: %v", err)
	}
	if err := d.Synchronize(); err != nil {
		t.Fatalf("Synchronize: %v", err)
	}
	if v := readU32(t, d, flag); v != SpinValue {
		t.Errorf("flag = %d after Synchronize", v)
	}
}

// holdRig gives a test of holds a zeroed flag word (for HoldUntil), a
// stream to hold, another to release it from, and an event, all given back
// when the test ends.
func holdRig(t *testing.T, d *Device) (flag device.Ptr, held, ctrl device.Stream, e device.Event) {
	t.Helper()
	var err error
	if flag, err = d.Alloc(2 * MiB); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Free(flag) })
	if err := d.Memset8(flag, 0, 8); err != nil {
		t.Fatal(err)
	}
	if held, err = d.NewStream(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.DestroyStream(held) })
	if ctrl, err = d.NewStream(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.DestroyStream(ctrl) })
	if e, err = d.NewEvent(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.DestroyEvent(e) })
	return flag, held, ctrl, e
}

// TestGPUHoldUntil: HoldUntil keeps a stream's work pending until its flag
// is written from another stream, and no longer than its cycle bound.
func TestGPUHoldUntil(t *testing.T) {
	d := openGPU(t)
	flag, a, ctrl, e := holdRig(t, d)

	if err := d.HoldUntil(a, flag, 100*spinCycles); err != nil {
		t.Fatalf("HoldUntil: %v", err)
	}
	if err := d.Record(e, a); err != nil {
		t.Fatal(err)
	}
	time.Sleep(100 * time.Millisecond)
	if done, err := d.Query(e); done || err != nil {
		t.Fatalf("Query 100 ms into a hold = %v, %v; want false", done, err)
	}
	start := time.Now()
	if err := d.MemsetAsync(flag, 1, 4, ctrl); err != nil {
		t.Fatal(err)
	}
	if err := d.SynchronizeStream(ctrl); err != nil {
		t.Fatal(err)
	}
	if err := d.Wait(e); err != nil {
		t.Fatal(err)
	}
	if el := time.Since(start); el > 100*time.Millisecond {
		t.Errorf("the hold ended %v after its flag was written, want at once", el)
	}

	// Never released: it ends by itself after its cycles.
	start = time.Now()
	if err := d.HoldUntil(a, flag+4, spinCycles/10); err != nil {
		t.Fatal(err)
	}
	if err := d.SynchronizeStream(a); err != nil {
		t.Fatal(err)
	}
	t.Logf("an unreleased hold of %d cycles ended after %v", spinCycles/10, time.Since(start))
}

func TestGPUStreamWaitOrdering(t *testing.T) {
	d := openGPU(t)
	a, err := d.NewStream()
	if err != nil {
		t.Fatal(err)
	}
	defer d.DestroyStream(a)
	b, err := d.NewStream()
	if err != nil {
		t.Fatal(err)
	}
	defer d.DestroyStream(b)
	flag, err := d.Alloc(4)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Free(flag)
	e, err := d.NewEvent()
	if err != nil {
		t.Fatal(err)
	}
	defer d.DestroyEvent(e)

	// Control: without StreamWait, B's memset overtakes A's spin, whose
	// store lands last.
	if err := d.Memset8(flag, 0, 4); err != nil {
		t.Fatal(err)
	}
	if err := d.Synchronize(); err != nil {
		t.Fatal(err)
	}
	if err := d.Spin(a, spinCycles, flag); err != nil {
		t.Fatal(err)
	}
	if err := d.Record(e, a); err != nil {
		t.Fatal(err)
	}
	if err := d.MemsetAsync(flag, 2, 4, b); err != nil {
		t.Fatalf("MemsetAsync: %v", err)
	}
	if err := d.SynchronizeStream(b); err != nil {
		t.Fatalf("SynchronizeStream: %v", err)
	}
	if done, _ := d.Query(e); done {
		t.Error("control: the spin on A had completed when B's memset did (streams not concurrent?)")
	}
	if v := readU32(t, d, flag); v != 0x02020202 {
		t.Errorf("control: flag = %#x right after B, want 0x02020202", v)
	}
	if err := d.SynchronizeStream(a); err != nil {
		t.Fatal(err)
	}
	if v := readU32(t, d, flag); v != SpinValue {
		t.Errorf("control: flag = %#x after A, want the spin's %d", v, SpinValue)
	}

	// With StreamWait, B's memset runs after A's spin.
	if err := d.Spin(a, spinCycles, flag); err != nil {
		t.Fatal(err)
	}
	if err := d.Record(e, a); err != nil {
		t.Fatal(err)
	}
	if err := d.StreamWait(b, e); err != nil {
		t.Fatalf("StreamWait: %v", err)
	}
	if err := d.MemsetAsync(flag, 2, 4, b); err != nil {
		t.Fatal(err)
	}
	if done, _ := d.Query(e); done {
		t.Error("the spin completed before StreamWait was even tested")
	}
	if err := d.SynchronizeStream(b); err != nil {
		t.Fatal(err)
	}
	if done, err := d.Query(e); !done || err != nil {
		t.Errorf("after B (which waited on e): Query(e) = %v, %v; want true", done, err)
	}
	if v := readU32(t, d, flag); v != 0x02020202 {
		t.Errorf("flag = %#x, want 0x02020202: B's memset did not run after A's spin", v)
	}
}

func TestGPUStreams(t *testing.T) {
	d := openGPU(t)
	for range 4 {
		s, err := d.NewStream()
		if err != nil {
			t.Fatalf("NewStream: %v", err)
		}
		if s == 0 {
			t.Error("NewStream returned the default stream")
		}
		if err := d.SynchronizeStream(s); err != nil {
			t.Errorf("SynchronizeStream: %v", err)
		}
		if err := d.DestroyStream(s); err != nil {
			t.Errorf("DestroyStream: %v", err)
		}
	}
	if err := d.SynchronizeStream(0); err != nil {
		t.Errorf("SynchronizeStream(default): %v", err)
	}

	// The cost of one call: context made current + purego + driver.
	e, err := d.NewEvent()
	if err != nil {
		t.Fatal(err)
	}
	defer d.DestroyEvent(e)
	const calls = 20000
	start := time.Now()
	for range calls {
		if _, err := d.Query(e); err != nil {
			t.Fatal(err)
		}
	}
	t.Logf("Query: %v per call", time.Since(start)/calls)
}

// TestGPUSharedPrimaryContext: two Devices of one ordinal share the primary
// context, so a pointer of one is usable through the other, and closing one
// leaves the other working.
func TestGPUSharedPrimaryContext(t *testing.T) {
	d := openGPU(t)
	d2, err := Open(0)
	if err != nil {
		t.Fatal(err)
	}
	if d2.ctx != d.ctx {
		t.Errorf("two Opens retained different contexts %#x, %#x", d.ctx, d2.ctx)
	}
	p, err := d.Alloc(4096)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Free(p)
	want := bytes.Repeat([]byte("gpumem!"), 586)[:4096]
	if err := d2.CopyFromHost(p, want); err != nil {
		t.Fatalf("CopyFromHost through the second Device: %v", err)
	}
	if err := d2.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if err := d2.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
	_, err = d2.Alloc(4096)
	if !errors.Is(err, ErrClosed) || !errors.Is(err, device.ErrInvalid) {
		t.Errorf("Alloc after Close: %v, want ErrClosed", err)
	}
	got := make([]byte, 4096)
	if err := d.CopyToHost(got, p); err != nil {
		t.Fatalf("CopyToHost after the other Device closed: %v", err)
	}
	if !bytes.Equal(got, want) {
		t.Error("bytes differ")
	}
}

// TestGPUContextRule: calls work from any goroutine on any thread, even a
// thread whose current context was cleared behind the package's back.
func TestGPUContextRule(t *testing.T) {
	d := openGPU(t)
	done := make(chan error)
	go func() {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		if r := ccall(d.drv.cuCtxSetCurrent, 0); r != cudaSuccess {
			done <- opError(d.drv, "cuCtxSetCurrent", r, "ctx=0")
			return
		}
		p, err := d.Alloc(MiB)
		if err == nil {
			err = d.Free(p)
		}
		done <- err
	}()
	if err := <-done; err != nil {
		t.Fatalf("Alloc on a thread with no current context: %v", err)
	}

	var wg sync.WaitGroup
	errs := make(chan error, 16)
	for w := range 16 {
		wg.Go(func() {
			for i := range 100 {
				p, err := d.Alloc(uint64(4096 * (1 + (w+i)%7)))
				if err != nil {
					errs <- err
					return
				}
				if err := d.Memset8(p, byte(w), 4096); err != nil {
					errs <- err
					return
				}
				var b [1]byte
				if err := d.CopyToHost(b[:], p+100); err != nil {
					errs <- err
					return
				}
				if b[0] != byte(w) {
					errs <- errors.New("wrong byte read back")
					return
				}
				e, err := d.NewEvent()
				if err != nil {
					errs <- err
					return
				}
				if err := d.Record(e, 0); err != nil {
					errs <- err
				}
				if _, err := d.Query(e); err != nil {
					errs <- err
				}
				if err := d.DestroyEvent(e); err != nil {
					errs <- err
				}
				if err := d.Free(p); err != nil {
					errs <- err
					return
				}
				runtime.Gosched()
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}

func TestGPUOpenErrors(t *testing.T) {
	openGPU(t)
	_, err := Open(9999)
	mustInvalid(t, "Open(9999)", err)
	_, err = Open(-1)
	mustInvalid(t, "Open(-1)", err)
}

// TestCallRestoresContext: a driver call leaves the thread's current context
// as it found it, whether that was none or the primary context. The C
// library runs on its host's threads, where a changed context would send
// the host's next runtime call to the wrong device.
func TestCallRestoresContext(t *testing.T) {
	d := openGPU(t)
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	current := func() uintptr {
		var c uintptr
		if r := ccall(d.drv.cuCtxGetCurrent, uintptr(unsafe.Pointer(&c))); r != cudaSuccess {
			t.Fatalf("cuCtxGetCurrent: %v", r)
		}
		return c
	}
	for _, before := range []uintptr{0, d.ctx} {
		if r := ccall(d.drv.cuCtxSetCurrent, before); r != cudaSuccess {
			t.Fatalf("cuCtxSetCurrent(%#x): %v", before, r)
		}
		if _, _, err := d.MemInfo(); err != nil {
			t.Fatalf("MemInfo with context %#x current: %v", before, err)
		}
		if got := current(); got != before {
			t.Errorf("after MemInfo with context %#x current, the current context is %#x", before, got)
		}
	}
}

// TestGPUMarkers: a marker's word moves when its stream gets there, not
// before: held behind HoldUntil it keeps its old value (and an event
// recorded before the write stays pending), then reads the new one once
// the hold ends, with the event done. A marker destroyed with its write
// pending is not handed out again until the write lands; words past one
// page come from a second slab; a marker never made reads 0 and is
// refused.
func TestGPUMarkers(t *testing.T) {
	d := openGPU(t)
	if !d.marks.supported {
		t.Skipf("%s has no 64-bit stream memory operations (CU_DEVICE_ATTRIBUTE_CAN_USE_64_BIT_STREAM_MEM_OPS %d, its _V1 %d): markers are not used here",
			d.Info().Name, d.attribute(cuDeviceAttrStreamMemOps64), d.attribute(cuDeviceAttrStreamMemOps64V1))
	}
	flag, a, ctrl, e := holdRig(t, d)
	m, err := d.NewMarker()
	if err != nil {
		t.Fatal(err)
	}
	if v := d.Reached(m); v != 0 {
		t.Fatalf("a new marker reads %d, want 0", v)
	}
	if err := d.Mark(m, a, 7); err != nil {
		t.Fatal(err)
	}
	if err := d.SynchronizeStream(a); err != nil {
		t.Fatal(err)
	}
	if v := d.Reached(m); v != 7 {
		t.Fatalf("after a synchronize the marker reads %d, want 7", v)
	}

	if err := d.HoldUntil(a, flag, 100*spinCycles); err != nil {
		t.Fatalf("HoldUntil: %v", err)
	}
	if err := d.Record(e, a); err != nil {
		t.Fatal(err)
	}
	if err := d.Mark(m, a, 8); err != nil {
		t.Fatal(err)
	}
	time.Sleep(50 * time.Millisecond)
	if v, done := d.Reached(m), mustQuery(t, d, e); v != 7 || done {
		t.Fatalf("50 ms into a hold: the marker reads %d (want 7), the event before it done %v (want false)", v, done)
	}
	// Destroyed with its write pending: its word is retired, not reused.
	if err := d.DestroyMarker(m); err != nil {
		t.Fatal(err)
	}
	m2, err := d.NewMarker()
	if err != nil {
		t.Fatal(err)
	}
	if m2 == m {
		t.Fatalf("marker %d handed out again with its write pending", m)
	}
	if err := d.MemsetAsync(flag, 1, 4, ctrl); err != nil {
		t.Fatal(err)
	}
	if err := d.SynchronizeStream(a); err != nil {
		t.Fatal(err)
	}
	if done := mustQuery(t, d, e); !done {
		t.Fatal("the event is pending after the stream's synchronize")
	}
	if !d.marks.landed(uint32(m - 1)) {
		t.Fatal("the destroyed marker's write has not landed after the stream's synchronize")
	}

	// A page of words, then one more: the second slab; the retired word
	// comes back once landed.
	made := []device.Marker{m2}
	seen := map[device.Marker]bool{m2: true}
	for range slabWords {
		x, err := d.NewMarker()
		if err != nil {
			t.Fatal(err)
		}
		if seen[x] {
			t.Fatalf("marker %d handed out twice", x)
		}
		seen[x] = true
		made = append(made, x)
	}
	if !seen[m] || len(*d.marks.slabs.Load()) != 2 {
		t.Errorf("%d markers live: the retired one handed out again %v, %d slabs (want true, 2)", len(made), seen[m], len(*d.marks.slabs.Load()))
	}
	last := made[len(made)-1]
	if err := d.Mark(last, ctrl, 99); err != nil {
		t.Fatal(err)
	}
	if err := d.SynchronizeStream(ctrl); err != nil {
		t.Fatal(err)
	}
	if v := d.Reached(last); v != 99 {
		t.Errorf("a marker of the second slab reads %d, want 99", v)
	}
	for _, x := range made {
		if err := d.DestroyMarker(x); err != nil {
			t.Fatal(err)
		}
	}
	if v := d.Reached(1 << 40); v != 0 {
		t.Errorf("a marker never made reads %d", v)
	}
	mustInvalid(t, "Mark of a marker never made", d.Mark(1<<40, a, 1))
}

func mustQuery(t *testing.T, d *Device, e device.Event) bool {
	t.Helper()
	done, err := d.Query(e)
	if err != nil {
		t.Fatal(err)
	}
	return done
}
