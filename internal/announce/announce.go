// Package announce lets processes that serve their gpumem pools over HTTP
// be found by the tools that watch a host (gpumem serve, gpumem top): each
// writes its address to a file named by its PID in one directory, and the
// tools list that directory, dropping the files of processes that have
// exited. The directory is $GPUMEM_RUN_DIR, else gpumem-UID in the system's
// temporary directory, made private to the user.
package announce

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
)

// Getenv reads the environment for Dir. The C library (clib) sets it to C's
// getenv before its first call: in a c-shared library os.Getenv reads the
// Go runtime's copy of the environment, made as the library loaded, so a
// GPUMEM_RUN_DIR a Python program put in os.environ after loading it was
// seen or not depending on that race (python/tests/test_library.py's
// test_run_dir_set_in_os_environ_is_read failed 3 runs in 12).
var Getenv = os.Getenv

// Dir is the directory of announcements.
func Dir() string {
	if d := Getenv("GPUMEM_RUN_DIR"); d != "" {
		return d
	}
	tmp := Getenv("TMPDIR") // os.TempDir's rule on Unix, through Getenv
	if tmp == "" {
		tmp = "/tmp"
	}
	return filepath.Join(tmp, fmt.Sprintf("gpumem-%d", os.Getuid()))
}

// Announce records that this process serves its pools at addr.
func Announce(addr string) error {
	dir := Dir()
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	name := filepath.Join(dir, strconv.Itoa(os.Getpid()))
	tmp := name + ".tmp"
	if err := os.WriteFile(tmp, []byte(addr+"\n"), 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, name)
}

// Process is an announced process.
type Process struct {
	PID  int
	Addr string // host:port of its gpumem handler
}

// List returns the announced processes that are still running, by PID,
// and removes the announcements of those that are not.
func List() ([]Process, error) {
	dir := Dir()
	entries, err := os.ReadDir(dir)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var out []Process
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid <= 0 {
			continue
		}
		path := filepath.Join(dir, e.Name())
		if !alive(pid) {
			os.Remove(path)
			continue
		}
		b, err := os.ReadFile(path)
		if err != nil {
			continue
		}
		out = append(out, Process{PID: pid, Addr: strings.TrimSpace(string(b))})
	}
	slices.SortFunc(out, func(a, b Process) int { return a.PID - b.PID })
	return out, nil
}

// alive reports whether a process with this PID exists (signal 0 is only
// checked, never sent).
func alive(pid int) bool {
	err := syscall.Kill(pid, 0)
	return err == nil || errors.Is(err, syscall.EPERM)
}
