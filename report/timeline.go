package report

// See doc.go for the overview.

import "math"

// A Clock divides a trace's time, from its first event to its last, into
// N buckets of equal width: bucket i covers [T0 + i*Width, T0 +
// (i+1)*Width) microseconds. The last event falls in bucket N-1.
type Clock struct {
	T0    uint64  `json:"t0_us"`    // time of the first event, microseconds
	Width float64 `json:"width_us"` // microseconds per bucket, > 0
	N     int     `json:"n"`        // buckets, >= 1
}

// newClock spreads the times first..last over at most n buckets, and over
// one when the trace has no duration.
func newClock(first, last uint64, n int) Clock {
	if last <= first || n < 1 {
		return Clock{T0: first, Width: 1, N: 1}
	}
	// last-first+1 so that last falls inside bucket n-1, not at its end.
	return Clock{T0: first, Width: float64(last-first+1) / float64(n), N: n}
}

// bucket returns the bucket of time t (clamped to the Clock's range).
func (c Clock) bucket(t uint64) int {
	if t <= c.T0 {
		return 0
	}
	i := int(float64(t-c.T0) / c.Width)
	return min(i, c.N-1)
}

// start returns the time at which bucket i begins, in microseconds.
func (c Clock) start(i int) float64 { return float64(c.T0) + float64(i)*c.Width }

// Series is a quantity that changes at events (bytes live, bytes reserved),
// downsampled to the buckets of the trace's Clock. Min[i] and Max[i] are the
// least and greatest values it took while bucket i lasted: the value it had
// when the bucket began and the value after each event in it. So no extreme
// is lost however many events share a bucket, and the greatest Max is the
// quantity's peak, exactly.
//
// Invariant: len(Min) == len(Max) == the Clock's N, and Min[i] <= Max[i].
type Series struct {
	Min []uint64 `json:"min"`
	Max []uint64 `json:"max"`
}

// seriesBuilder fills a Series from a value sampled after each event, in
// time order, starting from the value before the first event.
type seriesBuilder struct {
	c   Clock
	s   Series
	cur int    // bucket of the last value set
	val uint64 // the value now
}

func newSeriesBuilder(c Clock, start uint64) *seriesBuilder {
	b := &seriesBuilder{c: c, s: Series{Min: make([]uint64, c.N), Max: make([]uint64, c.N)}, val: start}
	b.s.Min[0], b.s.Max[0] = start, start
	return b
}

// set records that the value became v at time t (after an event at t).
func (b *seriesBuilder) set(t, v uint64) {
	i := b.c.bucket(t)
	if i != b.cur {
		b.carry(i)
	}
	b.val = v
	b.s.Min[i] = min(b.s.Min[i], v)
	b.s.Max[i] = max(b.s.Max[i], v)
}

// carry closes the buckets before i: the ones between the last value set
// and i held that value throughout, and bucket i begins with it.
func (b *seriesBuilder) carry(i int) {
	for j := b.cur + 1; j <= i; j++ {
		b.s.Min[j], b.s.Max[j] = b.val, b.val
	}
	b.cur = i
}

// done closes the remaining buckets and returns the series.
func (b *seriesBuilder) done() Series {
	b.carry(b.c.N - 1)
	return b.s
}

// Ratio is a fraction between 0 and 1 that changes at events
// (fragmentation), downsampled like a Series, with the time-weighted mean
// of each bucket besides its extremes. Where the fraction is undefined (no
// memory reserved) a bucket's values are -1; a bucket partly undefined is
// described by its defined part. Values are rounded to four decimals.
//
// Invariant: for every bucket, Min[i] <= Mean[i] <= Max[i], or all three
// are -1.
type Ratio struct {
	Min  []float64 `json:"min"`
	Max  []float64 `json:"max"`
	Mean []float64 `json:"mean"`
}

// ratioBuilder fills a Ratio from values set after each event.
type ratioBuilder struct {
	c   Clock
	min []float64
	max []float64
	sum []float64 // integral of the value over the bucket's defined time
	dur []float64 // the bucket's defined time
	cur int
	at  float64 // time of the last value set, microseconds
	val float64 // the value now; NaN when undefined
}

// newRatioBuilder starts a ratio whose value before the first event is
// start (NaN: undefined).
func newRatioBuilder(c Clock, start float64) *ratioBuilder {
	b := &ratioBuilder{c: c, min: make([]float64, c.N), max: make([]float64, c.N),
		sum: make([]float64, c.N), dur: make([]float64, c.N), at: float64(c.T0), val: start}
	for i := range b.min {
		b.min[i], b.max[i] = math.Inf(1), math.Inf(-1)
	}
	b.note(0)
	return b
}

// set records that the value became v at time t; v is NaN for undefined.
func (b *ratioBuilder) set(t uint64, v float64) {
	i := b.c.bucket(t)
	b.advance(i, float64(t))
	b.val = v
	if !math.IsNaN(v) {
		b.min[i] = min(b.min[i], v)
		b.max[i] = max(b.max[i], v)
	}
}

// advance integrates the current value up to time t in bucket i, closing
// the buckets between.
func (b *ratioBuilder) advance(i int, t float64) {
	for b.cur < i {
		end := b.c.start(b.cur + 1)
		b.integrate(b.cur, end)
		b.cur++
		b.note(b.cur) // the bucket begins with the value now
	}
	b.integrate(i, t)
}

func (b *ratioBuilder) integrate(i int, t float64) {
	if dt := t - b.at; dt > 0 && !math.IsNaN(b.val) {
		b.sum[i] += b.val * dt
		b.dur[i] += dt
	}
	b.at = max(b.at, t)
}

func (b *ratioBuilder) note(i int) {
	if !math.IsNaN(b.val) {
		b.min[i] = min(b.min[i], b.val)
		b.max[i] = max(b.max[i], b.val)
	}
}

// done closes the remaining buckets and returns the ratio.
func (b *ratioBuilder) done() Ratio {
	last := b.c.N - 1
	b.advance(last, b.c.start(last+1))
	r := Ratio{Min: b.min, Max: b.max, Mean: make([]float64, b.c.N)}
	for i := range r.Mean {
		switch {
		case math.IsInf(r.Min[i], 1): // never defined in this bucket
			r.Min[i], r.Max[i], r.Mean[i] = -1, -1, -1
		case b.dur[i] > 0:
			r.Mean[i] = min(max(b.sum[i]/b.dur[i], r.Min[i]), r.Max[i])
		default: // defined only at instants, between events at one time
			r.Mean[i] = r.Max[i]
		}
		r.Min[i], r.Max[i], r.Mean[i] = round4(r.Min[i]), round4(r.Max[i]), round4(r.Mean[i])
	}
	return r
}

func round4(x float64) float64 { return math.Round(x*1e4) / 1e4 }
