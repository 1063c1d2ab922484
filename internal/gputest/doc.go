// Package gputest holds the tests that need a real NVIDIA GPU: the
// conformance suite on the CUDA backend, and the checks only real memory can
// answer (data written through buffers reads back; work pending on one
// stream never sees its memory handed to another; Trim shows in NVML).
//
// The suite runs on suiteGPU (suite_test.go, pend_test.go), the real device
// with the suite's hooks: faults injected before the driver; streams held
// pending by a kernel that waits for a flag, with every buffer written on
// its stream and every handoff checked by asking the GPU whether the new
// stream's work would overtake the pending work; and device memory taken
// away by real allocations. No test of the suite skips on a GPU.
// Without a driver every test skips and says why. scripts/gpu.sh builds the
// test binary on a machine without a GPU and runs it on one.
package gputest
