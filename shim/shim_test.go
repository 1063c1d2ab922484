package shim

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// built is what the tests run: the shim, gpumem's library, the stand-in
// driver (as libcuda.so.1 in its own directory) and tfalloc.
type built struct {
	shim, lib, driverDir, tfalloc string
}

func build(t *testing.T) built {
	t.Helper()
	cc, err := exec.LookPath("cc")
	if err != nil {
		t.Skip("no C compiler (cc): the shim and its test programs are C")
	}
	dir := t.TempDir()
	b := built{
		shim:      filepath.Join(dir, "libgpumem_preload.so"),
		lib:       filepath.Join(dir, "libgpumem.so"),
		driverDir: filepath.Join(dir, "driver"),
		tfalloc:   filepath.Join(dir, "tfalloc"),
	}
	if err := os.Mkdir(b.driverDir, 0o755); err != nil {
		t.Fatal(err)
	}
	run := func(name string, args ...string) {
		t.Helper()
		cmd := exec.Command(name, args...)
		cmd.Env = append(os.Environ(), "CGO_ENABLED=1")
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
		}
	}
	run(cc, "-O2", "-Wall", "-Werror", "-fPIC", "-shared", "-o", b.shim, "c/preload.c", "-ldl", "-lpthread")
	run(cc, "-O2", "-Wall", "-Werror", "-fPIC", "-shared", "-o", filepath.Join(b.driverDir, "libcuda.so.1"), "c/fakecuda.c")
	run(cc, "-O2", "-Wall", "-Werror", "-o", b.tfalloc, "c/tfalloc.c", "-ldl")
	run("go", "build", "-buildmode=c-shared", "-o", b.lib, "../clib")
	return b
}

func (b built) command(env []string, name string, args ...string) *exec.Cmd {
	cmd := exec.Command(name, args...)
	cmd.Env = append(os.Environ(), "LD_PRELOAD="+b.shim, "LD_LIBRARY_PATH="+b.driverDir, "GPUMEM_LIBRARY="+b.lib)
	cmd.Env = append(cmd.Env, env...)
	return cmd
}

func output(t *testing.T, cmd *exec.Cmd) (stdout, stderr string, code int) {
	t.Helper()
	var o, e strings.Builder
	cmd.Stdout, cmd.Stderr = &o, &e
	err := cmd.Run()
	if ee, ok := err.(*exec.ExitError); ok {
		if !ee.Exited() {
			t.Fatalf("%s died: %v\nstdout:\n%s\nstderr:\n%s", cmd.Path, err, o.String(), e.String())
		}
		return o.String(), e.String(), ee.ExitCode()
	} else if err != nil {
		t.Fatal(err)
	}
	return o.String(), e.String(), 0
}

// TestTensorFlowCalls: TensorFlow's cuda_malloc_async calls, made through
// dlsym and cuGetProcAddress as frameworks make them, are served by gpumem
// (tfalloc checks each contract and that the driver got none of them but
// the capturing stream's); out-of-memory is the driver's error with one
// verdict on stderr.
func TestTensorFlowCalls(t *testing.T) {
	b := build(t)
	stdout, stderr, code := output(t, b.command([]string{"GPUMEM_CONFIG=device=sim,capacity=4GiB,limit=1GiB,check=true"},
		b.tfalloc, "1073741824"))
	if code != 0 {
		t.Fatalf("tfalloc under the shim: exit %d\n%s%s", code, stdout, stderr)
	}
	if n := strings.Count(stdout, "ok: "); n != 5 {
		t.Errorf("%d checks passed, want 5:\n%s", n, stdout)
	}
	if !strings.HasPrefix(stderr, "gpumem: out of memory (allocator limit)") || strings.Count(stderr, "\n") != 1 {
		t.Errorf("stderr should be the one verdict of the out-of-memory, got:\n%s", stderr)
	}
	// Without the shim the same program sees the driver's allocations:
	// the checks can fail.
	cmd := exec.Command(b.tfalloc, "1073741824")
	cmd.Env = append(os.Environ(), "LD_LIBRARY_PATH="+b.driverDir)
	if _, _, code := output(t, cmd); code == 0 {
		t.Error("tfalloc passed without the shim: its checks do not tell gpumem from the driver")
	}
}

// TestMissingLibrary: without a usable gpumem the shim says so in one line
// and the program runs on the driver (tfalloc then reports that the driver
// served its allocations), never crashing.
func TestMissingLibrary(t *testing.T) {
	b := build(t)
	for _, lib := range []string{"/nonexistent/libgpumem.so", b.driverDir + "/libcuda.so.1"} {
		cmd := b.command([]string{"GPUMEM_LIBRARY=" + lib}, b.tfalloc, "0")
		stdout, stderr, code := output(t, cmd)
		lines := strings.Split(strings.TrimSpace(stderr), "\n")
		if !strings.HasPrefix(lines[0], "gpumem: preload: cannot use "+lib) {
			t.Errorf("GPUMEM_LIBRARY=%s: first line %q, want the shim's one line", lib, lines[0])
		}
		if strings.Count(stderr, "gpumem: preload") != 1 {
			t.Errorf("GPUMEM_LIBRARY=%s: the shim said more than one line:\n%s", lib, stderr)
		}
		if code != 1 || !strings.Contains(stderr, "the driver got allocations") {
			t.Errorf("GPUMEM_LIBRARY=%s: exit %d; want tfalloc to find the driver serving it\n%s%s", lib, code, stdout, stderr)
		}
	}
}

// TestNoWrappedCalls: a program that never allocates device memory runs as
// without the shim, and gpumem is never loaded into it.
func TestNoWrappedCalls(t *testing.T) {
	b := build(t)
	stdout, stderr, code := output(t, b.command(nil, "sh", "-c", "echo hello; grep -c libgpumem.so /proc/self/maps || true"))
	if code != 0 || stdout != "hello\n0\n" || stderr != "" {
		t.Errorf("exit %d, stdout %q, stderr %q; want hello, 0 mappings of gpumem, nothing on stderr", code, stdout, stderr)
	}
}
