package torchsnapshot

import "errors"

// ErrFormat is matched (with errors.Is) by every error that reports input
// that is not a well-formed PyTorch memory snapshot: a corrupt or truncated
// pickle, or a pickle of something else.
var ErrFormat = errors.New("torchsnapshot: not a PyTorch memory snapshot")

// FormatError reports input that is not a well-formed snapshot: where it
// is and what is wrong.
type FormatError struct {
	// Path is where in the snapshot the fault is, written as Python
	// would index it without the quotes: "device_traces[0][17]",
	// "segments[3].blocks[2]". It is "" for the pickle as a whole.
	Path string
	Msg  string // what is wrong
	// Err is the underlying error of a corrupt or truncated pickle
	// (io.ErrUnexpectedEOF for a truncated one), else nil.
	Err error
}

// Error returns, for example,
// "torchsnapshot: device_traces[0][17]: action is int, want a string".
func (e *FormatError) Error() string {
	s := "torchsnapshot: "
	if e.Path != "" {
		s += e.Path + ": "
	}
	s += e.Msg
	if e.Err != nil {
		s += ": " + e.Err.Error()
	}
	return s
}

// Is reports whether target is ErrFormat.
func (e *FormatError) Is(target error) bool { return target == ErrFormat }

// Unwrap returns the underlying error, if any.
func (e *FormatError) Unwrap() error { return e.Err }
