package report

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/gpumem/gpumem/policy"
	"github.com/gpumem/gpumem/trace"
)

const traceDir = "../testdata/traces/"

func readTrace(t testing.TB, text string) *trace.Trace {
	t.Helper()
	tr, err := trace.Read(strings.NewReader("# gpumem-trace v1\n"+text), "test.trace")
	if err != nil {
		t.Fatal(err)
	}
	return tr
}

func loadTrace(t testing.TB, name string) *trace.Trace {
	t.Helper()
	tr, err := trace.Load(traceDir + name + ".trace.gz")
	if err != nil {
		t.Fatal(err)
	}
	return tr
}

// randomTrace makes a trace of n events at random times (several often at
// one time) with random sizes, some requests live at the end.
func randomTrace(t testing.TB, seed uint64, n int) *trace.Trace {
	rng := rand.New(rand.NewPCG(seed, 1))
	var b strings.Builder
	var live []int
	id, now := 0, uint64(0)
	b.WriteString("s 1 forward model.py:10 < main train.py:3\ns 2 step optim.py:99\n")
	for i := 0; i < n; i++ {
		if rng.IntN(3) > 0 {
			now += uint64(rng.IntN(5000))
		}
		if len(live) > 0 && rng.IntN(2) == 0 {
			k := rng.IntN(len(live))
			fmt.Fprintf(&b, "f %d %d\n", live[k], now)
			live = slices.Delete(live, k, k+1)
			continue
		}
		size := 1 + rng.Uint64N(8*mib)
		if rng.IntN(20) == 0 {
			size = 1 + rng.Uint64N(300*mib)
		}
		fmt.Fprintf(&b, "a %d %d 0 %d", id, size, now)
		if site := rng.IntN(3); site > 0 {
			fmt.Fprintf(&b, " %d", site)
		}
		b.WriteString("\n")
		live = append(live, id)
		id++
	}
	return readTrace(t, b.String())
}

// stepExtremes is what a Series must hold, worked out the slow way: for
// each bucket, the least and greatest of the value at its start (0 before
// the first event) and after each event in it.
func stepExtremes(c Clock, times, values []uint64) (lo, hi []uint64) {
	lo, hi = make([]uint64, c.N), make([]uint64, c.N)
	for i := range c.N {
		var at uint64
		for j, t := range times {
			if c.bucket(t) < i {
				at = values[j]
			}
		}
		lo[i], hi[i] = at, at
		for j, t := range times {
			if c.bucket(t) == i {
				lo[i], hi[i] = min(lo[i], values[j]), max(hi[i], values[j])
			}
		}
	}
	return lo, hi
}

// replayPeak replays tr under a new allocator of p, the simple way, and
// returns its peak of reserved bytes, the first event at it with the most
// bytes served, and its OOMs.
func replayPeak(t *testing.T, tr *trace.Trace, p Policy) (peak uint64, at, ooms int) {
	t.Helper()
	a, err := p.New()
	if err != nil {
		t.Fatal(err)
	}
	addr, size := map[uint64]uint64{}, map[uint64]uint64{}
	var live, liveAtPeak uint64
	for i, e := range tr.Events {
		if e.Kind == trace.Alloc {
			x, err := a.Alloc(e.Size, e.Stream)
			if errors.Is(err, policy.ErrOutOfMemory) {
				ooms++
			} else if err != nil {
				t.Fatal(err)
			} else {
				addr[e.ID], size[e.ID] = x, e.Size
				live += e.Size
			}
		} else if x, ok := addr[e.ID]; ok {
			if err := a.Free(x); err != nil {
				t.Fatal(err)
			}
			live -= size[e.ID]
			delete(addr, e.ID)
		}
		if r := a.Reserved(); r > peak || r == peak && live > liveAtPeak {
			peak, at, liveAtPeak = r, i, live
		}
	}
	return peak, at, ooms
}

