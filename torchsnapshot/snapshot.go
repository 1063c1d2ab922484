package torchsnapshot

import (
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/gpumem/gpumem/trace"
	"github.com/nlpodyssey/gopickle/types"
)

// Snapshot is a PyTorch memory snapshot, read and checked, reduced to what
// a trace needs: for each device, its allocation history and the blocks
// allocated when the snapshot was taken.
type Snapshot struct {
	devices []history // by device index, as device_traces
}

// history is what a Snapshot keeps of one device.
type history struct {
	entries []entry // the alloc and free_requested entries, in order
	blocks  []block // the active_allocated blocks of the device's segments
}

// entry is an alloc or free_requested entry of a device trace.
type entry struct {
	free   bool   // free_requested, else alloc
	addr   uint64 // the block's address
	size   uint64 // the bytes the program asked for
	stream uint64
	timeUS int64  // as recorded: microseconds of an arbitrary epoch
	site   string // alloc only: the call stack as a trace writes it, "" for none
}

// block is a block allocated when the snapshot was taken.
type block struct {
	addr   uint64
	size   uint64 // the bytes the program asked for
	stream uint64 // its segment's
	site   string // as entry.site
}

// Read reads a snapshot as torch.cuda.memory._dump_snapshot writes it: a
// pickle of a dict with the keys device_traces and segments (others are
// ignored). It checks every part that a trace needs, and returns a
// *FormatError, matching ErrFormat, for a corrupt or truncated pickle or one
// of something else. Errors of r itself are returned wrapped.
func Read(r io.Reader) (*Snapshot, error) {
	data, err := io.ReadAll(r)
	if err != nil {
		return nil, fmt.Errorf("torchsnapshot: %w", err)
	}
	v, err := unpickle(data)
	if err != nil {
		return nil, err
	}
	return decode(v)
}

// Load reads the snapshot in the file at path, as Read does.
func Load(path string) (*Snapshot, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return Read(f)
}

// Devices returns, in increasing order, the devices whose history holds at
// least one alloc or free_requested entry: those WriteTrace converts.
func (s *Snapshot) Devices() []int {
	var devs []int
	for i, h := range s.devices {
		if len(h.entries) > 0 {
			devs = append(devs, i)
		}
	}
	return devs
}

// decoder turns the values gopickle decoded into a Snapshot.
type decoder struct {
	lists  map[*types.List]string // a list seen where lists may not repeat: its path
	stacks map[*types.List]string // the site text of each frames list read
	frames map[*types.Dict]string // the text of each frame read
}

func decode(v any) (*Snapshot, error) {
	top, ok := v.(*types.Dict)
	if !ok {
		return nil, &FormatError{Msg: fmt.Sprintf("the pickle holds %s, not a dict: %s", typeName(v), notSnapshot)}
	}
	root := record{d: top}
	for _, key := range []string{"device_traces", "segments"} {
		if _, ok := root.get(key); !ok {
			return nil, &FormatError{Msg: fmt.Sprintf("no key %q: %s", key, notSnapshot)}
		}
	}
	d := &decoder{
		lists:  make(map[*types.List]string),
		stacks: make(map[*types.List]string),
		frames: make(map[*types.Dict]string),
	}
	s := &Snapshot{}
	traces, err := root.list("device_traces", false)
	if err != nil {
		return nil, err
	}
	for dev, v := range *traces {
		path := "device_traces[" + strconv.Itoa(dev) + "]"
		l, ok := v.(*types.List)
		if !ok {
			return nil, &FormatError{Path: "device_traces", Msg: fmt.Sprintf("item %d is %s, want a list", dev, typeName(v))}
		}
		if err := d.unique(l, "device_traces", "item "+strconv.Itoa(dev), path); err != nil {
			return nil, err
		}
		var h history
		for i, v := range *l {
			e, keep, err := d.entry(v, path, i)
			if err != nil {
				return nil, err
			}
			if keep {
				h.entries = append(h.entries, e)
			}
		}
		s.devices = append(s.devices, h)
	}

	segments, err := root.list("segments", false)
	if err != nil {
		return nil, err
	}
	for i, v := range *segments {
		seg, err := asRecord(v, "segments", i)
		if err != nil {
			return nil, err
		}
		dev, err := seg.int("device")
		if err != nil {
			return nil, err
		}
		stream, err := seg.uint("stream")
		if err != nil {
			return nil, err
		}
		blocks, err := seg.list("blocks", false)
		if err != nil {
			return nil, err
		}
		if err := d.unique(blocks, seg.path, "blocks", seg.path+".blocks"); err != nil {
			return nil, err
		}
		for j, v := range *blocks {
			b, keep, err := d.block(v, seg.path+".blocks", j)
			if err != nil {
				return nil, err
			}
			// A device without a history gets no trace: its blocks
			// are checked, then dropped.
			if keep && dev >= 0 && dev < int64(len(s.devices)) {
				b.stream = stream
				s.devices[dev].blocks = append(s.devices[dev].blocks, b)
			}
		}
	}
	return s, nil
}

const notSnapshot = "not a PyTorch memory snapshot (torch.cuda.memory._dump_snapshot writes one)"

// unique records that list l, called name in the record or list at path,
// is at where, and fails if it was somewhere before. A device trace or a
// segment's blocks must be a list of its own: PyTorch writes each once, and
// one list referenced in many places would make a small pickle into a huge
// snapshot.
func (d *decoder) unique(l *types.List, path, name, where string) error {
	if first, ok := d.lists[l]; ok {
		return &FormatError{Path: path, Msg: fmt.Sprintf("%s is the same list as %s", name, first)}
	}
	d.lists[l] = where
	return nil
}

