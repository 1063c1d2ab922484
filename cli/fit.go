package cli

import (
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"

	"github.com/gpumem/gpumem/internal/units"
	"github.com/gpumem/gpumem/policy"
)

const fitAbout = `Fit finds the smallest GPU on which a program runs without an out-of-memory
error: for each policy (gpumem's default configuration and the emulated
allocators of gpumem replay --policy), the least device capacity, to 2 MiB,
on which the replay of its trace (or of a PyTorch memory snapshot, .pickle,
imported as gpumem import does; its first device with a history) has no
OOM. With --gpu SIZE it also says whether the program fits a GPU of that
size under each policy, replayed at exactly that capacity.

"fits on" is the capacity to buy: the least C such that the program fits
on C and on every capacity above it, 2 MiB apart, up to C + 1/32 of C (at
least 16 MiB), each replayed. Fitting is not always monotone: near the
limit an allocator can run out at one capacity and not at a smaller one
(an OOM retry or a reclaim at another moment). "least found" is where
bisection from the peak live bytes landed: it fits and 2 MiB less does
not; where it is below "fits on", some capacity between them fails.
Both are shown rounded up to their last digit, so that the figure typed
back (--capacity, GPUMEM_CONFIG=limit=) is never below the capacity found.

tf-bfc-prealloc is XLA's default: 75% of the GPU is taken at start and is
the limit, so it fits a GPU whose 75% holds the program's pool.

With --passes N the program runs its trace N times on one allocator (as
gpumem replay --passes: what the trace never frees stays live, allocated once),
and fits only where no pass runs out of memory: the capacity for a job that
repeats its trace (a training run of many epochs, a server's many
batches). An allocator whose layout drifts from pass to pass can fail a
later pass on a capacity its first pass fitted in.

A progress bar goes to stderr when stderr is a terminal.`

func (e *env) fit(args []string) int {
	fs := e.flagSet("fit", "TRACE|SNAPSHOT", fitAbout)
	var gpu sizeFlag
	fs.Var(&gpu, "gpu", "also say whether it fits a GPU of `SIZE` (e.g. 24GiB)")
	pol := fs.String("policy", "all", "the `policy`: "+strings.Join(policy.Names(), ", ")+" or all; or gpumem-gather (gpumem.Config.Gather, only for programs whose GPU work, libraries' included, is launched from one thread at a time: another host thread's writes to moved memory are lost with no error), or gpumem-chunks (gpumem.Config.ChunkHandles, experimental)")
	dev := fs.Int("device", -1, "of a snapshot with several devices, the `index` of the one to fit (-1: the first)")
	passes := fs.Int("passes", 1, "fit `n` passes of the trace on one allocator (what the trace never frees stays live, allocated once, as a process keeps its workspaces): every pass must run without OOM")
	paths, code := e.parse(fs, args)
	if code >= 0 {
		return code
	}
	if *passes < 1 {
		return e.usageError(fs, fmt.Sprintf("invalid value %d for flag --passes: want 1 or more", *passes))
	}
	if len(paths) != 1 {
		return e.usageError(fs, "fit takes one trace or snapshot")
	}
	names := policy.Names()
	if *pol != "all" {
		if _, err := policy.New(*pol, 1<<30); err != nil {
			return e.usageError(fs, fmt.Sprintf("invalid value %q for flag --policy: want %s or all", *pol, strings.Join(policy.Names(), ", ")))
		}
		names = []string{*pol}
	}
	tr, _, err := loadTraceOrSnapshot(paths[0], *dev)
	if err != nil {
		fmt.Fprintf(e.stderr, "gpumem fit: %v\n", err)
		return ExitFail
	}
	bar := newProgressBar(e.stderr, len(names))
	t := table{header: []string{"policy", "fits on", "x peak live", "least found"}}
	if gpu > 0 {
		t.header = append(t.header, "fits "+units.Format(uint64(gpu)))
	}
	var fit, need []string
	live := max(tr.PeakLivePasses(*passes), 1) // the most live over the passes: the ratio's base
	for i, n := range names {
		f, err := policy.Fit(tr, n, *passes, func(done, total int) { bar.update(i, done, total) })
		if err != nil {
			bar.done()
			fmt.Fprintf(e.stderr, "gpumem fit: %v\n", err)
			return ExitFail
		}
		row := []string{n, units.FormatUp(f.Capacity), strconv.FormatFloat(float64(f.Capacity)/float64(live), 'f', 3, 64), units.FormatUp(f.Least)}
		if gpu > 0 {
			ok, err := policy.Fits(tr, n, uint64(gpu), *passes)
			if err != nil {
				bar.done()
				fmt.Fprintf(e.stderr, "gpumem fit: %v\n", err)
				return ExitFail
			}
			row = append(row, map[bool]string{true: "yes", false: "no"}[ok])
			if ok {
				fit = append(fit, n)
			} else {
				need = append(need, n+" needs "+shortSize(f.Capacity))
			}
		}
		t.rows = append(t.rows, row)
	}
	bar.done()
	if *passes > 1 {
		fmt.Fprintf(e.stdout, "%s: peak live %s over %d passes\n", tr.Name, units.Format(live), *passes)
	} else {
		fmt.Fprintf(e.stdout, "%s: peak live %s\n", tr.Name, units.Format(tr.PeakLiveBytes))
	}
	if err := t.write(e.stdout); err != nil {
		return ExitFail
	}
	if gpu > 0 {
		fmt.Fprintln(e.stdout, fitVerdict(shortSize(uint64(gpu)), fit, need))
	}
	return ExitOK
}

// fitVerdict is the one line of --gpu: the policies under which the program
// fits a GPU of that size, grouped, then what each of the others needs:
// "fits a 16 GiB GPU under gpumem and tf-bfc; tf-bfc-prealloc needs 17.7 GiB".
func fitVerdict(gpu string, fit, need []string) string {
	under := "no policy"
	if len(fit) > 0 {
		under = andList(fit)
	}
	return strings.Join(append([]string{"fits a " + gpu + " GPU under " + under}, need...), "; ")
}

// shortSize is units.FormatUp without trailing zeros: "16 GiB", "17.7 GiB".
func shortSize(n uint64) string {
	num, unit, _ := strings.Cut(units.FormatUp(n), " ")
	if strings.Contains(num, ".") {
		num = strings.TrimRight(strings.TrimRight(num, "0"), ".")
	}
	return num + " " + unit
}

// andList joins "a", "a and b", "a, b and c".
func andList(s []string) string {
	if len(s) <= 1 {
		return strings.Join(s, "")
	}
	return strings.Join(s[:len(s)-1], ", ") + " and " + s[len(s)-1]
}

// progressBar draws one line on a terminal, redrawn in place; on anything
// else it draws nothing.
type progressBar struct {
	w     io.Writer
	on    bool
	parts int
}

func newProgressBar(w io.Writer, parts int) *progressBar {
	f, ok := w.(*os.File)
	return &progressBar{w: w, on: ok && isTerminal(f.Fd()), parts: parts}
}

// update shows part i of the work (of parts) at done of total steps.
func (p *progressBar) update(i, done, total int) {
	if !p.on {
		return
	}
	frac := (float64(i) + float64(done)/float64(max(total, 1))) / float64(p.parts)
	const width = 30
	n := min(int(frac*width), width)
	fmt.Fprintf(p.w, "\r[%s%s] %3.0f%%", strings.Repeat("#", n), strings.Repeat(" ", width-n), 100*frac)
}

func (p *progressBar) done() {
	if p.on {
		fmt.Fprintf(p.w, "\r%s\r", strings.Repeat(" ", 40))
	}
}
