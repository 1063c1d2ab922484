package sim

import (
	"fmt"
	"math/bits"
	"sort"
	"strings"
	"sync"

	"github.com/gpumem/gpumem/device"
	"github.com/gpumem/gpumem/internal/faults"
)

// Defaults applied by New to zero fields of Config.
const (
	DefaultCapacity    = 80 << 30 // 80 GiB
	DefaultGranularity = 2 << 20  // 2 MiB
	DefaultName        = "sim"
)

// Address layout. Plain allocations and reservations come from disjoint
// ranges and are never reused; both stay below 1<<63 so that addresses fit
// in an int64 as well. As under CUDA's unified addressing, devices of
// different ordinals get disjoint parts of each range (maxOrdinals parts),
// so an address names its device.
const (
	plainBase   = 1 << 40
	plainLimit  = 1 << 60
	vaBase      = 1 << 60
	vaLimit     = 1 << 63
	maxOrdinals = 64
	plainPart   = (plainLimit - plainBase) / maxOrdinals
	vaPart      = (vaLimit - vaBase) / maxOrdinals
)

// Config configures a simulated device. Zero fields take the defaults.
type Config struct {
	Capacity    uint64 // bytes of device memory; default 80 GiB
	Granularity uint64 // VM granularity and Alloc rounding; power of two >= 4096; default 2 MiB
	Name        string // Info().Name; default "sim"
	Ordinal     int    // Info().Ordinal, 0 to 63; picks the device's part of the address space
	// QueryLag makes every recorded event report not done to its first
	// QueryLag queries, done work or not: a GPU takes microseconds to reach
	// a record even on an idle stream, so a query right after a record
	// finds it pending. 0: an event on an idle stream is done at once.
	QueryLag int
	// RunAhead is how far, in microseconds of SetTime's clock, the host
	// runs ahead of the GPU: an event recorded at time t reports not done
	// to every query before t+RunAhead, unless the host has waited for
	// it since (Wait, Synchronize, SynchronizeStream). A program that
	// does not synchronize at each step runs whole steps ahead; a replay
	// that sets the clock to each event's trace time models it. 0: the GPU
	// keeps up.
	RunAhead uint64
	// NoMarkers makes the device one without host-visible stream markers
	// (device.Markers), as a GPU without 64-bit stream memory operations:
	// NewMarker fails with device.ErrUnsupported.
	NoMarkers bool
}

// Device is a simulated GPU. It implements device.Device,
// device.VirtualMemory, device.Events, device.Markers (markers.go),
// device.Streams and device.Capture. Create one with New.
type Device struct {
	name    string
	ordinal int
	cap     uint64
	gran    uint64
	// queryLag is Config.QueryLag; runAhead Config.RunAhead; now the
	// clock SetTime sets (microseconds).
	queryLag                     int
	runAhead, now, base, lastSet uint64
	noMarkers                    bool // Config.NoMarkers

	mu        sync.Mutex
	used      uint64
	shrunk    uint64
	nextPlain uint64
	nextVA    uint64
	plainEnd  uint64        // the end of this device's part of the plain range
	vaEnd     uint64        // and of the virtual range
	nextH     device.Handle // last handle given out
	nextE     device.Event  // last event given out
	nextM     device.Marker // last marker given out

	allocs  tree[allocRec]
	resv    tree[resvRec]
	maps    tree[mapRec]
	handles map[device.Handle]handleRec
	events  map[device.Event]eventRec
	markers map[device.Marker]*markerRec

	streams        []*stream           // by id; nil once destroyed and idle
	captures       map[uint64]*capture // by id (capture.go)
	nextCapture    uint64
	graph          graphNodes // the nodes captures have made (capture.go)
	busy           []*stream  // streams with pending items
	pendingTouches int

	faults *faults.Injector // FailNth, FailOOM
	st     Stats

	// scratch, reused to keep the hot paths allocation-free
	stack   []frame
	scratch []*stream
	epoch   uint64
}

var (
	_ device.Device        = (*Device)(nil)
	_ device.VirtualMemory = (*Device)(nil)
	_ device.Events        = (*Device)(nil)
	_ device.Markers       = (*Device)(nil)
	_ device.Streams       = (*Device)(nil)
	_ device.Capture       = (*Device)(nil)
)

type allocRec struct {
	size    uint64 // requested
	rounded uint64 // charged
}

type resvRec struct {
	size     uint64
	mappings int
}

