package policy

import (
	"fmt"
	"strings"

	"github.com/gpumem/gpumem"
)

// The policies by name, in the order tables list them: gpumem first.
var policies = []struct {
	name string
	new  func(capacity uint64) (Allocator, error)
}{
	{"gpumem", func(c uint64) (Allocator, error) { return newGpumem(c, gpumem.Config{}) }},
	{"gpumem-compact", func(c uint64) (Allocator, error) { return newGpumem(c, gpumem.Config{Compact: true}) }},
	{"torch-native", func(c uint64) (Allocator, error) { return newTorchNative(c), nil }},
	{"torch-expandable", func(c uint64) (Allocator, error) { return newTorchExpandable(c), nil }},
	{"cuda-async", func(c uint64) (Allocator, error) { return newCudaAsync(c), nil }},
	{"tf-bfc", func(c uint64) (Allocator, error) { return newTFBFC(c, false), nil }},
	{"tf-bfc-prealloc", func(c uint64) (Allocator, error) { return newTFBFC(c, true), nil }},
}

// optional are policies New knows by name that Names (and so "all")
// leaves out: gpumem's opt-in settings, asked for one at a time.
var optional = []struct {
	name string
	new  func(capacity uint64) (Allocator, error)
}{
	{"gpumem-gather", func(c uint64) (Allocator, error) { return newGpumem(c, gpumem.Config{Gather: true}) }},
	{"gpumem-chunks", func(c uint64) (Allocator, error) { return newGpumem(c, gpumem.Config{ChunkHandles: true}) }},
}

// Names returns the names of the policies New knows, gpumem first.
func Names() []string {
	out := make([]string, len(policies))
	for i, p := range policies {
		out[i] = p.name
	}
	return out
}

// New returns a new allocator of the named policy on a device of capacity
// bytes. The allocator of "gpumem" holds a simulated device and implements
// io.Closer; the emulations hold nothing but their books.
func New(name string, capacity uint64) (Allocator, error) {
	if capacity == 0 {
		return nil, fmt.Errorf("policy %s: a device of capacity 0", name)
	}
	for _, p := range append(policies[:len(policies):len(policies)], optional...) {
		if p.name == name {
			return p.new(capacity)
		}
	}
	var opt []string
	for _, p := range optional {
		opt = append(opt, p.name)
	}
	return nil, fmt.Errorf("policy: unknown policy %q (want one of %s, or %s)", name, strings.Join(Names(), ", "), strings.Join(opt, ", "))
}
