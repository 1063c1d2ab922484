package cli

import (
	"fmt"
	"strings"

	"github.com/gpumem/gpumem/internal/units"
	"github.com/gpumem/gpumem/torchsnapshot"
	"github.com/gpumem/gpumem/trace"
)

const importAbout = `Import converts a PyTorch memory snapshot into allocation
traces (gpumem-trace v1, or with -format v2 its packed form, a third to a
quarter of the size) for gpumem replay: one per device with an allocation
history. The snapshot is the pickle that
torch.cuda.memory._dump_snapshot(path) writes after
torch.cuda.memory._record_memory_history() has recorded the program.

Each request the program made (PyTorch's alloc) becomes an alloc event with
the size asked for and the Python call stack as its site; each free
(free_requested) a free event. Times count from the device's first event.
What the history lacks but the snapshot implies is added, and a note on
stderr says how much: a request freed in the history but allocated before
it began, or a block allocated at the snapshot but never in the history, is
allocated at time 0. Package torchsnapshot says all of it.

With one such device, its trace goes to TRACE. With several, device 0's
goes to TRACE and device N's to TRACE with ".devN" inserted before ".trace"
(run.trace.gz: run.dev1.trace.gz), else before ".gz" (run.gz: run.dev1.gz),
else at the end (run: run.dev1). A TRACE ending in ".gz" is gzip-compressed.
For each trace written, one line gives its path, device, events, requests,
peak of live bytes and sites.`

func (e *env) importSnapshot(args []string) int {
	fs := e.flagSet("import", "SNAPSHOT -o TRACE", importAbout)
	out := fs.String("o", "", "write the trace to `TRACE` (required)")
	format := fs.String("format", "v1", "trace format: v1, or v2 (packed: requests numbered by order, times as deltas)")
	paths, code := e.parse(fs, args)
	if code >= 0 {
		return code
	}
	switch {
	case len(paths) == 0:
		fs.printUsage(e.stderr)
		return ExitUsage
	case len(paths) > 1:
		return e.usageError(fs, fmt.Sprintf("one SNAPSHOT at a time; got %d", len(paths)))
	case *out == "":
		return e.usageError(fs, "-o TRACE is required")
	}
	f, ok := trace.ParseFormat(*format)
	if !ok {
		return e.usageError(fs, fmt.Sprintf("-format %q: want v1 or v2", *format))
	}
	written, err := torchsnapshot.ImportFormat(paths[0], *out, f)
	for _, w := range written {
		sum := w.Summary
		fmt.Fprintf(e.stdout, "%s: device %d, %d events, %d requests, peak live %s, %d sites\n",
			w.Path, w.Device, sum.Events, sum.Requests, units.Format(sum.PeakLiveBytes), sum.Sites)
		for _, note := range importNotes(sum) {
			fmt.Fprintf(e.stderr, "gpumem import: note: %s: %s\n", w.Path, note)
		}
	}
	if err != nil {
		fmt.Fprintf(e.stderr, "gpumem import: %v\n", err)
		return ExitFail
	}
	return ExitOK
}

// importNotes says what a trace holds that the history did not record.
func importNotes(sum torchsnapshot.Summary) []string {
	var notes []string
	var start []string
	if n := sum.AllocatedBefore; n > 0 {
		start = append(start, fmt.Sprintf("%d %s freed in the history but allocated before it began", n, plural(n, "request")))
	}
	if n := sum.LiveThroughout; n > 0 {
		start = append(start, fmt.Sprintf("%d %s allocated at the snapshot but never in the history (never freed)", n, plural(n, "block")))
	}
	if len(start) > 0 {
		notes = append(notes, "allocated at time 0: "+strings.Join(start, "; "))
	}
	if n := sum.ImpliedFrees; n > 0 {
		notes = append(notes, fmt.Sprintf("%d %s inferred: an alloc at the address of a live request frees it", n, plural(n, "free")))
	}
	if n := sum.ClampedTimes; n > 0 {
		notes = append(notes, fmt.Sprintf("%d %s recorded earlier than the one before, written at its time", n, plural(n, "entry")))
	}
	return notes
}

func plural(n int, noun string) string {
	switch {
	case n == 1:
		return noun
	case strings.HasSuffix(noun, "y"):
		return noun[:len(noun)-1] + "ies"
	}
	return noun + "s"
}
