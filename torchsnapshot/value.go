package torchsnapshot

import (
	"fmt"
	"math/big"
	"strconv"

	"github.com/nlpodyssey/gopickle/types"
)

// maxRecordKeys is the most keys a dict read as a record (a segment, a
// block, a trace entry, a frame) may have; PyTorch writes at most a dozen.
// It bounds the work of reading a record that the pickle references many
// times.
const maxRecordKeys = 256

// A record is a dict of the snapshot read as a record: the values of its
// string keys. Its path says where it is, for error messages.
type record struct {
	d    *types.Dict
	path string
}

// asRecord returns v, item i of the list at path, as a record.
func asRecord(v any, path string, i int) (record, error) {
	p := path + "[" + strconv.Itoa(i) + "]"
	d, ok := v.(*types.Dict)
	if !ok {
		return record{}, &FormatError{Path: path, Msg: fmt.Sprintf("item %d is %s, want a dict", i, typeName(v))}
	}
	if len(*d) > maxRecordKeys {
		return record{}, &FormatError{Path: p, Msg: fmt.Sprintf("a dict of %d keys, more than any snapshot record has (at most %d)", len(*d), maxRecordKeys)}
	}
	return record{d: d, path: p}, nil
}

// get returns the value of key and whether it is there. Where the pickle
// sets a key twice, the last value counts, as in Python.
func (r record) get(key string) (any, bool) {
	for i := len(*r.d) - 1; i >= 0; i-- {
		if k, ok := (*r.d)[i].Key.(string); ok && k == key {
			return (*r.d)[i].Value, true
		}
	}
	return nil, false
}

// need returns the value of key, which must be there.
func (r record) need(key string) (any, error) {
	v, ok := r.get(key)
	if !ok {
		return nil, &FormatError{Path: r.path, Msg: fmt.Sprintf("no key %q", key)}
	}
	return v, nil
}

func (r record) wrongType(key string, v any, want string) error {
	return &FormatError{Path: r.path, Msg: fmt.Sprintf("%s is %s, want %s", key, typeName(v), want)}
}

// str returns the string value of key.
func (r record) str(key string) (string, error) {
	v, err := r.need(key)
	if err != nil {
		return "", err
	}
	s, ok := v.(string)
	if !ok {
		return "", r.wrongType(key, v, "a string")
	}
	return s, nil
}

// uint returns the value of key, an int from 0 to 2^64-1.
func (r record) uint(key string) (uint64, error) {
	v, err := r.need(key)
	if err != nil {
		return 0, err
	}
	switch n := v.(type) {
	case int:
		if n >= 0 {
			return uint64(n), nil
		}
	case *big.Int:
		if n.IsUint64() {
			return n.Uint64(), nil
		}
	default:
		return 0, r.wrongType(key, v, "an int")
	}
	return 0, &FormatError{Path: r.path, Msg: fmt.Sprintf("%s is %v, want 0 to 2^64-1", key, v)}
}

// int returns the value of key, an int that fits in 64 bits.
func (r record) int(key string) (int64, error) {
	v, err := r.need(key)
	if err != nil {
		return 0, err
	}
	switch n := v.(type) {
	case int:
		return int64(n), nil
	case *big.Int:
		if n.IsInt64() {
			return n.Int64(), nil
		}
		return 0, &FormatError{Path: r.path, Msg: fmt.Sprintf("%s is %v, which overflows 64 bits", key, n)}
	}
	return 0, r.wrongType(key, v, "an int")
}

// list returns the list value of key; nil if the key is absent or None and
// optional is set.
func (r record) list(key string, optional bool) (*types.List, error) {
	v, ok := r.get(key)
	if optional && (!ok || v == nil) {
		return nil, nil
	}
	if !ok {
		return nil, &FormatError{Path: r.path, Msg: fmt.Sprintf("no key %q", key)}
	}
	l, ok := v.(*types.List)
	if !ok {
		return nil, r.wrongType(key, v, "a list")
	}
	return l, nil
}

// typeName returns the Python name of the type of a value gopickle decoded.
func typeName(v any) string {
	switch v := v.(type) {
	case nil:
		return "None"
	case bool:
		return "bool"
	case int, *big.Int:
		return "int"
	case float64:
		return "float"
	case string:
		return "str"
	case []byte:
		return "bytes"
	case *types.ByteArray:
		return "bytearray"
	case *types.List:
		return "list"
	case *types.Tuple:
		return "tuple"
	case *types.Dict:
		return "dict"
	case *types.OrderedDict:
		return "OrderedDict"
	case *types.Set:
		return "set"
	case *types.FrozenSet:
		return "frozenset"
	case *types.GenericClass:
		return "the class " + v.Module + "." + v.Name
	case *types.GenericObject:
		if v.Class != nil {
			return "an object of " + v.Class.Module + "." + v.Class.Name
		}
	}
	return fmt.Sprintf("%T", v)
}
