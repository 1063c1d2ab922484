package cuda

import (
	"fmt"
	"runtime"
	"strings"
	"unsafe"

	"github.com/gpumem/gpumem/device"
)

// spinPTX is the PTX source of the kernels behind Spin and HoldUntil.
// gpumem_spin: one thread reads %clock64, loops until cycles SM clock cycles
// have passed, then stores the 32-bit value to *flag unless flag is 0.
// gpumem_hold: one thread loops until the 32-bit word at flag (read
// volatile, so that a write from the host or another stream is seen) is not
// 0, or cycles SM clock cycles have passed. The driver JIT-compiles the
// module for the device at the first use; @VERSION@ and @TARGET@ come from
// spinTargets.
const spinPTX = `//
// gpumem spin kernel: busy-waits for a number of SM clock cycles, then
// stores a 32-bit value to a device address (if it is not 0).
//
.version @VERSION@
.target @TARGET@
.address_size 64

.visible .entry gpumem_spin(
	.param .u64 gpumem_spin_param_cycles,
	.param .u64 gpumem_spin_param_flag,
	.param .u32 gpumem_spin_param_value
)
{
	.reg .pred 	%p<3>;
	.reg .b32 	%r<2>;
	.reg .b64 	%rd<7>;

	ld.param.u64 	%rd1, [gpumem_spin_param_cycles];
	ld.param.u64 	%rd2, [gpumem_spin_param_flag];
	ld.param.u32 	%r1, [gpumem_spin_param_value];
	mov.u64 	%rd3, %clock64;
$L_spin:
	mov.u64 	%rd4, %clock64;
	sub.s64 	%rd5, %rd4, %rd3;
	setp.lt.u64 	%p1, %rd5, %rd1;
	@%p1 bra 	$L_spin;
	setp.eq.s64 	%p2, %rd2, 0;
	@%p2 bra 	$L_done;
	cvta.to.global.u64 	%rd6, %rd2;
	st.global.u32 	[%rd6], %r1;
$L_done:
	ret;
}

.visible .entry gpumem_hold(
	.param .u64 gpumem_hold_param_flag,
	.param .u64 gpumem_hold_param_cycles
)
{
	.reg .pred 	%p<3>;
	.reg .b32 	%r<2>;
	.reg .b64 	%rd<6>;

	ld.param.u64 	%rd1, [gpumem_hold_param_flag];
	ld.param.u64 	%rd2, [gpumem_hold_param_cycles];
	cvta.to.global.u64 	%rd3, %rd1;
	mov.u64 	%rd4, %clock64;
$L_hold:
	ld.volatile.global.u32 	%r1, [%rd3];
	setp.ne.s32 	%p1, %r1, 0;
	@%p1 bra 	$L_released;
	mov.u64 	%rd5, %clock64;
	sub.s64 	%rd5, %rd5, %rd4;
	setp.lt.u64 	%p2, %rd5, %rd2;
	@%p2 bra 	$L_hold;
$L_released:
	ret;
}
`

// spinKernelName and holdKernelName are the entry points of spinPTX.
const (
	spinKernelName = "gpumem_spin"
	holdKernelName = "gpumem_hold"
)

// spinTargets are the (PTX ISA version, target) pairs tried in order: sm_50
// PTX runs on every GPU a CUDA 12 or 13 driver supports (checked with driver
// 580, CUDA 13.0, on an H100); should a later driver's JIT refuse sm_50
// (CUDA 13 dropped Maxwell to Volta from the toolkit), sm_75, the oldest
// architecture CUDA 13 supports, is tried next.
var spinTargets = [][2]string{{"6.0", "sm_50"}, {"6.3", "sm_75"}}

// ptxSource instantiates spinPTX for one ISA version and target.
func ptxSource(version, target string) string {
	return strings.NewReplacer("@VERSION@", version, "@TARGET@", target).Replace(spinPTX)
}

// SpinValue is the 32-bit value Spin stores at its flag address.
const SpinValue uint32 = 1

// Spin enqueues on stream s a kernel (one thread) that spins for the given
// number of SM clock cycles (%clock64; an H100 runs about 1.7e9 per second)
// and then, unless flag is 0, stores the 32-bit SpinValue at flag. It is the
// long-running work tests and replay use to prove stream ordering. The
// kernel is JIT-compiled from embedded PTX at the first call.
func (d *Device) Spin(s device.Stream, cycles uint64, flag device.Ptr) error {
	k, err := d.loadKernels()
	if err != nil {
		return err
	}
	args := &struct {
		cycles, flag uint64
		value        uint32
	}{cycles, uint64(flag), SpinValue}
	var pin runtime.Pinner
	pin.Pin(args)
	defer pin.Unpin()
	if r := d.launchOne(k.spin, s, unsafe.Pointer(&args.cycles), unsafe.Pointer(&args.flag), unsafe.Pointer(&args.value)); r != cudaSuccess {
		return d.fail("cuLaunchKernel", r, "kernel=%s, cycles=%d, flag=%#x, stream=%#x", spinKernelName, cycles, uint64(flag), uint64(s))
	}
	return nil
}

