package cli

import (
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/gpumem/gpumem/internal/host"
)

const runAbout = `Run runs COMMAND with gpumem as its GPU memory allocator: a PyTorch,
CuPy, TensorFlow or JAX program, unchanged.

PyTorch and CuPy: where the library is the Python package's (a wheel, or a
checkout's python/gpumem or build/), PYTHONPATH gains the package's hook
(gpumem/_autoload), which makes gpumem the framework's allocator as soon as
the program imports torch or cupy (gpumem.torch.use(), gpumem.cupy.use(),
with this command's configuration). GPUMEM_AUTOLOAD names the frameworks
(default torch,cupy; empty: none).

TensorFlow and JAX: it preloads gpumem's shim (libgpumem_preload.so),
which takes the framework's stream-ordered allocations, frees, memory pools
and cuMemGetInfo to gpumem (libgpumem.so), and sets the frameworks to that
mode with preallocation off:

	XLA_PYTHON_CLIENT_ALLOCATOR=cuda_async  XLA_PYTHON_CLIENT_PREALLOCATE=false
	TF_GPU_ALLOCATOR=cuda_malloc_async      TF_FORCE_GPU_ALLOW_GROWTH=true

XLA's command buffers (CUDA graphs) are kept for fused kernels only
(XLA_FLAGS gains --xla_gpu_enable_command_buffer=FUSION, unless XLA_FLAGS
already names that flag): XLA records its other commands (cuBLAS, cuDNN,
custom calls) by stream capture and captures them again whenever their
buffers move, which an allocator that gives memory back makes them do.
--xla-command-buffers=xla keeps XLA's default, =off turns them all off.

cuMemGetInfo answers within the limit, so a framework sizes itself to it;
each program run this way holds its own limit. Memory left unused for
--release-after goes back to the driver; gpumem.trim() from Python gives it
back at once. With --serve the program's pool is readable live over HTTP
(/debug/gpumem/stats, /debug/gpumem/snapshot, /metrics). An out-of-memory
reaches the framework as the driver's
CUDA_ERROR_OUT_OF_MEMORY, with gpumem's verdict printed once on stderr.

The libraries are found through --library and --shim, else GPUMEM_LIBRARY
and GPUMEM_PRELOAD, else beside the gpumem executable, in ../lib, or in
.. (a checkout's build/ when gpumem is build/gpu/gpumem). Other settings go
in --config or GPUMEM_CONFIG (key=value,...: see gpumem.h).

COMMAND replaces gpumem (exec): its exit status is the command's.`

// defaultReleaseAfter is how long memory may sit unused before gpumem run
// gives it back: long enough that the pauses of a training loop (an
// evaluation, a checkpoint) keep their cache, short enough that memory
// freed by a deleted model is back for other programs within seconds.
const defaultReleaseAfter = 5 * time.Second

// frameworkEnv is what gpumem run sets so that the frameworks make the
// calls the shim takes.
var frameworkEnv = []string{
	"XLA_PYTHON_CLIENT_ALLOCATOR=cuda_async",
	"XLA_PYTHON_CLIENT_PREALLOCATE=false",
	"TF_GPU_ALLOCATOR=cuda_malloc_async",
	"TF_FORCE_GPU_ALLOW_GROWTH=true",
}

// xlaCommandBuffers maps --xla-command-buffers to the value of XLA's
// --xla_gpu_enable_command_buffer ("xla": leave XLA's default). Kernels
// only is the default: measured on the H100 (docs/BENCHMARKS.md, "JAX on
// gpumem"), XLA's traced commands made 379-1,589 stream captures a run
// under gpumem (461-530 under BFC), and without them the steps of the lm
// and mlp programs were 1.4-5.9% faster under gpumem and no capture was
// made.
var xlaCommandBuffers = map[string]string{"kernels": "FUSION", "off": "", "xla": "xla"}

