package cli

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"runtime"
	"runtime/debug"
	"strings"

	"github.com/gpumem/gpumem/device/sim"
	"github.com/gpumem/gpumem/internal/units"
	"github.com/gpumem/gpumem/nvml"
)

// Version is gpumem's version as "gpumem version" prints it. When empty
// (the default), it is taken from the build information: the module
// version, or the VCS revision of a development build. Release builds set
// it with -ldflags "-X github.com/gpumem/gpumem/cli.Version=v1.2.3".
var Version = ""

// Exit statuses returned by Main.
const (
	ExitOK    = 0 // success
	ExitFail  = 1 // the command failed: bad trace, no driver, device error
	ExitUsage = 2 // the command line was wrong
)

// Main runs the gpumem command line: args are the arguments after the
// program name. Results go to stdout; diagnostics go to stderr, one line
// each, prefixed by "gpumem" and the command. Main returns the exit status:
// ExitOK, ExitFail or ExitUsage.
func Main(args []string, stdout, stderr io.Writer) int {
	return newEnv(stdout, stderr).main(args)
}

// env is what the commands need from the outside world, so that tests can
// replace the GPU.
type env struct {
	stdout, stderr io.Writer
	// openCUDA opens the CUDA device with the given ordinal; without a
	// driver its error matches device.ErrNoDriver.
	openCUDA func(ordinal int) (gpuDevice, error)
	// listGPUs reports the GPUs and the processes using them; without a
	// driver its error matches device.ErrNoDriver.
	listGPUs func() ([]nvml.GPUReport, error)
	// exec replaces the process with a command (gpumem run); it returns
	// only on failure.
	exec func(path string, argv, envv []string) error
}

func newEnv(stdout, stderr io.Writer) *env {
	return &env{stdout: stdout, stderr: stderr, openCUDA: openCUDA, listGPUs: listGPUs, exec: execCommand}
}

// A command is one subcommand of gpumem.
type command struct {
	name    string
	summary string
	run     func(e *env, args []string) int
}

// commands is filled in init, since help refers to it.
var commands []command

func init() {
	commands = []command{
		{"replay", "replay allocation traces and report peak memory, fragmentation and speed", (*env).replay},
		{"fit", "the smallest GPU a trace runs on, under gpumem and each emulated allocator", (*env).fit},
		{"report", "write an HTML report of where a trace's memory goes, per policy", (*env).report},
		{"import", "convert a PyTorch memory snapshot into allocation traces", (*env).importSnapshot},
		{"run", "run a TensorFlow or JAX program with gpumem as its allocator", (*env).run},
		{"top", "a live view of the GPUs, their processes and gpumem's pools", (*env).top},
		{"serve", "export the host's GPUs and gpumem pools to Prometheus", (*env).serve},
		{"devices", "list the GPUs, their memory and the processes using it", (*env).devices},
		{"version", "print gpumem's version", (*env).version},
		{"help", "print this help, or a command's (gpumem help replay)", (*env).help},
	}
}

func (e *env) main(args []string) int {
	if len(args) == 0 {
		e.usage(e.stderr)
		return ExitUsage
	}
	name := args[0]
	switch name {
	case "-h", "-help", "--help":
		name = "help"
	case "-v", "-version", "--version":
		name = "version"
	}
	for _, c := range commands {
		if c.name == name {
			return c.run(e, args[1:])
		}
	}
	if strings.HasPrefix(name, "-") {
		fmt.Fprintf(e.stderr, "gpumem: unknown flag %s: flags follow the command (gpumem replay --json ...)\n", name)
	} else {
		fmt.Fprintf(e.stderr, "gpumem: unknown command %q\n", name)
	}
	fmt.Fprintf(e.stderr, "Run 'gpumem help' for usage.\n")
	return ExitUsage
}

func (e *env) usage(w io.Writer) {
	fmt.Fprintf(w, "gpumem manages GPU memory: a stream-ordered caching allocator and its tools.\n\n")
	fmt.Fprintf(w, "Usage:\n\n\tgpumem <command> [flags] [arguments]\n\nCommands:\n\n")
	for _, c := range commands {
		fmt.Fprintf(w, "\t%-8s  %s\n", c.name, c.summary)
	}
	fmt.Fprintf(w, "\nRun 'gpumem <command> -h' for a command's flags.\n")
}

func (e *env) help(args []string) int {
	switch len(args) {
	case 0:
		e.usage(e.stdout)
		return ExitOK
	case 1:
		for _, c := range commands {
			if c.name == args[0] && c.name != "help" {
				return c.run(e, []string{"-h"})
			}
		}
		if args[0] == "help" {
			e.usage(e.stdout)
			return ExitOK
		}
		fmt.Fprintf(e.stderr, "gpumem help: unknown command %q\nRun 'gpumem help' for usage.\n", args[0])
		return ExitUsage
	}
	fmt.Fprintf(e.stderr, "gpumem help: too many arguments\nusage: gpumem help [command]\n")
	return ExitUsage
}

func (e *env) version(args []string) int {
	fs := e.flagSet("version", "", "Version prints gpumem's version, the Go version and the platform.")
	rest, code := e.parse(fs, args)
	if code >= 0 {
		return code
	}
	if len(rest) > 0 {
		return e.usageError(fs, "version takes no arguments")
	}
	fmt.Fprintf(e.stdout, "gpumem %s %s %s/%s\n", version(), runtime.Version(), runtime.GOOS, runtime.GOARCH)
	return ExitOK
}

