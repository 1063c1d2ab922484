package dl

import (
	"errors"
	"strings"
	"testing"
)

var errKind = errors.New("kind")

func TestMissingLibrary(t *testing.T) {
	const name = "libgpumem-no-such-library.so.1"
	var addr uintptr
	_, err := Open(name, []Symbol{{Addr: &addr, Names: []string{"f"}}}, errKind, "too old")
	if err == nil {
		t.Fatal("Open of a missing library succeeded")
	}
	if !errors.Is(err, errKind) || !IsLoadError(err) {
		t.Errorf("error %v does not match its kind or is no LoadError", err)
	}
	if got, want := err.Error(), name+" not found: no NVIDIA driver on this machine"; got != want {
		t.Errorf("error = %q, want %q", got, want)
	}
	if strings.Contains(err.Error(), "\n") {
		t.Errorf("error has several lines: %q", err)
	}
}

func TestMessage(t *testing.T) {
	for _, c := range []struct{ in, want string }{
		{"libcuda.so.1: cannot open shared object file: No such file or directory", "libcuda.so.1 not found: no NVIDIA driver on this machine"},
		{"/usr/lib/libcuda.so.1: wrong ELF class: ELFCLASS32", "cannot load /usr/lib/libcuda.so.1: wrong ELF class: ELFCLASS32"},
		{"bad\nthing", "cannot load libcuda.so.1: bad thing"},
	} {
		if got := Message("libcuda.so.1", errors.New(c.in)); got != c.want {
			t.Errorf("Message(%q) = %q, want %q", c.in, got, c.want)
		}
	}
}