// withXLAFlags returns environ with XLA_FLAGS naming the command buffers
// of mode (a key of xlaCommandBuffers), unless mode is "xla" or XLA_FLAGS
// already sets them: the user's choice stands.
func withXLAFlags(environ []string, mode string) []string {
	types := xlaCommandBuffers[mode]
	if types == "xla" {
		return environ
	}
	const flag = "--xla_gpu_enable_command_buffer"
	old := ""
	for _, kv := range environ {
		if v, ok := strings.CutPrefix(kv, "XLA_FLAGS="); ok {
			old = v
		}
	}
	if strings.Contains(old, flag) {
		return environ
	}
	return setEnv(environ, []string{"XLA_FLAGS=" + strings.TrimSpace(old+" "+flag+"="+types)})
}

func (e *env) run(args []string) int {
	fs := e.flagSet("run", "-- COMMAND [ARG...]", runAbout)
	limit := fs.String("limit", "", "cap the memory gpumem holds: a size (40GiB) or a percentage of the GPU (90%)")
	release := fs.Duration("release-after", defaultReleaseAfter, "give memory unused this long back to the driver (0: keep it until trimmed)")
	config := fs.String("config", "", "more configuration, as in GPUMEM_CONFIG (key=value,...)")
	serve := fs.String("serve", "", "serve the program's pool over HTTP on `ADDR` (stats, snapshot, Prometheus metrics; port 0 picks one)")
	library := fs.String("library", "", "libgpumem.so to use")
	shim := fs.String("shim", "", "libgpumem_preload.so to use")
	cmdBufs := fs.String("xla-command-buffers", "kernels", "XLA's command buffers: `kernels` (fused kernels only), xla (XLA's default) or off")
	flagArgs, command := splitCommand(args)
	if err := fs.Parse(flagArgs); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			fs.printUsage(e.stdout)
			return ExitOK
		}
		return e.usageError(fs, twoDashes(err.Error()))
	}
	command = append(fs.Args(), command...)
	if len(command) == 0 {
		return e.usageError(fs, "no COMMAND: gpumem run [flags] -- COMMAND [ARG...]")
	}
	if *release < 0 {
		return e.usageError(fs, "--release-after must not be negative")
	}
	if _, ok := xlaCommandBuffers[*cmdBufs]; !ok {
		return e.usageError(fs, fmt.Sprintf("--xla-command-buffers=%q: want kernels, xla or off", *cmdBufs))
	}
	cfg := os.Getenv("GPUMEM_CONFIG")
	for _, kv := range []string{*config, optional("limit", *limit), optional("serve", *serve), "release_after=" + release.String()} {
		if kv != "" {
			cfg = joinConfig(cfg, kv)
		}
	}
	if _, err := host.ParseConfig(cfg); err != nil {
		fmt.Fprintf(e.stderr, "gpumem run: %v\n", err)
		return ExitUsage
	}
	// defrag=true and gather=true move live memory: under the shim each
	// move closes its launch gate (shim/c/gate.c, gpumem.Gate), so that no
	// other thread launches meanwhile, and where the gate cannot see every
	// launch (any program that uses the CUDA runtime, which reaches the
	// driver through cuGetExportTable) no move is made and the shim says
	// why. Where it sees them all, the default gathers on the way to an
	// out-of-memory by itself.
	lib, err := findLibrary(*library, "GPUMEM_LIBRARY", "libgpumem.so")
	if err == nil {
		*shim, err = findLibrary(*shim, "GPUMEM_PRELOAD", "libgpumem_preload.so")
	}
	if err != nil {
		fmt.Fprintf(e.stderr, "gpumem run: %v\n", err)
		return ExitFail
	}
	path, err := exec.LookPath(command[0])
	if err != nil {
		fmt.Fprintf(e.stderr, "gpumem run: %v\n", err)
		return 127
	}
	preload := *shim
	if old := os.Getenv("LD_PRELOAD"); old != "" {
		preload += ":" + old
	}
	set := append([]string{
		"LD_PRELOAD=" + preload,
		"GPUMEM_LIBRARY=" + lib,
		"GPUMEM_CONFIG=" + cfg,
	}, frameworkEnv...)
	if dir := autoloadDir(lib); dir != "" {
		// PyTorch and CuPy: the Python package's hook, run at
		// interpreter start, makes gpumem their allocator when the
		// program imports them (python/gpumem/_autoload).
		pp := dir
		if old := os.Getenv("PYTHONPATH"); old != "" {
			pp += string(os.PathListSeparator) + old
		}
		set = append(set, "PYTHONPATH="+pp)
		if _, ok := os.LookupEnv("GPUMEM_AUTOLOAD"); !ok {
			set = append(set, "GPUMEM_AUTOLOAD=torch,cupy")
		}
	}
	envv := setEnv(withXLAFlags(os.Environ(), *cmdBufs), set)
	err = e.exec(path, command, envv)
	fmt.Fprintf(e.stderr, "gpumem run: %s: %v\n", command[0], err)
	return ExitFail
}