type mapRec struct {
	size   uint64
	h      device.Handle
	resv   uint64 // start of the enclosing reservation
	access bool
}

type handleRec struct {
	size     uint64
	mapCount int
	released bool
	// words: what Poke wrote and Copy copied into the chunk, by offset (the
	// content model: a word per address written, nil until one is).
	words map[uint64]uint64
}

// MaxCapacity is the most memory a simulated device models: 4 TiB, 14
// times the most a GPU has. An allocator's books grow with its device
// (gpumem's: an arena of address space twice the device's size, a record
// per 2 MiB chunk of it: 60 MiB at 4 TiB, 13 GiB and half a minute at
// 1 PiB), so a larger simulated device would cost the host more than any
// plan could use.
const MaxCapacity = 4 << 40

// New returns a simulated device, or an error if cfg is nonsense: a
// granularity that is not a power of two >= 4096, or a capacity smaller than
// one granule or larger than MaxCapacity.
func New(cfg Config) (*Device, error) {
	if cfg.Capacity == 0 {
		cfg.Capacity = DefaultCapacity
	}
	if cfg.Granularity == 0 {
		cfg.Granularity = DefaultGranularity
	}
	if cfg.Name == "" {
		cfg.Name = DefaultName
	}
	g := cfg.Granularity
	if g < 4096 || g&(g-1) != 0 {
		return nil, fmt.Errorf("sim: granularity %d is not a power of two >= 4096", g)
	}
	if g > 1<<40 {
		return nil, fmt.Errorf("sim: granularity %d is larger than 1 TiB", g)
	}
	if cfg.Capacity < g {
		return nil, fmt.Errorf("sim: capacity %d is smaller than one granule (%d)", cfg.Capacity, g)
	}
	if cfg.Capacity > MaxCapacity {
		return nil, fmt.Errorf("sim: capacity %d is more than %d bytes (4 TiB), the most a simulated device models", cfg.Capacity, uint64(MaxCapacity))
	}
	if cfg.Ordinal < 0 || cfg.Ordinal >= maxOrdinals {
		return nil, fmt.Errorf("sim: ordinal %d: want 0 to %d", cfg.Ordinal, maxOrdinals-1)
	}
	o := uint64(cfg.Ordinal)
	d := &Device{
		name:      cfg.Name,
		cap:       cfg.Capacity,
		gran:      g,
		queryLag:  max(cfg.QueryLag, 0),
		runAhead:  cfg.RunAhead,
		noMarkers: cfg.NoMarkers,
		ordinal:   cfg.Ordinal,
		nextPlain: plainBase + o*plainPart,
		plainEnd:  plainBase + (o+1)*plainPart,
		nextVA:    vaBase + o*vaPart,
		vaEnd:     vaBase + (o+1)*vaPart,
		handles:   make(map[device.Handle]handleRec),
		events:    make(map[device.Event]eventRec),
		markers:   make(map[device.Marker]*markerRec),
		faults:    faults.New(faults.DeviceOps...),
	}
	d.streams = []*stream{{id: 0, busyIdx: -1}}
	return d, nil
}

// MustNew is New for tests: it panics if cfg is invalid.
func MustNew(cfg Config) *Device {
	d, err := New(cfg)
	if err != nil {
		panic(err)
	}
	return d
}

// Info describes the device: its name, ordinal 0 and its capacity.
func (d *Device) Info() device.Info {
	return device.Info{Name: d.name, Ordinal: d.ordinal, Total: d.cap}
}

// Granularity returns Config.Granularity.
func (d *Device) Granularity() uint64 { return d.gran }

// MemInfo returns (capacity - shrunk - used, capacity).
func (d *Device) MemInfo() (free, total uint64, err error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if err := d.fault(opMemInfo); err != nil {
		return 0, 0, &device.OpError{Op: "sim.MemInfo", Err: err}
	}
	return d.avail(), d.cap, nil
}

func (d *Device) avail() uint64 { return d.cap - d.shrunk - d.used }

func (d *Device) oom(n uint64) error {
	return errf(device.ErrOutOfMemory, "need %d bytes, %d free (capacity %d, used %d, shrunk %d)",
		n, d.avail(), d.cap, d.used, d.shrunk)
}

// charge takes n bytes of device memory or fails with ErrOutOfMemory.
func (d *Device) charge(n uint64) error {
	if n > d.avail() {
		return d.oom(n)
	}
	d.used += n
	if d.used > d.st.PeakUsed {
		d.st.PeakUsed = d.used
	}
	return nil
}

