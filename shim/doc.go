// Package shim holds libgpumem_preload.so, the C shim that `gpumem run`
// preloads into TensorFlow and JAX programs (c/preload.c: what it wraps and
// the contracts it keeps), and its tests, which run it against a stand-in
// driver (c/fakecuda.c) with gpumem on the simulated device, so that
// they need no GPU: c/tfalloc.c makes TensorFlow's calls, c/paths.c checks
// the per-call path's contracts (captures, devices, fork), and
// c/shimbench.c times that path part by part (on a GPU machine against the
// real driver too: bench/jax/gpu_issue10.sh). There is no Go code in it:
// the shim is built by scripts/lib.sh.
package shim
