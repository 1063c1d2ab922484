package cli

import (
	"bytes"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/gpumem/gpumem/internal/units"
	"github.com/gpumem/gpumem/policy"
	"github.com/gpumem/gpumem/torchsnapshot"
	"github.com/gpumem/gpumem/trace"
)

const fitAbout = `Fit finds the smallest GPU on which a program runs without an out-of-memory
error: for each policy (gpumem's default configuration and the emulated
allocators of gpumem replay --policy), the least device capacity, to 2 MiB,
on which the replay of its trace (or of a PyTorch memory snapshot, .pickle,
imported as gpumem import does; its first device with a history) has no
OOM, by bisection. With --gpu SIZE it also says whether the program fits a
GPU of that size under each policy, replayed at exactly that capacity.

tf-bfc-prealloc is XLA's default: 75% of the GPU is taken at start and is
the limit, so it fits a GPU whose 75% holds the program's pool. A capacity
found by bisection fits; a policy that fits on a device may still fail on a
slightly larger one (an OOM retry at another moment), in which case a
capacity just below the one printed may fit too.

A progress bar goes to stderr when stderr is a terminal.`

func (e *env) fit(args []string) int {
	fs := e.flagSet("fit", "TRACE|SNAPSHOT", fitAbout)
	var gpu sizeFlag
	fs.Var(&gpu, "gpu", "also say whether it fits a GPU of `SIZE` (e.g. 24GiB)")
	pol := fs.String("policy", "all", "the `policy`: "+strings.Join(policy.Names(), ", ")+" or all")
	paths, code := e.parse(fs, args)
	if code >= 0 {
		return code
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
	tr, err := loadTraceOrSnapshot(paths[0])
	if err != nil {
		fmt.Fprintf(e.stderr, "gpumem fit: %v\n", err)
		return ExitFail
	}
	bar := newProgressBar(e.stderr, len(names))
	t := table{header: []string{"policy", "fits on", "x peak live"}}
	if gpu > 0 {
		t.header = append(t.header, "fits "+units.Format(uint64(gpu)))
	}
	var verdict []string
	for i, n := range names {
		c, err := policy.Fit(tr, n, func(done, total int) { bar.update(i, done, total) })
		if err != nil {
			bar.done()
			fmt.Fprintf(e.stderr, "gpumem fit: %v\n", err)
			return ExitFail
		}
		row := []string{n, units.Format(c), strconv.FormatFloat(float64(c)/float64(max(tr.PeakLiveBytes, 1)), 'f', 3, 64)}
		if gpu > 0 {
			ok, err := policy.Fits(tr, n, uint64(gpu))
			if err != nil {
				bar.done()
				fmt.Fprintf(e.stderr, "gpumem fit: %v\n", err)
				return ExitFail
			}
			row = append(row, map[bool]string{true: "yes", false: "no"}[ok])
			if ok {
				verdict = append(verdict, "fits a "+units.Format(uint64(gpu))+" GPU under "+n)
			} else {
				verdict = append(verdict, n+" needs "+units.Format(c))
			}
		}
		t.rows = append(t.rows, row)
	}
	bar.done()
	fmt.Fprintf(e.stdout, "%s: peak live %s\n", tr.Name, units.Format(tr.PeakLiveBytes))
	if err := t.write(e.stdout); err != nil {
		return ExitFail
	}
	if len(verdict) > 0 {
		fmt.Fprintln(e.stdout, strings.Join(verdict, "; "))
	}
	return ExitOK
}

// loadTraceOrSnapshot loads a trace, or a PyTorch snapshot (.pickle) as the
// trace of its first device with a history.
func loadTraceOrSnapshot(path string) (*trace.Trace, error) {
	if !strings.HasSuffix(path, ".pickle") && !strings.HasSuffix(path, ".pkl") {
		return trace.Load(path)
	}
	s, err := torchsnapshot.Load(path)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	devs := s.Devices()
	if len(devs) == 0 {
		return nil, fmt.Errorf("%s: %w", path, torchsnapshot.ErrNoHistory)
	}
	var buf bytes.Buffer
	w, err := trace.NewWriter(&buf)
	if err != nil {
		return nil, err
	}
	if _, err := s.WriteTrace(devs[0], w); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	if err := w.Flush(); err != nil {
		return nil, err
	}
	name := strings.TrimSuffix(strings.TrimSuffix(filepath.Base(path), ".pickle"), ".pkl")
	return trace.Read(&buf, name)
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
