// Package host runs gpumem inside another program: the C library libgpumem
// (clib/), which PyTorch, CuPy and the preload shim load, keeps one Host per
// process. A Host holds one allocator per device, made on the first call
// that names the device, configured from a configuration string (see
// Config: GPUMEM_CONFIG, or Configure), and finds buffers by address, since
// a C caller frees by pointer alone (table.go). Everything here is plain Go,
// tested without cgo; the C boundary in clib/ only converts.
//
// Concurrency: every method is safe for concurrent use. The hot pair,
// Alloc and Free, takes no Host-wide lock: the device is found by an atomic
// load, the buffer by one table shard's lock, and the allocator's own
// per-stream locks do the rest.
package host

import (
	"errors"
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/gpumem/gpumem"
	"github.com/gpumem/gpumem/device"
	"github.com/gpumem/gpumem/device/cuda"
	"github.com/gpumem/gpumem/device/sim"
)

// MaxDevices bounds the device ordinals a Host serves.
const MaxDevices = 64

// OpenFunc opens the device with the given ordinal for an allocator and
// returns it with the function that closes it.
type OpenFunc func(ordinal int, cfg Config) (device.Device, func() error, error)

// Host is the process-wide set of allocators of a program that hosts
// gpumem. The zero value is not usable: call New.
type Host struct {
	open OpenFunc

	mu      sync.Mutex // guards cfg, cfgErr and the making of devices
	cfg     Config
	cfgErr  error // the environment's configuration was bad: every call fails with it
	started bool  // a device exists: only the limit may still change

	served     string // the address served over HTTP, "" if none (serve.go)
	serveTried bool

	uncached atomic.Bool // the cache is off (SetCaching)
	// captureReuse: reuse within a capture, for devices opened later too
	// (SetCaptureReuse; under mu)
	captureReuse bool

	devs [MaxDevices]atomic.Pointer[Device]

	gate gpumem.Gate // the process's launch gate (SetGate), nil for none; under mu
}

// Device is one device's allocator and what the host keeps beside it.
type Device struct {
	Ordinal int
	Alloc   *gpumem.Allocator
	dev     device.Device
	closeFn func() error
	tab     table
	rec     atomic.Pointer[recorder] // nil unless recording
	outside outside                  // the process's memory outside gpumem (outside.go)
	pools   pools                    // private pools: CUDA graphs' memory (pools.go)
	hist    atomic.Pointer[history]  // nil unless the history is on (history.go)
}

// New makes a Host whose configuration is env (the value of GPUMEM_CONFIG;
// "" for the defaults), opening devices with open (nil: OpenDevice). A bad
// env is not an error here: it is returned, naming GPUMEM_CONFIG, by every
// call that needs a device, so that the host program sees it where it
// first uses gpumem.
func New(env string, open OpenFunc) *Host {
	if open == nil {
		open = OpenDevice
	}
	h := &Host{open: open}
	cfg, err := ParseConfig(env)
	if err != nil {
		h.cfgErr = fmt.Errorf("GPUMEM_CONFIG=%q: %w", env, err)
	}
	h.cfg = cfg
	return h
}

// OpenDevice opens the CUDA device with the given ordinal, or a simulated
// device when the configuration says device=sim.
func OpenDevice(ordinal int, cfg Config) (device.Device, func() error, error) {
	if cfg.Sim {
		d, err := sim.New(sim.Config{Capacity: cfg.SimCapacity, Name: fmt.Sprintf("sim%d", ordinal), Ordinal: ordinal})
		if err != nil {
			return nil, nil, err
		}
		return d, func() error { return nil }, nil
	}
	d, err := cuda.Open(ordinal)
	if err != nil {
		return nil, nil, err
	}
	return d, d.Close, nil
}

// Configure applies a configuration string on top of the current one (keys
// it does not name keep their values). Before any device is in use every
// key may change; after, only the limit, which is then applied to every
// device at once (gpumem.Allocator.SetLimit).
func (h *Host) Configure(s string) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.cfgErr != nil {
		return h.cfgErr
	}
	next := h.cfg
	keys, err := next.apply(s)
	if err != nil {
		return err
	}
	if !h.started {
		h.cfg = next
		return nil
	}
	for _, k := range keys {
		if k != "limit" && k != "serve" {
			return fmt.Errorf("%w: %s cannot change once a device is in use (only limit and serve can)", ErrConfig, k)
		}
	}
	h.cfg = next
	h.serveFromConfig()
	var errs []error
	for i := range h.devs {
		if d := h.devs[i].Load(); d != nil {
			errs = append(errs, d.Alloc.SetLimit(next.limitFor(d.dev.Info().Total)))
		}
	}
	return errors.Join(errs...)
}