// Alloc allocates size bytes, charging size rounded up to the granularity.
// The address is granularity-aligned.
func (d *Device) Alloc(size uint64) (device.Ptr, error) {
	d.mu.Lock()
	p, err := d.alloc(size)
	d.mu.Unlock()
	if err != nil {
		return 0, &device.OpError{Op: "sim.Alloc", Args: fmt.Sprintf("size=%d", size), Err: err}
	}
	return p, nil
}

func (d *Device) alloc(size uint64) (device.Ptr, error) {
	if err := d.fault(opAlloc); err != nil {
		return 0, err
	}
	if size == 0 {
		return 0, errf(device.ErrInvalid, "size is 0")
	}
	if size > d.cap { // also keeps roundUp from overflowing
		return 0, d.oom(size)
	}
	rounded := roundUp(size, d.gran)
	p := d.nextPlain
	if rounded+d.gran > d.plainEnd-p {
		return 0, errf(device.ErrOutOfMemory, "simulated address space for plain allocations exhausted")
	}
	if err := d.charge(rounded); err != nil {
		return 0, err
	}
	d.nextPlain = p + rounded + d.gran
	d.allocs.insert(p, allocRec{size: size, rounded: rounded})
	d.st.Allocs++
	return device.Ptr(p), nil
}

// Free frees an allocation made by Alloc. It fails if pending Touch work
// uses the allocation.
func (d *Device) Free(p device.Ptr) error {
	d.mu.Lock()
	err := d.free(p)
	d.mu.Unlock()
	if err != nil {
		return &device.OpError{Op: "sim.Free", Args: fmt.Sprintf("p=%#x", uint64(p)), Err: err}
	}
	return nil
}

func (d *Device) free(p device.Ptr) error {
	if err := d.fault(opFree); err != nil {
		return err
	}
	a := uint64(p)
	i := d.allocs.find(a)
	if i == 0 {
		if j := d.allocs.floor(a); j != 0 && a < d.allocs.key(j)+d.allocs.val(j).size {
			return errf(device.ErrInvalid, "%#x is inside the allocation at %#x, not its start", a, d.allocs.key(j))
		}
		if a >= vaBase {
			return errf(device.ErrInvalid, "%#x is a virtual-memory address, not an Alloc result", a)
		}
		return errf(device.ErrInvalid, "no live allocation at %#x (never allocated, or already freed)", a)
	}
	rec := *d.allocs.val(i)
	if err := d.checkIdle(a, rec.size); err != nil {
		return err
	}
	d.allocs.remove(a)
	d.used -= rec.rounded
	d.st.Frees++
	return nil
}

// Synchronize completes all work on all streams (see the package comment:
// it never blocks). Holds stay in force for work enqueued later.
func (d *Device) Synchronize() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if err := d.fault(opSynchronize); err != nil {
		return &device.OpError{Op: "sim.Synchronize", Err: err}
	}
	if err := d.refuseAnyCapture("sim.Synchronize"); err != nil {
		return err
	}
	d.completeAll()
	d.caughtUp(0, true)
	d.st.Synchronizes++
	return nil
}

// SetTime sets the device's clock to us microseconds, for
// Config.RunAhead: a replay sets it to each event's time. The clock never
// goes back: a time before the last one given starts a new run of the
// times (a trace's next pass), after the last.
func (d *Device) SetTime(us uint64) {
	d.mu.Lock()
	if us < d.lastSet {
		d.base = d.now + 1
	}
	d.lastSet = us
	d.now = max(d.now, d.base+us)
	d.mu.Unlock()
}

// Stats are the device's counters. Call counters count successful calls.
type Stats struct {
	Used            uint64 // bytes charged now (plain allocations rounded, chunks not yet freed)
	PeakUsed        uint64 // high-water mark of Used since New or ResetPeak
	Shrunk          uint64 // bytes taken by Shrink
	ReservedAddress uint64 // bytes of address space reserved now
	Mapped          uint64 // bytes mapped now

	Allocs, Frees                    uint64
	Reserves, AddressReleases        uint64
	Creates, Releases                uint64
	Maps, Unmaps, SetAccessCalls     uint64
	Records, Queries, Waits          uint64
	Marks, MarkerReads               uint64 // Mark, and Reached (a load on a GPU, no driver call)
	StreamWaits                      uint64
	Synchronizes                     uint64 // Synchronize and SynchronizeStream
	CaptureViolations                uint64 // calls refused because a stream captured (capture.go): each broke a capture
	GraphQueries                     uint64 // CaptureTerminals and NodeParents on capturing streams and graph nodes
	Touches                          uint64
	Copies, CopiedBytes              uint64
	Injected                         uint64 // failures injected by FailNth and FailOOM
	LiveAllocs, LiveHandles          int    // plain allocations and handles (incl. released but mapped)
	LiveMappings, LiveReservations   int
	LiveEvents, LiveStreams, Pending int // Pending: work items not yet completed, all streams
	LiveMarkers                      int
}

