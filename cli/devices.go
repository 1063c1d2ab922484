package cli

import (
	"encoding/json"
	"errors"
	"fmt"

	"github.com/gpumem/gpumem/device"
	"github.com/gpumem/gpumem/nvml"
)

const devicesAbout = `Devices lists the machine's NVIDIA GPUs as NVML sees them (all GPUs, in PCI
order, whatever CUDA_VISIBLE_DEVICES says): name, PCI bus id, UUID, memory
total, used and free, and the processes holding memory on each with their
type (C compute, G graphics) and device memory. Without a driver it prints
one line and exits with status 1.

With --json, each GPU is one JSON object on one line, with the keys index,
name, uuid, bus_id, memory_total_bytes, memory_used_bytes, memory_free_bytes,
processes (a list of objects with pid, type and used_memory_bytes, null when
NVML does not know it) and, when the GPU could not be fully described, error.`

func (e *env) devices(args []string) int {
	fs := e.flagSet("devices", "", devicesAbout)
	jsonOut := fs.Bool("json", false, "print one JSON object per GPU per line")
	rest, code := e.parse(fs, args)
	if code >= 0 {
		return code
	}
	if len(rest) > 0 {
		return e.usageError(fs, "devices takes no arguments")
	}
	reports, err := e.listGPUs()
	if err != nil {
		if errors.Is(err, device.ErrNoDriver) {
			fmt.Fprintf(e.stderr, "gpumem devices: no NVIDIA driver (%v)\n", err)
		} else {
			fmt.Fprintf(e.stderr, "gpumem devices: %v\n", err)
		}
		return ExitFail
	}
	if *jsonOut {
		enc := json.NewEncoder(e.stdout)
		for _, r := range reports {
			if err := enc.Encode(gpuJSON(r)); err != nil {
				fmt.Fprintf(e.stderr, "gpumem devices: %v\n", err)
				return ExitFail
			}
		}
	} else if err := nvml.Format(e.stdout, reports); err != nil {
		fmt.Fprintf(e.stderr, "gpumem devices: %v\n", err)
		return ExitFail
	}
	for _, r := range reports {
		if r.Err != nil {
			return ExitFail // printed with its GPU
		}
	}
	return ExitOK
}

// listGPUs is env.listGPUs outside tests.
func listGPUs() ([]nvml.GPUReport, error) { return nvml.List() }

// gpuRecord is a GPU as `gpumem devices --json` writes it.
type gpuRecord struct {
	Index       int             `json:"index"`
	Name        string          `json:"name"`
	UUID        string          `json:"uuid"`
	BusID       string          `json:"bus_id"`
	MemoryTotal uint64          `json:"memory_total_bytes"`
	MemoryUsed  uint64          `json:"memory_used_bytes"`
	MemoryFree  uint64          `json:"memory_free_bytes"`
	Processes   []processRecord `json:"processes"`
	Error       string          `json:"error,omitempty"`
}

type processRecord struct {
	PID        int     `json:"pid"`
	Type       string  `json:"type"`
	UsedMemory *uint64 `json:"used_memory_bytes"` // nil: unknown
}

func gpuJSON(r nvml.GPUReport) gpuRecord {
	g := r.GPU
	rec := gpuRecord{
		Index: g.Index, Name: g.Name, UUID: g.UUID, BusID: g.BusID,
		MemoryTotal: g.Memory.Total, MemoryUsed: g.Memory.Used, MemoryFree: g.Memory.Free,
		Processes: []processRecord{},
	}
	for _, p := range r.Processes {
		pr := processRecord{PID: p.PID, Type: p.Type()}
		if p.MemoryKnown {
			pr.UsedMemory = &p.UsedMemory
		}
		rec.Processes = append(rec.Processes, pr)
	}
	if r.Err != nil {
		rec.Error = r.Err.Error()
	}
	return rec
}
