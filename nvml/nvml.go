package nvml

import (
	"errors"
	"fmt"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"unsafe"

	"github.com/gpumem/gpumem/internal/dl"
)

// libName is the NVML library the driver installs.
const libName = "libnvidia-ml.so.1"

// library holds the loaded libnvidia-ml.so.1 and its entry points.
type library struct {
	handle uintptr

	initV2, shutdown, systemGetDriverVersion                            uintptr
	deviceGetCount, deviceGetHandleByIndex                              uintptr
	deviceGetName, deviceGetUUID, deviceGetPciInfo, deviceGetMemoryInfo uintptr

	// Optional: 0 where the library lacks every version.
	computeProcs, graphicsProcs, mpsProcs uintptr

	errorString func(int32) string
}

func (l *library) symbols() []dl.Symbol {
	return []dl.Symbol{
		{Addr: &l.initV2, Names: []string{"nvmlInit_v2"}},
		{Addr: &l.shutdown, Names: []string{"nvmlShutdown"}},
		{Addr: &l.systemGetDriverVersion, Names: []string{"nvmlSystemGetDriverVersion"}},
		{Addr: &l.deviceGetCount, Names: []string{"nvmlDeviceGetCount_v2"}},
		{Addr: &l.deviceGetHandleByIndex, Names: []string{"nvmlDeviceGetHandleByIndex_v2"}},
		{Addr: &l.deviceGetName, Names: []string{"nvmlDeviceGetName"}},
		{Addr: &l.deviceGetUUID, Names: []string{"nvmlDeviceGetUUID"}},
		{Addr: &l.deviceGetPciInfo, Names: []string{"nvmlDeviceGetPciInfo_v3", "nvmlDeviceGetPciInfo_v2"}},
		{Addr: &l.deviceGetMemoryInfo, Names: []string{"nvmlDeviceGetMemoryInfo"}},
		{Addr: &l.computeProcs, Names: []string{"nvmlDeviceGetComputeRunningProcesses_v3", "nvmlDeviceGetComputeRunningProcesses_v2", "nvmlDeviceGetComputeRunningProcesses"}, Optional: true},
		{Addr: &l.graphicsProcs, Names: []string{"nvmlDeviceGetGraphicsRunningProcesses_v3", "nvmlDeviceGetGraphicsRunningProcesses_v2", "nvmlDeviceGetGraphicsRunningProcesses"}, Optional: true},
		{Addr: &l.mpsProcs, Names: []string{"nvmlDeviceGetMPSComputeRunningProcesses_v3", "nvmlDeviceGetMPSComputeRunningProcesses_v2", "nvmlDeviceGetMPSComputeRunningProcesses"}, Optional: true},
	}
}

var (
	loadOnce sync.Once
	loaded   *library
	loadErr  error
)

func getLibrary() (*library, error) {
	loadOnce.Do(func() { loaded, loadErr = openLibrary(libName) })
	return loaded, loadErr
}

// openLibrary loads the library called name and resolves its entry points.
// Its errors are one line and match ErrUnavailable.
func openLibrary(name string) (*library, error) {
	l := &library{}
	h, err := dl.Open(name, l.symbols(), ErrUnavailable, "the NVIDIA driver is too old")
	if err != nil {
		return nil, err
	}
	l.handle = h
	if addr := dl.Sym(h, "nvmlErrorString"); addr != 0 {
		l.errorString = errorStringFunc(addr)
	}
	return l, nil
}

// NVML is an initialized NVML session (nvmlInit_v2 .. nvmlShutdown). Its
// methods are safe for concurrent use. GPUs are numbered as NVML numbers
// them (PCI order, all GPUs of the machine): not necessarily as CUDA does
// under CUDA_VISIBLE_DEVICES or CUDA_DEVICE_ORDER; IndexByUUID maps a CUDA
// device to its NVML index.
type NVML struct {
	lib    *library
	closed atomic.Bool
}

// Open loads libnvidia-ml.so.1 (once per process) and initializes NVML.
// Without a driver the error matches ErrUnavailable and device.ErrNoDriver
// and reads "libnvidia-ml.so.1 not found: no NVIDIA driver on this machine".
func Open() (*NVML, error) {
	l, err := getLibrary()
	if err != nil {
		return nil, err
	}
	if r := ccall(l.initV2); r != nvmlSuccess {
		return nil, l.opError("nvmlInit", r, "")
	}
	return &NVML{lib: l}, nil
}