func TestSeriesKeepsExtremes(t *testing.T) {
	for seed := range uint64(20) {
		tr := randomTrace(t, seed, 400)
		times := make([]uint64, len(tr.Events))
		values := make([]uint64, len(tr.Events))
		size := map[uint64]uint64{}
		var live uint64
		for i, e := range tr.Events {
			if e.Kind == trace.Alloc {
				size[e.ID] = e.Size
				live += e.Size
			} else {
				live -= size[e.ID]
			}
			times[i], values[i] = e.TimeUS, live
		}
		for _, n := range []int{1, 7, 50, 1000} {
			d, err := Build(tr, nil, Options{Buckets: n})
			if err != nil {
				t.Fatal(err)
			}
			lo, hi := stepExtremes(d.Clock, times, values)
			if !slices.Equal(d.Live.Min, lo) || !slices.Equal(d.Live.Max, hi) {
				t.Fatalf("seed %d, %d buckets: live series\nmin %v\nmax %v\nwant\nmin %v\nmax %v", seed, n, d.Live.Min, d.Live.Max, lo, hi)
			}
			if m := slices.Max(d.Live.Max); m != tr.PeakLiveBytes {
				t.Fatalf("seed %d, %d buckets: greatest bucket %d, peak live %d", seed, n, m, tr.PeakLiveBytes)
			}
		}
	}
}

// A spike shorter than a bucket is kept: alloc 1 GiB and free it at once,
// among small requests over a long time.
func TestSeriesKeepsSpike(t *testing.T) {
	var b strings.Builder
	for i := range 1000 {
		fmt.Fprintf(&b, "a %d 1000 0 %d\nf %d %d\n", i, i*1000, i, i*1000+10)
		if i == 500 {
			fmt.Fprintf(&b, "a 5000 1073741824 0 500011\nf 5000 500012\n")
		}
	}
	tr := readTrace(t, b.String())
	d, err := Build(tr, []Policy{cachePolicy("cache", 1<<40)}, Options{Buckets: 20})
	if err != nil {
		t.Fatal(err)
	}
	i := d.Clock.bucket(500011)
	if d.Live.Max[i] != 1<<30 || d.PeakLive.Bytes != 1<<30 || d.PeakLive.TimeUS != 500011 {
		t.Errorf("bucket %d: max %d, peak %+v; want %d at 500011", i, d.Live.Max[i], d.PeakLive, 1<<30)
	}
	if d.Live.Min[i] != 0 {
		t.Errorf("bucket %d: min %d, want 0", i, d.Live.Min[i])
	}
	pd := d.Policies[0]
	if pd.Reserved.Max[i] != pd.PeakReserved.Bytes || pd.PeakReserved.Bytes != 1<<30+2*mib {
		t.Errorf("reserved: bucket max %d, peak %+v; want %d", pd.Reserved.Max[i], pd.PeakReserved, 1<<30+2*mib)
	}
}

func TestTimelinePeakIsReplayPeak(t *testing.T) {
	traces := []*trace.Trace{loadTrace(t, "resnet50_train"), randomTrace(t, 3, 3000)}
	for _, tr := range traces {
		p := cachePolicy("cache", 1<<40)
		d, err := Build(tr, []Policy{p, cachePolicy("small", 4<<30)}, Options{})
		if err != nil {
			t.Fatal(err)
		}
		if d.PeakLive.Bytes != tr.PeakLiveBytes || slices.Max(d.Live.Max) != tr.PeakLiveBytes {
			t.Errorf("%s: peak live %d, greatest bucket %d; the trace says %d", tr.Name, d.PeakLive.Bytes, slices.Max(d.Live.Max), tr.PeakLiveBytes)
		}
		if d.Live.Max[d.Clock.bucket(d.PeakLive.TimeUS)] != tr.PeakLiveBytes {
			t.Errorf("%s: the bucket of the peak's time does not hold the peak", tr.Name)
		}
		for k, pd := range d.Policies {
			peak, at, ooms := replayPeak(t, tr, []Policy{p, cachePolicy("small", 4<<30)}[k])
			if pd.PeakReserved.Bytes != peak || pd.PeakReserved.Event != at || pd.OOMs != ooms {
				t.Errorf("%s, %s: peak %+v, %d OOMs; the replay's is %d after event %d, %d OOMs", tr.Name, pd.Name, pd.PeakReserved, pd.OOMs, peak, at, ooms)
			}
			if m := slices.Max(pd.Reserved.Max); m != peak {
				t.Errorf("%s, %s: greatest bucket %d, replay's peak %d", tr.Name, pd.Name, m, peak)
			}
			if got := pd.Reserved.Max[d.Clock.bucket(pd.PeakReserved.TimeUS)]; got != peak {
				t.Errorf("%s, %s: the bucket of the peak's time holds %d, not the peak %d", tr.Name, pd.Name, got, peak)
			}
			if want := float64(peak) / float64(tr.PeakLiveBytes); pd.Ratio != want {
				t.Errorf("%s, %s: ratio %v, want %v", tr.Name, pd.Name, pd.Ratio, want)
			}
		}
		if d.Policies[1].OOMs == 0 && tr.PeakLiveBytes > 4<<30 {
			t.Errorf("%s: no OOM on a device smaller than the peak", tr.Name)
		}
	}
}

