package report

// See doc.go for the overview.

import (
	"errors"
	"fmt"
	"runtime"
	"strings"
	"sync"

	"github.com/gpumem/gpumem/policy"
	"github.com/gpumem/gpumem/trace"
)

// A Policy is one allocation policy to replay the trace under: its name,
// as the report shows it, and how to make a new allocator of it. New is
// called twice per report (a replay to find the peak, a second to stop at
// it), and the two allocators must decide the same: Build checks that they
// do.
type Policy struct {
	Name string
	New  func() (policy.Allocator, error)
}

// Options tune what a report holds. Zero values take the defaults.
type Options struct {
	// Buckets is the number of points across the time axis (default
	// 1200): about one per pixel of a chart.
	Buckets int
	// Samples is the number of moments at which each policy's map is read
	// for its largest free block (default 240).
	Samples int
	// Largest is the number of largest requests listed (default 25), and
	// of call sites listed by their bytes at the peak.
	Largest int
	// Workers is the number of policies replayed at once (default
	// GOMAXPROCS).
	Workers int
}

func (o Options) withDefaults() Options {
	if o.Buckets <= 0 {
		o.Buckets = 1200
	}
	if o.Samples <= 0 {
		o.Samples = 240
	}
	o.Samples = min(o.Samples, o.Buckets)
	if o.Largest <= 0 {
		o.Largest = 25
	}
	if o.Workers <= 0 {
		o.Workers = runtime.GOMAXPROCS(0)
	}
	return o
}

// Data is everything a report shows: the trace's figures and each
// policy's. It marshals to the JSON that the page's script draws.
type Data struct {
	Trace    string `json:"trace"`
	Source   string `json:"source,omitempty"` // what the trace came from, when not a trace file
	Events   int    `json:"events"`
	Requests int    `json:"requests"`
	Streams  int    `json:"streams"`
	// Clock is the time axis: bucket i of every series begins at
	// Clock.T0 + i*Clock.Width microseconds.
	Clock    Clock  `json:"clock"`
	Duration uint64 `json:"duration_us"` // from the first event to the last
	// PeakLive is the trace's peak of live bytes (trace.Trace's
	// PeakLiveBytes) and the first event that reached it.
	PeakLive Peak   `json:"peak_live"`
	Live     Series `json:"live"`
	// Policies are in the order given to Build.
	Policies []PolicyData `json:"policies"`
	// Largest are the largest requests, largest first.
	Largest []Request `json:"largest"`
	// AtPeak are the call sites of the requests live at PeakLive, most
	// bytes first (empty when the trace has no sites).
	AtPeak []SiteBytes `json:"at_peak"`
	// Sites holds the text of each site that Largest and AtPeak name.
	Sites map[uint32]string `json:"sites"`
}

// A Peak is a quantity's greatest value and the event (index into the
// trace's events) after which it held it, at TimeUS: for live bytes the
// first such event; for a policy's reserved bytes, of the events after
// which it held its peak, the first at which it served the most live bytes
// (a policy that takes its memory at start holds its peak throughout, and
// its map is worth reading when it is fullest).
type Peak struct {
	Bytes  uint64 `json:"bytes"`
	Event  int    `json:"event"`
	TimeUS uint64 `json:"t_us"`
}

// PolicyData is one policy's replay.
type PolicyData struct {
	Name         string `json:"name"`
	PeakReserved Peak   `json:"peak_reserved"`
	// LiveAtPeak is the bytes the policy served at PeakReserved.Event.
	LiveAtPeak uint64 `json:"live_at_peak"`
	// Ratio is PeakReserved.Bytes / the trace's peak live bytes.
	Ratio float64 `json:"ratio"`
	// OOMs counts the requests the policy could not serve on its device;
	// they are left out of its live bytes.
	OOMs     int    `json:"ooms"`
	Reserved Series `json:"reserved"`
	// Frag is the fraction of reserved memory not live (1 - live/reserved,
	// live as the policy served it) over time.
	Frag Ratio `json:"frag"`
	// Free are moments at which the policy's free blocks were read: what
	// it held free and its largest free block.
	Free []FreeSample `json:"free"`
	// Map is the policy's segments and blocks at PeakReserved.
	Map Map `json:"map"`
}