// entry reads item i of the device trace at path. keep is false for the
// entries a trace has no use for (every action but alloc and
// free_requested), which are checked only for their action.
func (d *decoder) entry(v any, path string, i int) (e entry, keep bool, err error) {
	r, err := asRecord(v, path, i)
	if err != nil {
		return entry{}, false, err
	}
	action, err := r.str("action")
	if err != nil {
		return entry{}, false, err
	}
	switch action {
	case "alloc":
	case "free_requested":
		e.free = true
	default:
		return entry{}, false, nil
	}
	if e.addr, err = r.uint("addr"); err != nil {
		return entry{}, false, err
	}
	if e.size, err = r.uint("size"); err != nil {
		return entry{}, false, err
	}
	if err := checkSize(r, "size", e.size); err != nil {
		return entry{}, false, err
	}
	if e.stream, err = r.uint("stream"); err != nil {
		return entry{}, false, err
	}
	if e.timeUS, err = r.int("time_us"); err != nil {
		return entry{}, false, err
	}
	if !e.free {
		if e.site, err = d.site(r); err != nil {
			return entry{}, false, err
		}
	}
	return e, true, nil
}

// block reads item i of the blocks at path. keep is false for a block
// that is not allocated (state other than active_allocated), which is
// checked only for its state.
func (d *decoder) block(v any, path string, i int) (b block, keep bool, err error) {
	r, err := asRecord(v, path, i)
	if err != nil {
		return block{}, false, err
	}
	state, err := r.str("state")
	if err != nil || state != "active_allocated" {
		return block{}, false, err
	}
	if b.addr, err = r.uint("address"); err != nil {
		return block{}, false, err
	}
	// The bytes asked for; older snapshots have only the block's size.
	key := "requested_size"
	if _, ok := r.get(key); ok {
		b.size, err = r.uint(key)
	}
	if err == nil && b.size == 0 {
		key = "size"
		b.size, err = r.uint(key)
	}
	if err != nil {
		return block{}, false, err
	}
	if err := checkSize(r, key, b.size); err != nil {
		return block{}, false, err
	}
	if b.site, err = d.site(r); err != nil {
		return block{}, false, err
	}
	return b, true, nil
}

// checkSize checks a request's size as a trace will: 1 to trace.MaxSize.
func checkSize(r record, key string, n uint64) error {
	switch {
	case n == 0:
		return &FormatError{Path: r.path, Msg: key + " is 0"}
	case n > trace.MaxSize:
		return &FormatError{Path: r.path, Msg: fmt.Sprintf("%s is %d, more than 1 PiB", key, n)}
	}
	return nil
}

// Site texts: the frames of a call stack, innermost first, each
// "name filename:line", joined by siteSep; cut where they would pass
// trace.MaxSiteText, the cut marked by siteCut.
const (
	siteSep = " < "
	siteCut = siteSep + "..."
)

// site returns the site text of the frames of record r: "" when it has no
// frames (the key absent, None or an empty list).
func (d *decoder) site(r record) (string, error) {
	frames, err := r.list("frames", true)
	if err != nil || frames == nil {
		return "", err
	}
	if text, ok := d.stacks[frames]; ok {
		return text, nil
	}
	var b strings.Builder
	path := r.path + ".frames"
	limit := trace.MaxSiteText - len(siteCut)
	for i, v := range *frames {
		f, err := d.frame(v, path, i)
		if err != nil {
			return "", err
		}
		if i == 0 && len(f) > limit {
			b.WriteString(cut(f, limit))
			b.WriteString("...")
			break
		}
		if i > 0 {
			if b.Len()+len(siteSep)+len(f) > limit {
				// The frames past the cut are not read.
				b.WriteString(siteCut)
				break
			}
			b.WriteString(siteSep)
		}
		b.WriteString(f)
	}
	text := strings.Trim(b.String(), " \t")
	d.stacks[frames] = text
	return text, nil
}

// frame returns the text of item i of the frames at path:
// "name filename:line".
func (d *decoder) frame(v any, path string, i int) (string, error) {
	if f, ok := v.(*types.Dict); ok {
		if text, ok := d.frames[f]; ok {
			return text, nil
		}
	}
	r, err := asRecord(v, path, i)
	if err != nil {
		return "", err
	}
	name, err := r.str("name")
	if err != nil {
		return "", err
	}
	file, err := r.str("filename")
	if err != nil {
		return "", err
	}
	line, err := r.int("line")
	if err != nil {
		return "", err
	}
	if name == "" {
		name = "?"
	}
	text := clean(name) + " " + clean(file) + ":" + strconv.FormatInt(line, 10)
	d.frames[r.d] = text
	return text, nil
}

// clean returns s as valid UTF-8 without control characters (each becomes
// "?"), so that no frame can break a trace's line.
func clean(s string) string {
	ok := utf8.ValidString(s)
	for i := 0; ok && i < len(s); i++ {
		ok = s[i] >= 0x20 && s[i] != 0x7f
	}
	if ok {
		return s
	}
	return strings.Map(func(r rune) rune {
		if r < 0x20 || r == 0x7f {
			return '?'
		}
		return r
	}, strings.ToValidUTF8(s, "\uFFFD"))
}

// cut returns the longest prefix of s of at most n bytes that ends on a
// rune boundary.
func cut(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n]
}