// Stats returns a snapshot of the counters.
func (d *Device) Stats() Stats {
	d.mu.Lock()
	defer d.mu.Unlock()
	s := d.st
	s.Used = d.used
	s.Shrunk = d.shrunk
	s.LiveAllocs = d.allocs.len()
	s.LiveHandles = len(d.handles)
	s.LiveMappings = d.maps.len()
	s.LiveReservations = d.resv.len()
	s.LiveEvents = len(d.events)
	s.LiveMarkers = len(d.markers)
	s.LiveStreams = 0
	s.Pending = 0
	for _, st := range d.streams {
		if st != nil && !st.destroyed {
			s.LiveStreams++
		}
	}
	for _, st := range d.busy {
		s.Pending += len(st.q) - st.head
	}
	return s
}

// ResetPeak sets PeakUsed to the current Used.
func (d *Device) ResetPeak() {
	d.mu.Lock()
	d.st.PeakUsed = d.used
	d.mu.Unlock()
}

// Leaks returns nil if no plain allocation, physical handle, mapping or
// reservation is live, and otherwise an error listing them (in address or
// handle order). Events and streams are not counted (see Stats).
func (d *Device) Leaks() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	const show = 8
	var parts []string
	n := 0
	list := func(kind string, count int, items []string) {
		if count == 0 {
			return
		}
		n += count
		s := fmt.Sprintf("%d %s: %s", count, kind, strings.Join(items, ", "))
		if count > len(items) {
			s += fmt.Sprintf(", and %d more", count-len(items))
		}
		parts = append(parts, s)
	}
	var items []string
	d.allocs.each(func(k uint64, v *allocRec) bool {
		items = append(items, fmt.Sprintf("%#x (%d bytes)", k, v.size))
		return len(items) < show
	})
	list("allocation(s)", d.allocs.len(), items)

	items = nil
	hs := make([]device.Handle, 0, len(d.handles))
	for h := range d.handles {
		hs = append(hs, h)
	}
	sort.Slice(hs, func(i, j int) bool { return hs[i] < hs[j] })
	for _, h := range hs {
		if len(items) == show {
			break
		}
		r := d.handles[h]
		s := fmt.Sprintf("%d (%d bytes, mapped %d time(s)", h, r.size, r.mapCount)
		if r.released {
			s += ", released"
		}
		items = append(items, s+")")
	}
	list("handle(s)", len(hs), items)

	items = nil
	d.maps.each(func(k uint64, v *mapRec) bool {
		items = append(items, fmt.Sprintf("[%#x, %#x) of handle %d", k, k+v.size, v.h))
		return len(items) < show
	})
	list("mapping(s)", d.maps.len(), items)

	items = nil
	d.resv.each(func(k uint64, v *resvRec) bool {
		items = append(items, fmt.Sprintf("[%#x, %#x)", k, k+v.size))
		return len(items) < show
	})
	list("reservation(s)", d.resv.len(), items)

	if n == 0 {
		return nil
	}
	return fmt.Errorf("sim %q: %d leaked object(s): %s", d.name, n, strings.Join(parts, "; "))
}

// errf returns an error wrapping kind (a sentinel of package device) with a
// message.
func errf(kind error, format string, a ...any) error {
	return &detailError{kind: kind, msg: fmt.Sprintf(format, a...)}
}

type detailError struct {
	kind error
	msg  string
}

func (e *detailError) Error() string { return e.kind.Error() + ": " + e.msg }
func (e *detailError) Unwrap() error { return e.kind }

// roundUp rounds n up to a multiple of g (a power of two); n+g must not
// overflow.
func roundUp(n, g uint64) uint64 { return (n + g - 1) &^ (g - 1) }

// rangeEnd returns p+size and whether it did not overflow.
func rangeEnd(p, size uint64) (uint64, bool) {
	e, carry := bits.Add64(p, size, 0)
	return e, carry == 0
}