func TestMapAtPeakAddsUp(t *testing.T) {
	for _, tr := range []*trace.Trace{loadTrace(t, "resnet50_train"), randomTrace(t, 5, 3000)} {
		d, err := Build(tr, []Policy{cachePolicy("cache", 1<<40)}, Options{})
		if err != nil {
			t.Fatal(err)
		}
		pd := d.Policies[0]
		m := pd.Map
		if m.Reserved != pd.PeakReserved.Bytes || m.Used+m.Rounding+m.Split+m.Cached != m.Reserved {
			t.Errorf("%s: map %d reserved = %d used + %d rounding + %d split + %d cached; peak %d",
				tr.Name, m.Reserved, m.Used, m.Rounding, m.Split, m.Cached, pd.PeakReserved.Bytes)
		}
		var segs, used, rounding uint64
		for _, s := range m.Segments {
			var blocks uint64
			for i := 0; i < len(s.Blocks); i += 2 {
				size, req := s.Blocks[i], s.Blocks[i+1]
				blocks += size
				if req > 0 {
					used += req
					rounding += size - req
				}
			}
			if blocks != s.Size {
				t.Errorf("%s: segment %s of %d bytes has %d in blocks", tr.Name, s.Addr, s.Size, blocks)
			}
			segs += s.Size
		}
		if segs != m.Reserved || used != m.Used || rounding != m.Rounding {
			t.Errorf("%s: segments %d, used %d, rounding %d; map says %d, %d, %d", tr.Name, segs, used, rounding, m.Reserved, m.Used, m.Rounding)
		}
		// Used is the bytes live after the peak's event (no OOMs here).
		size := map[uint64]uint64{}
		var live uint64
		for _, e := range tr.Events[:pd.PeakReserved.Event+1] {
			if e.Kind == trace.Alloc {
				size[e.ID] = e.Size
				live += e.Size
			} else {
				live -= size[e.ID]
			}
		}
		if m.Used != live {
			t.Errorf("%s: used %d at the peak, %d live after event %d", tr.Name, m.Used, live, pd.PeakReserved.Event)
		}
		if m.Rounding == 0 || m.Split+m.Cached == 0 {
			t.Errorf("%s: the test allocator should round and cache: %+v", tr.Name, m)
		}
	}
}

