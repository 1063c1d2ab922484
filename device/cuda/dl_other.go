//go:build !(linux && (amd64 || arm64))

package cuda

import (
	"errors"
	"runtime"
)

func dlopen(name string) (uintptr, error) {
	return 0, errors.New("the CUDA driver is only loaded on linux/amd64 and linux/arm64, not " + runtime.GOOS + "/" + runtime.GOARCH)
}

func dlsym(h uintptr, name string) (uintptr, error) { return 0, errors.New("no dlsym") }

func dlclose(h uintptr) {}

func ccall(fn uintptr, args ...uintptr) result { panic("cuda: no driver on this platform") }
