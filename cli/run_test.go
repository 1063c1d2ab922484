package cli

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// runEnv is fakeEnv with an exec that records what it was asked to run.
func runEnv(got *[]string, gotEnv *[]string) *env {
	e := fakeEnv()
	e.exec = func(path string, argv, envv []string) error {
		*got = append([]string{path}, argv...)
		*gotEnv = envv
		return errors.New("recorded, not run")
	}
	return e
}

func envValue(envv []string, key string) (string, int) {
	var v string
	n := 0
	for _, kv := range envv {
		if k, val, _ := strings.Cut(kv, "="); k == key {
			v = val
			n++
		}
	}
	return v, n
}

func fakeLibraries(t *testing.T) (lib, shim string) {
	dir := t.TempDir()
	lib, shim = filepath.Join(dir, "libgpumem.so"), filepath.Join(dir, "libgpumem_preload.so")
	for _, p := range []string{lib, shim} {
		if err := os.WriteFile(p, nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return lib, shim
}

func TestRun(t *testing.T) {
	lib, shim := fakeLibraries(t)
	t.Setenv("GPUMEM_CONFIG", "release_threshold=1GiB,limit=10GiB")
	t.Setenv("LD_PRELOAD", "/other/preload.so")
	t.Setenv("XLA_PYTHON_CLIENT_ALLOCATOR", "platform")
	var argv, envv []string
	code, _, stderr := run(t, runEnv(&argv, &envv), "run", "--limit", "20GiB", "--release-after", "30s",
		"--library", lib, "--shim", shim, "--", "sh", "-c", "echo --limit")
	if code != ExitFail || !strings.Contains(stderr, "recorded, not run") {
		t.Fatalf("exit %d, stderr %q", code, stderr)
	}
	if !strings.HasSuffix(argv[0], "/sh") || !slices.Equal(argv[1:], []string{"sh", "-c", "echo --limit"}) {
		t.Errorf("ran %q, want sh with its arguments untouched", argv)
	}
	for key, want := range map[string]string{
		"GPUMEM_CONFIG":                 "release_threshold=1GiB,limit=20GiB,release_after=30s",
		"LD_PRELOAD":                    shim + ":/other/preload.so",
		"GPUMEM_LIBRARY":                lib,
		"XLA_PYTHON_CLIENT_ALLOCATOR":   "cuda_async",
		"XLA_PYTHON_CLIENT_PREALLOCATE": "false",
		"TF_GPU_ALLOCATOR":              "cuda_malloc_async",
	} {
		if v, n := envValue(envv, key); v != want || n != 1 {
			t.Errorf("%s=%q (%d times), want %q once", key, v, n, want)
		}
	}
}

func TestRunXLACommandBuffers(t *testing.T) {
	lib, shim := fakeLibraries(t)
	for _, tc := range []struct {
		flag, xlaFlags string // --xla-command-buffers ("" for none), XLA_FLAGS before ("-" unset)
		want           string // XLA_FLAGS after ("-" unset)
	}{
		{"", "-", "--xla_gpu_enable_command_buffer=FUSION"},
		{"", "--xla_dump_to=/tmp/d", "--xla_dump_to=/tmp/d --xla_gpu_enable_command_buffer=FUSION"},
		{"kernels", "--xla_gpu_enable_command_buffer=", "--xla_gpu_enable_command_buffer="}, // the user's choice stands
		{"off", "-", "--xla_gpu_enable_command_buffer="},
		{"xla", "-", "-"},
		{"xla", "--xla_dump_to=/tmp/d", "--xla_dump_to=/tmp/d"},
	} {
		if tc.xlaFlags == "-" {
			t.Setenv("XLA_FLAGS", "")
			os.Unsetenv("XLA_FLAGS")
		} else {
			t.Setenv("XLA_FLAGS", tc.xlaFlags)
		}
		args := []string{"run", "--library", lib, "--shim", shim}
		if tc.flag != "" {
			args = append(args, "--xla-command-buffers", tc.flag)
		}
		var argv, envv []string
		if code, _, stderr := run(t, runEnv(&argv, &envv), append(args, "--", "true")...); code != ExitFail || !strings.Contains(stderr, "recorded, not run") {
			t.Fatalf("%q: exit %d, stderr %q", args, code, stderr)
		}
		v, n := envValue(envv, "XLA_FLAGS")
		if tc.want == "-" && n != 0 || tc.want != "-" && (v != tc.want || n != 1) {
			t.Errorf("--xla-command-buffers %q, XLA_FLAGS %q: got XLA_FLAGS=%q (%d times), want %q", tc.flag, tc.xlaFlags, v, n, tc.want)
		}
	}
}

func TestRunErrors(t *testing.T) {
	lib, shim := fakeLibraries(t)
	t.Setenv("GPUMEM_CONFIG", "")
	var argv, envv []string
	for _, tc := range []struct {
		args []string
		code int
		says string
	}{
		{[]string{"run"}, ExitUsage, "no COMMAND"},
		{[]string{"run", "--limit", "lots", "--", "true"}, ExitUsage, "limit=lots"},
		{[]string{"run", "--release-after", "-1s", "--", "true"}, ExitUsage, "must not be negative"},
		{[]string{"run", "--xla-command-buffers", "some", "--", "true"}, ExitUsage, "want kernels, xla or off"},
		// Moves are the launch gate's to allow (shim/c/gate.c), not run's.
		{[]string{"run", "--config", "defrag=true", "--library", lib, "--shim", shim, "--", "true"}, 1, "recorded, not run"},
		{[]string{"run", "--config", "limit=1GiB,gather=true", "--library", lib, "--shim", shim, "--", "true"}, 1, "recorded, not run"},
		{[]string{"run", "--library", "/nonexistent/libgpumem.so", "--shim", shim, "--", "true"}, ExitFail, "/nonexistent/libgpumem.so"},
		{[]string{"run", "--library", lib, "--shim", shim, "--", "no-such-command-gpumem"}, 127, "no-such-command-gpumem"},
	} {
		code, _, stderr := run(t, runEnv(&argv, &envv), tc.args...)
		if code != tc.code || !strings.Contains(stderr, tc.says) {
			t.Errorf("%q: exit %d, stderr %q; want %d saying %q", tc.args, code, stderr, tc.code, tc.says)
		}
	}
}

func TestJoinConfig(t *testing.T) {
	for _, tc := range []struct{ cfg, kv, want string }{
		{"", "limit=1GiB", "limit=1GiB"},
		{"limit=2GiB,mode=plain", "limit=1GiB", "mode=plain,limit=1GiB"},
		{"mode=plain", "limit=1GiB,release_after=5s", "mode=plain,limit=1GiB,release_after=5s"},
	} {
		if got := joinConfig(tc.cfg, tc.kv); got != tc.want {
			t.Errorf("joinConfig(%q, %q) = %q, want %q", tc.cfg, tc.kv, got, tc.want)
		}
	}
}

// TestRunAutoload: beside a library in a package with the hook, gpumem run
// puts the hook first on PYTHONPATH and names PyTorch and CuPy, keeping the
// user's PYTHONPATH after it and their GPUMEM_AUTOLOAD; without the hook,
// it sets neither.
func TestRunAutoload(t *testing.T) {
	lib, shim := fakeLibraries(t)
	var argv, envv []string
	run(t, runEnv(&argv, &envv), "run", "--library", lib, "--shim", shim, "--", "sh", "-c", "true")
	for _, key := range []string{"PYTHONPATH", "GPUMEM_AUTOLOAD"} {
		if v, n := envValue(envv, key); n != 0 && v != os.Getenv(key) {
			t.Errorf("no hook beside the library: %s=%q, want it left alone", key, v)
		}
	}
	hook := filepath.Join(filepath.Dir(lib), "_autoload")
	if err := os.MkdirAll(hook, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(hook, "sitecustomize.py"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Setenv("PYTHONPATH", "/user/path")
	run(t, runEnv(&argv, &envv), "run", "--library", lib, "--shim", shim, "--", "sh", "-c", "true")
	if v, n := envValue(envv, "PYTHONPATH"); v != hook+":/user/path" || n != 1 {
		t.Errorf("PYTHONPATH=%q (%d times), want %q once", v, n, hook+":/user/path")
	}
	if v, n := envValue(envv, "GPUMEM_AUTOLOAD"); v != "torch,cupy" || n != 1 {
		t.Errorf("GPUMEM_AUTOLOAD=%q (%d times), want torch,cupy once", v, n)
	}
	t.Setenv("GPUMEM_AUTOLOAD", "")
	run(t, runEnv(&argv, &envv), "run", "--library", lib, "--shim", shim, "--", "sh", "-c", "true")
	if v, n := envValue(envv, "GPUMEM_AUTOLOAD"); v != "" || n != 1 {
		t.Errorf("the user's empty GPUMEM_AUTOLOAD became %q (%d times)", v, n)
	}
}
