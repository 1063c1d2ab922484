package policy

import (
	"fmt"
	"runtime"
	"sync"

	"github.com/gpumem/gpumem/device/sim"
	"github.com/gpumem/gpumem/internal/units"
	"github.com/gpumem/gpumem/trace"
)

// FitGranularity is the precision of Fit: capacities are multiples of the
// device's 2 MiB granule.
const FitGranularity = 2 << 20

// maxFitCapacity bounds Fit's search: the most a simulated device models
// (sim.MaxCapacity, 4 TiB), against trace.MaxSize's 1 PiB.
const maxFitCapacity = sim.MaxCapacity

// FitResult is what Fit found for one trace and policy.
type FitResult struct {
	// Capacity is the answer to "what is the smallest GPU on which it
	// runs" for a buyer of a larger one: the least capacity C (a multiple
	// of FitGranularity) such that the trace fits on C and on every
	// capacity C + k*FitGranularity up to C + FitWindow(C), each checked by
	// its replay.
	Capacity uint64
	// Least is the capacity the bisection landed on: it fits and one
	// granule less does not. It is at most Capacity; where it is less, the
	// policy's fit is not monotone there (it fits on Least but not on
	// some capacity between Least and Capacity).
	Least uint64
	// Replays counts the replays Fit made.
	Replays int
}

// FitWindow is how far above a capacity Fit checks, granule by granule,
// that every larger capacity fits too: 1/32 of it (3%, the scale at which
// a fit is judged), at least 8 granules.
func FitWindow(c uint64) uint64 {
	return max(roundUp(c/32, FitGranularity), 8*FitGranularity)
}

// Fits reports whether tr replays under the named policy on a device of
// capacity bytes without an out-of-memory error, in each of passes passes
// on one allocator (0 and 1 mean one). Several passes replay as Repeat
// does (what the trace never frees stays live, allocated once): a program that
// runs longer than its trace needs every pass to fit, and a policy whose
// layout drifts from pass to pass can refuse in a later pass what it
// served in the first.
func Fits(tr *trace.Trace, name string, capacity uint64, passes int) (bool, error) {
	if passes <= 1 {
		r, err := Run(tr, name, capacity, false, Options{})
		return err == nil && r.OOMs == 0, err
	}
	r, err := Repeat(tr, name, capacity, passes)
	return err == nil && r.oomsFirst == 0 && r.OOMsLater == 0, err
}

// Fit finds the capacity on which tr fits under the named policy, in two
// steps:
//
//  1. Least: the capacity doubles from the trace's peak live bytes until the
//     trace fits, then bisection finds a capacity that fits where one
//     granule less does not. Bisection assumes that fitting is monotone in
//     the capacity, which it is not everywhere: near the limit an OOM
//     retry, a cut last region (tf-bfc) or gpumem's reclaim can happen at
//     another moment and change later decisions, so a capacity above one
//     that fits can fail.
//  2. Capacity: every granule from Least up is replayed until FitWindow
//     of consecutive capacities fit; a failure moves the candidate above
//     it and the window with it. So the trace fits on Capacity and on
//     every capacity from there to Capacity+FitWindow(Capacity); nothing
//     is claimed above that window, where no policy here was seen to fail
//     (a policy's decisions depend on the capacity only when the device is
//     nearly full).
//
// For tf-bfc-prealloc, "fits" means on a GPU whose 75%, preallocated at
// start, holds the program: XLA's default, a capacity 4/3 of what the pool
// needs. With passes above 1 the trace must fit in every one of that
// many passes on one allocator (Fits). progress, if set, is called with
// the replays done and an estimate of the total: after each replay of the
// bisection, after each batch of the window's (which run fitWorkers at a
// time, with the answer of a scan one by one).
func Fit(tr *trace.Trace, name string, passes int, progress func(done, total int)) (FitResult, error) {
	var res FitResult
	total := 40
	fits := func(c uint64) (bool, error) {
		ok, err := Fits(tr, name, c, passes)
		res.Replays++
		total = max(total, res.Replays+1)
		if progress != nil {
			progress(res.Replays, total)
		}
		return ok, err
	}
	lo := uint64(0) // the largest capacity known not to fit
	hi := max(roundUp(tr.PeakLiveBytes, FitGranularity), FitGranularity)
	if hi > maxFitCapacity {
		return res, fmt.Errorf("policy %s: trace %s holds %s live at its peak: more than the largest device fit models (%s)", name, tr.Name, units.Format(tr.PeakLiveBytes), units.Format(maxFitCapacity))
	}
	for {
		ok, err := fits(hi)
		if err != nil {
			return res, err
		}
		if ok {
			break
		}
		lo = hi
		if hi >= maxFitCapacity {
			return res, fmt.Errorf("policy %s: trace %s does not fit even a device of %d bytes", name, tr.Name, hi)
		}
		hi = min(2*hi, maxFitCapacity)
	}
	for lo != 0 && hi-lo > FitGranularity {
		mid := lo + (hi-lo)/2/FitGranularity*FitGranularity
		ok, err := fits(mid)
		if err != nil {
			return res, err
		}
		if ok {
			hi = mid
		} else {
			lo = mid
		}
	}
	res.Least, res.Capacity = hi, hi
	total = res.Replays + int(FitWindow(hi)/FitGranularity)
	// The window's replays are independent: they run fitWorkers at a time,
	// a batch of consecutive capacities, each batch within the window as it
	// stands when the batch begins (a failure only moves it up). So the
	// capacities replayed are those a scan one by one replays, and the
	// answer and Replays are the same.
	batch := make([]fitProbe, 0, fitWorkers)
	for c := hi + FitGranularity; c <= res.Capacity+FitWindow(res.Capacity) && c <= maxFitCapacity; {
		end := min(res.Capacity+FitWindow(res.Capacity), maxFitCapacity)
		batch = batch[:0]
		for ; c <= end && len(batch) < fitWorkers; c += FitGranularity {
			batch = append(batch, fitProbe{capacity: c})
		}
		var wg sync.WaitGroup
		for i := range batch {
			wg.Add(1)
			go func(b *fitProbe) {
				defer wg.Done()
				b.ok, b.err = Fits(tr, name, b.capacity, passes)
			}(&batch[i])
		}
		wg.Wait()
		for _, b := range batch {
			res.Replays++
			if b.err != nil {
				return res, b.err
			}
			if !b.ok {
				res.Capacity = b.capacity + FitGranularity
				total = res.Replays + int(FitWindow(res.Capacity)/FitGranularity)
			}
		}
		total = max(total, res.Replays+1)
		if progress != nil {
			progress(res.Replays, total)
		}
	}
	if progress != nil {
		progress(res.Replays, res.Replays)
	}
	return res, nil
}

// A fitProbe is one replay of Fit's window: a capacity and its verdict.
type fitProbe struct {
	capacity uint64
	ok       bool
	err      error
}

// fitWorkers is how many of Fit's window replays run at once: the
// machine's cores, at most 8 (each holds a simulated device, an allocator
// and the replay's buffers).
var fitWorkers = min(max(runtime.GOMAXPROCS(0), 1), 8)
