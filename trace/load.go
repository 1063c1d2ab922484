package trace

import (
	"errors"
	"io"
	"math"
	"os"
	"path/filepath"
	"strings"
)

// Trace is a whole trace in memory, checked and ready to replay.
type Trace struct {
	// Name is the file name without directory and without the extensions
	// ".gz", then ".trace" or ".txt": "gpt2_generate" for
	// "testdata/traces/gpt2_generate.trace.gz".
	Name string

	// Events are the trace's events in file order.
	Events []Event

	// Slot[i] is the request number that Events[i] allocates or frees:
	// requests are numbered 0, 1, ... Requests-1 in the order of their
	// Alloc events, so a replay can index per-request state by Slot[i]
	// instead of looking up IDs.
	Slot []int32

	// Requests is the number of Alloc events.
	Requests int

	// PeakLiveBytes is the largest sum of Size over requests allocated and
	// not yet freed at the same moment (after any event): the least memory
	// any allocator must hold to replay the trace.
	PeakLiveBytes uint64

	// Streams are the distinct streams of the Alloc events, in order of
	// first use.
	Streams []uint64

	// Trims are where the program emptied the allocator's cache ("t"
	// lines: torch.cuda.empty_cache): each is the index of the event it
	// came before (len(Events) for one after the last), in order. A replay
	// trims there, as the program's allocator did.
	Trims []int32

	// Sites maps each site the trace defines to its text: the call stack
	// of the requests whose Event.Site it is. It is nil when the trace
	// defines none. A map, not a slice, since site numbers need not be
	// dense.
	Sites map[uint32]string
}

// Read reads and checks a whole trace, gzip-compressed or plain, from r. The
// name is the file name used in error messages; Trace.Name is name without
// directory and extensions.
func Read(r io.Reader, name string) (*Trace, error) {
	t, cut, err := read(r, name, false)
	if err == nil {
		err = cut
	}
	if err != nil {
		return nil, err
	}
	return t, nil
}

// ReadPartial reads a trace as Read does, but one cut short (ErrCutShort:
// a process that died while recording, a copy cut off) is read up to its
// last whole line: it returns the trace of what came before the cut, whose
// requests not freed by then stay live, with the error that says where it
// was cut (as io.ReadFull returns what it read with io.ErrUnexpectedEOF).
// Any other fault returns nil and the error, as Read does.
func ReadPartial(r io.Reader, name string) (*Trace, error) {
	t, cut, err := read(r, name, true)
	if err != nil {
		return nil, err
	}
	return t, cut
}

// read reads a whole trace; with partial, an error that is ErrCutShort ends
// it (returned as cut) instead of failing it.
func read(r io.Reader, name string, partial bool) (*Trace, error, error) {
	rd, err := newReader(r, name)
	if err != nil {
		if partial && errors.Is(err, ErrCutShort) {
			return &Trace{Name: baseName(name)}, err, nil
		}
		return nil, nil, err
	}
	t := &Trace{Name: baseName(name)}
	var (
		events     chunked[Event]
		slots      chunked[int32]
		sizes      []uint64 // by slot
		live       uint64
		seen       map[uint64]bool
		lastStream uint64
	)
	var cut error
	for {
		ev, slot, err := rd.next()
		if err == io.EOF {
			break
		}
		if err != nil {
			if partial && errors.Is(err, ErrCutShort) {
				cut = err
				break
			}
			return nil, nil, err
		}
		if ev.Kind == Alloc {
			if live > math.MaxUint64-ev.Size {
				return nil, nil, rd.syntaxError("a %d: the live requests add up to more than 2^64 bytes", ev.ID)
			}
			live += ev.Size
			t.PeakLiveBytes = max(t.PeakLiveBytes, live)
			sizes = append(grow(sizes), ev.Size)
			if len(t.Streams) == 0 || ev.Stream != lastStream && !seen[ev.Stream] {
				if seen == nil {
					seen = make(map[uint64]bool)
				}
				seen[ev.Stream] = true
				t.Streams = append(t.Streams, ev.Stream)
			}
			lastStream = ev.Stream
		} else {
			live -= sizes[slot]
		}
		for len(t.Trims) < rd.trims {
			t.Trims = append(t.Trims, int32(events.n))
		}
		events.add(ev)
		slots.add(slot)
	}
	for len(t.Trims) < rd.trims {
		t.Trims = append(t.Trims, int32(events.n))
	}
	t.Events = events.slice()
	t.Slot = slots.slice()
	t.Requests = len(sizes)
	if len(rd.sites) > 0 {
		t.Sites = make(map[uint32]string, len(rd.sites))
		for site, d := range rd.sites {
			t.Sites[site] = d.text
		}
	}
	return t, cut, nil
}

