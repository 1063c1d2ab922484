//go:build !(linux && (amd64 || arm64))

package cuda

func ccall(fn uintptr, args ...uintptr) result { panic("cuda: no driver on this platform") }
