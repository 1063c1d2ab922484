// Package shim holds libgpumem_preload.so, the C shim that `gpumem run`
// preloads into TensorFlow and JAX programs (c/preload.c: what it wraps and
// the contracts it keeps), and its tests, which run it against a stand-in
// driver (c/fakecuda.c) with gpumem on the simulated device, so that
// they need no GPU; on a GPU machine c/tfalloc.c runs against the
// real driver too (scripts/gpu.sh). There is no Go code in it: the shim is
// built by scripts/lib.sh.
package shim
