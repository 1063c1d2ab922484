package host

import (
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
	"time"

	"github.com/gpumem/gpumem"
	"github.com/gpumem/gpumem/device/sim"
	"github.com/gpumem/gpumem/internal/units"
)

// ErrConfig is matched by every error that reports a bad configuration
// string.
var ErrConfig = errors.New("gpumem: bad configuration")

// Config is the configuration of a host's allocators: the allocator's own
// (gpumem.Config) plus where its device comes from. It is written as a
// string of comma-separated key=value pairs, in GPUMEM_CONFIG or through
// gpumem_configure:
//
//	limit=40GiB,release_after=30s
//	device=sim,capacity=24GiB,limit=90%
//
// Keys:
//
//	device             cuda (the default) or sim (a simulated device, for
//	                   tests and planning without a GPU)
//	capacity           the simulated device's memory (default 80GiB, at most
//	                   4TiB: sim.MaxCapacity)
//	mode               auto, plain or virtual (gpumem.Mode)
//	limit              a size, or a percentage of the device's memory
//	preallocate        a size taken at start and kept (gpumem.Config.Preallocate)
//	release_threshold  a size: cache above it goes back at once
//	release_after      a duration (10s, 1m): cache idle that long goes back
//	span_size          a size (gpumem.Config.SpanSize)
//	compact            true or false: best-fit placement that holds the
//	                   least memory, at more driver calls (gpumem.Config.Compact)
//	chunk_handles      true or false: a physical handle per chunk, the free
//	                   chunks of partly used spans taken before new memory
//	                   (gpumem.Config.ChunkHandles; experimental)
//	defrag             true or false: move live chunks out of sparse spans
//	                   rather than grow (gpumem.Config.Defrag); only for
//	                   programs that launch from one thread at a time, or
//	                   under `gpumem run` (its launch gate, Host.SetGate)
//	gather             true or false: before an out-of-memory, move live
//	                   chunks out of sparse spans until the request fits
//	                   (gpumem.Config.Gather); the same proviso. Under
//	                   `gpumem run`, in a program whose every launch its
//	                   gate sees, the default gathers through the gate;
//	                   false turns that off too
//	stream_waits       true (default) or false: a stream that would map
//	                   more while other streams' frees are pending waits
//	                   for their work on the GPU and reuses the memory
//	                   (false: gpumem.Config.NoStreamWaits)
//	markers            true (default) or false: learn how far other streams
//	                   have run from words the GPU writes, not from event
//	                   queries (false: gpumem.Config.NoMarkers)
//	record_sites       true or false: allocation call stacks in leak reports
//	check              true or false: run the invariant checker after every
//	                   operation (slow)
//	serve              an address (127.0.0.1:9464; port 0 picks one): serve
//	                   the allocators' stats, snapshots and Prometheus metrics
//	                   over HTTP there (package httpdebug), from the first use
//
// Sizes are written as units.Parse reads them (80GiB, 512MiB, 1.5GB);
// durations as time.ParseDuration does. An unknown key, a key given twice
// or a bad value is an error that names it.
type Config struct {
	Sim         bool
	SimCapacity uint64
	// LimitFraction, when > 0, sets the limit to this fraction of the
	// device's memory (limit=90%); it overrides Alloc.Limit.
	LimitFraction float64
	Alloc         gpumem.Config
	// Serve is the address to serve over HTTP (serve=), "" for none.
	Serve string
	// NoMoves: gather=false was said, so the allocator moves no live
	// memory even where the process has a launch gate (Host.SetGate).
	NoMoves bool
}

// defaultSimCapacity is the simulated device's memory when capacity is not
// given: an H100's.
const defaultSimCapacity = 80 << 30

// ParseConfig parses a configuration string (see Config). The empty string
// is the default configuration.
func ParseConfig(s string) (Config, error) {
	c := Config{SimCapacity: defaultSimCapacity}
	if _, err := c.apply(s); err != nil {
		return Config{}, err
	}
	return c, nil
}