// Load reads and checks the trace in the file at path.
func Load(path string) (*Trace, error) { return loadFile(path, Read) }

// LoadPartial reads the trace in the file at path as ReadPartial does.
func LoadPartial(path string) (*Trace, error) { return loadFile(path, ReadPartial) }

// loadFile reads the file at path with read, named by its base name.
func loadFile(path string, read func(io.Reader, string) (*Trace, error)) (*Trace, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return read(f, filepath.Base(path))
}

// baseName returns name without directory and without the extensions ".gz",
// then ".trace" or ".txt".
func baseName(name string) string {
	name = filepath.Base(name)
	if name == "." || name == string(filepath.Separator) {
		return ""
	}
	name = strings.TrimSuffix(name, ".gz")
	if s, ok := strings.CutSuffix(name, ".trace"); ok {
		return s
	}
	return strings.TrimSuffix(name, ".txt")
}

// chunked collects values in chunks and then copies them into one slice of
// the exact length: for long traces this is much faster than growing a slice
// by append, which copies everything again at every growth.
type chunked[T any] struct {
	full [][]T
	cur  []T
	n    int
}

func (c *chunked[T]) add(v T) {
	if len(c.cur) == cap(c.cur) {
		size := 1024
		if c.cur != nil {
			c.full = append(c.full, c.cur)
			size = min(2*cap(c.cur), 1<<16)
		}
		c.cur = make([]T, 0, size)
	}
	c.cur = append(c.cur, v)
	c.n++
}

// slice returns all values added, in order; nil if none.
func (c *chunked[T]) slice() []T {
	if c.n == 0 {
		return nil
	}
	if len(c.full) == 0 {
		return c.cur[:len(c.cur):len(c.cur)]
	}
	s := make([]T, 0, c.n)
	for _, ch := range c.full {
		s = append(s, ch...)
	}
	return append(s, c.cur...)
}

// PeakLivePasses is the largest sum of Size over requests live at the same
// moment when the trace runs passes times in one process, the way a
// replay's passes run it (package replay's Options.Passes): a request the
// trace never frees stays live from the pass that allocated it, and later
// passes do not allocate it again. For a trace whose never-freed requests
// are allocated once and kept (a recorded program's workspaces) it is
// PeakLiveBytes; for one that leaves requests live that a repeated run
// would allocate anew, it is more. With passes <= 1, PeakLiveBytes.
func (t *Trace) PeakLivePasses(passes int) uint64 {
	if passes <= 1 {
		return t.PeakLiveBytes
	}
	// Every pass after the first starts with the never-freed requests
	// live and replays the rest as the first did: the second pass's peak
	// is every later pass's.
	size := make([]uint64, t.Requests)
	freed := make([]bool, t.Requests)
	for i, ev := range t.Events {
		if ev.Kind == Alloc {
			size[t.Slot[i]] = ev.Size
		} else {
			freed[t.Slot[i]] = true
		}
	}
	var live uint64
	for s, f := range freed {
		if !f {
			live += size[s]
		}
	}
	peak := max(t.PeakLiveBytes, live)
	for i, ev := range t.Events {
		s := t.Slot[i]
		switch {
		case !freed[s]: // live since the first pass
		case ev.Kind == Alloc:
			live += ev.Size
			peak = max(peak, live)
		default:
			live -= size[s]
		}
	}
	return peak
}