// Config returns the current configuration.
func (h *Host) Config() Config {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.cfg
}

// Device returns the device with the given ordinal, making its allocator on
// first use.
func (h *Host) Device(ordinal int) (*Device, error) {
	if ordinal < 0 || ordinal >= MaxDevices {
		return nil, fmt.Errorf("%w: device %d: want 0 to %d", ErrInvalidDevice, ordinal, MaxDevices-1)
	}
	if d := h.devs[ordinal].Load(); d != nil {
		return d, nil
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if d := h.devs[ordinal].Load(); d != nil {
		return d, nil
	}
	if h.cfgErr != nil {
		return nil, h.cfgErr
	}
	dev, closeFn, err := h.open(ordinal, h.cfg)
	if err != nil {
		return nil, fmt.Errorf("gpumem: device %d: %w", ordinal, err)
	}
	cfg := h.cfg.Alloc
	cfg.Limit = h.cfg.limitFor(dev.Info().Total)
	a, err := gpumem.New(dev, cfg)
	if err != nil {
		closeFn()
		return nil, fmt.Errorf("gpumem: device %d: %w", ordinal, err)
	}
	a.SetCaptureReuse(h.captureReuse)
	if h.gate != nil && !h.cfg.NoMoves {
		a.SetGate(h.gate)
	}
	d := &Device{Ordinal: ordinal, Alloc: a, dev: dev, closeFn: closeFn}
	h.devs[ordinal].Store(d)
	h.started = true
	h.serveFromConfig()
	if h.served != "" {
		d.measureOutside() // before its first allocation: nothing reserved yet
	}
	return d, nil
}

// SetGate gives every device's allocator, made or to be made, the
// process's launch gate (gpumem.Gate: the one of `gpumem run`'s preload
// shim, which refuses to close where it cannot see every launch), unless
// the configuration says gather=false. Private pools
// (CUDA graphs' memory) get none: a graph's addresses are fixed in it.
func (h *Host) SetGate(g gpumem.Gate) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.gate = g
	if h.cfg.NoMoves {
		return
	}
	for i := range h.devs {
		if d := h.devs[i].Load(); d != nil {
			d.Alloc.SetGate(g)
		}
	}
}

// Owns reports whether address ptr lies in memory of gpumem's, in use or
// not, on any device (private pools included): the shim asks before it
// turns moves off for an export of an address (an RDMA or NCCL
// registration, say).
func (h *Host) Owns(ptr uint64) bool {
	for _, d := range h.Devices() {
		if d.Alloc.Holds(device.Ptr(ptr), 1) {
			return true
		}
		for _, a := range d.privates() {
			if a.Holds(device.Ptr(ptr), 1) {
				return true
			}
		}
	}
	return false
}

// existing returns the device if its allocator has been made, else nil.
func (h *Host) existing(ordinal int) *Device {
	if ordinal < 0 || ordinal >= MaxDevices {
		return nil
	}
	return h.devs[ordinal].Load()
}

// Devices lists the devices in use, by ordinal.
func (h *Host) Devices() []*Device {
	var out []*Device
	for i := range h.devs {
		if d := h.devs[i].Load(); d != nil {
			out = append(out, d)
		}
	}
	return out
}

// ErrInvalidDevice: a device ordinal out of range.
var ErrInvalidDevice = errors.New("gpumem: invalid device")

// Alloc allocates size bytes on device ordinal for work on stream. A size
// of 0 returns address 0 and no error: there is nothing to allocate, as
// with PyTorch's own allocator. site is the call site of the request when
// recording (0: none).
func (h *Host) Alloc(ordinal int, size, stream uint64, site uint32) (uint64, error) {
	return h.AllocThread(ordinal, size, stream, site, 0)
}

