// Command sizes prints, per trace, how much of what a program allocates
// comes in large requests: for each threshold, the requests of at least that
// size and their share of all bytes allocated (one pass). It is the
// measure that EXPERIMENTS.md, "Large requests in a heap of their own",
// set beside compact placement's first-pass time: the programs that miss
// that bar by most allocate most of their bytes in blocks of 256 MiB or
// more.
//
//	go run ./bench/core/sizes TRACE...
package main

import (
	"fmt"
	"io"
	"os"

	"github.com/gpumem/gpumem/trace"
)

// thresholds are the request sizes the table counts from.
var thresholds = []uint64{64 << 20, 128 << 20, 256 << 20, 1 << 30}

// share is one trace's row: per threshold the requests at least that large
// and the bytes they ask for.
type share struct {
	name     string
	peak     uint64
	requests int
	total    uint64
	n        []int
	bytes    []uint64
}

func measure(tr *trace.Trace) share {
	s := share{name: tr.Name, peak: tr.PeakLiveBytes, requests: tr.Requests,
		n: make([]int, len(thresholds)), bytes: make([]uint64, len(thresholds))}
	for _, e := range tr.Events {
		if e.Kind != trace.Alloc {
			continue
		}
		s.total += e.Size
		for i, t := range thresholds {
			if e.Size >= t {
				s.n[i]++
				s.bytes[i] += e.Size
			}
		}
	}
	return s
}

func (s share) print(w io.Writer) {
	fmt.Fprintf(w, "| %s | %d | %d |", s.name, s.peak>>20, s.requests)
	for i := range thresholds {
		pct := 0.0
		if s.total > 0 {
			pct = 100 * float64(s.bytes[i]) / float64(s.total)
		}
		fmt.Fprintf(w, " %d, %.0f%% |", s.n[i], pct)
	}
	fmt.Fprintln(w)
}

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: sizes TRACE...")
		os.Exit(2)
	}
	fmt.Print("| trace | peak live MiB | requests |")
	for _, t := range thresholds {
		fmt.Printf(" >= %d MiB: requests, share of bytes |", t>>20)
	}
	fmt.Println()
	fmt.Print("| --- | ---: | ---: |")
	for range thresholds {
		fmt.Print(" ---: |")
	}
	fmt.Println()
	status := 0
	for _, f := range os.Args[1:] {
		tr, err := trace.Load(f)
		if err != nil {
			fmt.Fprintln(os.Stderr, "sizes:", err)
			status = 1
			continue
		}
		measure(tr).print(os.Stdout)
	}
	os.Exit(status)
}
