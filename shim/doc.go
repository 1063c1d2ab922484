// Package shim holds libgpumem_preload.so, the C shim that `gpumem run`
// preloads into TensorFlow, JAX, PyTorch and CuPy programs (c/preload.c:
// what it wraps and the contracts it keeps; c/gate.c: the launch gate that
// lets gpumem move live memory with no other thread's work in flight), and
// its tests, which run it against a stand-in driver (c/fakecuda.c) with
// gpumem on the simulated device, so that they need no GPU: c/tfalloc.c
// makes TensorFlow's calls, c/paths.c checks the per-call path's contracts
// (captures, devices, fork), c/gatecheck.c the gate's (and times it:
// BenchmarkLaunchGate), and c/shimbench.c times the per-call path part by
// part (on a GPU machine against the real driver too:
// bench/jax/gpu_issue10.sh). There is no Go code in it but the tests: the
// shim is built by scripts/lib.sh.
package shim