// version is Version, or what the build information says.
func version() string {
	if Version != "" {
		return Version
	}
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return "(unknown)"
	}
	v := bi.Main.Version
	if v != "" && v != "(devel)" {
		return v
	}
	var rev, modified string
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			rev = s.Value
		case "vcs.modified":
			if s.Value == "true" {
				modified = "-dirty"
			}
		}
	}
	if rev == "" {
		return "(devel)"
	}
	if len(rev) > 12 {
		rev = rev[:12]
	}
	return "(devel) " + rev + modified
}

// cmdFlags is a command's FlagSet with the text of its usage.
type cmdFlags struct {
	*flag.FlagSet
	synopsis string // the argument part of the usage line
	about    string // what the command does
}

// flagSet returns the flags of a command that prints its usage itself.
func (e *env) flagSet(name, synopsis, about string) *cmdFlags {
	fs := flag.NewFlagSet("gpumem "+name, flag.ContinueOnError)
	fs.SetOutput(io.Discard) // errors are reported by parse, help by printUsage
	fs.Usage = func() {}
	return &cmdFlags{fs, synopsis, about}
}

// printUsage writes a command's usage: its synopsis, what it does and its
// flags, spelled with two dashes (one works as well).
func (fs *cmdFlags) printUsage(w io.Writer) {
	line := fs.Name()
	if hasFlags(fs.FlagSet) {
		line += " [flags]"
	}
	if fs.synopsis != "" {
		line += " " + fs.synopsis
	}
	fmt.Fprintf(w, "Usage: %s\n\n%s\n", line, fs.about)
	if !hasFlags(fs.FlagSet) {
		return
	}
	fmt.Fprintf(w, "\nFlags:\n")
	fs.VisitAll(func(f *flag.Flag) {
		name, text := flag.UnquoteUsage(f)
		head := "  --" + f.Name
		if name != "" {
			head += " " + name
		}
		if f.DefValue != "" && f.DefValue != "false" && f.DefValue != "0" {
			text += " (default " + f.DefValue + ")"
		}
		fmt.Fprintf(w, "%s\n    \t%s\n", head, strings.ReplaceAll(text, "\n", "\n    \t"))
	})
}

func hasFlags(fs *flag.FlagSet) bool {
	n := 0
	fs.VisitAll(func(*flag.Flag) { n++ })
	return n > 0
}

// parse parses args with fs, allowing flags after the arguments
// ("gpumem replay a.trace --json"); "--" ends the flags. It returns the
// arguments and -1, or the exit status if the command is done: ExitOK
// after -h (usage printed to stdout), ExitUsage after a bad flag (one line
// to stderr).
func (e *env) parse(fs *cmdFlags, args []string) ([]string, int) {
	var pos []string
	for {
		if err := fs.Parse(args); err != nil {
			if errors.Is(err, flag.ErrHelp) {
				fs.printUsage(e.stdout)
				return nil, ExitOK
			}
			return nil, e.usageError(fs, twoDashes(err.Error()))
		}
		rest := fs.Args()
		used := len(args) - len(rest)
		if used > 0 && args[used-1] == "--" {
			return append(pos, rest...), -1
		}
		if len(rest) == 0 {
			return pos, -1
		}
		pos = append(pos, rest[0])
		args = rest[1:]
	}
}

// twoDashes respells the flag names in the flag package's messages
// ("flag provided but not defined: -x", "invalid value "y" for flag -x")
// with two dashes, as the usage does.
func twoDashes(msg string) string {
	for _, p := range []string{"defined: -", "for flag -", "for -", "argument: -"} {
		if i := strings.Index(msg, p); i >= 0 && !strings.HasPrefix(msg[i+len(p):], "-") {
			return msg[:i+len(p)] + "-" + msg[i+len(p):]
		}
	}
	return msg
}

// usageError reports a command-line mistake in one line, points to the
// command's help, and returns ExitUsage.
func (e *env) usageError(fs *cmdFlags, msg string) int {
	fmt.Fprintf(e.stderr, "%s: %s\nRun '%s -h' for usage.\n", fs.Name(), msg, fs.Name())
	return ExitUsage
}

// sizeFlag is a flag.Value holding a size in bytes, set with units.Parse's
// syntax.
type sizeFlag uint64

// capacityProblem says what is wrong with a --capacity, "" if nothing: 0,
// or more than the largest device the policies model (sim.MaxCapacity).
func capacityProblem(c sizeFlag) string {
	switch {
	case c == 0:
		return "invalid value 0 for flag --capacity"
	case c > sim.MaxCapacity:
		return fmt.Sprintf("invalid value %s for flag --capacity: the simulated device models at most %s", units.Format(uint64(c)), units.Format(sim.MaxCapacity))
	}
	return ""
}

func (s *sizeFlag) Set(v string) error {
	n, err := units.ParseBare(v)
	if err != nil {
		return err
	}
	*s = sizeFlag(n)
	return nil
}

func (s *sizeFlag) String() string {
	if s == nil || *s == 0 {
		return "0"
	}
	return units.Format(uint64(*s))
}

// Get implements flag.Getter.
func (s *sizeFlag) Get() any { return uint64(*s) }
