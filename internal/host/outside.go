package host

import (
	"os"
	"sync/atomic"

	"github.com/gpumem/gpumem/device"
	"github.com/gpumem/gpumem/nvml"
)

// What a process holds on a GPU outside gpumem: its CUDA context, the
// modules its libraries loaded, anything it allocated before gpumem
// started. NVML's figure for the process is that plus what gpumem reserved;
// `gpumem top` reconciles the two and shows what neither explains.
//
// It is measured once per device, when the host starts serving its pools
// (serve= in GPUMEM_CONFIG, Serve): NVML's figure for this process on the
// device minus what gpumem reserved at that moment. Measuring costs an
// NVML session (tens of milliseconds), so a process that never serves pays
// nothing.

// outside is a device's measurement; zero until measured.
type outside struct {
	bytes atomic.Uint64
	known atomic.Bool
}

// processMemory returns NVML's figure for this process on dev, if NVML
// knows it. A variable so that tests can stand in for NVML.
var processMemory = measureWithNVML

func measureWithNVML(dev device.Device) (uint64, bool) {
	u, ok := dev.(interface{ UUID() string })
	if !ok {
		return 0, false // not a CUDA device: nothing outside gpumem on it
	}
	n, err := nvml.Open()
	if err != nil {
		return 0, false
	}
	defer n.Shutdown()
	i, err := n.IndexByUUID(u.UUID())
	if err != nil {
		return 0, false
	}
	procs, err := n.Processes(i)
	if err != nil {
		return 0, false
	}
	pid := os.Getpid()
	for _, p := range procs {
		if p.PID == pid && p.MemoryKnown {
			return p.UsedMemory, true
		}
	}
	// Not listed: a process in its own PID namespace is listed under the
	// host's numbering, which it cannot see.
	return 0, false
}

// measureOutside measures d's outside memory if not yet known.
func (d *Device) measureOutside() {
	if d.outside.known.Load() {
		return
	}
	used, ok := processMemory(d.dev)
	if !ok {
		return
	}
	res := d.stats().Reserved // the private pools' memory is gpumem's too
	d.outside.bytes.Store(used - min(used, res))
	d.outside.known.Store(true)
}

// Outside returns what the process held on d's GPU outside gpumem when it
// was measured (see above), and whether it was.
func (d *Device) Outside() (uint64, bool) {
	return d.outside.bytes.Load(), d.outside.known.Load()
}
