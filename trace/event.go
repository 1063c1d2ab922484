package trace

import (
	"errors"
	"fmt"
	"strconv"
)

// Kind is the kind of an event: the letter that starts its line.
type Kind byte

// The event kinds. A site definition ("s SITE TEXT") is a line but not an
// event: a Reader keeps its text (see Reader.Site) and Next skips it.
const (
	Alloc Kind = 'a' // a request for memory
	Free  Kind = 'f' // the release of an earlier request
)

// siteKind is the letter of a site definition line; trimKind of a trim
// line ("t T_US": the program emptied the allocator's cache, as
// torch.cuda.empty_cache does), which is not an event either: Trace.Trims
// and Reader.Trims say where trims fall among the events.
const (
	siteKind Kind = 's'
	trimKind Kind = 't'
)

// String returns the kind's letter, or a quoted byte for an unknown kind.
func (k Kind) String() string {
	switch k {
	case Alloc, Free, siteKind, trimKind:
		return string(rune(k))
	}
	return strconv.QuoteRune(rune(k))
}

// MaxSize is the largest SIZE a trace may hold: 1 PiB. Larger requests cannot
// come from any real device and are taken to be corrupt data.
const MaxSize = 1 << 50

// MaxSiteText is the longest TEXT of a site definition, in bytes: a call
// stack deeper than this is cut by whoever writes it. It keeps every line
// within the 64 KiB a Reader accepts.
const MaxSiteText = 60 << 10

// Event is one event line of a trace. Size, Stream and Site are zero for
// Free events.
type Event struct {
	Kind Kind
	// Site is the call site of the request, a site defined earlier in the
	// trace, or 0 for none (Alloc only). It sits beside Kind, in what would
	// be padding: an Event stays 40 bytes.
	Site   uint32
	ID     uint64 // request ID, unique within a trace
	Size   uint64 // bytes requested (Alloc only)
	Stream uint64 // stream of the request, 0 = default (Alloc only)
	TimeUS uint64 // microseconds since the first event
}

// String returns the event as a trace line, without the newline.
func (e Event) String() string {
	return string(appendEvent(nil, e))
}

func appendEvent(b []byte, e Event) []byte {
	b = append(b, byte(e.Kind), ' ')
	b = strconv.AppendUint(b, e.ID, 10)
	if e.Kind == Alloc {
		b = append(b, ' ')
		b = strconv.AppendUint(b, e.Size, 10)
		b = append(b, ' ')
		b = strconv.AppendUint(b, e.Stream, 10)
	}
	b = append(b, ' ')
	b = strconv.AppendUint(b, e.TimeUS, 10)
	if e.Kind == Alloc && e.Site != 0 {
		b = append(b, ' ')
		b = strconv.AppendUint(b, uint64(e.Site), 10)
	}
	return b
}

// appendSite appends the line "s site text", without the newline.
func appendSite(b []byte, site uint32, text string) []byte {
	b = append(b, 's', ' ')
	b = strconv.AppendUint(b, uint64(site), 10)
	b = append(b, ' ')
	return append(b, text...)
}

// ErrSyntax is matched (with errors.Is) by every error that reports malformed
// trace data.
var ErrSyntax = errors.New("trace: syntax error")

// ErrCutShort is matched (with errors.Is) by the syntax errors of a trace
// that ends where it should not: gzip data that stops before its end, or a
// last line without its newline (a copy cut short, or a recording whose
// process died). What comes before the cut is whole: ReadPartial and
// LoadPartial read it.
var ErrCutShort = errors.New("trace: cut short")

// SyntaxError reports malformed trace data: where it is and what is wrong.
type SyntaxError struct {
	Name string // file name as given to Read or Load; "" when unknown
	Line int    // 1-based line number
	Msg  string // what is wrong, starting with the event's kind and ID when known
	Err  error  // the gzip error for corrupt or truncated compressed data, else nil
	Cut  bool   // the data ends before the trace does (ErrCutShort)
}

// Error returns, for example,
// "trace gpt2.trace.gz:1234: f 77: request 77 was never allocated".
func (e *SyntaxError) Error() string {
	s := where(e.Name, e.Line) + ": " + e.Msg
	if e.Err != nil {
		s += ": " + e.Err.Error()
	}
	return s
}

// Is reports whether target is ErrSyntax, or ErrCutShort for a trace cut
// short.
func (e *SyntaxError) Is(target error) bool {
	return target == ErrSyntax || target == ErrCutShort && e.Cut
}

// Unwrap returns the underlying gzip error, if any.
func (e *SyntaxError) Unwrap() error { return e.Err }

func where(name string, line int) string {
	if name == "" {
		return fmt.Sprintf("trace: line %d", line)
	}
	return fmt.Sprintf("trace %s:%d", name, line)
}