// Shutdown ends the session (nvmlShutdown; NVML counts initializations, so
// other sessions stay valid). It is idempotent.
func (n *NVML) Shutdown() error {
	if n.closed.Swap(true) {
		return nil
	}
	if r := ccall(n.lib.shutdown); r != nvmlSuccess {
		return n.lib.opError("nvmlShutdown", r, "")
	}
	return nil
}

// call calls fn unless the session is shut down.
//
//go:uintptrescapes
func (n *NVML) call(fn uintptr, args ...uintptr) nvmlReturn {
	if n.closed.Load() {
		return returnClosed
	}
	return ccall(fn, args...)
}

// DriverVersion is the driver's version string, e.g. "570.124.06".
func (n *NVML) DriverVersion() (string, error) {
	buf := make([]byte, versionBufferSize)
	if r := n.call(n.lib.systemGetDriverVersion, uintptr(unsafe.Pointer(&buf[0])), uintptr(len(buf))); r != nvmlSuccess {
		return "", n.lib.opError("nvmlSystemGetDriverVersion", r, "")
	}
	return cString(buf), nil
}

// DeviceCount is the number of GPUs NVML sees.
func (n *NVML) DeviceCount() (int, error) {
	var c uint32
	if r := n.call(n.lib.deviceGetCount, uintptr(unsafe.Pointer(&c))); r != nvmlSuccess {
		return 0, n.lib.opError("nvmlDeviceGetCount", r, "")
	}
	return int(c), nil
}

// handle is the nvmlDevice_t of GPU i.
func (n *NVML) handle(i int) (uintptr, error) {
	if i < 0 {
		return 0, n.lib.opError("nvmlDeviceGetHandleByIndex", 2, fmt.Sprintf("index=%d", i))
	}
	var h uintptr
	if r := n.call(n.lib.deviceGetHandleByIndex, uintptr(i), uintptr(unsafe.Pointer(&h))); r != nvmlSuccess {
		return 0, n.lib.opError("nvmlDeviceGetHandleByIndex", r, fmt.Sprintf("index=%d", i))
	}
	return h, nil
}

// GPU describes one GPU.
type GPU struct {
	Index  int    // NVML index
	Name   string // e.g. "NVIDIA H100 80GB HBM3"
	UUID   string // e.g. "GPU-6e0d1a2b-3c4d-5e6f-7081-92a3b4c5d6e7"
	BusID  string // PCI bus id, e.g. "00000000:19:00.0"
	Memory Memory
}

// Memory is a GPU's memory as nvmlDeviceGetMemoryInfo reports it, in bytes.
// Used counts every process and the driver's own reservations.
type Memory struct {
	Total, Used, Free uint64
}

// Device describes GPU i: name, UUID, PCI bus id and memory.
func (n *NVML) Device(i int) (GPU, error) {
	g := GPU{Index: i}
	h, err := n.handle(i)
	if err != nil {
		return g, err
	}
	args := fmt.Sprintf("index=%d", i)
	name := make([]byte, nameBufferSize)
	if r := n.call(n.lib.deviceGetName, h, uintptr(unsafe.Pointer(&name[0])), uintptr(len(name))); r != nvmlSuccess {
		return g, n.lib.opError("nvmlDeviceGetName", r, args)
	}
	g.Name = cString(name)
	uuid := make([]byte, uuidBufferSize)
	if r := n.call(n.lib.deviceGetUUID, h, uintptr(unsafe.Pointer(&uuid[0])), uintptr(len(uuid))); r != nvmlSuccess {
		return g, n.lib.opError("nvmlDeviceGetUUID", r, args)
	}
	g.UUID = cString(uuid)
	var pci pciInfo
	if r := n.call(n.lib.deviceGetPciInfo, h, uintptr(unsafe.Pointer(&pci))); r != nvmlSuccess {
		return g, n.lib.opError("nvmlDeviceGetPciInfo", r, args)
	}
	g.BusID = cString(pci.BusID[:])
	var mem memoryInfo
	if r := n.call(n.lib.deviceGetMemoryInfo, h, uintptr(unsafe.Pointer(&mem))); r != nvmlSuccess {
		return g, n.lib.opError("nvmlDeviceGetMemoryInfo", r, args)
	}
	g.Memory = Memory{Total: mem.Total, Used: mem.Used, Free: mem.Free}
	return g, nil
}