// AllocThread is Alloc made by thread (an identity of the calling thread,
// 0 if unknown), which private pools' thread routes match (pools.go).
func (h *Host) AllocThread(ordinal int, size, stream uint64, site uint32, thread uint64) (uint64, error) {
	if size == 0 {
		return 0, nil
	}
	d, err := h.Device(ordinal)
	if err != nil {
		return 0, err
	}
	a := d.Alloc
	var pool *privatePool
	if d.pools.n.Load() > 0 {
		if pool = d.route(stream, thread); pool != nil {
			a = pool.alloc
		}
	}
	if pool == nil && h.uncached.Load() {
		// The cache is off (SetCaching): the driver's own allocation.
		p, err := d.dev.Alloc(size)
		if err == nil {
			return d.enter(entry{direct: &directBuffer{ptr: p, size: size}, site: site, stream: stream}, uint64(p), size)
		}
		if errors.Is(err, device.ErrOutOfMemory) {
			err = fmt.Errorf("%w: the cache is off (caching_allocator_enable(False)), and the driver refused %d bytes on device %d: %v",
				gpumem.ErrOutOfMemory, size, d.Ordinal, err)
		}
		return 0, d.failed(err, size, stream, site)
	}
	buf, err := a.Alloc(size, device.Stream(stream))
	if errors.Is(err, gpumem.ErrOutOfMemory) {
		// Freeable graph pools go back before an out-of-memory, as
		// PyTorch's do (pools.go).
		if closed, cerr := d.closeFreeable(); closed && cerr == nil {
			buf, err = a.Alloc(size, device.Stream(stream))
		}
	}
	if errors.Is(err, gpumem.ErrOutOfMemory) && pool == nil && d.pools.onOOM.Load() > 0 {
		// Then the pools that serve the device's own allocations in need
		// (PoolOptions.UseOnOOM); the device's own error if none can.
		for _, p := range d.onOOM() {
			if pool == nil {
				if b, perr := p.alloc.Alloc(size, device.Stream(stream)); perr == nil {
					buf, err, pool = b, nil, p
					continue
				}
			}
			d.freed(p)
		}
	}
	if err != nil {
		if pool != nil {
			d.freed(pool)
		}
		return 0, d.failed(err, size, stream, site)
	}
	return d.enter(entry{buf: buf, pool: pool, site: site, stream: stream}, uint64(buf.Ptr()), buf.Size())
}

// failed notes an allocation that failed with err in the history (an
// out-of-memory) and returns err.
func (d *Device) failed(err error, size, stream uint64, site uint32) error {
	if hs := d.hist.Load(); hs != nil && errors.Is(err, gpumem.ErrOutOfMemory) {
		hs.add("oom", 0, size, stream, site)
	}
	return err
}

// SetCaching turns the cache on or off on every device (PyTorch's
// caching_allocator_enable, PYTORCH_NO_CUDA_MEMORY_CACHING=1): while it is
// off, an allocation that no private pool takes is a driver allocation of
// its own (cuMemAlloc) and its free gives it straight back (cuMemFree),
// whatever the mode is by then; one made while it was on goes back to the
// cache. Uncached buffers count in none of the allocator's statistics,
// as under PyTorch's allocator, and the limit does not apply to them; the
// driver's own numbers (MemInfo, NVML) show them. For tools that check
// every access against its allocation (compute-sanitizer), where a cache
// would hide a read past a buffer's end.
func (h *Host) SetCaching(on bool) { h.uncached.Store(!on) }

// SetCaptureReuse turns reuse within a CUDA graph capture on or off, on
// every device, those opened later too (PyTorch's
// graph_capture_record_stream_reuse; gpumem.Allocator.SetCaptureReuse): a
// buffer freed during a capture after other streams used it is reused on
// its stream once the capture's graph orders all their work before that
// stream's next work. It reports false if a device in use cannot read
// capture graphs (the driver lacks the calls), where on changes nothing.
func (h *Host) SetCaptureReuse(on bool) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.captureReuse = on
	ok := true
	for _, d := range h.Devices() {
		ok = d.Alloc.SetCaptureReuse(on) && ok
	}
	return ok
}

// Caching reports whether the cache is on (SetCaching).
func (h *Host) Caching() bool { return !h.uncached.Load() }

// enter puts e, a buffer just allocated at ptr of size bytes (of a pool,
// of the device's allocator, or the driver's own with the cache off), in
// the table, the history and the recording, and returns its address.
func (d *Device) enter(e entry, ptr, size uint64) (uint64, error) {
	if hs := d.hist.Load(); hs != nil {
		hs.add("alloc", ptr, size, e.stream, e.site)
	}
	if r := d.rec.Load(); r != nil {
		e.rec, e.recGen = r.alloc(size, e.stream, e.site), r.gen
	}
	if !d.tab.put(ptr, e) {
		// The allocator (or the driver) handed out a live address twice:
		// the books are wrong. Refuse rather than corrupt the host's
		// memory.
		return 0, fmt.Errorf("gpumem: internal error: address %#x handed out while still live on device %d", ptr, d.Ordinal)
	}
	return ptr, nil
}

