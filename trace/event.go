package trace

import (
	"errors"
	"fmt"
	"strconv"
)

// Kind is the kind of an event: the letter that starts its line.
type Kind byte

// The event kinds.
const (
	Alloc Kind = 'a' // a request for memory
	Free  Kind = 'f' // the release of an earlier request
)

// String returns the kind's letter, or a quoted byte for an unknown kind.
func (k Kind) String() string {
	switch k {
	case Alloc, Free:
		return string(rune(k))
	}
	return strconv.QuoteRune(rune(k))
}

// MaxSize is the largest SIZE a trace may hold: 1 PiB. Larger requests cannot
// come from any real device and are taken to be corrupt data.
const MaxSize = 1 << 50

// Event is one line of a trace. Size and Stream are zero for Free events.
type Event struct {
	Kind   Kind
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
	return strconv.AppendUint(b, e.TimeUS, 10)
}

// ErrSyntax is matched (with errors.Is) by every error that reports malformed
// trace data.
var ErrSyntax = errors.New("trace: syntax error")

// SyntaxError reports malformed trace data: where it is and what is wrong.
type SyntaxError struct {
	Name string // file name as given to Read or Load; "" when unknown
	Line int    // 1-based line number
	Msg  string // what is wrong, starting with the event's kind and ID when known
	Err  error  // the gzip error for corrupt or truncated compressed data, else nil
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

// Is reports whether target is ErrSyntax.
func (e *SyntaxError) Is(target error) bool { return target == ErrSyntax }

// Unwrap returns the underlying gzip error, if any.
func (e *SyntaxError) Unwrap() error { return e.Err }

func where(name string, line int) string {
	if name == "" {
		return fmt.Sprintf("trace: line %d", line)
	}
	return fmt.Sprintf("trace %s:%d", name, line)
}
