//go:build linux && (amd64 || arm64)

package cuda

import "github.com/ebitengine/purego"

// ccall calls the C function at fn and returns its CUresult.
//
// Pointers converted to uintptr in the argument list of a call to ccall are
// moved to the heap and kept alive until it returns (go:uintptrescapes, as
// for purego.SyscallN and syscall.Syscall).
//
//go:uintptrescapes
func ccall(fn uintptr, args ...uintptr) result {
	r, _, _ := purego.SyscallN(fn, args...)
	return result(int32(r))
}