func TestLargestAndSites(t *testing.T) {
	tr := randomTrace(t, 9, 4000)
	d, err := Build(tr, nil, Options{Largest: 10})
	if err != nil {
		t.Fatal(err)
	}
	var sizes []uint64
	for _, e := range tr.Events {
		if e.Kind == trace.Alloc {
			sizes = append(sizes, e.Size)
		}
	}
	slices.Sort(sizes)
	slices.Reverse(sizes)
	if len(d.Largest) != 10 {
		t.Fatalf("%d largest, want 10", len(d.Largest))
	}
	for i, r := range d.Largest {
		if r.Size != sizes[i] {
			t.Errorf("largest[%d] is %d bytes, want %d", i, r.Size, sizes[i])
		}
		if r.Site != 0 && d.Sites[r.Site] == "" {
			t.Errorf("largest[%d]: site %d has no text", i, r.Site)
		}
		if r.FreeUS >= 0 && uint64(r.FreeUS) < r.AllocUS {
			t.Errorf("largest[%d] freed at %d before its alloc at %d", i, r.FreeUS, r.AllocUS)
		}
	}
	// Three sites (none, 1, 2): all listed, and they hold the peak.
	var sum uint64
	for i, s := range d.AtPeak {
		sum += s.Bytes
		if i > 0 && s.Bytes > d.AtPeak[i-1].Bytes {
			t.Errorf("sites at the peak not sorted: %+v", d.AtPeak)
		}
	}
	if len(d.AtPeak) != 3 || sum != tr.PeakLiveBytes {
		t.Errorf("sites at the peak %+v add up to %d; want 3 sites and %d", d.AtPeak, sum, tr.PeakLiveBytes)
	}
	if d.Sites[1] != tr.Sites[1] || d.Sites[2] != tr.Sites[2] {
		t.Errorf("site texts %v", d.Sites)
	}

	// A trace without sites has no table of them.
	d, err = Build(loadTrace(t, "sweep_create_dispose"), nil, Options{})
	if err != nil {
		t.Fatal(err)
	}
	if len(d.AtPeak) != 0 || len(d.Sites) != 0 || len(d.Largest) != 25 {
		t.Errorf("sweep: %d sites at the peak, %d texts, %d largest; want 0, 0, 25", len(d.AtPeak), len(d.Sites), len(d.Largest))
	}
}

func TestShortSite(t *testing.T) {
	frame := "forward site-packages/torch/nn/modules/module.py:1775"
	long := strings.Repeat(frame+" < ", 100) + frame
	s := shortSite(long)
	if len(s) > maxSiteText+len(" < ...") || !strings.HasSuffix(s, frame+" < ...") || !strings.HasPrefix(long, strings.TrimSuffix(s, " < ...")) {
		t.Errorf("shortSite cut %d bytes to %d: ...%q", len(long), len(s), s[max(0, len(s)-80):])
	}
	if got := shortSite(frame); got != frame {
		t.Errorf("shortSite(%q) = %q", frame, got)
	}
	one := strings.Repeat("é", maxSiteText) // one frame, too long, cut at a rune
	if got := shortSite(one); !strings.HasSuffix(got, "é < ...") {
		t.Errorf("one long frame cut to ...%q", got[len(got)-12:])
	}
}

func TestRatio(t *testing.T) {
	c := Clock{T0: 0, Width: 100, N: 3}
	b := newRatioBuilder(c, nanV)
	b.set(0, 0.5)    // bucket 0: 0.5 for 50 us, then 0.1 for 50
	b.set(50, 0.1)   //
	b.set(150, nanV) // bucket 1: 0.1 for 50 us, then undefined
	// bucket 2: undefined throughout
	r := b.done()
	want := Ratio{Min: []float64{0.1, 0.1, -1}, Max: []float64{0.5, 0.1, -1}, Mean: []float64{0.3, 0.1, -1}}
	if !slices.Equal(r.Min, want.Min) || !slices.Equal(r.Max, want.Max) || !slices.Equal(r.Mean, want.Mean) {
		t.Errorf("ratio %+v, want %+v", r, want)
	}
	// Fragmentation stays within its bounds on a real trace.
	d, err := Build(loadTrace(t, "resnet50_train"), []Policy{cachePolicy("cache", 1<<40)}, Options{})
	if err != nil {
		t.Fatal(err)
	}
	f := d.Policies[0].Frag
	for i := range f.Mean {
		if f.Mean[i] == -1 && f.Min[i] == -1 && f.Max[i] == -1 {
			continue
		}
		if !(0 <= f.Min[i] && f.Min[i] <= f.Mean[i] && f.Mean[i] <= f.Max[i] && f.Max[i] <= 1) {
			t.Fatalf("bucket %d: fragmentation %v <= %v <= %v out of order or bounds", i, f.Min[i], f.Mean[i], f.Max[i])
		}
	}
	free := d.Policies[0].Free
	if len(free) != 240 {
		t.Errorf("%d free samples, want 240", len(free))
	}
	for i, s := range free {
		if s.Largest > s.Bytes || i > 0 && s.TimeUS <= free[i-1].TimeUS {
			t.Fatalf("free sample %d: %+v after %+v", i, s, free[max(i-1, 0)])
		}
	}
}

