package announce

import (
	"os"
	"path/filepath"
	"strconv"
	"testing"
)

func TestAnnounceAndList(t *testing.T) {
	dir := t.TempDir()
	t.Setenv("GPUMEM_RUN_DIR", dir)
	if err := Announce("127.0.0.1:4242"); err != nil {
		t.Fatal(err)
	}
	// A process that has exited (PID far beyond pid_max), and a stray file.
	dead := filepath.Join(dir, strconv.Itoa(1<<30))
	os.WriteFile(dead, []byte("127.0.0.1:1\n"), 0o600)
	os.WriteFile(filepath.Join(dir, "notes"), nil, 0o600)
	ps, err := List()
	if err != nil {
		t.Fatal(err)
	}
	if len(ps) != 1 || ps[0].PID != os.Getpid() || ps[0].Addr != "127.0.0.1:4242" {
		t.Errorf("List() = %+v, want this process at 127.0.0.1:4242", ps)
	}
	if _, err := os.Stat(dead); !os.IsNotExist(err) {
		t.Error("the announcement of an exited process was not removed")
	}
}

// TestDirReadsGetenv: Dir reads GPUMEM_RUN_DIR, then TMPDIR, through
// Getenv (the C library's getenv), not the Go runtime's copy.
func TestDirReadsGetenv(t *testing.T) {
	t.Setenv("GPUMEM_RUN_DIR", "/go/copy")
	defer func(g func(string) string) { Getenv = g }(Getenv)
	env := map[string]string{"GPUMEM_RUN_DIR": "/c/environ"}
	Getenv = func(k string) string { return env[k] }
	if d := Dir(); d != "/c/environ" {
		t.Errorf("Dir() = %q, want GPUMEM_RUN_DIR through Getenv, /c/environ", d)
	}
	env = map[string]string{"TMPDIR": "/c/tmp"}
	if d, want := Dir(), filepath.Join("/c/tmp", "gpumem-"+strconv.Itoa(os.Getuid())); d != want {
		t.Errorf("Dir() = %q, want %q", d, want)
	}
	env = map[string]string{}
	if d, want := Dir(), filepath.Join("/tmp", "gpumem-"+strconv.Itoa(os.Getuid())); d != want {
		t.Errorf("Dir() = %q, want %q", d, want)
	}
}
