package trace

import (
	"bufio"
	"bytes"
	"compress/flate"
	"compress/gzip"
	"errors"
	"fmt"
	"io"
	"math"
	"slices"
	"strconv"
	"unicode/utf8"
)

// header is the significant prefix of the first line of every v1 trace,
// headerV2 of every v2 trace.
const (
	header   = "# gpumem-trace v1"
	headerV2 = "# gpumem-trace v2"
)

// headerLine and headerLineV2 are the full first lines that Writer writes.
const (
	headerLine   = header + ": a ID SIZE STREAM T_US | f ID T_US\n"
	headerLineV2 = headerV2 + ": a SIZE STREAM DT_US | f BACK DT_US | t DT_US\n"
)

// maxLine is the longest line a Reader accepts, comments included.
const maxLine = 64 << 10

// Reader reads the events of a trace one at a time, checking them as it goes
// (see the package documentation for the checks). It remembers, per request,
// only the lines of its Alloc and Free events, and the text of every site
// defined (see Site).
type Reader struct {
	br    *bufio.Reader
	gz    bool   // input is gzip-compressed
	v2    bool   // the header says v2: IDs implicit, times as deltas
	name  string // for error messages; set by Read
	line  int    // number of the last line read
	lastT uint64 // time of the last event
	err   error  // sticky: returned by every Next after the first error

	ids   idTable
	reqs  []request          // by slot
	sites map[uint32]siteDef // by site number; nil until the first
	trims int                // "t" lines read so far (Trims)
	idbuf []byte             // v2: the current line's request ID, for messages
}

// Trims is how many "t" lines (the program emptied the allocator's cache)
// the Reader has read so far: a trim read before the event Next returned
// last came before that event.
func (r *Reader) Trims() int { return r.trims }

// siteDef is a site as a Reader keeps it.
type siteDef struct {
	text string
	line int // where it was defined
}

// request is what a Reader remembers of one request.
type request struct {
	allocLine int
	freeLine  int // 0 while live
}

// NewReader returns a Reader of the trace in r, gzip-compressed or plain. It
// reads and checks the header line.
func NewReader(r io.Reader) (*Reader, error) {
	return newReader(r, "")
}

func newReader(r io.Reader, name string) (*Reader, error) {
	rd := &Reader{name: name}
	br := bufio.NewReaderSize(r, maxLine)
	magic, err := br.Peek(2)
	if err != nil && err != io.EOF {
		return nil, rd.readError(err)
	}
	if len(magic) == 2 && magic[0] == 0x1f && magic[1] == 0x8b {
		rd.gz = true
		zr, err := gzip.NewReader(br)
		if err != nil {
			return nil, rd.readError(err)
		}
		br = bufio.NewReaderSize(zr, maxLine)
	}
	rd.br = br

	line, err := rd.readLine()
	switch {
	case err == io.EOF:
		rd.line = 1
		return nil, rd.syntaxError("missing header line %q: the input is empty", header)
	case err != nil:
		return nil, err
	}
	switch {
	case hasHeader(line, header):
	case hasHeader(line, headerV2):
		rd.v2 = true
	case bytes.HasPrefix(line, []byte("# gpumem-trace ")):
		return nil, rd.syntaxError("unsupported format %s; this package reads %q and %q", quote(line), header, headerV2)
	default:
		return nil, rd.syntaxError("missing header line %q; got %s", header, quote(line))
	}
	return rd, nil
}

// hasHeader reports whether line is the header line h, with or without
// the text after it.
func hasHeader(line []byte, h string) bool {
	return bytes.HasPrefix(line, []byte(h)) && (len(line) == len(h) || isHeaderEnd(line[len(h)]))
}

func isHeaderEnd(c byte) bool { return c == ':' || c == ' ' || c == '\t' }

// Next returns the next event, or io.EOF after the last one. Site
// definitions are not events: Next checks and keeps them (see Site) and
// goes on to the next event. After an error, Next returns the same error
// again.
func (r *Reader) Next() (Event, error) {
	ev, _, err := r.next()
	return ev, err
}

// next returns the next event and its request's slot: the number of Alloc
// events before the request's own Alloc event.
func (r *Reader) next() (Event, int32, error) {
	if r.err != nil {
		return Event{}, -1, r.err
	}
	for {
		line, err := r.readLine()
		if err != nil {
			r.err = err
			return Event{}, -1, err
		}
		ev, slot, skip, err := r.parse(line)
		if err != nil {
			r.err = err
			return Event{}, -1, err
		}
		if !skip {
			return ev, slot, nil
		}
	}
}

