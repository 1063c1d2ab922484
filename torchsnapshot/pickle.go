package torchsnapshot

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"

	"github.com/nlpodyssey/gopickle/pickle"
)

// unpickle decodes the pickle at the start of data with gopickle, after
// checkPickle has made sure that gopickle's trust in the input cannot cost
// more than the input's size. Bytes after the pickle's STOP are ignored, as
// Python's pickle.load ignores them. A panic in gopickle (it indexes some
// malformed input without checking) becomes a *FormatError.
func unpickle(data []byte) (v any, err error) {
	end, err := checkPickle(data)
	if err != nil {
		return nil, err
	}
	defer func() {
		if p := recover(); p != nil {
			v, err = nil, &FormatError{Msg: "corrupt pickle", Err: fmt.Errorf("%v", p)}
		}
	}()
	u := pickle.NewUnpickler(bytes.NewReader(data[:end]))
	v, err = u.Load()
	switch {
	case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF):
		// checkPickle saw the whole pickle, so this is a frame that
		// ends inside an argument.
		return nil, &FormatError{Msg: "corrupt pickle", Err: io.ErrUnexpectedEOF}
	case err != nil:
		return nil, &FormatError{Msg: "corrupt pickle", Err: err}
	}
	return v, nil
}

// Limits checkPickle sets beyond those of the format. A snapshot's integers
// take at most 9 bytes and its containers nest a few levels deep.
const (
	maxLongBytes = 1 << 10 // of a LONG4 integer: decoding is quadratic in it
	maxMarkDepth = 1 << 10 // of MARKs not yet closed: gopickle allocates a stack per MARK
)

// checkPickle walks the opcodes of the pickle at the start of data without
// building anything, and returns where it ends (just after its STOP). It
// rejects what gopickle would trust: an argument longer than the bytes that
// remain (gopickle allocates the length it reads before reading), an integer
// wider than maxLongBytes, MARKs nested deeper than maxMarkDepth, an opcode
// it does not know and input that ends before STOP. It decodes no values:
// that is gopickle's work.
func checkPickle(data []byte) (int, error) {
	depth := 0
	for pos := 0; ; {
		if pos >= len(data) {
			return 0, truncated(pos, "the pickle ends before its STOP opcode")
		}
		op := data[pos]
		at := pos
		pos++
		// n is the length of the opcode's argument, after its own length
		// prefix of prefix bytes; lines counts arguments that end with a
		// newline instead.
		var n uint64
		prefix, lines := 0, 0
		switch op {
		case '.': // STOP
			return pos, nil
		case '(': // MARK
			if depth++; depth > maxMarkDepth {
				return 0, &FormatError{Msg: fmt.Sprintf("corrupt pickle: MARKs nested more than %d deep at byte %d", maxMarkDepth, at)}
			}
		case '1', 'd', 'e', 'l', 'o', 't', 'u', '\x90', '\x91': // POP_MARK, DICT, APPENDS, LIST, OBJ, TUPLE, SETITEMS, ADDITEMS, FROZENSET
			depth = max(depth-1, 0)
		case '0', '2', 'N', 'R', 'a', 'b', '}', ']', 's', ')', 'Q', '\x81', '\x85', '\x86', '\x87',
			'\x88', '\x89', '\x8f', '\x92', '\x93', '\x94', '\x97', '\x98':
			// No argument.
		case 'K', 'h', 'q', '\x80', '\x82': // BININT1, BINGET, BINPUT, PROTO, EXT1
			n = 1
		case 'M', '\x83': // BININT2, EXT2
			n = 2
		case 'J', 'j', 'r', '\x84': // BININT, LONG_BINGET, LONG_BINPUT, EXT4
			n = 4
		case 'G': // BINFLOAT
			n = 8
		case 'I', 'L', 'F', 'S', 'V', 'P', 'g', 'p': // text arguments
			lines = 1
		case 'i': // INST: module and name, the arguments from a MARK
			depth = max(depth-1, 0)
			lines = 2
		case 'c': // GLOBAL: module and name
			lines = 2
		case 'U', 'C', '\x8c', '\x8a': // SHORT_BINSTRING, SHORT_BINBYTES, SHORT_BINUNICODE, LONG1
			prefix = 1
		case 'T', 'B', 'X', '\x8b': // BINSTRING, BINBYTES, BINUNICODE, LONG4
			prefix = 4
		case '\x8d', '\x8e', '\x96': // BINUNICODE8, BINBYTES8, BYTEARRAY8
			prefix = 8
		case '\x95': // FRAME: its length, then opcodes, walked as any others
			if len(data)-pos < 8 {
				return 0, truncated(at, "no length")
			}
			if l, left := binary.LittleEndian.Uint64(data[pos:]), uint64(len(data)-pos-8); l > left {
				return 0, truncated(at, fmt.Sprintf("a frame of %d bytes, %d left", l, left))
			}
			n = 8
		default:
			return 0, &FormatError{Msg: fmt.Sprintf("corrupt pickle: unknown opcode 0x%02x at byte %d", op, at)}
		}
		if prefix > 0 {
			if len(data)-pos < prefix {
				return 0, truncated(at, "no length")
			}
			switch prefix {
			case 1:
				n = uint64(data[pos])
			case 4:
				l := binary.LittleEndian.Uint32(data[pos:])
				if (op == 'T' || op == '\x8b') && int32(l) < 0 {
					return 0, &FormatError{Msg: fmt.Sprintf("corrupt pickle: negative length %d at byte %d", int32(l), at)}
				}
				if op == '\x8b' && l > maxLongBytes {
					return 0, &FormatError{Msg: fmt.Sprintf("corrupt pickle: an integer of %d bytes at byte %d (at most %d)", l, at, maxLongBytes)}
				}
				n = uint64(l)
			case 8:
				n = binary.LittleEndian.Uint64(data[pos:])
			}
			pos += prefix
		}
		for range lines {
			i := bytes.IndexByte(data[pos:], '\n')
			if i < 0 {
				return 0, truncated(at, "a line without its end")
			}
			pos += i + 1
		}
		if left := uint64(len(data) - pos); n > left {
			return 0, truncated(at, fmt.Sprintf("an argument of %d bytes, %d left", n, left))
		}
		pos += int(n)
	}
}

// truncated reports a pickle cut short at byte at.
func truncated(at int, what string) error {
	return &FormatError{Msg: fmt.Sprintf("truncated pickle: %s at byte %d", what, at), Err: io.ErrUnexpectedEOF}
}