var nanV = math.NaN()

// A policy that takes its memory at start: its series starts there, its
// peak is its fullest moment at that size, and its map is read there.
func TestPreallocated(t *testing.T) {
	tr := loadTrace(t, "resnet50_train")
	const prealloc = 8 << 30 // more than the trace needs: it never grows
	p := Policy{Name: "prealloc", New: func() (policy.Allocator, error) {
		c := newCache(1 << 40)
		c.reserve(prealloc)
		return c, nil
	}}
	d, err := Build(tr, []Policy{p}, Options{})
	if err != nil {
		t.Fatal(err)
	}
	pd := d.Policies[0]
	if pd.Reserved.Min[0] != prealloc || slices.Min(pd.Reserved.Min) != prealloc || pd.PeakReserved.Bytes != prealloc {
		t.Errorf("reserved from %d (least %d), peak %d; want %d throughout", pd.Reserved.Min[0], slices.Min(pd.Reserved.Min), pd.PeakReserved.Bytes, prealloc)
	}
	if pd.PeakReserved.Event != d.PeakLive.Event || pd.LiveAtPeak != tr.PeakLiveBytes || pd.Map.Used != tr.PeakLiveBytes {
		t.Errorf("peak at event %d with %d served, map used %d; want the live peak's event %d, %d", pd.PeakReserved.Event, pd.LiveAtPeak, pd.Map.Used, d.PeakLive.Event, tr.PeakLiveBytes)
	}
	if pd.Frag.Max[0] != 1 {
		t.Errorf("fragmentation in the first bucket up to %v; want 1 (all reserved, nothing live)", pd.Frag.Max[0])
	}
}

func TestBuildErrors(t *testing.T) {
	tr := randomTrace(t, 1, 300)
	calls := 0
	for _, tc := range []struct {
		name string
		tr   *trace.Trace
		ps   []Policy
		want string // a regexp
	}{
		{"no events", readTrace(t, ""), nil, `^report: trace test has no events$`},
		{"no name", tr, []Policy{{New: cachePolicy("x", 1).New}}, `^report: a policy needs a name and a constructor \(got ""\)$`},
		{"no constructor", tr, []Policy{{Name: "x"}}, `^report: a policy needs a name and a constructor \(got "x"\)$`},
		{"twice", tr, []Policy{cachePolicy("x", 1<<40), cachePolicy("x", 1<<40)}, `^report: policy "x" given twice$`},
		{"constructor fails", tr, []Policy{{Name: "x", New: func() (policy.Allocator, error) { return nil, errors.New("no device") }}},
			`^report: trace test: policy x: no device$`},
		{"segments off reserved", tr, []Policy{{Name: "x", New: func() (policy.Allocator, error) { return &broken{newCache(1 << 40), "reserved"}, nil }}},
			`^report: trace test: policy x: at its peak \(event \d+\): its \d+ segments add up to \d+ bytes, but it reserves \d+$`},
		{"blocks with a gap", tr, []Policy{{Name: "x", New: func() (policy.Allocator, error) { return &broken{newCache(1 << 40), "gap"}, nil }}},
			`^report: trace test: policy x: at its peak \(event \d+\): segment 0x10000000000 \(\d+ bytes\): block 0 is at 0x[0-9a-f]+, want 0x10000000000 \(the blocks must tile the segment in order\)$`},
		{"not deterministic", tr, []Policy{{Name: "x", New: func() (policy.Allocator, error) {
			calls++
			c := newCache(1 << 40)
			if calls%2 == 0 {
				c.reserve(2 * mib)
			}
			return c, nil
		}}}, `^report: trace test: policy x: the policy is not deterministic: after event \d+ it reserved \d+ bytes and served \d+ in one replay, \d+ and \d+ in another$`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Build(tc.tr, tc.ps, Options{})
			if err == nil || !regexp.MustCompile(tc.want).MatchString(err.Error()) {
				t.Errorf("error %v; want %s", err, tc.want)
			}
		})
	}
}