// readLine returns the next line without its line ending, and counts it.
// The line is valid until the next read.
func (r *Reader) readLine() ([]byte, error) {
	b, err := r.br.ReadSlice('\n')
	if err != nil {
		switch {
		case err == bufio.ErrBufferFull:
			r.line++
			return nil, r.syntaxError("line longer than %d bytes", maxLine)
		case err != io.EOF:
			return nil, r.readError(err)
		case len(b) == 0:
			return nil, io.EOF
		}
		// A last line without a newline: every line a Writer writes ends
		// with one, so the file was cut short (a copy or a recording
		// stopped mid-line), and what the cut line says may be a prefix
		// of what it said ("f 4" of "f 421 ..."): refuse it rather than
		// read a wrong event.
		r.line++
		e := r.syntaxError("the last line, %s, has no newline: the trace is cut short", quote(b)).(*SyntaxError)
		e.Cut = true
		return nil, e
	}
	r.line++
	if n := len(b); n > 0 && b[n-1] == '\n' {
		b = b[:n-1]
	}
	if n := len(b); n > 0 && b[n-1] == '\r' {
		b = b[:n-1]
	}
	return b, nil
}

// readError turns an error from reading the input into the error to return:
// a SyntaxError for corrupt or truncated gzip data, otherwise the error
// wrapped with the place where it happened.
func (r *Reader) readError(err error) error {
	line := r.line + 1
	if r.gz {
		var corrupt flate.CorruptInputError
		switch {
		case errors.Is(err, io.ErrUnexpectedEOF):
			return &SyntaxError{Name: r.name, Line: line, Msg: "truncated gzip stream", Err: err, Cut: true}
		case errors.Is(err, gzip.ErrChecksum), errors.Is(err, gzip.ErrHeader), errors.As(err, &corrupt):
			return &SyntaxError{Name: r.name, Line: line, Msg: "corrupt gzip data", Err: err}
		}
	}
	return fmt.Errorf("%s: %w", where(r.name, line), err)
}

// syntaxError returns a SyntaxError at the current line.
func (r *Reader) syntaxError(format string, args ...any) error {
	return &SyntaxError{Name: r.name, Line: r.line, Msg: fmt.Sprintf(format, args...)}
}

// parse parses and checks one line after the header. skip reports a line
// that is not an event: blank, a comment or a site definition.
func (r *Reader) parse(line []byte) (ev Event, slot int32, skip bool, err error) {
	// Split into fields by hand: strings.Fields would allocate per line.
	var f [6][]byte
	n := 0
	third := 0 // where the third field starts: a site's TEXT
	for i := 0; ; {
		for i < len(line) && (line[i] == ' ' || line[i] == '\t') {
			i++
		}
		if i == len(line) {
			break
		}
		j := i
		for j < len(line) && line[j] != ' ' && line[j] != '\t' {
			j++
		}
		if n < len(f) {
			f[n] = line[i:j]
		}
		if n == 2 {
			third = i
		}
		n++
		i = j
	}
	if n == 0 || f[0][0] == '#' {
		return Event{}, -1, true, nil
	}

	if r.v2 {
		return r.parseV2(f, n, line[third:])
	}
	var want, most int
	switch {
	case len(f[0]) == 1 && f[0][0] == byte(Alloc):
		want, most = 5, 6
	case len(f[0]) == 1 && f[0][0] == byte(Free):
		want, most = 3, 3
	case len(f[0]) == 1 && f[0][0] == byte(siteKind):
		return Event{}, -1, true, r.defineSite(f[1], n, line[third:])
	case len(f[0]) == 1 && f[0][0] == byte(trimKind):
		return Event{}, -1, true, r.trim(f[1], n)
	default:
		return Event{}, -1, false, r.syntaxError("unknown event kind %s; want \"a\" (a ID SIZE STREAM T_US [SITE]), \"f\" (f ID T_US), \"t\" (t T_US) or \"s\" (s SITE TEXT)", quote(f[0]))
	}
	kind := Kind(f[0][0])
	if n < want || n > most {
		if kind == Free {
			return Event{}, -1, false, r.syntaxError("f event with %d fields; want 3: f ID T_US", n)
		}
		return Event{}, -1, false, r.syntaxError("a event with %d fields; want 5 or 6: a ID SIZE STREAM T_US [SITE]", n)
	}

	ev.Kind = kind
	if ev.ID, err = r.number(kind, nil, "ID", f[1]); err != nil {
		return Event{}, -1, false, err
	}
	tf := f[2]
	if kind == Alloc {
		if ev.Size, err = r.number(kind, f[1], "SIZE", f[2]); err != nil {
			return Event{}, -1, false, err
		}
		if ev.Stream, err = r.number(kind, f[1], "STREAM", f[3]); err != nil {
			return Event{}, -1, false, err
		}
		tf = f[4]
		if n == 6 {
			if ev.Site, err = r.siteNumber(kind, f[1], f[5]); err != nil {
				return Event{}, -1, false, err
			}
		}
	}
	if ev.TimeUS, err = r.number(kind, f[1], "T_US", tf); err != nil {
		return Event{}, -1, false, err
	}

	if ev.TimeUS < r.lastT {
		return Event{}, -1, false, r.syntaxError("%s %d: time %d us is before the previous event's %d us; time must not go backwards",
			kind, ev.ID, ev.TimeUS, r.lastT)
	}
	return r.check(ev)
}