// IndexByUUID finds the NVML index of the GPU with the given UUID (as
// cuda.Device.UUID gives it).
func (n *NVML) IndexByUUID(uuid string) (int, error) {
	c, err := n.DeviceCount()
	if err != nil {
		return 0, err
	}
	for i := range c {
		g, err := n.Device(i)
		if err != nil {
			return 0, err
		}
		if strings.EqualFold(g.UUID, uuid) {
			return i, nil
		}
	}
	return 0, n.lib.opError("nvmlDeviceGetUUID", 6, "uuid="+uuid)
}

// Process is a process holding memory on a GPU.
type Process struct {
	PID int // as the host's PID namespace numbers it
	// UsedMemory is the device memory the process holds, in bytes
	// (contexts included); valid when MemoryKnown.
	UsedMemory  uint64
	MemoryKnown bool
	Compute     bool // listed as a compute (CUDA) process, MPS clients included
	Graphics    bool // listed as a graphics process
}

// Type is "C", "G" or "C+G", as nvidia-smi shows it.
func (p Process) Type() string {
	switch {
	case p.Compute && p.Graphics:
		return "C+G"
	case p.Graphics:
		return "G"
	default:
		return "C"
	}
}

// Processes lists the processes holding memory on GPU i: compute
// (nvmlDeviceGetComputeRunningProcesses_v3), MPS clients and graphics
// processes, merged by pid and sorted by it. A pid listed in several
// lists counts its memory once; a pid on several MIG instances counts each.
// Lists the GPU does not support are treated as empty.
func (n *NVML) Processes(i int) ([]Process, error) {
	h, err := n.handle(i)
	if err != nil {
		return nil, err
	}
	if n.lib.computeProcs == 0 && n.lib.graphicsProcs == 0 {
		return nil, n.lib.opError("nvmlDeviceGetComputeRunningProcesses", 13, fmt.Sprintf("index=%d", i))
	}
	type key struct {
		pid    uint32
		gi, ci uint32
	}
	type entry struct {
		mem          uint64
		known        bool
		compute, gfx bool
		order        int
	}
	byKey := map[key]*entry{}
	lists := []struct {
		fn      uintptr
		op      string
		graphic bool
	}{
		{n.lib.computeProcs, "nvmlDeviceGetComputeRunningProcesses", false},
		{n.lib.mpsProcs, "nvmlDeviceGetMPSComputeRunningProcesses", false},
		{n.lib.graphicsProcs, "nvmlDeviceGetGraphicsRunningProcesses", true},
	}
	for _, l := range lists {
		if l.fn == 0 {
			continue
		}
		raw, err := n.running(l.fn, h, l.op, i)
		if err != nil {
			if l.op != lists[0].op && isUnsupported(err) {
				continue
			}
			return nil, err
		}
		for _, p := range raw {
			k := key{p.PID, p.GPUInstanceID, p.ComputeInstanceID}
			e := byKey[k]
			if e == nil {
				e = &entry{}
				byKey[k] = e
			}
			if p.UsedGPUMemory != valueNotAvailable {
				e.known = true
				e.mem = max(e.mem, p.UsedGPUMemory)
			}
			if l.graphic {
				e.gfx = true
			} else {
				e.compute = true
			}
		}
	}
	byPID := map[uint32]*Process{}
	for k, e := range byKey {
		p := byPID[k.pid]
		if p == nil {
			p = &Process{PID: int(k.pid)}
			byPID[k.pid] = p
		}
		if e.known {
			p.MemoryKnown = true
			p.UsedMemory += e.mem
		}
		p.Compute = p.Compute || e.compute
		p.Graphics = p.Graphics || e.gfx
	}
	out := make([]Process, 0, len(byPID))
	for _, p := range byPID {
		out = append(out, *p)
	}
	sort.Slice(out, func(a, b int) bool { return out[a].PID < out[b].PID })
	return out, nil
}

func isUnsupported(err error) bool {
	var ne *Error
	return errors.As(err, &ne) && (ne.Code == int(nvmlErrNotSupported) || ne.Code == 13)
}

// ProcessMemory reports how much device memory process pid holds on GPU i.
// ok is false when NVML does not list the process on that GPU, or lists it
// without a figure. NVML numbers processes in the host's PID namespace: a
// process in a container (another PID namespace) finds itself under another
// pid, or not at all.
func (n *NVML) ProcessMemory(i int, pid int) (used uint64, ok bool, err error) {
	procs, err := n.Processes(i)
	if err != nil {
		return 0, false, err
	}
	for _, p := range procs {
		if p.PID == pid {
			return p.UsedMemory, p.MemoryKnown, nil
		}
	}
	return 0, false, nil
}

