package torchsnapshot

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
	"math/big"
	"reflect"
	"strings"
	"testing"

	"github.com/nlpodyssey/gopickle/types"
)

// pickleOf encodes v as a protocol 2 pickle, for tests: the values gopickle
// decodes (nil, bool, int, *big.Int, float64, string, *types.List,
// *types.Tuple, *types.Dict). As Python's pickler, it writes a list or dict
// referenced twice once, and then a reference to it.
func pickleOf(t testing.TB, v any) []byte {
	t.Helper()
	e := encoder{memo: make(map[any]uint32)}
	e.b.WriteString("\x80\x02")
	if err := e.encode(v); err != nil {
		t.Fatal(err)
	}
	e.b.WriteByte('.')
	return e.b.Bytes()
}

type encoder struct {
	b    bytes.Buffer
	memo map[any]uint32 // list or dict -> its memo index
}

// memoize writes v's memo index if v was written before and reports
// whether it did; else it stores the container just written as v.
func (e *encoder) memoize(v any) bool {
	if i, ok := e.memo[v]; ok {
		e.b.WriteByte('j') // LONG_BINGET
		e.b.Write(binary.LittleEndian.AppendUint32(nil, i))
		return true
	}
	return false
}

func (e *encoder) put(v any) {
	i := uint32(len(e.memo))
	e.memo[v] = i
	e.b.WriteByte('r') // LONG_BINPUT
	e.b.Write(binary.LittleEndian.AppendUint32(nil, i))
}

func (e *encoder) encode(v any) error {
	b := &e.b
	switch v := v.(type) {
	case nil:
		b.WriteByte('N')
	case bool:
		if v {
			b.WriteByte('\x88')
		} else {
			b.WriteByte('\x89')
		}
	case int:
		if v >= math.MinInt32 && v <= math.MaxInt32 {
			b.WriteByte('J')
			b.Write(binary.LittleEndian.AppendUint32(nil, uint32(int32(v))))
			return nil
		}
		return e.encode(big.NewInt(int64(v)))
	case *big.Int:
		// LONG1: the value in two's complement, little-endian, in
		// as few bytes as hold its sign.
		x := new(big.Int).Set(v)
		n := (x.BitLen() + 8) / 8
		if x.Sign() < 0 {
			n = (new(big.Int).Not(x).BitLen() + 8) / 8
			x.Add(x, new(big.Int).Lsh(big.NewInt(1), uint(8*n)))
		}
		le := make([]byte, n)
		x.FillBytes(le)
		for i, j := 0, n-1; i < j; i, j = i+1, j-1 {
			le[i], le[j] = le[j], le[i]
		}
		b.WriteByte('\x8a')
		b.WriteByte(byte(n))
		b.Write(le)
	case float64:
		b.WriteByte('G')
		b.Write(binary.BigEndian.AppendUint64(nil, math.Float64bits(v)))
	case string:
		b.WriteByte('X')
		b.Write(binary.LittleEndian.AppendUint32(nil, uint32(len(v))))
		b.WriteString(v)
	case *types.List:
		if e.memoize(v) {
			return nil
		}
		b.WriteByte(']')
		e.put(v)
		if len(*v) > 0 {
			b.WriteByte('(')
			for _, x := range *v {
				if err := e.encode(x); err != nil {
					return err
				}
			}
			b.WriteByte('e')
		}
	case *types.Tuple:
		b.WriteByte('(')
		for _, x := range *v {
			if err := e.encode(x); err != nil {
				return err
			}
		}
		b.WriteByte('t')
	case *types.Dict:
		if e.memoize(v) {
			return nil
		}
		b.WriteByte('}')
		e.put(v)
		if len(*v) > 0 {
			b.WriteByte('(')
			for _, kv := range *v {
				if err := e.encode(kv.Key); err != nil {
					return err
				}
				if err := e.encode(kv.Value); err != nil {
					return err
				}
			}
			b.WriteByte('u')
		}
	default:
		return fmt.Errorf("pickleOf: cannot encode %T", v)
	}
	return nil
}

// dict returns a Dict of the given keys and values, in order.
func dict(kv ...any) *types.Dict {
	d := types.NewDict()
	for i := 0; i < len(kv); i += 2 {
		d.Set(kv[i], kv[i+1])
	}
	return d
}

func list(items ...any) *types.List {
	l := append(types.List{}, items...)
	return &l
}

func TestPickleOfRoundTrip(t *testing.T) {
	huge, _ := new(big.Int).SetString("-123456789012345678901234567890", 10)
	for _, v := range []any{
		nil, true, false, 0, -1, 255, 256, math.MaxInt32, math.MinInt32, math.MaxInt32 + 1, math.MinInt64, math.MaxInt64,
		new(big.Int).SetUint64(math.MaxUint64), huge, 1.5, "", "caf\u00e9",
		list(), list(1, "a", list(nil)), dict(), dict("k", 1, "l", list(dict())),
	} {
		got, err := unpickle(pickleOf(t, v))
		if err != nil {
			t.Fatalf("%v: %v", v, err)
		}
		if b, ok := v.(*big.Int); ok {
			if g, ok := got.(*big.Int); !ok || g.Cmp(b) != 0 {
				t.Errorf("%v read back as %v", v, got)
			}
			continue
		}
		if !reflect.DeepEqual(got, v) {
			t.Errorf("%v read back as %v", v, got)
		}
	}
}

