package nvml

import (
	"fmt"
	"io"
	"text/tabwriter"
)

// Format writes reports as the readable listing of `gpumem devices`:
//
//	GPU 0  NVIDIA H100 80GB HBM3  bus 00000000:19:00.0  GPU-6e0d1a2b-3c4d-5e6f-7081-92a3b4c5d6e7
//	  memory: 1.52 GiB used of 79.65 GiB (1.9%), 78.13 GiB free
//	  PID    TYPE  GPU MEMORY
//	  12345  C       1.00 GiB
//	  23456  C+G          n/a
//
// A GPU without processes gets "(no processes)"; a report's error is printed
// under its GPU.
func Format(w io.Writer, reports []GPUReport) error {
	ew := &errWriter{w: w}
	if len(reports) == 0 {
		ew.printf("no NVIDIA GPUs\n")
		return ew.err
	}
	for k, r := range reports {
		if k > 0 {
			ew.printf("\n")
		}
		g := r.GPU
		ew.printf("GPU %d", g.Index)
		if g.Name != "" {
			ew.printf("  %s", g.Name)
		}
		if g.BusID != "" {
			ew.printf("  bus %s", g.BusID)
		}
		if g.UUID != "" {
			ew.printf("  %s", g.UUID)
		}
		ew.printf("\n")
		if m := g.Memory; m.Total > 0 {
			ew.printf("  memory: %s used of %s (%.1f%%), %s free\n",
				FormatBytes(m.Used), FormatBytes(m.Total), 100*float64(m.Used)/float64(m.Total), FormatBytes(m.Free))
		}
		if r.Err != nil {
			ew.printf("  error: %v\n", r.Err)
			if r.Processes == nil {
				continue
			}
		}
		if len(r.Processes) == 0 {
			ew.printf("  (no processes)\n")
			continue
		}
		tw := tabwriter.NewWriter(ew, 0, 0, 2, ' ', 0)
		fmt.Fprintf(tw, "  PID\tTYPE\t%10s\n", "GPU MEMORY")
		for _, p := range r.Processes {
			mem := "n/a"
			if p.MemoryKnown {
				mem = FormatBytes(p.UsedMemory)
			}
			fmt.Fprintf(tw, "  %d\t%s\t%10s\n", p.PID, p.Type(), mem)
		}
		if err := tw.Flush(); err != nil && ew.err == nil {
			ew.err = err
		}
	}
	return ew.err
}

// FormatBytes spells a byte count with a binary unit: "512 B", "1.50 KiB",
// "2.00 MiB", "79.65 GiB".
func FormatBytes(b uint64) string {
	const unit = 1024
	if b < unit {
		return fmt.Sprintf("%d B", b)
	}
	v := float64(b) / unit
	for _, u := range []string{"KiB", "MiB", "GiB", "TiB"} {
		if v < unit || u == "TiB" {
			return fmt.Sprintf("%.2f %s", v, u)
		}
		v /= unit
	}
	panic("unreachable")
}

// errWriter keeps the first write error and stops writing after it.
type errWriter struct {
	w   io.Writer
	err error
}

func (e *errWriter) Write(p []byte) (int, error) {
	if e.err != nil {
		return 0, e.err
	}
	n, err := e.w.Write(p)
	e.err = err
	return n, err
}

func (e *errWriter) printf(format string, a ...any) {
	fmt.Fprintf(e, format, a...)
}
