//go:build !(linux && (amd64 || arm64))

package dl

import (
	"errors"
	"runtime"
)

func dlopen(name string) (uintptr, error) {
	return 0, errors.New("NVIDIA libraries are loaded only on linux/amd64 and linux/arm64, not " + runtime.GOOS + "/" + runtime.GOARCH)
}

func dlsym(h uintptr, name string) (uintptr, error) {
	return 0, errors.New("no dlsym on this platform")
}

func dlclose(h uintptr) {}
