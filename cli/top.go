package cli

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/signal"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/gpumem/gpumem"
	"github.com/gpumem/gpumem/internal/announce"
	"github.com/gpumem/gpumem/internal/units"
)

const topAbout = `Top shows, refreshed every interval until interrupted, the GPUs of this
host and the processes holding their memory (NVML), and for each process
that runs on gpumem and serves its handler (gpumem run --serve, serve= in
GPUMEM_CONFIG, gpumem.serve()) its pool: bytes allocated, held from the
driver (reserved), cached, how fragmented the cache is, its memory
calls to the driver, with what one cost on average, and its misses (the
allocations its cache could not serve at once), with what one cost the
host and the share of that in event calls (keeping the streams' order). For those
processes it reconciles NVML's figure with gpumem's: NVML's figure is what
gpumem reserved, plus what the process held outside gpumem when it started
serving (its CUDA context, loaded modules, earlier allocations; measured
once through NVML), plus what neither explains, shown with its share of
NVML's figure (modules loaded later, allocations made beside gpumem).

--once prints one frame and exits (for scripts).`

func (e *env) top(args []string) int {
	fs := e.flagSet("top", "", topAbout)
	interval := fs.Duration("interval", time.Second, "refresh every `DURATION`")
	once := fs.Bool("once", false, "print one frame and exit")
	rest, code := e.parse(fs, args)
	if code >= 0 {
		return code
	}
	if len(rest) > 0 {
		return e.usageError(fs, "top takes no arguments")
	}
	if *interval <= 0 {
		return e.usageError(fs, "--interval must be positive")
	}
	if *once {
		e.topFrame(e.stdout)
		return ExitOK
	}
	stop := make(chan os.Signal, 1)
	signal.Notify(stop, os.Interrupt)
	defer signal.Stop(stop)
	tick := time.NewTicker(*interval)
	defer tick.Stop()
	for {
		var b strings.Builder
		b.WriteString("\x1b[H\x1b[2J") // home, clear
		e.topFrame(&b)
		io.WriteString(e.stdout, b.String())
		select {
		case <-stop:
			return ExitOK
		case <-tick.C:
		}
	}
}

// poolView is a gpumem process's pools, as its handler reports them.
type poolView struct {
	PID   int
	Addr  string
	Err   error
	Stats map[string]struct {
		Pool    string       `json:"pool"`
		Limit   uint64       `json:"limit"`
		Outside *uint64      `json:"outside"` // absent where not measured
		Stats   gpumem.Stats `json:"stats"`
	}
}

func fetchPools() []poolView {
	procs, _ := announce.List()
	client := &http.Client{Timeout: time.Second}
	var out []poolView
	for _, p := range procs {
		v := poolView{PID: p.PID, Addr: p.Addr}
		resp, err := client.Get("http://" + p.Addr + "/debug/gpumem/stats")
		if err == nil {
			err = json.NewDecoder(resp.Body).Decode(&v.Stats)
			resp.Body.Close()
		}
		v.Err = err
		out = append(out, v)
	}
	return out
}