// check checks an event parsed from the current line against the requests
// read so far (see the package documentation), records it and returns its
// slot.
func (r *Reader) check(ev Event) (Event, int32, bool, error) {
	kind := ev.Kind
	s, known := r.ids.get(ev.ID)
	if kind == Alloc {
		switch {
		case ev.Size == 0:
			return Event{}, -1, false, r.syntaxError("a %d: SIZE is 0", ev.ID)
		case ev.Size > MaxSize:
			return Event{}, -1, false, r.syntaxError("a %d: SIZE %d is larger than 1 PiB, not a plausible request", ev.ID, ev.Size)
		case ev.Site != 0 && r.sites[ev.Site].line == 0:
			return Event{}, -1, false, r.syntaxError("a %d: site %d is not defined; an \"s %d TEXT\" line must come first", ev.ID, ev.Site, ev.Site)
		case known:
			return Event{}, -1, false, r.syntaxError("a %d: request %d was already allocated at line %d", ev.ID, ev.ID, r.reqs[s].allocLine)
		case len(r.reqs) >= math.MaxInt32:
			return Event{}, -1, false, r.syntaxError("a %d: more than %d requests", ev.ID, math.MaxInt32)
		}
		s = int32(len(r.reqs))
		r.reqs = append(grow(r.reqs), request{allocLine: r.line})
		r.ids.put(ev.ID, s)
	} else {
		switch {
		case !known:
			return Event{}, -1, false, r.syntaxError("f %d: request %d was never allocated", ev.ID, ev.ID)
		case r.reqs[s].freeLine != 0:
			return Event{}, -1, false, r.syntaxError("f %d: request %d was already freed at line %d", ev.ID, ev.ID, r.reqs[s].freeLine)
		}
		r.reqs[s].freeLine = r.line
	}
	r.lastT = ev.TimeUS
	return ev, s, false, nil
}