func TestCheckPickle(t *testing.T) {
	le4 := func(n uint32) string { return string(binary.LittleEndian.AppendUint32(nil, n)) }
	le8 := func(n uint64) string { return string(binary.LittleEndian.AppendUint64(nil, n)) }
	tests := []struct {
		name string
		in   string
		msg  string // substring of the error
		eof  bool   // the error wraps io.ErrUnexpectedEOF
	}{
		{"empty", "", "truncated pickle: the pickle ends before its STOP opcode at byte 0", true},
		{"not a pickle", "\xffhello", "corrupt pickle: unknown opcode 0xff at byte 0", false},
		{"no stop", "\x80\x04N", "the pickle ends before its STOP opcode at byte 3", true},
		{"frame too long", "\x80\x04\x95" + le8(1<<62), "truncated pickle: a frame of 4611686018427387904 bytes, 0 left at byte 2", true},
		{"frame past the end", "\x80\x04\x95" + le8(20) + "N.", "a frame of 20 bytes, 2 left at byte 2", true},
		{"frame length cut", "\x80\x04\x95\x01\x00", "no length at byte 2", true},
		{"binunicode8 huge", "\x80\x04\x8d" + le8(math.MaxUint64) + "x.", "an argument of 18446744073709551615 bytes, 2 left", true},
		{"binunicode huge", "\x80\x04X" + le4(math.MaxUint32) + "x.", "an argument of 4294967295 bytes, 2 left at byte 2", true},
		{"binbytes8 huge", "\x80\x04\x8e" + le8(1<<40) + ".", "an argument of 1099511627776 bytes, 1 left", true},
		{"binstring negative", "\x80\x02T" + le4(math.MaxUint32) + ".", "negative length -1 at byte 2", false},
		{"long4 negative", "\x80\x02\x8b" + le4(0x80000000) + ".", "negative length", false},
		{"long4 wide", "\x80\x02\x8b" + le4(1<<20) + strings.Repeat("\x01", 1<<20) + ".", "an integer of 1048576 bytes at byte 2 (at most 1024)", false},
		{"short string cut", "\x80\x04\x8c\x05abc", "an argument of 5 bytes, 3 left at byte 2", true},
		{"line without end", "\x80\x02I12", "a line without its end at byte 2", true},
		{"global one line", "\x80\x02cmodule\nname", "a line without its end", true},
		{"deep marks", "\x80\x02" + strings.Repeat("(", maxMarkDepth+1) + ".", "MARKs nested more than 1024 deep at byte 1026", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := unpickle([]byte(tt.in))
			var fe *FormatError
			if !errors.As(err, &fe) || !errors.Is(err, ErrFormat) {
				t.Fatalf("error %v; want a *FormatError", err)
			}
			if !strings.Contains(err.Error(), tt.msg) || fe.Path != "" {
				t.Errorf("error %q; want %q", err, tt.msg)
			}
			if errors.Is(err, io.ErrUnexpectedEOF) != tt.eof {
				t.Errorf("error %v: wraps io.ErrUnexpectedEOF: %v, want %v", err, !tt.eof, tt.eof)
			}
		})
	}

	// A list referenced twice is one list.
	shared := list(1)
	v, err := unpickle(pickleOf(t, list(shared, shared)))
	if l, ok := v.(*types.List); err != nil || !ok || (*l)[0] != (*l)[1] {
		t.Errorf("a shared list read back as %v, %v", v, err)
	}

	// Marks that close again may come any number of times.
	ok := "\x80\x02]" + strings.Repeat("(Ne", 2*maxMarkDepth) + "."
	if v, err := unpickle([]byte(ok)); err != nil || len(*v.(*types.List)) != 2*maxMarkDepth {
		t.Errorf("balanced marks: %v, %v", v, err)
	}
	// Bytes after STOP are ignored, as by Python.
	if v, err := unpickle([]byte("\x80\x02K\x07.garbage")); err != nil || v != 7 {
		t.Errorf("trailing bytes: %v, %v", v, err)
	}
}

// TestGopicklePanics feeds gopickle input it indexes without checking: the
// panic becomes an error.
func TestGopicklePanics(t *testing.T) {
	for _, in := range []string{
		"\x80\x02\x8a\x00.",          // LONG1 of no bytes
		"\x80\x02(K\x01d.",           // DICT of one item
		"\x80\x02(K\x01K\x02K\x03d.", // DICT of three
		"\x80\x04\x8f(C\x01x\x90.",   // a set of bytes: unhashable
	} {
		_, err := unpickle([]byte(in))
		var fe *FormatError
		if !errors.As(err, &fe) || !strings.HasPrefix(err.Error(), "torchsnapshot: corrupt pickle") {
			t.Errorf("%q: error %v; want a corrupt pickle", in, err)
		}
	}
}