// topFrame writes one frame: the GPUs with their processes, then the
// gpumem processes' pools.
func (e *env) topFrame(w io.Writer) {
	fmt.Fprintf(w, "gpumem top  %s\n\n", time.Now().Format("15:04:05"))
	pools := fetchPools()
	reserved := map[int]uint64{} // by pid, over its devices
	outside := map[int]uint64{}  // by pid, where every device's was measured
	for _, p := range pools {
		known := true
		for _, d := range p.Stats {
			reserved[p.PID] += d.Stats.Reserved
			if d.Outside == nil {
				known = false
			} else {
				outside[p.PID] += *d.Outside
			}
		}
		if !known {
			delete(outside, p.PID)
		}
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	reports, err := e.listGPUs()
	if err != nil {
		fmt.Fprintf(w, "GPUs: %v\n", err)
	}
	for _, r := range reports {
		g := r.GPU
		fmt.Fprintf(w, "GPU %d  %s  %s used of %s\n", g.Index, g.Name, units.Format(g.Memory.Used), units.Format(g.Memory.Total))
		fmt.Fprintln(tw, "pid\tNVML\tgpumem reserved\toutside gpumem (context; measured)\tunexplained\t")
		procs := r.Processes
		sort.Slice(procs, func(i, j int) bool { return procs[i].UsedMemory > procs[j].UsedMemory })
		more := false // a gpumem process holds more than its pool and its measured context
		for _, p := range procs {
			res, gm := reserved[p.PID]
			resCol, ctxCol, rest := "-", "", ""
			if gm {
				resCol = units.Format(res)
				ctx, known := outside[p.PID]
				ctxCol = "?"
				if known {
					ctxCol = units.Format(ctx)
				}
				rest = signedBytes(p.UsedMemory, res+ctx)
				more = more || known && p.UsedMemory > res+ctx
				if p.UsedMemory > 0 {
					rest += fmt.Sprintf(" (%+.2f%%)", 100*(float64(p.UsedMemory)-float64(res+ctx))/float64(p.UsedMemory))
				}
			}
			fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\t\n", p.PID, units.Format(p.UsedMemory), resCol, ctxCol, rest)
		}
		tw.Flush()
		if more {
			// What the column cannot tell apart, said once per GPU.
			fmt.Fprintln(w, "unexplained: device memory the process took outside gpumem after its context was measured (kernels loaded lazily, NCCL's own buffers, a library's own cudaMalloc)")
		}
		fmt.Fprintln(w)
	}
	if len(pools) == 0 {
		fmt.Fprintf(w, "no gpumem process serves its pool here (gpumem run --serve, serve= in GPUMEM_CONFIG; announcements in %s)\n", announce.Dir())
		return
	}
	fmt.Fprintln(w, "gpumem pools")
	fmt.Fprintln(tw, "pid\tdevice\tallocated\treserved\tpeak reserved\tcached\tfragmented\tlimit\tbuffers\tdriver calls\tmisses\t")
	for _, p := range pools {
		if p.Err != nil {
			fmt.Fprintf(tw, "%d\t%s\t%v\t\t\t\t\t\t\t\t\t\n", p.PID, p.Addr, p.Err)
			continue
		}
		devs := make([]string, 0, len(p.Stats))
		for d := range p.Stats {
			devs = append(devs, d)
		}
		sort.Strings(devs)
		for _, d := range devs {
			s := p.Stats[d]
			st := s.Stats
			fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\t%s\t%.1f%%\t%s\t%d\t%s\t%s\t\n", p.PID, d, units.Format(st.Allocated),
				units.Format(st.Reserved), units.Format(st.PeakReserved), units.Format(st.Cached),
				100*st.Fragmentation, units.Format(s.Limit), st.LiveBuffers, driverCalls(st), misses(st))
		}
	}
	tw.Flush()
}

// driverCalls says how many memory calls a pool made to the driver and
// what one cost on average: where a GPU's other work makes each call slow
// (milliseconds on four H200s under an FSDP2 job, docs/BENCHMARKS.md), its
// growth steps wait there.
func driverCalls(st gpumem.Stats) string {
	n := st.DeviceCalls()
	if n == 0 {
		return "none"
	}
	return fmt.Sprintf("%d, %s each", n, shortDuration(st.DriverNanos/n))
}

// misses says how many allocations the cache could not serve at once and
// what one cost the host on average, with the share of that in event
// calls (the streams' order: about half of it under FSDP2 on two H200s,
// docs/BENCHMARKS.md): the allocator's cost beyond its cache hits.
func misses(st gpumem.Stats) string {
	if st.Misses == 0 {
		return "none"
	}
	out := fmt.Sprintf("%d, %s each", st.Misses, shortDuration(st.MissNanos/st.Misses))
	if st.EventNanos > 0 && st.MissNanos > 0 {
		out += fmt.Sprintf(" (events %.0f%%)", 100*min(float64(st.EventNanos)/float64(st.MissNanos), 1))
	}
	return out
}

// shortDuration writes ns with three significant digits or so.
func shortDuration(ns uint64) string {
	switch {
	case ns < 1e3:
		return fmt.Sprintf("%d ns", ns)
	case ns < 1e6:
		return fmt.Sprintf("%.1f us", float64(ns)/1e3)
	case ns < 1e9:
		return fmt.Sprintf("%.1f ms", float64(ns)/1e6)
	}
	return fmt.Sprintf("%.2f s", float64(ns)/1e9)
}

// signedBytes writes a - b, with its sign.
func signedBytes(a, b uint64) string {
	if a >= b {
		return units.Format(a - b)
	}
	return "-" + units.Format(b-a)
}