// parseV2 parses and checks one line after a v2 header, of n fields f
// (text is the line from its third field on, a site's TEXT): the line's
// request ID and time are made absolute, as a v1 line gives them, and the
// event checked as one.
func (r *Reader) parseV2(f [6][]byte, n int, text []byte) (Event, int32, bool, error) {
	if len(f[0]) != 1 {
		return Event{}, -1, false, r.unknownKindV2(f[0])
	}
	next := uint64(len(r.reqs)) // the ID of the next request
	r.idbuf = strconv.AppendUint(r.idbuf[:0], next, 10)
	var ev Event
	var err error
	var dt []byte
	switch Kind(f[0][0]) {
	case Alloc:
		if n < 4 || n > 5 {
			return Event{}, -1, false, r.syntaxError("a event with %d fields; want 4 or 5: a SIZE STREAM DT_US [SITE]", n)
		}
		ev = Event{Kind: Alloc, ID: next}
		if ev.Size, err = r.number(Alloc, r.idbuf, "SIZE", f[1]); err != nil {
			return Event{}, -1, false, err
		}
		if ev.Stream, err = r.number(Alloc, r.idbuf, "STREAM", f[2]); err != nil {
			return Event{}, -1, false, err
		}
		if n == 5 {
			if ev.Site, err = r.siteNumber(Alloc, r.idbuf, f[4]); err != nil {
				return Event{}, -1, false, err
			}
		}
		dt = f[3]
	case Free:
		if n != 3 {
			return Event{}, -1, false, r.syntaxError("f event with %d fields; want 3: f BACK DT_US", n)
		}
		back, err := r.number(Free, nil, "BACK", f[1])
		if err != nil {
			return Event{}, -1, false, err
		}
		if back >= next {
			return Event{}, -1, false, r.syntaxError("f: BACK %d reaches before the first request (%d allocated so far)", back, next)
		}
		ev = Event{Kind: Free, ID: next - 1 - back}
		r.idbuf = strconv.AppendUint(r.idbuf[:0], ev.ID, 10)
		dt = f[2]
	case siteKind:
		return Event{}, -1, true, r.defineSite(f[1], n, text)
	case trimKind:
		if n != 2 {
			return Event{}, -1, false, r.syntaxError("t line with %d fields; want 2: t DT_US", n)
		}
		t, err := r.after(trimKind, nil, f[1])
		if err != nil {
			return Event{}, -1, false, err
		}
		r.lastT = t
		r.trims++
		return Event{}, -1, true, nil
	default:
		return Event{}, -1, false, r.unknownKindV2(f[0])
	}
	if ev.TimeUS, err = r.after(ev.Kind, r.idbuf, dt); err != nil {
		return Event{}, -1, false, err
	}
	return r.check(ev)
}

// after returns the time of a v2 line whose DT_US field is b: the previous
// event's time plus b.
func (r *Reader) after(kind Kind, id []byte, b []byte) (uint64, error) {
	dt, err := r.number(kind, id, "DT_US", b)
	if err != nil {
		return 0, err
	}
	if dt > math.MaxUint64-r.lastT {
		return 0, r.syntaxError("%sDT_US %d after %d us overflows 64 bits", eventPrefix(kind, id), dt, r.lastT)
	}
	return r.lastT + dt, nil
}

func (r *Reader) unknownKindV2(k []byte) error {
	return r.syntaxError("unknown event kind %s; want \"a\" (a SIZE STREAM DT_US [SITE]), \"f\" (f BACK DT_US), \"t\" (t DT_US) or \"s\" (s SITE TEXT)", quote(k))
}

// trim checks the line "t T_US", of n fields, and counts it.
func (r *Reader) trim(tf []byte, n int) error {
	if n != 2 {
		return r.syntaxError("t line with %d fields; want 2: t T_US", n)
	}
	t, err := strconv.ParseUint(string(tf), 10, 64)
	if err != nil {
		return r.syntaxError("t: T_US %s is not an unsigned decimal number of 64 bits", quote(tf))
	}
	if t < r.lastT {
		return r.syntaxError("t: time %d us is before the previous event's %d us; time must not go backwards", t, r.lastT)
	}
	r.lastT = t
	r.trims++
	return nil
}

// defineSite checks the line "s SITE TEXT", of n fields, and keeps the
// site's text. text is the line from its third field on.
func (r *Reader) defineSite(num []byte, n int, text []byte) error {
	if n < 2 {
		return r.syntaxError("s line with no SITE; want s SITE TEXT")
	}
	site, err := r.siteNumber(siteKind, nil, num)
	if err != nil {
		return err
	}
	if n < 3 {
		return r.syntaxError("s %d: no TEXT; want s SITE TEXT", site)
	}
	for len(text) > 0 && (text[len(text)-1] == ' ' || text[len(text)-1] == '\t') {
		text = text[:len(text)-1]
	}
	switch {
	case len(text) > MaxSiteText:
		return r.syntaxError("s %d: TEXT of %d bytes is longer than %d", site, len(text), MaxSiteText)
	case !utf8.Valid(text):
		return r.syntaxError("s %d: TEXT is not valid UTF-8", site)
	case bytes.IndexByte(text, '\r') >= 0:
		return r.syntaxError("s %d: TEXT holds a carriage return", site)
	case r.sites[site].line != 0:
		return r.syntaxError("s %d: site %d was already defined at line %d", site, site, r.sites[site].line)
	}
	if r.sites == nil {
		r.sites = make(map[uint32]siteDef)
	}
	r.sites[site] = siteDef{text: string(text), line: r.line}
	return nil
}