// Free frees the buffer at ptr on device ordinal (-1: whichever device
// holds it). Address 0 is a no-op. An address gpumem did not hand out, or
// already freed, is an error matching gpumem.ErrForeign, and nothing
// changes.
func (h *Host) Free(ordinal int, ptr uint64) error {
	if ptr == 0 {
		return nil
	}
	d, e, err := h.take(ordinal, ptr)
	if err != nil {
		return err
	}
	return d.free(e, 0)
}

// FreeSite is Free with the call site of the free itself (a site id of
// the history's, 0 for none), which the free's history entries carry as
// their FreeSite (PyTorch's context "all").
func (h *Host) FreeSite(ordinal int, ptr uint64, site uint32) error {
	if ptr == 0 {
		return nil
	}
	d, e, err := h.take(ordinal, ptr)
	if err != nil {
		return err
	}
	return d.free(e, site)
}

// free records the free of a buffer taken from the table, made at call
// site freeSite (0: not known), and frees it.
func (d *Device) free(e entry, freeSite uint32) error {
	if r := d.rec.Load(); r != nil && e.rec != 0 && e.recGen == r.gen {
		r.free(e.rec - 1)
	}
	if hs := d.hist.Load(); hs != nil {
		p, n := uint64(e.buf.Ptr()), e.buf.Size()
		if e.direct != nil {
			p, n = uint64(e.direct.ptr), e.direct.size
		}
		hs.addFree("free_requested", p, n, e.stream, e.site, freeSite)
		hs.addFree("free_completed", p, n, e.stream, e.site, freeSite)
	}
	if e.direct != nil {
		return d.dev.Free(e.direct.ptr) // the driver waits for the work using it
	}
	if e.pool != nil {
		err := e.pool.alloc.Free(e.buf)
		d.freed(e.pool)
		return err
	}
	return d.Alloc.Free(e.buf)
}

// allocatorOf is the allocator a buffer of the table came from.
func (d *Device) allocatorOf(e entry) *gpumem.Allocator {
	if e.pool != nil {
		return e.pool.alloc
	}
	return d.Alloc
}

// FreeOn frees the buffer at ptr as freed on stream: if that is not the
// stream it was allocated on, its memory is reused only after stream's
// work up to now (cuMemFreeAsync's meaning). Otherwise as Free.
func (h *Host) FreeOn(ordinal int, ptr, stream uint64) error {
	if ptr == 0 {
		return nil
	}
	d, e, err := h.take(ordinal, ptr)
	if err != nil {
		return err
	}
	if e.direct == nil {
		if err := d.allocatorOf(e).RecordStream(e.buf, device.Stream(stream)); err != nil {
			d.tab.put(ptr, e) // nothing changed: the buffer stays live
			return err
		}
	}
	return d.free(e, 0)
}

func (h *Host) take(ordinal int, ptr uint64) (*Device, entry, error) {
	if ordinal >= 0 {
		if d := h.existing(ordinal); d != nil {
			if e, ok := d.tab.take(ptr); ok {
				return d, e, nil
			}
		}
	} else {
		// Every slot, without building Devices' slice: this is every
		// cuMemFreeAsync of gpumem run (the shim does not know the device).
		for i := range h.devs {
			if d := h.devs[i].Load(); d != nil {
				if e, ok := d.tab.take(ptr); ok {
					return d, e, nil
				}
			}
		}
	}
	return nil, entry{}, foreign("Free", ordinal, ptr)
}

// find returns the device and entry of the live buffer at ptr, without
// taking it from the table.
func (h *Host) find(op string, ordinal int, ptr uint64) (*Device, entry, error) {
	for _, d := range h.Devices() {
		if ordinal >= 0 && d.Ordinal != ordinal {
			continue
		}
		if e, ok := d.tab.get(ptr); ok {
			return d, e, nil
		}
	}
	return nil, entry{}, foreign(op, ordinal, ptr)
}