// apply sets the keys that s names, leaving the others as they are, and
// returns the keys set. On an error c is unchanged.
func (c *Config) apply(s string) ([]string, error) {
	next := *c
	var keys []string
	seen := map[string]bool{}
	for i, item := range strings.Split(s, ",") {
		item = strings.TrimSpace(item)
		if item == "" {
			continue
		}
		key, val, ok := strings.Cut(item, "=")
		key, val = strings.TrimSpace(key), strings.TrimSpace(val)
		if !ok || key == "" {
			return nil, fmt.Errorf("%w: item %d %q: want key=value", ErrConfig, i+1, item)
		}
		if seen[key] {
			return nil, fmt.Errorf("%w: %s given twice", ErrConfig, key)
		}
		seen[key] = true
		keys = append(keys, key)
		if err := next.set(key, val); err != nil {
			return nil, fmt.Errorf("%w: %s=%s: %v", ErrConfig, key, val, err)
		}
	}
	if !next.Sim && seen["capacity"] {
		return nil, fmt.Errorf("%w: capacity is for the simulated device: add device=sim", ErrConfig)
	}
	*c = next
	return keys, nil
}

func (c *Config) set(key, val string) error {
	var err error
	switch key {
	case "device":
		switch val {
		case "cuda":
			c.Sim = false
		case "sim":
			c.Sim = true
		default:
			return errors.New("want cuda or sim")
		}
	case "capacity":
		c.SimCapacity, err = units.ParseBare(val)
		switch {
		case err != nil:
		case c.SimCapacity == 0:
			err = errors.New("must be more than 0")
		case c.SimCapacity > sim.MaxCapacity:
			err = fmt.Errorf("must be at most %s, the most a simulated device models", units.Format(sim.MaxCapacity))
		}
	case "mode":
		c.Alloc.Mode, err = gpumem.ParseMode(val)
	case "limit":
		if p, ok := strings.CutSuffix(val, "%"); ok {
			f, perr := strconv.ParseFloat(strings.TrimSpace(p), 64)
			if perr != nil || !(f > 0 && f <= 100) {
				return errors.New("want a percentage above 0 and at most 100")
			}
			c.LimitFraction = f / 100
			return nil
		}
		c.LimitFraction = 0
		c.Alloc.Limit, err = units.ParseBare(val)
	case "preallocate":
		c.Alloc.Preallocate, err = units.ParseBare(val)
	case "release_threshold":
		c.Alloc.ReleaseThreshold, err = units.ParseBare(val)
	case "release_after":
		c.Alloc.IdleRelease, err = time.ParseDuration(val)
		if err == nil && c.Alloc.IdleRelease < 0 {
			err = errors.New("negative")
		}
	case "span_size":
		c.Alloc.SpanSize, err = units.ParseBare(val)
	case "compact":
		c.Alloc.Compact, err = strconv.ParseBool(val)
	case "chunk_handles":
		c.Alloc.ChunkHandles, err = strconv.ParseBool(val)
	case "defrag":
		c.Alloc.Defrag, err = strconv.ParseBool(val)
	case "gather":
		c.Alloc.Gather, err = strconv.ParseBool(val)
		c.NoMoves = err == nil && !c.Alloc.Gather
	case "stream_waits":
		var on bool
		on, err = strconv.ParseBool(val)
		c.Alloc.NoStreamWaits = !on
	case "markers":
		var on bool
		on, err = strconv.ParseBool(val)
		c.Alloc.NoMarkers = !on
	case "record_sites":
		c.Alloc.RecordSites, err = strconv.ParseBool(val)
	case "check":
		c.Alloc.CheckInvariants, err = strconv.ParseBool(val)
	case "serve":
		if _, _, e := net.SplitHostPort(val); e != nil {
			return errors.New("want host:port, such as 127.0.0.1:9464")
		}
		c.Serve = val
	default:
		return errors.New("unknown key (want device, capacity, mode, limit, preallocate, release_threshold, release_after, span_size, compact, chunk_handles, defrag, gather, stream_waits, record_sites, check or serve)")
	}
	return err
}

// limitFor is the limit of an allocator on a device of total bytes.
func (c Config) limitFor(total uint64) uint64 {
	if c.LimitFraction > 0 {
		return uint64(c.LimitFraction * float64(total))
	}
	return c.Alloc.Limit
}