// HoldUntil enqueues on stream s a kernel (one thread) that waits until
// the 32-bit word at flag is not 0, or maxCycles SM clock cycles have
// passed: work held pending at will, which the caller releases by writing
// the flag from a stream that does not wait for s (MemsetAsync on a
// non-blocking stream). Tests use it to keep a stream's work pending while
// they check what the allocator does; maxCycles bounds a hold that is never
// released. flag must be device memory of at least 4 bytes.
func (d *Device) HoldUntil(s device.Stream, flag device.Ptr, maxCycles uint64) error {
	k, err := d.loadKernels()
	if err != nil {
		return err
	}
	args := &struct{ flag, cycles uint64 }{uint64(flag), maxCycles}
	var pin runtime.Pinner
	pin.Pin(args)
	defer pin.Unpin()
	if r := d.launchOne(k.hold, s, unsafe.Pointer(&args.flag), unsafe.Pointer(&args.cycles)); r != cudaSuccess {
		return d.fail("cuLaunchKernel", r, "kernel=%s, flag=%#x, cycles=%d, stream=%#x", holdKernelName, uint64(flag), maxCycles, uint64(s))
	}
	return nil
}

// launchOne launches fn as one thread on stream s (cuLaunchKernel). params
// point to the kernel's argument values, in its parameter order; the
// driver copies the values during the call. The values live in Go memory
// referenced from Go memory handed to C, so the caller pins them.
func (d *Device) launchOne(fn uintptr, s device.Stream, params ...unsafe.Pointer) result {
	r := d.call(d.drv.cuLaunchKernel, fn,
		1, 1, 1, // grid
		1, 1, 1, // block
		0,          // shared memory
		uintptr(s), // stream
		uintptr(unsafe.Pointer(&params[0])),
		0) // extra
	runtime.KeepAlive(params)
	return r
}

// kernels are the entry points of the module built from spinPTX.
type kernels struct{ spin, hold uintptr }

// loadKernels loads the kernels' module on first use.
func (d *Device) loadKernels() (kernels, error) {
	d.modMu.Lock()
	defer d.modMu.Unlock()
	if d.closed.Load() {
		return kernels{}, opError(d.drv, "cuModuleLoadData", resultClosed, "")
	}
	if d.module != 0 {
		return d.kernels, nil
	}
	var firstErr error
	for _, vt := range spinTargets {
		mod, err := d.loadModule(ptxSource(vt[0], vt[1]), vt[1])
		if err != nil {
			if firstErr == nil {
				firstErr = err
			}
			continue
		}
		var k kernels
		for _, e := range []struct {
			name string
			fn   *uintptr
		}{{spinKernelName, &k.spin}, {holdKernelName, &k.hold}} {
			name := append([]byte(e.name), 0)
			if r := d.call(d.drv.cuModuleGetFunction, uintptr(unsafe.Pointer(e.fn)), mod, uintptr(unsafe.Pointer(&name[0]))); r != cudaSuccess {
				d.call(d.drv.cuModuleUnload, mod)
				return kernels{}, d.fail("cuModuleGetFunction", r, "name=%s", e.name)
			}
		}
		d.module, d.kernels, d.spinTarget = mod, k, vt[1]
		return k, nil
	}
	return kernels{}, firstErr
}

// loadModule JIT-compiles PTX text (cuModuleLoadDataEx), keeping the JIT's
// error log for the error message.
func (d *Device) loadModule(ptx, target string) (uintptr, error) {
	image := append([]byte(ptx), 0)
	logBuf := make([]byte, 4096)
	var pin runtime.Pinner
	pin.Pin(&logBuf[0])
	defer pin.Unpin()
	options := [2]int32{cuJitErrorLogBuffer, cuJitErrorLogBufferSizeBytes}
	values := [2]uintptr{uintptr(unsafe.Pointer(&logBuf[0])), uintptr(len(logBuf))}
	var mod uintptr
	r := d.call(d.drv.cuModuleLoadDataEx, uintptr(unsafe.Pointer(&mod)), uintptr(unsafe.Pointer(&image[0])),
		uintptr(len(options)), uintptr(unsafe.Pointer(&options[0])), uintptr(unsafe.Pointer(&values[0])))
	runtime.KeepAlive(image)
	runtime.KeepAlive(logBuf)
	runtime.KeepAlive(&options)
	runtime.KeepAlive(&values)
	if r != cudaSuccess {
		args := "target=" + target
		if log := strings.Join(strings.Fields(cString(logBuf)), " "); log != "" {
			args += fmt.Sprintf(", jit log: %q", log)
		}
		return 0, d.fail("cuModuleLoadData", r, "%s", args)
	}
	return mod, nil
}