func foreign(op string, ordinal int, ptr uint64) error {
	where := fmt.Sprintf("on device %d", ordinal)
	if ordinal < 0 {
		where = "on any device"
	}
	return &gpumem.BufferError{Op: op, Ptr: ptr, Err: gpumem.ErrForeign,
		Why: "gpumem did not allocate this address " + where + ", or it was freed already"}
}

// RecordStream tells the allocator that the buffer at ptr is also used by
// work on stream (torch.Tensor.record_stream): its memory is reused only
// after that work.
func (h *Host) RecordStream(ordinal int, ptr, stream uint64) error {
	d, e, err := h.find("RecordStream", ordinal, ptr)
	if err != nil {
		return err
	}
	if e.direct != nil {
		return nil // its free goes to the driver, which waits for every stream
	}
	return d.allocatorOf(e).RecordStream(e.buf, device.Stream(stream))
}

// Trim returns every cached byte of device ordinal (-1: of every device)
// to the driver, and the memory of the private pools that are freeable
// (pools.go).
func (h *Host) Trim(ordinal int) error {
	var errs []error
	for _, d := range h.Devices() {
		if ordinal < 0 || d.Ordinal == ordinal {
			if r := d.rec.Load(); r != nil {
				r.trim() // a replay of the recording trims here too
			}
			_, err := d.closeFreeable() // released graph pools (pools.go)
			errs = append(errs, err, d.Alloc.Trim())
		}
	}
	return errors.Join(errs...)
}

// SetLimit caps the memory device ordinal's allocator holds (0: the
// device's capacity), making the allocator if it does not exist yet.
func (h *Host) SetLimit(ordinal int, n uint64) error {
	d, err := h.Device(ordinal)
	if err != nil {
		return err
	}
	return d.Alloc.SetLimit(n)
}

// SetLimitFraction caps device ordinal's memory at a fraction of its total
// (torch.cuda.set_per_process_memory_fraction). A fraction of 0 lets
// nothing more be allocated, as under PyTorch's allocator (a limit of one
// byte: the allocator's limit 0 means the device's capacity); a fraction
// below what live buffers hold is no error either (gpumem.ErrOverLimit is
// dropped), as there.
func (h *Host) SetLimitFraction(ordinal int, f float64) error {
	if !(f >= 0 && f <= 1) {
		return fmt.Errorf("%w: memory fraction %v: want 0 to 1", ErrConfig, f)
	}
	d, err := h.Device(ordinal)
	if err != nil {
		return err
	}
	err = d.Alloc.SetLimit(max(1, uint64(f*float64(d.dev.Info().Total))))
	if errors.Is(err, gpumem.ErrOverLimit) && !hasOtherThan(err, gpumem.ErrOverLimit) {
		// PyTorch's fraction is a cap on what comes next: set below what
		// is live, it is no error there (allocations fail until enough
		// is freed), and so none here.
		return nil
	}
	return err
}

// hasOtherThan reports whether err, a join of errors, holds one that is
// not target.
func hasOtherThan(err error, target error) bool {
	j, ok := err.(interface{ Unwrap() []error })
	if !ok {
		return !errors.Is(err, target)
	}
	for _, e := range j.Unwrap() {
		if e != nil && hasOtherThan(e, target) {
			return true
		}
	}
	return false
}

// Stats returns device ordinal's statistics; zeros (and no error) if
// nothing was allocated on it yet.
func (h *Host) Stats(ordinal int) (gpumem.Stats, error) {
	if ordinal < 0 || ordinal >= MaxDevices {
		return gpumem.Stats{}, fmt.Errorf("%w: device %d: want 0 to %d", ErrInvalidDevice, ordinal, MaxDevices-1)
	}
	if d := h.existing(ordinal); d != nil {
		return d.stats(), nil
	}
	return gpumem.Stats{}, nil
}

// ResetPeaks starts device ordinal's peaks over (-1: every device's).
func (h *Host) ResetPeaks(ordinal int) {
	for _, d := range h.Devices() {
		if ordinal < 0 || d.Ordinal == ordinal {
			d.Alloc.ResetPeaks()
			d.pools.mu.Lock()
			for _, p := range d.pools.byID {
				p.alloc.ResetPeaks()
			}
			d.pools.mu.Unlock()
		}
	}
}

