// Package cli is the gpumem command line: Main runs it with the arguments,
// output and error streams given, so that cmd/gpumem stays a one-line
// wrapper and tests run the commands in process.
//
// The commands are
//
//	gpumem replay [flags] TRACE...   replay allocation traces through the
//	                                 allocator on the GPU or a simulated
//	                                 device, and report peak memory,
//	                                 fragmentation (peak reserved / peak
//	                                 live), OOMs (the first one's verdict,
//	                                 and which emulated policies would have
//	                                 run the trace), mappings and speed
//	gpumem import SNAPSHOT -o TRACE  convert a PyTorch memory snapshot into
//	                                 traces, one per device
//	gpumem run [flags] -- COMMAND    run a TensorFlow or JAX program with
//	                                 gpumem as its allocator (the preload
//	                                 shim; flags before "--" only)
//	gpumem top [--interval D]        a live view of the GPUs, their processes
//	                                 and the pools of gpumem processes
//	gpumem serve [--listen ADDR]     export the GPUs (NVML) and the pools of
//	                                 gpumem processes to Prometheus
//	gpumem devices [--json]          list the GPUs (NVML): memory and the
//	                                 processes using it
//	gpumem version                   print the version
//	gpumem help [command]            print the usage
//
// Each command has its own flag set (package flag); flags take one dash or
// two, and may follow the arguments (run's must come before its command). Sizes are written as units.Parse reads
// them ("80GiB", "512MiB", "1.5GB", "1024") and printed as units.Format
// writes them ("12.17 GiB"). Results go to standard output (a readable
// table, or with --json one JSON object per line); diagnostics go to
// standard error, one line each, prefixed by "gpumem" and the command (a
// command-line mistake adds a line pointing to the command's -h).
//
// Exit statuses: 0 success, 1 the command failed (unreadable trace, no
// driver, device error), 2 the command line was wrong.
//
// Without an NVIDIA driver, "replay --device auto" (the default) says so in
// one line and uses the simulated device (package device/sim); "replay
// --device cuda" and "devices" fail with that one line.
package cli