// siteNumber parses the SITE field b of a site definition (id nil) or of
// the alloc event whose ID field is id: a number from 1 to 2^32-1.
func (r *Reader) siteNumber(kind Kind, id []byte, b []byte) (uint32, error) {
	v, err := r.number(kind, id, "SITE", b)
	switch {
	case err != nil:
		return 0, err
	case v > math.MaxUint32:
		return 0, r.syntaxError("%sSITE %s overflows 32 bits", eventPrefix(kind, id), quote(b))
	case v == 0 && kind == siteKind:
		return 0, r.syntaxError("s 0: SITE is 0; sites are numbered from 1")
	case v == 0:
		return 0, r.syntaxError("%sSITE is 0; sites are numbered from 1 (leave the field out for none)", eventPrefix(kind, id))
	}
	return uint32(v), nil
}

// Site returns the text of site, as defined by an "s" line read so far, or
// "" if no such line has been read. Every site an Alloc event returned by
// Next names is defined.
func (r *Reader) Site(site uint32) string {
	return r.sites[site].text
}

// number parses field b, named field, of an event of the given kind whose ID
// field is id (nil while parsing the ID itself).
func (r *Reader) number(kind Kind, id []byte, field string, b []byte) (uint64, error) {
	var v uint64
	for i, c := range b {
		d := uint64(c - '0')
		if d > 9 {
			return 0, r.numberError(kind, id, field, b)
		}
		if i >= 19 && (v > (math.MaxUint64-d)/10) {
			return 0, r.syntaxError("%s%s %s overflows 64 bits", eventPrefix(kind, id), field, quote(b))
		}
		v = v*10 + d
	}
	return v, nil
}

func (r *Reader) numberError(kind Kind, id []byte, field string, b []byte) error {
	what := "is not a decimal number"
	if b[0] == '-' && len(b) > 1 {
		what = "is negative"
		for _, c := range b[1:] {
			if c < '0' || c > '9' {
				what = "is not a decimal number"
				break
			}
		}
	}
	return r.syntaxError("%s%s %s %s", eventPrefix(kind, id), field, quote(b), what)
}

// eventPrefix returns "a 12: " for an event whose ID field is known.
func eventPrefix(kind Kind, id []byte) string {
	if id == nil {
		return kind.String() + ": "
	}
	return kind.String() + " " + string(id) + ": "
}

// quote quotes b for an error message, shortened if long.
func quote(b []byte) string {
	const max = 40
	if len(b) > max {
		return fmt.Sprintf("%q...", b[:max])
	}
	return fmt.Sprintf("%q", b)
}

// idTable maps request IDs to slots. IDs that count up from 0, as in every
// recorded trace, live in a slice indexed by ID; IDs far beyond the number of
// requests seen go to a map, so that memory stays proportional to the number
// of requests whatever the IDs.
type idTable struct {
	dense  []int32 // by ID: slot+1, or 0 for none
	sparse map[uint64]int32
	n      int // entries
}

func (t *idTable) get(id uint64) (int32, bool) {
	if id < uint64(len(t.dense)) {
		if s := t.dense[id]; s != 0 {
			return s - 1, true
		}
	}
	if t.sparse != nil {
		s, ok := t.sparse[id]
		return s, ok
	}
	return 0, false
}

// put records id, which must not be present, at slot s.
func (t *idTable) put(id uint64, s int32) {
	t.n++
	l := uint64(len(t.dense))
	switch {
	case id == l:
		t.dense = append(grow(t.dense), s+1)
	case id < l:
		t.dense[id] = s + 1
	case id < 2*uint64(t.n)+1024:
		t.dense = append(t.dense, make([]int32, id-l+1)...)
		t.dense[id] = s + 1
	default:
		if t.sparse == nil {
			t.sparse = make(map[uint64]int32)
		}
		t.sparse[id] = s
	}
}

// grow returns s with room for at least one more element, doubling its
// capacity when full. Plain append grows large slices by only 1.25x, which
// for the per-request tables of a long trace costs several copies of each.
func grow[T any](s []T) []T {
	if len(s) < cap(s) {
		return s
	}
	return slices.Grow(s, max(len(s), 256))
}