// Usage returns device ordinal's Usage, its private pools' included, as
// Stats counts them: the figures of Stats that need no walk of the pools'
// blocks (torch.cuda.memory_allocated and the like, a CUDA pool's used
// and reserved attributes). Zeros if nothing was allocated on it yet.
func (h *Host) Usage(ordinal int) (gpumem.Usage, error) {
	if ordinal < 0 || ordinal >= MaxDevices {
		return gpumem.Usage{}, fmt.Errorf("%w: device %d: want 0 to %d", ErrInvalidDevice, ordinal, MaxDevices-1)
	}
	d := h.existing(ordinal)
	if d == nil {
		return gpumem.Usage{}, nil
	}
	u := d.Alloc.Usage()
	d.pools.mu.Lock()
	defer d.pools.mu.Unlock()
	for _, p := range d.pools.byID {
		pu := p.alloc.Usage()
		u.Allocated += pu.Allocated
		u.PeakAllocated += pu.PeakAllocated
		u.Active += pu.Active
		u.PeakActive += pu.PeakActive
		u.Reserved += pu.Reserved
	}
	u.PeakReserved = max(d.Alloc.FamilyPeakReserved(), u.Reserved) // as poolStats
	return u, nil
}

// Snapshot returns device ordinal's snapshot (an empty allocator's if
// nothing was allocated on it yet): its allocator's segments, then each
// private pool's, named by the pool (SegmentSnapshot.PrivatePool), with the
// statistics of all of them together (Host.Stats).
func (h *Host) Snapshot(ordinal int) (gpumem.Snapshot, error) {
	d, err := h.Device(ordinal)
	if err != nil {
		return gpumem.Snapshot{}, err
	}
	return d.snapshot(), nil
}

// stats is the device's allocator's statistics with its private pools'.
func (d *Device) stats() gpumem.Stats {
	st := d.Alloc.Stats()
	d.poolStats(&st)
	return st
}

// snapshot is Host.Snapshot's answer for d.
func (d *Device) snapshot() gpumem.Snapshot {
	snap := d.Alloc.Snapshot()
	d.pools.mu.Lock()
	for id, p := range d.pools.byID {
		for _, seg := range p.alloc.Snapshot().Segments {
			seg.PrivatePool = []uint64{id.Hi, id.Lo}
			snap.Segments = append(snap.Segments, seg)
		}
	}
	d.pools.mu.Unlock()
	snap.Stats = d.stats()
	return snap
}

// privates lists the device's private pools' allocators.
func (d *Device) privates() []*gpumem.Allocator {
	d.pools.mu.Lock()
	defer d.pools.mu.Unlock()
	out := make([]*gpumem.Allocator, 0, len(d.pools.byID))
	for _, p := range d.pools.byID {
		out = append(out, p.alloc)
	}
	return out
}

// MemInfo reports device ordinal's memory as a program running on gpumem
// should see it (what cuMemGetInfo and torch.cuda.mem_get_info answer under
// gpumem): total is the allocator's limit, and free what the program could
// still allocate: the cache, plus what may still be taken from the device
// within the limit.
func (h *Host) MemInfo(ordinal int) (free, total uint64, err error) {
	d, err := h.Device(ordinal)
	if err != nil {
		return 0, 0, err
	}
	devFree, _, err := d.dev.MemInfo()
	if err != nil {
		return 0, 0, err
	}
	reserved, active := d.Alloc.Held()
	var cached uint64
	if reserved > active {
		cached = reserved - active
	}
	all := reserved + d.poolsReserved() // the private pools' memory counts against the limit, and is not free to the program
	total = d.Alloc.Limit()
	var room uint64
	if total > all {
		room = min(total-all, devFree)
	}
	return cached + room, total, nil
}

// Live counts the buffers the host knows by address on device ordinal.
func (h *Host) Live(ordinal int) int {
	if d := h.existing(ordinal); d != nil {
		return d.tab.len()
	}
	return 0
}

// Close stops recordings and closes every allocator and device. Buffers
// still live are freed (an allocator's Close reports them).
func (h *Host) Close() error {
	h.mu.Lock()
	defer h.mu.Unlock()
	var errs []error
	for i := range h.devs {
		d := h.devs[i].Swap(nil)
		if d == nil {
			continue
		}
		if r := d.rec.Swap(nil); r != nil {
			errs = append(errs, r.close())
		}
		errs = append(errs, d.closePools())
		if err := d.Alloc.Close(); err != nil && !errors.Is(err, gpumem.ErrLeak) {
			errs = append(errs, err)
		}
		errs = append(errs, d.closeFn())
	}
	h.started = false
	return errors.Join(errs...)
}