// splitCommand splits args at the first "--": the flags before, the command
// after (nil if there is no "--"; then the command starts at the first
// argument that is not a flag).
func splitCommand(args []string) (flags, command []string) {
	for i, a := range args {
		if a == "--" {
			return args[:i], args[i+1:]
		}
	}
	return args, nil
}

func optional(key, value string) string {
	if value == "" {
		return ""
	}
	return key + "=" + value
}

// joinConfig appends key=value to a configuration string, replacing the
// key's earlier value.
func joinConfig(cfg, kv string) string {
	var keep []string
	for item := range strings.SplitSeq(kv, ",") {
		key, _, _ := strings.Cut(item, "=")
		key = strings.TrimSpace(key)
		var rest []string
		for old := range strings.SplitSeq(cfg, ",") {
			if k, _, _ := strings.Cut(old, "="); strings.TrimSpace(k) != key && strings.TrimSpace(old) != "" {
				rest = append(rest, old)
			}
		}
		cfg = strings.Join(rest, ",")
		keep = append(keep, item)
	}
	if cfg == "" {
		return strings.Join(keep, ",")
	}
	return cfg + "," + strings.Join(keep, ",")
}

// setEnv returns environ with each KEY=value of set in place of KEY's
// earlier value.
func setEnv(environ, set []string) []string {
	out := make([]string, 0, len(environ)+len(set))
	for _, kv := range environ {
		k, _, _ := strings.Cut(kv, "=")
		replaced := false
		for _, s := range set {
			if sk, _, _ := strings.Cut(s, "="); sk == k {
				replaced = true
			}
		}
		if !replaced {
			out = append(out, kv)
		}
	}
	return append(out, set...)
}

// findLibrary finds one of gpumem's libraries: the flag's path, the
// environment variable's, or name beside the executable, in ../lib or in
// .. of it.
func findLibrary(flagPath, envName, name string) (string, error) {
	for _, p := range []string{flagPath, os.Getenv(envName)} {
		if p == "" {
			continue
		}
		if _, err := os.Stat(p); err != nil {
			return "", fmt.Errorf("%s: %w", name, err)
		}
		return filepath.Abs(p)
	}
	var tried []string
	if exe, err := os.Executable(); err == nil {
		if r, err := filepath.EvalSymlinks(exe); err == nil {
			exe = r
		}
		dir := filepath.Dir(exe)
		for _, d := range []string{dir, filepath.Join(dir, "..", "lib"), filepath.Join(dir, "..")} {
			p := filepath.Join(d, name)
			if _, err := os.Stat(p); err == nil {
				return filepath.Abs(p)
			}
			tried = append(tried, filepath.Clean(p))
		}
	}
	return "", fmt.Errorf("%s not found (looked at %s); build it with scripts/lib.sh, or name it with %s", name,
		strings.Join(tried, ", "), envName)
}

// autoloadDir returns the Python package's hook directory for the library
// at lib (gpumem/_autoload/sitecustomize.py): beside it in the package (a
// wheel, or a checkout's python/gpumem), or in the checkout around a
// build/ library; "" if there is none.
func autoloadDir(lib string) string {
	dir := filepath.Dir(lib)
	for _, d := range []string{filepath.Join(dir, "_autoload"), filepath.Join(dir, "..", "python", "gpumem", "_autoload")} {
		if _, err := os.Stat(filepath.Join(d, "sitecustomize.py")); err == nil {
			if abs, err := filepath.Abs(d); err == nil {
				return abs
			}
		}
	}
	return ""
}

// execCommand replaces this process with the command.
func execCommand(path string, argv, envv []string) error { return syscall.Exec(path, argv, envv) }
