//go:build !(linux && (amd64 || arm64))

package nvml

import (
	"errors"
	"runtime"
)

func dlopen(name string) (uintptr, error) {
	return 0, errors.New("NVML is only loaded on linux/amd64 and linux/arm64, not " + runtime.GOOS + "/" + runtime.GOARCH)
}

func dlsym(h uintptr, name string) (uintptr, error) { return 0, errors.New("no dlsym") }

func dlclose(h uintptr) {}

func ccall(fn uintptr, args ...uintptr) nvmlReturn { panic("nvml: no library on this platform") }

func errorStringFunc(addr uintptr) func(int32) string { return nil }
