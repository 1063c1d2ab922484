package cli

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/gpumem/gpumem/device/sim"
	"github.com/gpumem/gpumem/internal/units"
	"github.com/gpumem/gpumem/policy"
	"github.com/gpumem/gpumem/report"
	"github.com/gpumem/gpumem/torchsnapshot"
	"github.com/gpumem/gpumem/trace"
)

const reportAbout = `Report writes one HTML file that shows where the memory of a program
goes: its live bytes over time and what each allocation policy held,
with every peak marked; each policy's segments and blocks at its peak
(used, rounding, free blocks split off in segments that hold live ones,
cached segments); the largest allocations and, where the trace has call
sites, the sites holding the most at the peak; and fragmentation over
time. The file opens from disk in a browser and fetches nothing.

The input is a trace (gpumem-trace v1, plain or gzip) or a PyTorch memory
snapshot (the pickle of torch.cuda.memory._dump_snapshot), read as gpumem
import reads it; of a snapshot with several devices, --device picks one
(by default the first with an allocation history).

The trace is replayed under each policy of --policy (package policy:
gpumem itself on a simulated device, and the other allocators emulated),
on a device of --capacity bytes; a request a policy cannot fit is counted
as an OOM. One line on stdout says what was written. SIZE is bytes with
an optional unit: 80GiB, 512MiB, 1.5GB, 1024.`

func (e *env) report(args []string) int {
	fs := e.flagSet("report", "TRACE|SNAPSHOT -o FILE", reportAbout)
	out := fs.String("o", "", "write the report to `FILE` (required)")
	pols := fs.String("policy", "all", "the `policies`, separated by commas ("+strings.Join(policy.Names(), ", ")+"), or all")
	capacity := sizeFlag(sim.DefaultCapacity)
	fs.Var(&capacity, "capacity", "the device's memory (`SIZE`) under every policy")
	dev := fs.Int("device", -1, "of a snapshot with several devices, the `index` of the one to report (-1: the first)")
	paths, code := e.parse(fs, args)
	if code >= 0 {
		return code
	}
	switch {
	case len(paths) == 0:
		fs.printUsage(e.stderr)
		return ExitUsage
	case len(paths) > 1:
		return e.usageError(fs, fmt.Sprintf("one TRACE or SNAPSHOT at a time; got %d", len(paths)))
	case *out == "":
		return e.usageError(fs, "-o FILE is required")
	case capacityProblem(capacity) != "":
		return e.usageError(fs, capacityProblem(capacity))
	}
	names, err := policyNames(*pols)
	if err != nil {
		return e.usageError(fs, err.Error())
	}

	tr, source, err := loadTraceOrSnapshot(paths[0], *dev)
	if err != nil {
		fmt.Fprintf(e.stderr, "gpumem report: %v\n", err)
		return ExitFail
	}
	ps := make([]report.Policy, len(names))
	for i, n := range names {
		ps[i] = report.Policy{Name: n, New: func() (policy.Allocator, error) { return policy.New(n, uint64(capacity)) }}
	}
	d, err := report.Build(tr, ps, report.Options{})
	if err != nil {
		fmt.Fprintf(e.stderr, "gpumem report: %v\n", err)
		return ExitFail
	}
	d.Source = source
	n, err := writeReport(*out, d)
	if err != nil {
		fmt.Fprintf(e.stderr, "gpumem report: %v\n", err)
		return ExitFail
	}
	fmt.Fprintf(e.stdout, "%s: %s, %d events, peak live %s, %d %s, %s\n",
		*out, d.Trace, d.Events, units.Format(d.PeakLive.Bytes), len(names), plural(len(names), "policy"), units.Format(uint64(n)))
	return ExitOK
}

// policyNames parses --policy: names separated by commas, or all.
func policyNames(s string) ([]string, error) {
	known := policy.Names()
	if s == "all" {
		return known, nil
	}
	var names []string
	for n := range strings.SplitSeq(s, ",") {
		n = strings.TrimSpace(n)
		switch {
		case !slices.Contains(known, n):
			return nil, fmt.Errorf("invalid value %q for flag --policy: unknown policy %q (want %s, or all)", s, n, strings.Join(known, ", "))
		case slices.Contains(names, n):
			return nil, fmt.Errorf("invalid value %q for flag --policy: %s twice", s, n)
		}
		names = append(names, n)
	}
	return names, nil
}

// loadTraceOrSnapshot reads a trace, or the trace of device dev (-1: the
// first) of a PyTorch snapshot (gpumem fit and report), told apart by the pickle's first byte
// whatever the file's name. For a snapshot it also returns what the trace
// came from.
func loadTraceOrSnapshot(path string, dev int) (*trace.Trace, string, error) {
	return loadInput(path, dev, nil)
}

// loadInput is loadTraceOrSnapshot; with cut not nil, a trace cut short is
// read up to the cut (trace.LoadPartial) and cut is called with the error
// that says where.
func loadInput(path string, dev int, cut func(error)) (*trace.Trace, string, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, "", err
	}
	head, _ := bufio.NewReader(f).Peek(2)
	f.Close()
	// A pickle of protocol 2 or later starts with PROTO (0x80) and its
	// version; a trace with "#" or gzip's 0x1f.
	if len(head) < 2 || head[0] != 0x80 {
		if dev >= 0 {
			return nil, "", fmt.Errorf("%s: --device picks a device of a snapshot; this is not one", path)
		}
		if cut == nil {
			tr, err := trace.Load(path)
			return tr, "", err
		}
		tr, err := trace.LoadPartial(path)
		if err != nil && tr != nil { // cut short: what came before the cut
			cut(err)
			err = nil
		}
		return tr, "", err
	}
	s, err := torchsnapshot.Load(path)
	if err != nil {
		if errors.Is(err, torchsnapshot.ErrFormat) {
			err = fmt.Errorf("%s: %w", path, err)
		}
		return nil, "", err
	}
	devs := s.Devices()
	if len(devs) == 0 {
		return nil, "", fmt.Errorf("%s: %w", path, torchsnapshot.ErrNoHistory)
	}
	if dev < 0 {
		dev = devs[0]
	} else if !slices.Contains(devs, dev) {
		return nil, "", fmt.Errorf("%s: no allocation history on device %d (devices with one: %v)", path, dev, devs)
	}
	var buf bytes.Buffer
	w, err := trace.NewWriter(&buf)
	if err != nil {
		return nil, "", err
	}
	if _, err := s.WriteTrace(dev, w); err != nil {
		return nil, "", fmt.Errorf("%s: device %d: %w", path, dev, err)
	}
	if err := w.Flush(); err != nil {
		return nil, "", err
	}
	name := strings.TrimSuffix(filepath.Base(path), ".pickle")
	if len(devs) > 1 {
		name += fmt.Sprintf(".dev%d", dev)
	}
	tr, err := trace.Read(&buf, name)
	if err != nil {
		return nil, "", fmt.Errorf("%s: device %d: the imported trace: %w", path, dev, err)
	}
	return tr, fmt.Sprintf("PyTorch snapshot %s, device %d", filepath.Base(path), dev), nil
}

// writeReport writes d's page to path and returns its size.
func writeReport(path string, d *report.Data) (int, error) {
	var buf bytes.Buffer
	if err := d.WriteHTML(&buf); err != nil {
		return 0, err
	}
	if err := os.WriteFile(path, buf.Bytes(), 0o644); err != nil {
		return 0, err
	}
	return buf.Len(), nil
}