// sentinelWord fills process buffers before the call, so that the stride
// the library wrote can be read back (see decodeProcesses).
const sentinelWord = 0xA5A5A5A5A5A5A5A5

// lastStride is the entry size decodeProcesses last detected (for tests).
var lastStride atomic.Int32

// maxStride is the largest process entry any NVML version writes.
const maxStride = 32

// running calls one nvmlDevice*RunningProcesses function, growing the buffer
// while NVML answers NVML_ERROR_INSUFFICIENT_SIZE.
func (n *NVML) running(fn, h uintptr, op string, i int) ([]processInfo, error) {
	capacity := 32
	for range 8 {
		words := make([]uint64, capacity*maxStride/8)
		for j := range words {
			words[j] = sentinelWord
		}
		count := uint32(capacity)
		r := n.call(fn, h, uintptr(unsafe.Pointer(&count)), uintptr(unsafe.Pointer(&words[0])))
		switch r {
		case nvmlSuccess:
			buf := unsafe.Slice((*byte)(unsafe.Pointer(&words[0])), len(words)*8)
			procs, stride := decodeProcesses(buf, int(count))
			if stride != 0 {
				lastStride.Store(int32(stride))
			}
			return procs, nil
		case nvmlErrInsufficient:
			// count now holds the number of processes; more may start
			// before the next call.
			capacity = max(2*capacity, int(count)+16)
		default:
			return nil, n.lib.opError(op, r, fmt.Sprintf("index=%d", i))
		}
	}
	return nil, n.lib.opError(op, nvmlErrInsufficient, fmt.Sprintf("index=%d", i))
}

// decodeProcesses reads count process entries from buf, which was filled
// with sentinelWord before NVML wrote into it. The stride is the smallest
// of 16, 24 and 32 bytes whose count entries cover everything NVML wrote:
// the last byte of each layout's last entry is never 0xA5 (it is the top
// byte of a memory figure or an instance id: 0x00 or 0xFF).
func decodeProcesses(buf []byte, count int) ([]processInfo, int) {
	if count <= 0 {
		return nil, 0
	}
	end := len(buf)
	for end > 0 && buf[end-1] == 0xA5 {
		end--
	}
	stride := 24
	for _, s := range []int{16, 24, 32} {
		if count*s >= end {
			stride = s
			break
		}
	}
	if count*stride > len(buf) {
		count = len(buf) / stride
	}
	out := make([]processInfo, count)
	for j := range out {
		e := buf[j*stride:]
		p := processInfo{
			PID:           *(*uint32)(unsafe.Pointer(&e[0])),
			UsedGPUMemory: *(*uint64)(unsafe.Pointer(&e[8])),
		}
		if stride >= 24 {
			p.GPUInstanceID = *(*uint32)(unsafe.Pointer(&e[16]))
			p.ComputeInstanceID = *(*uint32)(unsafe.Pointer(&e[20]))
		} else {
			p.GPUInstanceID, p.ComputeInstanceID = ^uint32(0), ^uint32(0)
		}
		out[j] = p
	}
	return out, stride
}

// cString gives the Go string in b up to its first NUL.
func cString(b []byte) string {
	for i, c := range b {
		if c == 0 {
			return string(b[:i])
		}
	}
	return string(b)
}

// GPUReport is one GPU and the processes holding memory on it, as List
// gathers them for `gpumem devices`.
type GPUReport struct {
	GPU       GPU
	Processes []Process
	// Err is set when the GPU could not be described fully (the fields
	// gathered before the failure are kept).
	Err error
}

// List opens NVML, describes every GPU with its processes, and shuts NVML
// down. It fails only when NVML is unusable (the error matches
// ErrUnavailable without a driver); a failure on one GPU lands in its
// report's Err.
func List() ([]GPUReport, error) {
	n, err := Open()
	if err != nil {
		return nil, err
	}
	defer n.Shutdown()
	c, err := n.DeviceCount()
	if err != nil {
		return nil, err
	}
	reports := make([]GPUReport, c)
	for i := range c {
		r := &reports[i]
		r.GPU, r.Err = n.Device(i)
		if r.Err != nil {
			continue
		}
		r.Processes, r.Err = n.Processes(i)
	}
	return reports, nil
}
