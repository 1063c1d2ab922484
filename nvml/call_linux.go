//go:build linux && (amd64 || arm64)

package nvml

import "github.com/ebitengine/purego"

// ccall calls the C function at fn and returns its nvmlReturn_t.
//
// Pointers converted to uintptr in the argument list of a call to ccall are
// moved to the heap and kept alive until it returns (go:uintptrescapes, as
// for purego.SyscallN).
//
//go:uintptrescapes
func ccall(fn uintptr, args ...uintptr) nvmlReturn {
	r, _, _ := purego.SyscallN(fn, args...)
	return nvmlReturn(int32(r))
}

// errorStringFunc wraps "const char *nvmlErrorString(nvmlReturn_t)"; purego
// copies the returned C string into a Go string.
func errorStringFunc(addr uintptr) func(int32) string {
	var f func(int32) string
	purego.RegisterFunc(&f, addr)
	return f
}
