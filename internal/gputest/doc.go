// Package gputest holds the tests that need a real NVIDIA GPU: the
// conformance suite on the CUDA backend, and the checks only real memory can
// answer (data written through buffers reads back; work pending on one
// stream never sees its memory handed to another; Trim shows in NVML).
// Without a driver every test skips and says why. scripts/gpu.sh builds the
// test binary on a machine without a GPU and runs it on one.
package gputest
