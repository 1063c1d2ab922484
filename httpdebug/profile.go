package httpdebug

import (
	"runtime"
	"time"

	"github.com/google/pprof/profile"

	"github.com/gpumem/gpumem"
)

// Profile is the device memory of the allocators as a pprof profile, built
// with Google's profile package: one sample per call stack, with the four
// sample types of Go's heap profile: alloc_objects and alloc_space (every
// allocation since the allocator began, freed or not) and inuse_objects
// and inuse_space (what is live; the default). Call stacks come from
// Config.RecordSites; buffers allocated without them are one sample at a
// location named "gpumem: no call site (set RecordSites)", with no alloc_*
// counts (gpumem keeps those per stack only while it records stacks).
// `go tool pprof` opens it.
func Profile(allocators []*gpumem.Allocator) *profile.Profile {
	p := &profile.Profile{
		SampleType: []*profile.ValueType{
			{Type: "alloc_objects", Unit: "count"},
			{Type: "alloc_space", Unit: "bytes"},
			{Type: "inuse_objects", Unit: "count"},
			{Type: "inuse_space", Unit: "bytes"},
		},
		DefaultSampleType: "inuse_space",
		PeriodType:        &profile.ValueType{Type: "space", Unit: "bytes"},
		Period:            1,
		TimeNanos:         time.Now().UnixNano(),
	}
	b := builder{p: p, locs: map[uintptr]*profile.Location{}, funcs: map[string]*profile.Function{}}
	samples := map[string]*profile.Sample{}
	sample := func(stack []uintptr) *profile.Sample {
		key := gpumem.StackKey(stack)
		s := samples[key]
		if s == nil {
			s = &profile.Sample{Value: []int64{0, 0, 0, 0}, Location: b.stack(stack)}
			samples[key] = s
			p.Sample = append(p.Sample, s)
		}
		return s
	}
	for _, a := range allocators {
		for _, t := range a.SiteTotals() {
			s := sample(t.Stack)
			s.Value[0] += int64(t.Allocs)
			s.Value[1] += int64(t.Bytes)
		}
		for _, seg := range a.Snapshot().Segments {
			for _, blk := range seg.Blocks {
				if blk.State != "allocated" {
					continue
				}
				s := sample(blk.Stack)
				s.Value[2]++
				s.Value[3] += int64(blk.Requested)
			}
		}
	}
	return p
}

type builder struct {
	p     *profile.Profile
	locs  map[uintptr]*profile.Location
	funcs map[string]*profile.Function
	none  *profile.Location
}

func (b *builder) function(name, file string) *profile.Function {
	f := b.funcs[name]
	if f == nil {
		f = &profile.Function{ID: uint64(len(b.p.Function) + 1), Name: name, SystemName: name, Filename: file}
		b.funcs[name] = f
		b.p.Function = append(b.p.Function, f)
	}
	return f
}

func (b *builder) stack(pcs []uintptr) []*profile.Location {
	if len(pcs) == 0 {
		if b.none == nil {
			b.none = &profile.Location{ID: uint64(len(b.p.Location) + 1),
				Line: []profile.Line{{Function: b.function("gpumem: no call site (set RecordSites)", "")}}}
			b.p.Location = append(b.p.Location, b.none)
		}
		return []*profile.Location{b.none}
	}
	var out []*profile.Location
	for _, pc := range pcs {
		loc := b.locs[pc]
		if loc == nil {
			loc = &profile.Location{ID: uint64(len(b.p.Location) + 1), Address: uint64(pc)}
			frames := runtime.CallersFrames([]uintptr{pc})
			for {
				fr, more := frames.Next()
				if fr.Function != "" {
					loc.Line = append(loc.Line, profile.Line{Function: b.function(fr.Function, fr.File), Line: int64(fr.Line)})
				}
				if !more {
					break
				}
			}
			b.locs[pc] = loc
			b.p.Location = append(b.p.Location, loc)
		}
		out = append(out, loc)
	}
	return out
}