// A FreeSample is the free memory of a policy at one moment: Bytes in all
// its free blocks, Largest in its largest. Largest < Bytes means free
// memory split among blocks; a request above Largest cannot use it.
type FreeSample struct {
	TimeUS  uint64 `json:"t_us"`
	Bytes   uint64 `json:"bytes"`
	Largest uint64 `json:"largest"`
}

// errNondeterministic: a policy reserved different amounts in the two
// replays of one report.
var errNondeterministic = errors.New("the policy is not deterministic")

// Build replays tr under each policy and gathers the report's data. An
// allocation that a policy fails with policy.ErrOutOfMemory is counted
// (PolicyData.OOMs) and its free skipped; any other error of a policy stops
// the build.
func Build(tr *trace.Trace, policies []Policy, opt Options) (*Data, error) {
	if len(tr.Events) == 0 {
		return nil, fmt.Errorf("report: trace %s has no events", tr.Name)
	}
	opt = opt.withDefaults()
	seen := map[string]bool{}
	for _, p := range policies {
		if p.Name == "" || p.New == nil {
			return nil, fmt.Errorf("report: a policy needs a name and a constructor (got %q)", p.Name)
		}
		if seen[p.Name] {
			return nil, fmt.Errorf("report: policy %q given twice", p.Name)
		}
		seen[p.Name] = true
	}
	first, last := tr.Events[0].TimeUS, tr.Events[len(tr.Events)-1].TimeUS
	d := &Data{
		Trace:    tr.Name,
		Events:   len(tr.Events),
		Requests: tr.Requests,
		Streams:  len(tr.Streams),
		Clock:    newClock(first, last, opt.Buckets),
		Duration: last - first,
		Policies: make([]PolicyData, len(policies)),
	}
	d.replayTrace(tr)
	if d.PeakLive.Bytes != tr.PeakLiveBytes {
		return nil, fmt.Errorf("report: trace %s: the peak of live bytes is %d, the trace says %d", tr.Name, d.PeakLive.Bytes, tr.PeakLiveBytes)
	}
	d.requests(tr, opt.Largest)

	errs := make([]error, len(policies))
	var wg sync.WaitGroup
	sem := make(chan struct{}, opt.Workers)
	for i, p := range policies {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer func() { <-sem; wg.Done() }()
			pd, err := replayPolicy(tr, d.Clock, p, opt)
			if err != nil {
				if !strings.HasPrefix(err.Error(), "policy "+p.Name+":") { // policy.New's errors name it
					err = fmt.Errorf("policy %s: %w", p.Name, err)
				}
				errs[i] = fmt.Errorf("report: trace %s: %w", tr.Name, err)
				return
			}
			if tr.PeakLiveBytes > 0 {
				pd.Ratio = float64(pd.PeakReserved.Bytes) / float64(tr.PeakLiveBytes)
			}
			d.Policies[i] = pd
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return d, nil
}

// replayTrace fills Live and PeakLive.
func (d *Data) replayTrace(tr *trace.Trace) {
	sizes := make([]uint64, tr.Requests)
	sb := newSeriesBuilder(d.Clock, 0)
	var now uint64
	for i, e := range tr.Events {
		if e.Kind == trace.Alloc {
			sizes[tr.Slot[i]] = e.Size
			now += e.Size
		} else {
			now -= sizes[tr.Slot[i]]
		}
		sb.set(e.TimeUS, now)
		if now > d.PeakLive.Bytes {
			d.PeakLive = Peak{Bytes: now, Event: i, TimeUS: e.TimeUS}
		}
	}
	d.Live = sb.done()
}
