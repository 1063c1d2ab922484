package policy

import (
	"fmt"

	"github.com/gpumem/gpumem/trace"
)

// FitGranularity is the precision of Fit: capacities are multiples of the
// device's 2 MiB granule.
const FitGranularity = 2 << 20

// maxFitCapacity bounds Fit's search: 1 PiB, trace.MaxSize.
const maxFitCapacity = trace.MaxSize

// Fits reports whether tr replays under the named policy on a device of
// capacity bytes without an out-of-memory error.
func Fits(tr *trace.Trace, name string, capacity uint64) (bool, error) {
	r, err := Run(tr, name, capacity, false, Options{})
	return err == nil && r.OOMs == 0, err
}

// Fit returns the smallest device capacity, a multiple of FitGranularity,
// on which tr replays under the named policy without an out-of-memory
// error: the capacity doubles from the trace's peak live bytes until the
// trace fits, then bisection finds the least that fits between the last
// that did not and the first that did. It assumes that a device that fits
// the trace fits it with more memory too, which holds for these policies
// except where a cut in a last region (tf-bfc) or a different moment of an
// OOM retry changes later decisions; the capacity returned fits, checked by
// its replay. For tf-bfc-prealloc, "fits" means on a GPU whose 75%,
// preallocated at start, holds the program: XLA's default, a capacity 4/3
// of what the pool needs. progress, if set, is called after each replay
// with the number done and an estimate of the total.
func Fit(tr *trace.Trace, name string, progress func(done, total int)) (uint64, error) {
	lo := uint64(0) // the largest capacity known not to fit
	hi := max(roundUp(tr.PeakLiveBytes, FitGranularity), FitGranularity)
	done, total := 0, 20
	step := func() {
		done++
		total = max(total, done+1)
		if progress != nil {
			progress(done, total)
		}
	}
	for {
		ok, err := Fits(tr, name, hi)
		step()
		if err != nil {
			return 0, err
		}
		if ok {
			break
		}
		lo = hi
		if hi >= maxFitCapacity {
			return 0, fmt.Errorf("policy %s: trace %s does not fit even a device of %d bytes", name, tr.Name, hi)
		}
		hi = min(2*hi, maxFitCapacity)
	}
	if lo == 0 {
		return hi, nil // the peak live rounded up: nothing less can fit
	}
	for hi-lo > FitGranularity {
		mid := lo + (hi-lo)/2/FitGranularity*FitGranularity
		ok, err := Fits(tr, name, mid)
		step()
		if err != nil {
			return 0, err
		}
		if ok {
			hi = mid
		} else {
			lo = mid
		}
	}
	if progress != nil {
		progress(done, done)
	}
	return hi, nil
}
