//go:build !(linux && (amd64 || arm64))

package nvml

func ccall(fn uintptr, args ...uintptr) nvmlReturn { panic("nvml: no library on this platform") }

func errorStringFunc(addr uintptr) func(int32) string { return nil }
