// Package dl loads a C library at run time and resolves its entry points:
// what the CUDA driver backend (device/cuda) and NVML telemetry (nvml)
// share. It needs no cgo: purego does the dlopen, on linux/amd64 and
// linux/arm64; elsewhere Open fails with a clear error.
package dl

import (
	"errors"
	"strings"
)

// Symbol is an entry point to resolve and the exported names it may have,
// best first.
type Symbol struct {
	Addr     *uintptr
	Names    []string
	Optional bool // left 0 when the library has none of the names
}

// LoadError is the failure to load a library or one of its required entry
// points: a single line, unwrapping to the Kind the caller chose (a
// sentinel matching device.ErrNoDriver).
type LoadError struct {
	Msg  string
	Kind error
}

func (e *LoadError) Error() string { return e.Msg }
func (e *LoadError) Unwrap() error { return e.Kind }

// IsLoadError reports whether err is (or wraps) a *LoadError.
func IsLoadError(err error) bool {
	var le *LoadError
	return errors.As(err, &le)
}

// Open loads the library called name and resolves syms. A missing library
// or a missing required symbol gives a *LoadError of kind; tooOld is added
// to the message of a missing symbol ("the NVIDIA driver is too old").
func Open(name string, syms []Symbol, kind error, tooOld string) (uintptr, error) {
	h, err := dlopen(name)
	if err != nil {
		return 0, &LoadError{Msg: Message(name, err), Kind: kind}
	}
	for _, s := range syms {
		for _, n := range s.Names {
			if addr := Sym(h, n); addr != 0 {
				*s.Addr = addr
				break
			}
		}
		if *s.Addr == 0 && !s.Optional {
			dlclose(h)
			return 0, &LoadError{Msg: name + " has no " + s.Names[0] + ": " + tooOld, Kind: kind}
		}
	}
	return h, nil
}

// Sym returns the address of the exported name in library h, or 0.
func Sym(h uintptr, name string) uintptr {
	addr, err := dlsym(h, name)
	if err != nil {
		return 0
	}
	return addr
}

// Message turns a dlopen failure into one clear line: a missing library
// says that no NVIDIA driver is installed.
func Message(name string, err error) string {
	msg := strings.Join(strings.Fields(err.Error()), " ")
	if strings.Contains(msg, "No such file") || strings.Contains(msg, "cannot open shared object file") || msg == "" {
		return name + " not found: no NVIDIA driver on this machine"
	}
	if !strings.Contains(msg, name) {
		msg = name + ": " + msg
	}
	return "cannot load " + msg
}
